//! Phase 2 of a decision, as `lua/acquire.lua` takes it: `plan_bucket` (each
//! sliding-window bucket once: what left the window, the value it starts from),
//! `plan_tokens` for a token bucket, and `take` (each call's permits, or the wait
//! until it could have them), writing nothing. The bucket plans Lua keeps in the table
//! of the first rule naming a bucket are this file's `BucketPlan`s; `state.rs`'s
//! `Bucket` is the stored state (the value and log keys).

use super::load::Resolved;
use super::state::Bucket;
use super::Locked;
use crate::algorithm::{bucket, window};
use crate::backend::{ConfigChange, RuleCall};
use crate::{RateLimiterConfig, RateType};

/// What a decision does to one bucket, computed before anything is written
/// (acquire.lua's `b`).
pub(super) struct BucketPlan {
    /// The first call on this bucket: its limiter name and config.
    pub(super) call: usize,
    pub(super) kind: RateType,
    pub(super) cutoff: i64,
    pub(super) live: i64,
    pub(super) value: i64,
    pub(super) skip: usize,
    pub(super) spent: i64,
    pub(super) dirty: bool,
    pub(super) clear: bool,
}

/// Phase 2 for every call at `now`: token buckets planned, each sliding-window bucket
/// planned once (plan_bucket) and each call's permits taken from it (take). Answers
/// the plans, the first refusing call and the longest wait.
pub(super) fn plan_and_take(
    locked: &mut Locked<'_>,
    calls: &[RuleCall<'_>],
    resolved: &mut [Resolved],
    now: u64,
    clock_now: u64,
) -> (Vec<BucketPlan>, Option<usize>, i64) {
    let mut plans: Vec<BucketPlan> = Vec::with_capacity(calls.len());
    let (mut refused, mut retry) = (None, 0i64);
    for i in 0..calls.len() {
        let wait = match calls[i].bucket {
            Some(shape) => plan_tokens(&mut resolved[i], &calls[i], shape, now),
            None => {
                let (name, kind) = (calls[i].keys.config(), resolved[i].config.rate_type);
                let existing = plans
                    .iter()
                    .position(|p| p.kind == kind && calls[p.call].keys.config() == name);
                let hash = resolved[i].hash;
                let mut limiter = locked.store(hash).limiters.get_hashed(hash, name);
                let bucket = limiter.as_mut().and_then(|l| l.bucket(kind, clock_now));
                let at = existing.unwrap_or_else(|| {
                    plans.push(plan_bucket(i, bucket.as_deref(), &resolved[i], now as i64));
                    plans.len() - 1
                });
                resolved[i].plan = at;
                take(
                    &mut plans[at],
                    bucket.as_deref(),
                    &calls[i],
                    &resolved[i].config,
                    now as i64,
                )
            }
        };
        if let Some(wait) = wait {
            refused.get_or_insert(i);
            retry = retry.max(wait);
        }
    }
    (plans, refused, retry)
}

/// plan_tokens: a token bucket at `now`, and what happens to its config; the wait
/// when it has too few tokens.
pub(super) fn plan_tokens(
    r: &mut Resolved,
    call: &RuleCall<'_>,
    shape: crate::BucketShape,
    now: u64,
) -> Option<i64> {
    let config = r.config;
    let (plan, old) = bucket::plan_tokens(
        config.rate,
        config.interval_ms(),
        shape.burst,
        shape.warmup_ms,
        r.stored_tokens.as_ref().map(|t| &t.state),
        now,
    );
    r.change = match (&r.stored_tokens, old) {
        (None, _) => ConfigChange::Created,
        (Some(_), Some(old)) => ConfigChange::Changed(RateLimiterConfig {
            rate: old.rate,
            interval: std::time::Duration::from_millis(old.interval),
            ..config
        }),
        (Some(_), None) => ConfigChange::Kept,
    };
    let wait = plan.wait(call.permits);
    r.tokens = Some(plan);
    wait.map(|wait| wait as i64)
}

/// take: a call's permits from its bucket's plan; the wait when the bucket has too
/// few (the exact wait until the log releases them).
pub(super) fn take(
    plan: &mut BucketPlan,
    bucket: Option<&Bucket>,
    call: &RuleCall<'_>,
    config: &RateLimiterConfig,
    now: i64,
) -> Option<i64> {
    if call.permits == 0 {
        return None;
    }
    let (permits, rate) = (call.permits as i64, config.rate as i64);
    let interval = config.interval_ms() as i64;
    let mut wait = None;
    if let Some(need) = window::lacking(plan.value, plan.spent, permits).filter(|_| !plan.clear) {
        let empty = Bucket::default();
        let bucket = bucket.unwrap_or(&empty);
        wait = bucket.wait_for(plan.skip, need, interval, now, plan.spent);
        if wait.is_none() {
            // Value and log disagree (permits lost): the log is the authority.
            plan.value = rate - plan.live;
            plan.dirty = true;
            if let Some(need) = window::lacking(plan.value, plan.spent, permits) {
                let again = bucket.wait_for(plan.skip, need, interval, now, plan.spent);
                wait = Some(again.unwrap_or(interval));
            }
        }
    }
    plan.spent += permits;
    wait
}

/// Plans one bucket: release what left the window, rebuild a lost value from the log.
pub(super) fn plan_bucket(call: usize, bucket: Option<&Bucket>, resolved: &Resolved, now: i64) -> BucketPlan {
    let config = &resolved.config;
    let rate = config.rate as i64;
    let cutoff = now - config.interval_ms() as i64;
    let mut plan = BucketPlan {
        call,
        kind: config.rate_type,
        cutoff,
        live: 0,
        value: rate,
        skip: 0,
        spent: 0,
        dirty: true,
        clear: resolved.mode_changed,
    };
    if resolved.mode_changed {
        return plan;
    }
    let Some(bucket) = bucket else { return plan };
    let (skip, released) = bucket.stale(cutoff);
    plan.skip = skip;
    plan.live = (bucket.total - released) as i64;
    let changed = matches!(resolved.change, ConfigChange::Changed(_));
    (plan.value, plan.dirty) = window::plan_value(bucket.value, changed, released, plan.live, rate);
    plan
}
