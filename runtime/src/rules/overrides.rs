//! Rates changed at run time, fleet-wide: a rule's rate and interval replaced for every
//! key of its template, or for one limiter, without a redeploy.
//!
//! The library keeps its own keys under `<prefix>redlimit:`, a segment no rule's
//! limiter can start with (the attribute refuses such keys at compile time, the layer
//! such names when it is built). Overrides live in one hash there,
//! `<prefix>redlimit:overrides` (so they survive restarts), field `rule:<rule name>` or `key:<limiter name>`, value
//! `<rate>/<interval in ms>`. Each process reads the hash on its first decision and then
//! every second in the background (`backend::redis::shared::sync`), so a change reaches every process within about a
//! second and a decision never waits for it. Rules of the attribute and of the layer
//! apply them: a limiter's own override first, then its rule's; the rule then writes
//! the overridden config, so it does not undo it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::{Error, RateLimiterConfig, RateType};

/// What an override applies to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OverrideOf {
    /// Every limiter of a rule: its key template as written (`order:{user_id}`), the
    /// function's path for a rule without key, or a layer rule's name.
    Rule(String),
    /// One limiter, by its full name (prefix included: `rate_limit:order:42`).
    Key(String),
}

impl OverrideOf {
    pub(crate) fn field(&self) -> String {
        match self {
            OverrideOf::Rule(name) => format!("rule:{name}"),
            OverrideOf::Key(name) => format!("key:{name}"),
        }
    }

    fn from_field(field: &str) -> Option<OverrideOf> {
        if let Some(name) = field.strip_prefix("rule:") {
            Some(OverrideOf::Rule(name.to_owned()))
        } else {
            field
                .strip_prefix("key:")
                .map(|name| OverrideOf::Key(name.to_owned()))
        }
    }
}

/// A rate and interval that replace a rule's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateOverride {
    pub of: OverrideOf,
    pub rate: u64,
    pub interval: Duration,
}

impl RateOverride {
    pub(crate) fn value(&self) -> String {
        format!("{}/{}", self.rate, self.interval.as_millis())
    }

    pub(crate) fn parse(field: &str, value: &str) -> Option<RateOverride> {
        let of = OverrideOf::from_field(field)?;
        let (rate, interval) = value.split_once('/')?;
        let override_ = RateOverride {
            of,
            rate: rate.trim().parse().ok()?,
            interval: Duration::from_millis(interval.trim().parse().ok()?),
        };
        override_.check().ok()?;
        Some(override_)
    }

    pub(crate) fn check(&self) -> Result<(), Error> {
        let name = match &self.of {
            OverrideOf::Rule(name) | OverrideOf::Key(name) => name,
        };
        RateLimiterConfig::new(RateType::Overall, self.rate, self.interval).validate(name)
    }
}

/// The overrides a process knows, by rule and by limiter.
#[derive(Debug, Default)]
pub(crate) struct Table {
    rules: HashMap<String, (u64, Duration)>,
    keys: HashMap<String, (u64, Duration)>,
}

impl Table {
    pub(crate) fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.keys.is_empty()
    }

    /// The rate and interval for the limiter `key` of rule `rule`, when overridden.
    pub(crate) fn lookup(&self, rule: &str, key: &str) -> Option<(u64, Duration)> {
        self.keys.get(key).or_else(|| self.rules.get(rule)).copied()
    }

    pub(crate) fn from_list(list: &[RateOverride]) -> Table {
        let mut table = Table::default();
        for o in list {
            let entry = (o.rate, o.interval);
            match &o.of {
                OverrideOf::Rule(name) => table.rules.insert(name.clone(), entry),
                OverrideOf::Key(name) => table.keys.insert(name.clone(), entry),
            };
        }
        table
    }

    pub(crate) fn list(&self) -> Vec<RateOverride> {
        let rules = self.rules.iter().map(|(n, &(rate, interval))| RateOverride {
            of: OverrideOf::Rule(n.clone()),
            rate,
            interval,
        });
        let keys = self.keys.iter().map(|(n, &(rate, interval))| RateOverride {
            of: OverrideOf::Key(n.clone()),
            rate,
            interval,
        });
        let mut list: Vec<RateOverride> = rules.chain(keys).collect();
        list.sort_by(|a, b| a.of.cmp(&b.of));
        list
    }
}

/// A client's overrides: the table its decisions read (refreshed by the client's
/// background task, `backend::redis::shared::sync`).
#[derive(Debug, Default)]
pub(crate) struct Overrides {
    table: RwLock<Arc<Table>>,
    /// Whether the table holds any override: read without the lock by a call that
    /// needs the table only when it does.
    any: AtomicBool,
    /// When an unusable override was last reported.
    warned_ms: AtomicU64,
}

impl Overrides {
    pub(crate) fn table(&self) -> Arc<Table> {
        self.table.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn replace(&self, table: Table) {
        let mut held = self.table.write().unwrap_or_else(|e| e.into_inner());
        self.any.store(!table.is_empty(), Ordering::Release);
        *held = Arc::new(table);
    }

    /// Changes the table's list as `change` says, under the table's lock from the read
    /// to the write: two changes made at once never undo each other.
    pub(crate) fn edit<R>(&self, change: impl FnOnce(&mut Vec<RateOverride>) -> R) -> R {
        let mut held = self.table.write().unwrap_or_else(|e| e.into_inner());
        let mut list = held.list();
        let answer = change(&mut list);
        let table = Table::from_list(&list);
        self.any.store(!table.is_empty(), Ordering::Release);
        *held = Arc::new(table);
        answer
    }

    /// Whether any override is set: when not, every rule decides at its own rate.
    #[inline]
    pub(crate) fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// Reports, at most once per 10 s, an override a rule cannot take (and ignores).
    pub(crate) fn warn_unusable(&self, rule: &str, error: &Error, now_ms: u64) {
        let last = self.warned_ms.load(Ordering::Relaxed);
        if now_ms.saturating_sub(last) >= 10_000
            && self
                .warned_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                rule,
                "rate override ignored, the rule's own rate applies: {error}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_values_round_trip() {
        let o = RateOverride {
            of: OverrideOf::Rule("order:{user}".into()),
            rate: 10,
            interval: Duration::from_secs(60),
        };
        assert_eq!(o.of.field(), "rule:order:{user}");
        assert_eq!(o.value(), "10/60000");
        assert_eq!(RateOverride::parse(&o.of.field(), &o.value()), Some(o));
        assert_eq!(
            RateOverride::parse("key:x", "0/1000"),
            None,
            "rate 0 is not a rate"
        );
        assert_eq!(RateOverride::parse("other:x", "1/1000"), None);
        assert_eq!(RateOverride::parse("key:x", "1"), None);
    }

    #[test]
    fn a_limiter_override_wins_over_its_rules() {
        let table = Table::from_list(&[
            RateOverride {
                of: OverrideOf::Rule("r".into()),
                rate: 1,
                interval: Duration::from_secs(1),
            },
            RateOverride {
                of: OverrideOf::Key("p:r:7".into()),
                rate: 7,
                interval: Duration::from_secs(7),
            },
        ]);
        assert_eq!(table.lookup("r", "p:r:7"), Some((7, Duration::from_secs(7))));
        assert_eq!(table.lookup("r", "p:r:8"), Some((1, Duration::from_secs(1))));
        assert_eq!(table.lookup("s", "p:s:8"), None);
    }
}
