//! Rates changed at run time, fleet-wide: a rule's rate and interval replaced for every
//! key of its template, or for one limiter, without a redeploy. And the refusals each
//! process reports to Redis once a second, for operators watching a limiter.
//!
//! The library keeps its own keys under `<prefix>redlimit:`, a segment no rule's
//! limiter can start with (the attribute refuses such keys at compile time, the layer
//! such names when it is built). Overrides live in one hash there,
//! `<prefix>redlimit:overrides` (so they survive restarts), field `rule:<rule name>` or `key:<limiter name>`, value
//! `<rate>/<interval in ms>`. Each process reads the hash on its first decision and then
//! every second in the background, so a change reaches every process within about a
//! second and a decision never waits for it. Rules of the attribute and of the layer
//! apply them: a limiter's own override first, then its rule's; the rule then writes
//! the overridden config, so it does not undo it.
//!
//! Refusals of the attribute's and the layer's rules are counted in process and added,
//! by the same background task, to `<prefix>redlimit:refused:<epoch second>` (a hash of counts
//! by limiter name, kept 2 minutes): `redlimit watch` reads them. No call waits for
//! this. What the reports cost Redis is bounded per process, whatever keys callers
//! send: each second, at most `MAX_REPORTED` limiters (the first refused, not the
//! busiest) and `MAX_REPORTED_BYTES` of their names get a field of their own; the
//! refusals of any other limiter are counted under its rule, in the field
//! `rule:<rule name>`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::OnceCell;

