//! The usual calls, decided without the phases' lists: the twin of
//! `lua/acquire_plain.lua` for one sliding-window rule (read config, load_rule,
//! settle_time, plan_bucket, take, commit, reply), of `lua/tokens_one.lua` for one
//! token bucket (load_tokens, settle_time, plan_tokens, take, commit, reply), and of
//! `lua/acquire.lua`'s phases for several rules on limiters held with their rules'
//! configs (each step for every rule before the next). Each answers `None`, before anything is written, for every case it
//! does not cover; `decide.rs` then decides the call by the phases.

use super::commit::{keep_segments_of, ttl_rule_live};
use super::name::same_name;
use super::state::{slot, Limiter, Store, Tokens};
use super::Locked;
use crate::algorithm::bucket::Plan;
use crate::algorithm::call_time::settle_time;
use crate::algorithm::window;
use crate::backend::{ConfigChange, Outcome, RuleCall, RuleOutcome};

/// The decision of one rule: the usual call's, made in place, or one made through
/// the phases.
pub(crate) enum RuleDecision {
    Usual(Usual),
    Phased(Outcome),
}

/// What the usual call of one rule decided (its config kept, as stored): all a
/// caller's [`Decision`](crate::Decision) says.
pub(crate) struct Usual {
    pub granted: bool,
    pub retry_ms: u64,
    pub at_ms: u64,
    pub left: u64,
}

impl Usual {
    pub fn decision(&self) -> crate::Decision {
        crate::Decision {
            allowed: self.granted,
            remaining: self.left,
            retry_after: (!self.granted).then(|| std::time::Duration::from_millis(self.retry_ms)),
            refused_by: (!self.granted).then_some(0),
            at_ms: self.at_ms,
            tightest: Some(0),
        }
    }

    pub(super) fn outcome(&self) -> Outcome {
        Outcome {
            granted: self.granted,
            refused: (!self.granted).then_some(0),
            retry_ms: self.retry_ms,
            at_ms: self.at_ms,
            rules: smallvec::smallvec![RuleOutcome {
                left: self.left,
                config: ConfigChange::Kept,
            }],
        }
    }
}

/// acquire_plain.lua's twin for one rule, in its order: read config, load_rule,
/// settle_time, plan_bucket, take, commit, reply. One sliding-window rule whose
/// stored config is its own, with a value and no change of mode, decided without the
/// phases' lists; an idle limiter (every part expired) is first made live in place, as
/// the phases would make it. `None`, before anything is written, for every other case
/// (a config to create or change, no stored value or a value inflated by hand, a log
/// short of the wait): `decide.rs` then decides the call from the start.
#[inline(always)]
pub(super) fn decide_one(
    store: &mut Store,
    call: &RuleCall<'_>,
    hash: u64,
    window_ms: Option<(u64, u64)>,
    clock_now: u64,
) -> Option<Usual> {
    // read config: the rule's own, stored
    let rule = call
        .rule
        .filter(|r| call.bucket.is_none() && call.permits <= r.rate)?;
    let limiter = store
        .limiters
        .get_with(hash, |(n, _)| same_name(n, call.keys.config()))?;
    // (compared where it is held: a config is seven words)
    if limiter.live_config_ref(clock_now).is_none() {
        // an idle limiter (every part expired) is a missing one: made live in place
        // (a call asking what is available writes nothing: the phases answer it)
        if call.permits == 0 || !limiter.revive_window(rule, clock_now) {
            return None;
        }
    } else if limiter.config.as_ref() != Some(rule) {
        return None;
    }
    let bucket = limiter.bucket(rule.rate_type, clock_now)?;
    let value = bucket.value?;
    // load_rule: the newest grant, when newer than this call's time
    let logged = bucket.newest();
    let now = settle_time(logged.unwrap_or(clock_now).max(clock_now), clock_now);
    let (interval, keep_alive) = window_ms.unwrap_or_else(|| (rule.interval_ms(), rule.keep_alive_ms()));
    let (permits, rate, interval) = (call.permits as i64, rule.rate as i64, interval as i64);
    // plan_bucket: the value, plus what left the window
    let (skip, released) = bucket.stale(now as i64 - interval);
    let mut value = window::plain_value(value, released, rate)?;
    // take: enough permits, or the exact wait until the log releases them
    let mut wait = 0;
    if permits > 0 {
        if let Some(need) = window::lacking(value, 0, permits) {
            wait = bucket.wait_for(skip, need, interval, now as i64, 0)?;
        }
    }
    let granted = wait == 0;
    // commit (a call asking what is available writes nothing)
    if permits > 0 {
        bucket.remove_first(skip, released);
        if granted {
            value -= permits;
            // (entries were dropped from the front only: the newest is as read)
            bucket.push_after(logged, now, call.permits as u32);
        }
        if granted || released > 0 {
            bucket.value = Some(value);
        }
        ttl_rule_live(limiter, rule.rate_type, keep_alive, now, clock_now);
    }
    // reply
    Some(Usual {
        granted,
        retry_ms: wait.max(0) as u64,
        at_ms: now,
        left: value.max(0) as u64,
    })
}

