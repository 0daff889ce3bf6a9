//! What a Redis client keeps in process because the state is remote, and the decision
//! on Redis that goes through it: a refusal Redis gave, answered again until its wait
//! is over ([`refusals`]), and permits taken in batches, served until their lease ends
//! ([`batches`]). A call one of them answers needs no round trip; any other is one
//! script call.

use std::sync::Arc;

use super::RedisBackend;
use crate::backend::decisions::{merged_calls, merged_decision, one_rule_decision};
use crate::backend::RuleCall;
use crate::{Decision, Error, Rule};

pub(crate) mod batches;
pub(crate) mod refusals;

/// A Redis client's refusals and batches.
pub(crate) struct Kept {
    refusals: refusals::RefusalCache,
    batches: batches::Batches,
}

impl Kept {
    /// `local_refusals`: whether refusals are kept at all.
    pub(crate) fn new(local_refusals: bool) -> Self {
        Kept {
            refusals: refusals::RefusalCache::new(local_refusals),
            batches: batches::Batches::new(true),
        }
    }
}

impl RedisBackend {
    /// A call of one rule answered from what this client keeps, at `now`: granted
    /// from an open batch, or refused again as Redis refused it.
    /// Such a call sends nothing: the task it needs (the sweeper of its batch, the
    /// background task that ends kept refusals) is started again here when it ran on a
    /// runtime that ended, or is not driven.
    pub(crate) fn answered_here(self: &Arc<Self>, rules: &[Rule], now: u64) -> Option<Decision> {
        let [rule] = rules else { return None };
        let permits = rule.permits_per_call().min(rule.most_permits());
        if rule.batch_size() > 1 {
            if let Some(served) = self.serve_batched(rule, permits) {
                self.start_sweeper();
                return Some(served);
            }
        }
        let refused = self.kept.refusals.answer(rule, permits, now)?;
        self.start_background();
        Some(refused)
    }

    /// `Client::check_rules` on Redis, at `now`, for a call not answered here.
    pub(crate) async fn check_rules(self: &Arc<Self>, rules: &[Rule], now: u64) -> Result<Decision, Error> {
        if let [rule] = rules {
            return self.check_rule(rule, now).await;
        }
        crate::rules::rule::check_rule_count(rules)?;
        let keys = rules
            .iter()
            .map(|rule| self.rule_keys(rule))
            .collect::<Result<Vec<_>, Error>>()?;
        let merged = crate::rules::rule::merge(rules)?;
        let calls = merged_calls(rules, &keys, &merged);
        let outcome = crate::backend::redis_acquire(self, &calls, now).await?;
        let decision = merged_decision(rules, &merged, &outcome, || self.now_ms());
        // Refusals kept of them dropped on a grant.
        if decision.allowed {
            for rule in rules {
                self.kept.refusals.forget_rule(rule);
            }
        }
        Ok(decision)
    }

    /// [`check_rules`](RedisBackend::check_rules) of one rule, not answered from the
    /// refusals kept: nothing to merge, nothing to collect.
    async fn check_rule(self: &Arc<Self>, rule: &Rule, now: u64) -> Result<Decision, Error> {
        let permits = rule.permits_per_call().min(rule.most_permits());
        let mut now = now;
        if rule.batch_size() > 1 {
            // Boxed: taking a batch holds a lock and two round trips' state, which
            // every decision's future would otherwise carry.
            if let Some(decided) = Box::pin(self.check_batched(rule, permits)).await {
                return decided;
            }
            now = self.now_ms();
        }
        let keys = self.rule_keys(rule)?;
        let calls = [RuleCall {
            keys,
            permits,
            rule: Some(rule.config()),
            bucket: rule.shape(),
            reserved: None,
        }];
        let outcome = crate::backend::redis_acquire(self, &calls, now).await?;
        let decision = one_rule_decision(rule, &outcome, || self.now_ms());
        self.keep_refusal(rule, permits, &decision, now);
        Ok(decision)
    }

    /// Keeps `decision` of `permits` of `rule` at `now` when it is a refusal this
    /// client can answer again.
    fn keep_refusal(self: &Arc<Self>, rule: &Rule, permits: u64, decision: &Decision, now: u64) {
        if self.kept.refusals.note(rule, permits, decision, now) {
            // Kept refusals end when their limiter is reset anywhere: announcements
            // are read in the background.
            self.start_background();
        }
    }

    /// Drops the refusal this client keeps of the limiter `name`, if any: it changed.
    pub(crate) fn forget_refusal(&self, name: &str) {
        self.kept.refusals.forget(name);
    }

    /// Drops every refusal this client keeps.
    pub(crate) fn forget_every_refusal(&self) {
        self.kept.refusals.forget_all();
    }
}