use crate::{Client, Error, RateLimiterConfig, RateType};

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
    fn field(&self) -> String {
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
    fn value(&self) -> String {
        format!("{}/{}", self.rate, self.interval.as_millis())
    }

    fn parse(field: &str, value: &str) -> Option<RateOverride> {
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

    fn check(&self) -> Result<(), Error> {
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

    fn from_list(list: &[RateOverride]) -> Table {
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

    fn list(&self) -> Vec<RateOverride> {
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

/// The first segment, after the prefix, of the keys the library keeps for itself.
pub const LIBRARY_SEGMENT: &str = "redlimit";

/// How often each process reads the overrides and reports its refusals.
pub(crate) const REFRESH: Duration = Duration::from_secs(1);
/// Limiters whose refusals one process reports per second, at most, each in a field of
/// its own; other refusals are counted by rule.
pub(crate) const MAX_REPORTED: usize = 100;
/// The bytes of limiter names one process reports per second, at most.
pub(crate) const MAX_REPORTED_BYTES: usize = 16 * 1024;
/// How often a process publishes its rules when they did not change, and how long
/// the published table is kept after the last publication.
const RULES_REFRESH_MS: u64 = 60_000;
const RULES_TTL_MS: u64 = 3_600_000;
/// How long the refusal counts of one second are kept.
const REPORT_TTL_MS: u64 = 120_000;

/// Refusals counted since the last report, by second and limiter (or rule), and the
/// fields and bytes of names each second has taken of the budget.
#[derive(Debug, Default)]
struct Refused {
    counts: HashMap<(u64, String), u64>,
    budget: HashMap<u64, (usize, usize)>,
}

/// A client's overrides: the table its decisions read, and the refresh behind it.
#[derive(Debug, Default)]
pub(crate) struct Overrides {
    table: RwLock<Arc<Table>>,
    /// Set once the first read is done (or failed) and the refresh task runs.
    started: OnceCell<()>,
    /// When an unusable override was last reported.
    warned_ms: AtomicU64,
    /// Refusals not yet reported (Redis clients only).
    refused: std::sync::Mutex<Refused>,
    /// The registry's generation (plus one) last published, and when.
    published: AtomicU64,
    published_ms: AtomicU64,
}

impl Overrides {
    pub(crate) fn table(&self) -> Arc<Table> {
        self.table.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn replace(&self, table: Table) {
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(table);
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

impl Client {
    /// The key of the overrides hash: `<prefix>redlimit:overrides`.
    pub fn overrides_key(&self) -> String {
        format!("{}{LIBRARY_SEGMENT}:overrides", self.prefix())
    }

    /// The key of the table where each process publishes the rules it runs (what an
    /// override must fit, see [`Client::set_override`]): `<prefix>redlimit:rules`.
    pub fn rules_key(&self) -> String {
        format!("{}{LIBRARY_SEGMENT}:rules", self.prefix())
    }

    /// Publishes this process's rules, when they changed or a minute passed (Redis
    /// clients): fields of `rules_key()`, kept an hour after the last process
    /// publishing them.
    async fn publish_rules(&self) {
        let generation = crate::rules::registry::generation() as u64 + 1;
        let state = self.overrides();
        let now = self.now_ms();
        if state.published.load(Ordering::Relaxed) == generation
            && now.saturating_sub(state.published_ms.load(Ordering::Relaxed)) < RULES_REFRESH_MS
        {
            return;
        }
        let fields: Vec<(String, u64)> = crate::rules::registry::published_fields()
            .into_iter()
            .map(|f| (f, 0))
            .collect();
        if fields.is_empty() {
            return;
        }
        if let crate::backend::Backend::Redis(redis) = self.backend() {
            if redis
                .add_counts(&self.rules_key(), &fields, RULES_TTL_MS)
                .await
                .is_ok()
            {
                state.published.store(generation, Ordering::Relaxed);
                state.published_ms.store(now, Ordering::Relaxed);
            }
        }
    }

    /// The key of the refusals reported for the epoch second `second`:
    /// `<prefix>redlimit:refused:<second>`.
    pub fn refusals_key(&self, second: u64) -> String {
        format!("{}{LIBRARY_SEGMENT}:refused:{second}", self.prefix())
    }

    /// Counts a refusal of the limiter `name` of rule `rule`, for the next report
    /// (Redis clients): under the limiter's name while the second's budget lasts, else
    /// under the rule's.
    pub(crate) fn note_refused(&self, name: &str, rule: &str) {
        if self.is_memory() {
            return;
        }
        let second = self.now_ms() / 1000;
        let mut refused = self.overrides().refused.lock().unwrap_or_else(|e| e.into_inner());
        let Refused { counts, budget } = &mut *refused;
        if let Some(count) = counts.get_mut(&(second, name.to_owned())) {
            *count += 1;
            return;
        }
        if !budget.contains_key(&second) {
            budget.retain(|&s, _| s > second);
        }
        let (fields, bytes) = budget.entry(second).or_default();
        let field = if *fields < MAX_REPORTED && *bytes + name.len() <= MAX_REPORTED_BYTES {
            *fields += 1;
            *bytes += name.len();
            name.to_owned()
        } else {
            format!("rule:{rule}")
        };
        *counts.entry((second, field)).or_default() += 1;
    }

    /// Adds the refusals counted since the last report to Redis.
    async fn report_refusals(&self) {
        let counts = std::mem::take(
            &mut self
                .overrides()
                .refused
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .counts,
        );
        if counts.is_empty() {
            return;
        }
        if let crate::backend::Backend::Redis(redis) = self.backend() {
            let mut by_second: HashMap<u64, Vec<(String, u64)>> = HashMap::new();
            for ((second, name), count) in counts {
                by_second.entry(second).or_default().push((name, count));
            }
            for (second, counts) in by_second {
                let key = self.refusals_key(second);
                // Lost when Redis fails: these are for watching, not for deciding.
                let _ = redis.add_counts(&key, &counts, REPORT_TTL_MS).await;
            }
        }
    }

    /// Makes sure this client's background task runs: the first call reads the
    /// overrides (one round trip, once per client) and starts the task that refreshes
    /// them and reports refusals every second; later calls return at once. The
    /// in-process backend keeps overrides in this process only and reports nothing.
    pub(crate) async fn background_ready(&self) -> Arc<Table> {
        let state = self.overrides();
        if state.started.initialized() {
            return state.table();
        }
        state
            .started
            .get_or_init(|| async {
                if self.is_memory() {
                    return;
                }
                if let Ok(list) = self.read_overrides().await {
                    state.replace(Table::from_list(&list));
                }
                let weak = self.downgrade();
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(REFRESH).await;
                        let Some(client) = weak.upgrade() else {
                            return;
                        };
                        // A failed read keeps the table it has: the backend failing is
                        // on_error's business, not a reason to drop the overrides.
                        if let Ok(list) = client.read_overrides().await {
                            client.overrides().replace(Table::from_list(&list));
                        }
                        client.report_refusals().await;
                        client.publish_rules().await;
                    }
                });
            })
            .await;
        state.table()
    }

    async fn read_overrides(&self) -> Result<Vec<RateOverride>, Error> {
        match self.backend() {
            crate::backend::Backend::Redis(redis) => {
                let fields = redis.read_hash(&self.overrides_key()).await?;
                Ok(fields
                    .iter()
                    .filter_map(|(field, value)| RateOverride::parse(field, value))
                    .collect())
            }
            crate::backend::Backend::Memory(_) => Ok(self.overrides().table().list()),
        }
    }

    /// Sets an override for every process using this Redis and prefix (and at once
    /// for this client): rules of the attribute and the layer decide with `rate` per
    /// `interval` instead of their own.
    ///
    /// The override is checked first against every rule of this process it reaches,
    /// with the rule's own checks (a rate below the permits the rule takes per call, a
    /// token bucket whose counts would not fit): an override a rule cannot take is
    /// refused with the reason, and nothing is written.
    pub async fn set_override(&self, override_: &RateOverride) -> Result<(), Error> {
        override_.check()?;
        if let OverrideOf::Rule(rule) = &override_.of {
            // this process's rules, and those every process using this Redis published
            let published = match self.backend() {
                crate::backend::Backend::Redis(redis) => redis
                    .read_hash(&self.rules_key())
                    .await?
                    .into_iter()
                    .map(|(field, _)| field)
                    .collect(),
                crate::backend::Backend::Memory(_) => Vec::new(),
            };
            crate::rules::registry::check_override(
                &override_.of.field(),
                rule,
                override_.rate,
                override_.interval,
                &published,
            )?;
        }
        if let crate::backend::Backend::Redis(redis) = self.backend() {
            redis
                .write_hash(
                    &self.overrides_key(),
                    &override_.of.field(),
                    Some(&override_.value()),
                )
                .await?;
        }
        let mut list = self.overrides().table().list();
        list.retain(|o| o.of != override_.of);
        list.push(override_.clone());
        self.overrides().replace(Table::from_list(&list));
        Ok(())
    }

    /// Removes an override; the rule's own rate applies again. False when there was
    /// none.
    pub async fn remove_override(&self, of: &OverrideOf) -> Result<bool, Error> {
        let mut list = self.overrides().table().list();
        let had = list.iter().any(|o| &o.of == of);
        list.retain(|o| &o.of != of);
        let removed = match self.backend() {
            crate::backend::Backend::Redis(redis) => {
                redis.write_hash(&self.overrides_key(), &of.field(), None).await?
            }
            crate::backend::Backend::Memory(_) => had,
        };
        self.overrides().replace(Table::from_list(&list));
        Ok(removed)
    }

    /// Every override set, rules first, by name. Entries of the hash that do not
    /// parse are left out.
    pub async fn list_overrides(&self) -> Result<Vec<RateOverride>, Error> {
        let mut list = self.read_overrides().await?;
        list.sort_by(|a, b| a.of.cmp(&b.of));
        Ok(list)
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