/// tokens_one.lua's twin: one token-bucket rule whose bucket is held with the rule's
/// config: load_tokens, settle_time, plan_tokens, take, commit, reply, in place and
/// without lists; a bucket missing or full again is read full and cold, as the phases
/// read it. `None`, before anything is written, when the limiter is missing, a
/// recalled bucket waits for its config or the config differs: `decide.rs` then
/// decides the call from the start (it creates the limiter, or reports the change).
#[inline(always)]
pub(super) fn decide_tokens_one(
    store: &mut Store,
    call: &RuleCall<'_>,
    shape: crate::BucketShape,
    hash: u64,
    window_ms: Option<(u64, u64)>,
    clock_now: u64,
) -> Option<Usual> {
    let rule = call.rule?;
    let limiter = store
        .limiters
        .get_with(hash, |(n, _)| same_name(n, call.keys.config()))?;
    // (a bucket with reservations pending, or a reservation's grant: the phases, which
    // read and write its segments, as tokens.lua does: tokens_one.lua leaves both)
    if limiter.segments.is_some() || call.reserved.is_some() {
        return None;
    }
    // load_tokens, settle_time
    let stored = if call.permits > 0 {
        limiter.tokens_or_full(rule, shape.burst, shape.warmup_ms, clock_now)?
    } else {
        limiter.tokens(rule.rate_type, clock_now)?
    };
    let now = settle_time(stored.state.at.max(clock_now), clock_now);
    // plan_tokens: a bucket held with this rule's config, refilled
    let (rate, interval) = (
        rule.rate,
        window_ms.map_or_else(|| rule.interval_ms(), |(ms, _)| ms),
    );
    if !stored.state.holds(rate, interval, shape.burst, shape.warmup_ms) {
        return None;
    }
    let plan = Plan::refilled(&stored.state, now);
    // take: enough tokens, or the exact wait until there are
    let wait = plan.wait(call.permits);
    let taken = if wait.is_none() { call.permits } else { 0 };
    let (units, cold) = plan.take_tokens(taken);
    // commit (a call asking what is available writes nothing), in place; a refusal
    // writes nothing without a warm-up, as tokens_one.lua, and the refill with one, as
    // tokens.lua's phases, which Redis runs then
    if call.permits > 0 && (wait.is_none() || shape.warmup_ms > 0) {
        *stored = Tokens::stored(&plan, units, cold);
    }
    // reply
    Some(Usual {
        granted: wait.is_none(),
        retry_ms: wait.unwrap_or(0),
        at_ms: now,
        left: plan.whole(units),
    })
}

