//! A call's rules: each rule's limiter for the call's key, at the rate and window of
//! an override where one applies.

use std::time::Duration;

use super::call::CallKeys;
use super::Engine;
use crate::rules::overrides::Table;
use crate::{Client, Rule, RuleSpec};

impl Engine {
    /// Every rule's limiter for this call (rules that do not apply included, with the
    /// permits 0 they never spend), at the overridden rate and interval where the
    /// client has an override for the limiter or its rule.
    pub(super) fn build_rules(
        &self,
        prefix: &str,
        call: &CallKeys<'_>,
        overrides: Option<(&Client, &Table)>,
    ) -> Vec<Rule> {
        let overrides = overrides.filter(|(_, table)| !table.is_empty());
        self.rules
            .iter()
            .zip(call.keys)
            .enumerate()
            .map(|(i, (spec, key))| {
                let mut name = String::with_capacity(prefix.len() + key.len());
                name.push_str(prefix);
                name.push_str(key);
                let (rate, interval) = match overrides {
                    Some((client, table)) => rate_of(spec, &name, client, table),
                    None => (spec.rate, spec.interval),
                };
                spec.rule(name, call.permits(i, spec), rate, interval)
            })
            .collect()
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
