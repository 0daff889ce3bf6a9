//! Phase 1 of a decision, `load_rule` (`load_tokens` for a token bucket), as
//! `lua/acquire.lua` takes it: each call's config resolved (the rule's own or the
//! stored one, and what happens to it), and the newest grant or refill among them,
//! for `settle_time`.

use super::state::{Store, Tokens};
use super::Locked;
use crate::algorithm::bucket::Plan;
use crate::backend::{ConfigChange, RuleCall};
use crate::{Error, RateLimiterConfig};

/// One call's resolved config, what happened to it, and its plan.
pub(super) struct Resolved {
    pub(super) config: RateLimiterConfig,
    pub(super) change: ConfigChange,
    pub(super) mode_changed: bool,
    pub(super) plan: usize,
    /// The limiter name's hash in its shard's table, computed once.
    pub(super) hash: u64,
    /// A token-bucket call: its stored state (phase 1), then its plan (phase 2).
    pub(super) stored_tokens: Option<Tokens>,
    pub(super) tokens: Option<Plan>,
}

/// Phase 1, load_rule, for every call: its config resolved, and the newest grant (or
/// refill) among them, at least `clock_now`.
pub(super) fn load_rules(
    locked: &mut Locked<'_>,
    calls: &[RuleCall<'_>],
    hashes: &[u64],
    clock_now: u64,
) -> Result<(Vec<Resolved>, u64), Error> {
    let mut resolved = Vec::with_capacity(calls.len());
    let mut newest = clock_now;
    for (call, &hash) in calls.iter().zip(hashes) {
        let store = locked.store(hash);
        let r = match (call.bucket, call.rule) {
            (Some(_), Some(rule)) => load_tokens(store, call, rule, hash, clock_now, &mut newest),
            _ => load_rule(store, call, hash, clock_now, &mut newest)?,
        };
        resolved.push(r);
    }
    Ok((resolved, newest))
}

/// load_tokens: a token bucket's state now; its plan once the time is settled.
pub(super) fn load_tokens(
    store: &mut Store,
    call: &RuleCall<'_>,
    rule: &RateLimiterConfig,
    hash: u64,
    clock_now: u64,
    newest: &mut u64,
) -> Resolved {
    let limiter = store.limiters.get_hashed(hash, call.keys.config());
    let shape = call.bucket.expect("a token-bucket call");
    let stored = limiter.and_then(|l| {
        l.tokens_or_recalled(rule, shape.burst, shape.warmup_ms, clock_now)
            .copied()
    });
    if let Some(stored) = stored {
        *newest = (*newest).max(stored.state.at);
    }
    Resolved {
        config: *rule,
        change: ConfigChange::Kept,
        mode_changed: false,
        plan: usize::MAX,
        hash,
        stored_tokens: stored,
        tokens: None,
    }
}

/// load_rule: a sliding-window call's config (the rule's own, or the stored one) and
/// what happens to it, and its bucket's newest grant.
pub(super) fn load_rule(
    store: &mut Store,
    call: &RuleCall<'_>,
    hash: u64,
    clock_now: u64,
    newest: &mut u64,
) -> Result<Resolved, Error> {
    let name = call.keys.config();
    let mut limiter = store.limiters.get_hashed(hash, name);
    let stored = limiter.as_mut().and_then(|l| l.live_config(clock_now));
    let (config, change) = match (call.rule, stored) {
        (Some(rule), Some(old)) if *rule == old => (old, ConfigChange::Kept),
        (Some(rule), Some(old)) => (*rule, ConfigChange::Changed(old)),
        (Some(rule), None) => (*rule, ConfigChange::Created),
        (None, Some(old)) => (old, ConfigChange::Kept),
        (None, None) => {
            return Err(Error::NotInitialized {
                name: name.to_owned(),
            })
        }
    };
    crate::rules::fit::within_rate(name, call.permits, config.rate)?;
    if let Some(score) = limiter.and_then(|l| l.bucket(config.rate_type, clock_now)?.newest()) {
        *newest = (*newest).max(score);
    }
    let mode_changed = matches!(change, ConfigChange::Changed(old) if old.rate_type != config.rate_type);
    Ok(Resolved {
        config,
        change,
        mode_changed,
        plan: 0,
        hash,
        stored_tokens: None,
        tokens: None,
    })
}
