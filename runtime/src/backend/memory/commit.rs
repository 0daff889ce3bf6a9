//! Phase 3 of a decision, `commit`, as `lua/acquire.lua` takes it: the writes, once
//! every rule is planned (a call that only asks what is available writes nothing):
//! each token bucket stored, each sliding-window bucket settled, each grant logged,
//! and Redisson's TTL rule.

use super::load::Resolved;
use super::plan::BucketPlan;
use super::state::{slot, Limiter, Tokens};
use super::Locked;
use crate::algorithm::bucket::Plan;
use crate::algorithm::segments::{room_of, Segments};
use crate::algorithm::ttl;
use crate::backend::{ConfigChange, RuleCall};
use crate::RateType;

/// What phases 1 and 2 decided, for phase 3, commit: the writes `acquire.lua` makes.
pub(super) struct Decided<'a> {
    pub(super) resolved: &'a [Resolved],
    pub(super) plans: &'a [BucketPlan],
    pub(super) granted: bool,
    /// The time the call is decided at (a later grant's, when overtaken).
    pub(super) now: u64,
    /// The client's clock, for finding what has expired.
    pub(super) clock_now: u64,
}

pub(super) fn commit(locked: &mut Locked<'_>, calls: &[RuleCall<'_>], decided: &Decided<'_>) {
    for (i, (call, r)) in calls.iter().zip(decided.resolved).enumerate() {
        let name = call.keys.config();
        let store = locked.store(r.hash);
        if let Some(tokens) = &r.tokens {
            // A token bucket stores its refilled state, less what a grant took; the
            // refusal of a lone call without a warm-up on a bucket held with its config
            // writes nothing, as tokens_one.lua, which Redis runs for it.
            let taken = if decided.granted { call.permits } else { 0 };
            let (units, cold) = tokens.take_tokens(taken);
            if decided.granted || calls.len() > 1 || tokens.warmup > 0 || r.change != ConfigChange::Kept {
                let limiter = store.limiters.get_or_insert(r.hash, name);
                let kind = r.config.rate_type;
                if r.change != ConfigChange::Kept {
                    // made, or its config changed: no pending reservation's settle
                    // gives back into it
                    limiter.drop_segments(slot(kind));
                }
                let opened = call
                    .reserved
                    .filter(|_| taken > 0)
                    .map(|id| (decided.now, units, id));
                if opened.is_some() || limiter.segments(kind).is_some() {
                    keep_segments_of(limiter, kind, tokens, taken, opened);
                }
                limiter.set_tokens(kind, Tokens::stored(tokens, units, cold));
            }
            continue;
        }
        // A kept config means the limiter exists: one lookup, no insertion.
        let limiter = match r.change {
            ConfigChange::Kept => store.limiters.get_hashed(r.hash, name).expect("found in phase 1"),
            _ => store.limiters.get_or_insert(r.hash, name),
        };
        if r.change != ConfigChange::Kept {
            limiter.config = Some(r.config);
        }
        commit_window(limiter, i, call, r, decided);
    }
}

/// [`keep_segments`] on the segments of `limiter`'s token bucket of `kind` (made when
/// none is pending), dropped when none is left pending: the phases' commit and the
/// usual call of several rules keep them alike.
#[inline(never)]
pub(super) fn keep_segments_of(
    limiter: &mut Limiter,
    kind: RateType,
    plan: &Plan,
    taken: u64,
    opened: Option<(u64, i64, u64)>,
) {
    keep_segments(limiter.segments_or_new(kind), plan, taken, opened);
    limiter.drop_empty_segments(slot(kind));
}

/// A token bucket's pending reservations' segments when a call writes it, as
/// lib/bucket.lua's take_tokens, open_segment and store_tokens keep them: a take's
/// peak (the room just before it) in the last; a reservation's grant's segment
/// `opened` at its time with the units it left, under its id; those older than an
/// empty bucket takes to fill dropped.
fn keep_segments(segments: &mut Segments, plan: &Plan, taken: u64, opened: Option<(u64, i64, u64)>) {
    let capacity = plan.burst * plan.interval;
    if taken > 0 {
        segments.peak(room_of(capacity, plan.units));
    }
    if let Some((at, units, id)) = opened {
        segments.open(at, room_of(capacity, units), id);
    }
    segments.prune(plan.at, capacity.div_ceil(plan.rate));
}

/// A sliding-window call's writes: its bucket settled (by the first call that
/// planned it), its grant logged, and Redisson's TTL rule.
pub(super) fn commit_window(
    limiter: &mut Limiter,
    i: usize,
    call: &RuleCall<'_>,
    r: &Resolved,
    decided: &Decided<'_>,
) {
    let Decided {
        plans,
        granted,
        now,
        clock_now,
        ..
    } = *decided;
    let plan = &plans[r.plan];
    let kind = r.config.rate_type;
    if plan.call == i {
        if plan.clear {
            // A change of mode deletes both modes' state, as acquire.lua.
            limiter.remove_bucket(RateType::Overall);
            limiter.remove_bucket(RateType::PerClient);
        } else if let Some(bucket) = limiter.bucket(kind, clock_now) {
            let (skip, released) = bucket.stale(plan.cutoff);
            bucket.remove_first(skip, released);
        }
        if granted || plan.dirty {
            let value = if granted {
                plan.value - plan.spent
            } else {
                plan.value
            };
            limiter.bucket_or_default(kind).value = Some(value);
        }
    }
    if granted {
        let bucket = limiter.bucket_or_default(kind);
        bucket.push(now, call.permits as u32);
    }
    ttl_rule(limiter, kind, r.config.keep_alive_ms(), now, clock_now);
}

/// Redisson's TTL rule ([`ttl::ttl_rule`]) on a limiter's config and its bucket of
/// `kind`.
#[inline]
pub(super) fn ttl_rule(limiter: &mut Limiter, kind: RateType, keep: u64, now: u64, clock_now: u64) {
    let expires = ttl::ttl_rule(keep, &mut limiter.config_expires, now, clock_now);
    if let (Some(expires), Some(bucket)) = (expires, limiter.bucket(kind, clock_now)) {
        bucket.expires = Some(expires);
    }
}

/// [`ttl_rule`] on a bucket read live at `clock_now` by this decision (the usual
/// call's): found again without looking at its expiry.
#[inline]
pub(super) fn ttl_rule_live(limiter: &mut Limiter, kind: RateType, keep: u64, now: u64, clock_now: u64) {
    let expires = ttl::ttl_rule(keep, &mut limiter.config_expires, now, clock_now);
    if let (Some(expires), Some(bucket)) = (expires, limiter.buckets[slot(kind)].as_mut()) {
        bucket.expires = Some(expires);
    }
}