#[cfg(test)]
thread_local! {
    /// Calls of several rules this thread decided on their usual path.
    pub(super) static SEVERAL: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// What the usual call of several rules found of one rule's limiter before writing: a
/// sliding window's newest grant, what left the window and the value, or a token
/// bucket's plan; and the wait.
#[derive(Clone, Copy, Default)]
struct Step {
    logged: Option<u64>,
    skip: usize,
    released: u64,
    value: i64,
    tokens: Option<Plan>,
    wait: Option<i64>,
}

/// The usual call of several rules on their locked shards: each limiter held with its
/// rule's config (a sliding window's stored with a value, a token bucket's live),
/// each call asking permits of its own limiter (distinct names), decided without the
/// phases' lists, as the phases decide it: load_rule and load_tokens (the newest
/// grant or refill of all), settle_time, plan_bucket, plan_tokens and take for each,
/// then commit for each, once every rule is planned. `None`, before anything is
/// written, for every other call (a limiter missing, idle, or of another config, a
/// call asking no permit, two calls on one limiter, a value the log must correct):
/// `decide` then decides it from the start.
pub(super) fn decide_several(
    locked: &mut Locked<'_>,
    calls: &[RuleCall<'_>],
    hashes: &[u64],
    clock_now: u64,
) -> Option<Outcome> {
    let mut steps: smallvec::SmallVec<[Step; 4]> = smallvec::smallvec![Step::default(); calls.len()];
    // read config, load_rule and load_tokens, for every call: the newest grant or
    // refill among them. Read only: what expired is left for the phases to drop (a
    // call they refuse before they read it, a limiter they cannot recall at the
    // bound, leaves it as it was), and an expired token bucket for them to read, or
    // one recalled in its place.
    let mut newest = clock_now;
    for (i, (call, &hash)) in calls.iter().zip(hashes).enumerate() {
        let name = call.keys.config();
        let rule = call.rule.filter(|_| call.permits > 0)?;
        if calls[..i]
            .iter()
            .zip(hashes)
            .any(|(c, &h)| h == hash && c.keys.config() == name)
        {
            return None;
        }
        let limiter = locked
            .store(hash)
            .limiters
            .get_with(hash, |(n, _)| same_name(n, name))?;
        let at = match call.bucket {
            Some(shape) => {
                // (a bucket with reservations pending, and a reservation's grant, which
                // opens a segment: kept at commit, as the phases keep them)
                let tokens = live_tokens(limiter, rule.rate_type, clock_now)?;
                if !tokens
                    .state
                    .holds(rule.rate, rule.interval_ms(), shape.burst, shape.warmup_ms)
                {
                    return None;
                }
                tokens.state.at
            }
            None => {
                let live = |expires: Option<u64>| expires.is_none_or(|t| t > clock_now);
                if call.permits > rule.rate
                    || !live(limiter.config_expires)
                    || limiter.config.as_ref() != Some(rule)
                {
                    return None;
                }
                let bucket = limiter.buckets[slot(rule.rate_type)]
                    .as_ref()
                    .filter(|b| live(b.expires))?;
                bucket.value?;
                steps[i].logged = bucket.newest();
                steps[i].logged.unwrap_or(0)
            }
        };
        newest = newest.max(at);
    }
    let now = settle_time(newest, clock_now);
    // plan_bucket, plan_tokens and take, for every call, writing nothing
    for (i, (call, &hash)) in calls.iter().zip(hashes).enumerate() {
        let rule = call.rule?;
        let limiter = locked
            .store(hash)
            .limiters
            .get_with(hash, |(n, _)| same_name(n, call.keys.config()))?;
        if call.bucket.is_some() {
            let plan = Plan::refilled(&live_tokens(limiter, rule.rate_type, clock_now)?.state, now);
            steps[i].wait = plan.wait(call.permits).map(|wait| wait as i64);
            steps[i].tokens = Some(plan);
            continue;
        }
        let bucket = limiter.bucket(rule.rate_type, clock_now)?;
        let (permits, rate, interval) = (call.permits as i64, rule.rate as i64, rule.interval_ms() as i64);
        let (skip, released) = bucket.stale(now as i64 - interval);
        let value = window::plain_value(bucket.value?, released, rate)?;
        let wait = match window::lacking(value, 0, permits) {
            Some(need) => Some(bucket.wait_for(skip, need, interval, now as i64, 0)?),
            None => None,
        };
        steps[i] = Step {
            skip,
            released,
            value,
            wait,
            ..steps[i]
        };
    }
    let refused = steps.iter().position(|s| s.wait.is_some());
    let granted = refused.is_none();
    // commit, for every call
    let mut rules = crate::backend::RuleOutcomes::with_capacity(calls.len());
    for ((call, &hash), step) in calls.iter().zip(hashes).zip(&steps) {
        let rule = call.rule.expect("read in load_rule");
        let limiter = locked
            .store(hash)
            .limiters
            .get_with(hash, |(n, _)| same_name(n, call.keys.config()))
            .expect("found in load_rule");
        let left = match &step.tokens {
            Some(plan) => {
                // (a refusal stores the refill, as the phases store it, but that of a
                // lone call without a warm-up, which Redis decides with tokens_one.lua:
                // it writes nothing)
                let taken = if granted { call.permits } else { 0 };
                let (units, cold) = plan.take_tokens(taken);
                if granted || calls.len() > 1 || plan.warmup > 0 {
                    let opened = call.reserved.filter(|_| taken > 0).map(|id| (now, units, id));
                    if opened.is_some() || limiter.segments(rule.rate_type).is_some() {
                        keep_segments_of(limiter, rule.rate_type, plan, taken, opened);
                    }
                    limiter.set_tokens(rule.rate_type, Tokens::stored(plan, units, cold));
                }
                plan.whole(units)
            }
            None => {
                let bucket = limiter
                    .bucket(rule.rate_type, clock_now)
                    .expect("live in load_rule");
                bucket.remove_first(step.skip, step.released);
                let mut value = step.value;
                if granted {
                    value -= call.permits as i64;
                    // (entries were dropped from the front only: the newest is as read)
                    bucket.push_after(step.logged, now, call.permits as u32);
                }
                if granted || step.released > 0 {
                    bucket.value = Some(value);
                }
                ttl_rule_live(limiter, rule.rate_type, rule.keep_alive_ms(), now, clock_now);
                value.max(0) as u64
            }
        };
        rules.push(RuleOutcome {
            left,
            config: ConfigChange::Kept,
        });
    }
    #[cfg(test)]
    SEVERAL.with(|n| n.set(n.get() + 1));
    // reply
    let retry = steps.iter().filter_map(|s| s.wait).max().unwrap_or(0);
    Some(Outcome {
        granted,
        refused,
        retry_ms: if granted { 0 } else { retry.max(0) as u64 },
        at_ms: now,
        rules,
    })
}

/// The token bucket of `kind`, unless missing or expired, changing nothing.
fn live_tokens(limiter: &Limiter, kind: crate::RateType, now: u64) -> Option<&Tokens> {
    limiter.tokens[slot(kind)].as_ref().filter(|t| t.expires > now)
}
