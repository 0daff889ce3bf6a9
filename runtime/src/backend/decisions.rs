//! From rules to calls and from an outcome back to the decision a caller sees, the
//! same on either backend: one call per distinct limiter of several rules, one rule's
//! decision with a change of its stored config logged, several rules' decision
//! numbered as their callers number them.

use crate::backend::{ConfigChange, Outcome, RuleCall, RuleOutcome};
use crate::keys::Keys;
use crate::rules::config_log;
use crate::rules::rule::Merged;
use crate::{Decision, Rule};

/// One call per distinct limiter of `rules` ([`Merged`]).
pub(crate) fn merged_calls<'r>(rules: &'r [Rule], keys: &[Keys<'r>], merged: &[Merged]) -> MergedCalls<'r> {
    merged
        .iter()
        .map(|m| RuleCall {
            keys: keys[m.first],
            permits: m.permits,
            rule: Some(rules[m.config].config()),
            bucket: rules[m.config].shape(),
            reserved: None,
        })
        .collect()
}

/// A decision's calls, inline for a few.
pub(crate) type MergedCalls<'r> = smallvec::SmallVec<[RuleCall<'r>; 4]>;

/// The decision of `rule` alone from its outcome, a change of its stored config
/// logged at the time `now` reads.
pub(crate) fn one_rule_decision(rule: &Rule, outcome: &Outcome, now: impl Fn() -> u64) -> Decision {
    if let Some(RuleOutcome {
        config: ConfigChange::Changed(previous),
        ..
    }) = outcome.rules.first()
    {
        config_log::changed(rule, previous, now());
    }
    outcome.decision()
}

/// The decision of several rules, as their callers number them, from the outcome of
/// their merged calls: config changes logged at the time `now` reads.
pub(crate) fn merged_decision(
    rules: &[Rule],
    merged: &[Merged],
    outcome: &Outcome,
    now: impl Fn() -> u64,
) -> Decision {
    for (m, rule) in merged.iter().zip(&outcome.rules) {
        if let ConfigChange::Changed(previous) = &rule.config {
            let rule = &rules[m.config];
            config_log::changed(rule, previous, now());
        }
    }
    let mut decision = outcome.decision();
    decision.refused_by = decision.refused_by.map(|i| merged[i].first);
    decision.tightest = decision.tightest.map(|i| merged[i].first);
    decision
}
