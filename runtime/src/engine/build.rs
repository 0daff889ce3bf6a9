//! A call's rules: each rule's limiter for the call's key, at the rate and window of
//! an override where one applies.

use std::time::Duration;

use super::call::{CallKeys, Written};
use super::Engine;
use crate::rules::overrides::Table;
use crate::{Client, Rule, RuleSpec};

impl Engine {
    /// Every rule's limiter for this call (rules that do not apply included, with the
    /// permits 0 they never spend), at the overridden rate and interval where the
    /// client has an override for the limiter or its rule.
    pub(super) fn build_rules<C: FromIterator<Rule>>(
        &self,
        prefix: &str,
        call: &mut CallKeys<'_>,
        overrides: Option<(&Client, &Table)>,
    ) -> C {
        let (permits, written) = (call.permits, call.written);
        // One per rule (keys beyond the rules are not any rule's).
        self.rules
            .iter()
            .zip(call.keys.iter_mut())
            .enumerate()
            .map(|(i, (_, key))| self.build_rule(i, prefix, key, permits, overrides, written))
            .collect()
    }

    /// Rule `i`'s limiter for this call's `key`, which becomes its name: no second
    /// string (a key built for the call has room for the prefix, or starts with it:
    /// see [`Written`]).
    #[inline]
    pub(super) fn build_rule(
        &self,
        i: usize,
        prefix: &str,
        key: &mut String,
        permits: Option<&[u64]>,
        overrides: Option<(&Client, &Table)>,
        written: Written,
    ) -> Rule {
        let spec = &self.rules[i];
        let mut name = std::mem::take(key);
        if written == Written::Layer {
            debug_assert!(name.starts_with(prefix), "{name} lacks the prefix {prefix}");
        } else {
            name.insert_str(0, prefix);
        }
        let (rate, interval) = match overrides.filter(|(_, table)| !table.is_empty()) {
            Some((client, table)) => rate_of(spec, &name, client, table),
            None => (spec.rate, spec.interval),
        };
        let permits = permits.map_or(spec.permits, |p| p[i]);
        let rule = spec.rule(name, permits, rate, interval);
        if (rate, interval) != (spec.rate, spec.interval) {
            rule.mark_overridden();
        } else if self.specs_checked()[i] && permits == spec.permits {
            if written != Written::ByCaller && self.escaped_names_pass(i, prefix) {
                debug_assert!(
                    crate::keys::check_name(rule.name()).is_ok()
                        && crate::keys::library_key(prefix, rule.name()).is_none(),
                    "{} is not a name a layer writes",
                    rule.name()
                );
                rule.mark_checked();
            } else {
                rule.mark_settings_checked();
            }
        }
        rule
    }

    /// Whether rule `i`'s escaped limiters under `prefix` pass every check of a name
    /// (`rules::checks::escaped_names_pass`), worked out for the first prefix asked
    /// about; `false` under any other.
    fn escaped_names_pass(&self, i: usize, prefix: &str) -> bool {
        let (first, pass) = self.escaped_names.get_or_init(|| {
            let pass = self
                .rules
                .iter()
                .map(|spec| crate::rules::checks::escaped_names_pass(prefix, &spec.name))
                .collect();
            (prefix.into(), pass)
        });
        pass[i] && **first == *prefix
    }

    /// Whether each rule's settings at its own rate, window and permits pass a client's
    /// checks (see `Engine::checked`).
    fn specs_checked(&self) -> &[bool] {
        self.checked.get_or_init(|| {
            self.rules
                .iter()
                .map(|spec| {
                    let rule = spec.rule(String::new(), spec.permits, spec.rate, spec.interval);
                    crate::rules::checks::check_settings(&rule).is_ok()
                })
                .collect()
        })
    }

    /// Rule `i`'s limit as decided: its name, and its rate and window after overrides.
    pub(super) fn limit_of(&self, i: usize, rule: Option<&Rule>) -> crate::Limit {
        let mut limit = self.rules[i].limit();
        if let Some(rule) = rule {
            limit.rate = rule.config().rate;
            limit.window = rule.config().interval;
        }
        limit
    }
}

/// The rate and window of `spec` for the limiter `name`: an override's, or the rule's
/// own. An override the rule cannot take (set by hand in Redis) is ignored, with a
/// warning: the rule's own rate applies, never an error.
fn rate_of(spec: &RuleSpec, name: &str, client: &Client, table: &Table) -> (u64, Duration) {
    let Some((rate, interval)) = table.lookup(&spec.name, name) else {
        return (spec.rate, spec.interval);
    };
    match crate::rules::registry::fits(&spec.name, spec.permits, spec.bucket, rate, interval) {
        Ok(()) => (rate, interval),
        Err(error) => {
            client
                .overrides()
                .warn_unusable(&spec.name, &error, client.now_ms());
            (spec.rate, spec.interval)
        }
    }
}
