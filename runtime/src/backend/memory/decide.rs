//! A decision over one or more rules, as `lua/acquire.lua` makes it, phase for phase
//! and name for name, in its order: `load_rule` (each rule's config and the newest
//! grant; `load_tokens` for a token bucket), `settle_time` (an overtaken call moves
//! to the later time), `plan_bucket` and `take` (each bucket once, then each rule's
//! permits, writing nothing; `plan_tokens` for a token bucket), `commit` (the writes,
//! with `ttl_rule`, `lua/lib/ttl_rule.lua`'s twin) and `reply`. The bucket plans Lua
//! keeps in the table of the first rule naming a bucket are this file's `BucketPlan`s;
//! `state.rs`'s `Bucket` is the stored state (the value and log keys). The usual call
//! (one sliding-window rule with its stored config) is decided first by `decide_one`,
//! the twin of `lua/acquire_plain.lua` for one rule (read config, load_rule,
//! settle_time, plan_bucket, take, commit, reply), which leaves every other case to
//! the phases (several such rules: acquire_plain.lua decides them too, here the phases
//! do).

use super::state::{Bucket, Limiter, Store, Tokens};
use std::sync::MutexGuard;

use super::{shard_of, Locked, MemoryBackend, AT_BOUND, PER_NEW};
use crate::algorithm::bucket::{self, Plan};
use crate::algorithm::call_time::settle_time;
use crate::algorithm::{ttl, window};
use crate::backend::{Call, ConfigChange, Outcome, RuleOutcome};
use crate::{Error, RateLimiterConfig, RateType};

/// The decision of one rule: the usual call's, or any other.
pub(crate) enum OneRule {
    Usual(Usual),
    Other(Outcome),
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

    fn outcome(&self) -> Outcome {
        Outcome {
            granted: self.granted,
            refused: (!self.granted).then_some(0),
            retry_ms: self.retry_ms,
            at_ms: self.at_ms,
            rules: smallvec::SmallVec::from_buf([RuleOutcome {
                left: self.left,
                config: ConfigChange::Kept,
            }]),
        }
    }
}

/// What a decision does to one bucket, computed before anything is written
/// (acquire.lua's `b`).
struct BucketPlan {
    /// The first call on this bucket: its limiter name and config.
    call: usize,
    kind: RateType,
    cutoff: i64,
    live: i64,
    value: i64,
    skip: usize,
    spent: i64,
    dirty: bool,
    clear: bool,
}

/// One call's resolved config, what happened to it, and its plan.
struct Resolved {
    config: RateLimiterConfig,
    change: ConfigChange,
    mode_changed: bool,
    plan: usize,
    /// The limiter name's hash in its shard's table, computed once.
    hash: u64,
    /// A token-bucket call: its stored state (phase 1), then its plan (phase 2).
    stored_tokens: Option<Tokens>,
    tokens: Option<Plan>,
}

impl MemoryBackend {
    pub async fn acquire(&self, calls: &[Call<'_>], clock_now: u64) -> Result<Outcome, Error> {
        self.decide_calls(calls, clock_now)
    }

    /// The decision of `calls` (nothing in process waits).
    pub fn decide_calls(&self, calls: &[Call<'_>], clock_now: u64) -> Result<Outcome, Error> {
        if let [call] = calls {
            return self.decide_rule(call, self.hash(call.keys.config()), clock_now);
        }
        self.sweep_in_turn(clock_now);
        let hashes: Vec<u64> = calls.iter().map(|c| self.hash(c.keys.config())).collect();
        let locked = self.lock_all(&hashes);
        decide(self, locked, calls, &hashes, clock_now)
    }

    /// The decision of one rule, whose name hashes to `hash`.
    pub fn decide_rule(&self, call: &Call<'_>, hash: u64, clock_now: u64) -> Result<Outcome, Error> {
        match self.decide_one_rule(call, hash, clock_now)? {
            OneRule::Usual(usual) => Ok(usual.outcome()),
            OneRule::Other(outcome) => Ok(outcome),
        }
    }

    /// The decision of one rule, whose name hashes to `hash`: one shard, and the usual
    /// calls (a sliding window's, a token bucket's, on a limiter held with the rule's
    /// config) decided on their own, without the phases' lists.
    #[inline]
    pub fn decide_one_rule(&self, call: &Call<'_>, hash: u64, clock_now: u64) -> Result<OneRule, Error> {
        self.sweep_in_turn(clock_now);
        let mut store = self.lock_shard(shard_of(hash));
        let usual = match call.bucket {
            None => decide_one(&mut store, call, hash, clock_now),
            Some(shape) => decide_tokens_one(&mut store, call, shape, hash, clock_now),
        };
        match usual {
            Some(usual) => Ok(OneRule::Usual(usual)),
            None => self
                .decide_other(store, call, hash, clock_now)
                .map(OneRule::Other),
        }
    }

    /// Any other call of one rule: the phases.
    #[cold]
    fn decide_other(
        &self,
        store: MutexGuard<'_, Store>,
        call: &Call<'_>,
        hash: u64,
        now: u64,
    ) -> Result<Outcome, Error> {
        decide(self, Locked::One(store), std::slice::from_ref(call), &[hash], now)
    }

    /// Room for the limiters a decision of `calls` creates (the names not held yet,
    /// each once), taken from the bound; at the bound, after sweeping their shards for
    /// expired limiters. Answers the first call of each new name.
    fn make_room(
        &self,
        locked: &mut Locked<'_>,
        calls: &[Call<'_>],
        hashes: &[u64],
        now: u64,
    ) -> Result<Vec<usize>, Error> {
        let new = |locked: &mut Locked<'_>| -> Vec<usize> {
            (0..calls.len())
                .filter(|&i| {
                    let name = calls[i].keys.config();
                    !calls[..i].iter().any(|c| c.keys.config() == name)
                        && !locked.store(hashes[i]).limiters.contains(hashes[i], name)
                })
                .collect()
        };
        let mut fresh = new(locked);
        if self.room.take(fresh.len()) {
            return Ok(fresh);
        }
        // Dropping expired limiters changes no answer already computed (an expired
        // limiter decides as a missing one), but a call's own may go: count again.
        for &i in &fresh {
            self.sweep(locked.store(hashes[i]), now, AT_BOUND);
        }
        fresh = new(locked);
        if self.room.take(fresh.len()) {
            return Ok(fresh);
        }
        Err(self.room.refuse(calls[fresh[0]].keys.config()))
    }
}

/// The decision of `calls`, whose names hash to `hashes`, on their locked shards:
/// acquire.lua's phases, in its order.
fn decide(
    backend: &MemoryBackend,
    mut locked: Locked<'_>,
    calls: &[Call<'_>],
    hashes: &[u64],
    clock_now: u64,
) -> Result<Outcome, Error> {
    // Phase 1, load_rule: each call's config, and the newest grant of its bucket.
    let (mut resolved, newest) = load_rules(&mut locked, calls, hashes, clock_now)?;
    let now = settle_time(newest, clock_now);
    // Phase 2, plan_bucket and take: each bucket once, then each call's permits,
    // writing nothing.
    let (plans, refused, retry) = plan_and_take(&mut locked, calls, &mut resolved, now, clock_now);
    let granted = refused.is_none();
    // Phase 3, commit (a call that only asks what is available writes nothing).
    if calls.iter().any(|c| c.permits > 0) {
        let decided = Decided {
            resolved: &resolved,
            plans: &plans,
            granted,
            now,
            clock_now,
        };
        let fresh = backend.make_room(&mut locked, calls, hashes, clock_now)?;
        commit(&mut locked, calls, &decided);
        // Each new limiter pays for sweeping its share of the table, after the writes
        // (before them, a sweep could drop a limiter the writes then create again,
        // uncounted).
        for &i in &fresh {
            backend.sweep(locked.store(hashes[i]), clock_now, PER_NEW);
        }
    }
    // Phase 4, reply.
    Ok(Outcome {
        granted,
        refused,
        retry_ms: if granted { 0 } else { retry.max(0) as u64 },
        at_ms: now,
        rules: reply(calls, &resolved, &plans, granted),
    })
}

/// Phase 1, load_rule, for every call: its config resolved, and the newest grant (or
/// refill) among them, at least `clock_now`.
fn load_rules(
    locked: &mut Locked<'_>,
    calls: &[Call<'_>],
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
fn load_tokens(
    store: &mut Store,
    call: &Call<'_>,
    rule: &RateLimiterConfig,
    hash: u64,
    clock_now: u64,
    newest: &mut u64,
) -> Resolved {
    let limiter = store.limiters.get_hashed(hash, call.keys.config());
    let stored = limiter.and_then(|l| l.tokens(rule.rate_type, clock_now).copied());
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
fn load_rule(
    store: &mut Store,
    call: &Call<'_>,
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

/// Phase 2 for every call at `now`: token buckets planned, each sliding-window bucket
/// planned once (plan_bucket) and each call's permits taken from it (take). Answers
/// the plans, the first refusing call and the longest wait.
fn plan_and_take(
    locked: &mut Locked<'_>,
    calls: &[Call<'_>],
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
fn plan_tokens(r: &mut Resolved, call: &Call<'_>, shape: crate::BucketShape, now: u64) -> Option<i64> {
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
fn take(
    plan: &mut BucketPlan,
    bucket: Option<&Bucket>,
    call: &Call<'_>,
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

/// Phase 4, reply: each rule's permits (or tokens) left and what happened to its config.
fn reply(
    calls: &[Call<'_>],
    resolved: &[Resolved],
    plans: &[BucketPlan],
    granted: bool,
) -> smallvec::SmallVec<[RuleOutcome; 1]> {
    resolved
        .iter()
        .zip(calls)
        .map(|(r, call)| {
            let left = match &r.tokens {
                Some(tokens) => tokens.left(if granted { call.permits } else { 0 }),
                None => window::left(plans[r.plan].value, plans[r.plan].spent, granted),
            };
            RuleOutcome {
                left,
                config: r.change,
            }
        })
        .collect()
}

/// acquire_plain.lua's twin for one rule, in its order: read config, load_rule,
/// settle_time, plan_bucket, take, commit, reply. One sliding-window rule whose
/// stored config is its own, with a value and no change of mode, decided without the
/// phases' lists. `None`, before anything is written, for every other case (a config
/// to create or change, no stored value or a value inflated by hand, a log short of
/// the wait): [`decide`] then decides the call from the start.
fn decide_one(store: &mut Store, call: &Call<'_>, hash: u64, clock_now: u64) -> Option<Usual> {
    // read config: the rule's own, stored
    let rule = call
        .rule
        .filter(|r| call.bucket.is_none() && call.permits <= r.rate)?;
    let limiter = store.limiters.get_hashed(hash, call.keys.config())?;
    if limiter.live_config(clock_now)? != *rule {
        return None;
    }
    let bucket = limiter.bucket(rule.rate_type, clock_now)?;
    let value = bucket.value?;
    // load_rule: the newest grant, when newer than this call's time
    let newest = bucket.newest().unwrap_or(clock_now).max(clock_now);
    let now = settle_time(newest, clock_now);
    let (permits, rate, interval) = (call.permits as i64, rule.rate as i64, rule.interval_ms() as i64);
    // plan_bucket: the value, plus what left the window
    let (skip, released) = bucket.stale(now as i64 - interval);
    let mut value = window::plain_value(value, released, rate)?;
    // take: enough permits, or the exact wait until the log releases them
    let mut wait = 0;
    if let Some(need) = window::lacking(value, 0, permits).filter(|_| permits > 0) {
        wait = bucket.wait_for(skip, need, interval, now as i64, 0)?;
    }
    let granted = wait == 0;
    // commit (a call asking what is available writes nothing)
    if permits > 0 {
        bucket.remove_first(skip, released);
        if granted {
            value -= permits;
            bucket.push(now, call.permits as u32);
        }
        if granted || released > 0 {
            bucket.value = Some(value);
        }
        ttl_rule(limiter, rule.rate_type, rule.keep_alive_ms(), now, clock_now);
    }
    // reply
    Some(Usual {
        granted,
        retry_ms: wait.max(0) as u64,
        at_ms: now,
        left: value.max(0) as u64,
    })
}

/// The twin of the phases for one token-bucket rule whose bucket is held with the
/// rule's config: load_tokens, settle_time, plan_tokens, commit, reply, in place and
/// without lists. `None`, before anything is written, when the bucket is missing or
/// its config differs: [`decide`] then decides the call from the start (it creates
/// the limiter, or reports the change).
fn decide_tokens_one(
    store: &mut Store,
    call: &Call<'_>,
    shape: crate::BucketShape,
    hash: u64,
    clock_now: u64,
) -> Option<Usual> {
    let rule = call.rule?;
    let limiter = store.limiters.get_hashed(hash, call.keys.config())?;
    // load_tokens, settle_time
    let stored = limiter.tokens(rule.rate_type, clock_now)?;
    let now = settle_time(stored.state.at.max(clock_now), clock_now);
    // plan_tokens: a bucket held with this rule's config, refilled
    let (rate, interval) = (rule.rate, rule.interval_ms());
    if !stored.state.holds(rate, interval, shape.burst, shape.warmup_ms) {
        return None;
    }
    let plan = Plan::refilled(&stored.state, now);
    let wait = plan.wait(call.permits);
    let taken = if wait.is_none() { call.permits } else { 0 };
    let (units, cold) = plan.take_tokens(taken);
    // commit (a call asking what is available writes nothing), in place
    if call.permits > 0 {
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

/// Plans one bucket: release what left the window, rebuild a lost value from the log.
fn plan_bucket(call: usize, bucket: Option<&Bucket>, resolved: &Resolved, now: i64) -> BucketPlan {
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

/// What phases 1 and 2 decided, for phase 3, commit: the writes `acquire.lua` makes.
struct Decided<'a> {
    resolved: &'a [Resolved],
    plans: &'a [BucketPlan],
    granted: bool,
    /// The time the call is decided at (a later grant's, when overtaken).
    now: u64,
    /// The client's clock, for finding what has expired.
    clock_now: u64,
}

fn commit(locked: &mut Locked<'_>, calls: &[Call<'_>], decided: &Decided<'_>) {
    for (i, (call, r)) in calls.iter().zip(decided.resolved).enumerate() {
        let name = call.keys.config();
        let store = locked.store(r.hash);
        if let Some(tokens) = &r.tokens {
            // A token bucket stores its refilled state, less what a grant took.
            let taken = if decided.granted { call.permits } else { 0 };
            let (units, cold) = tokens.take_tokens(taken);
            store
                .limiters
                .get_or_insert(r.hash, name)
                .set_tokens(r.config.rate_type, Tokens::stored(tokens, units, cold));
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

/// A sliding-window call's writes: its bucket settled (by the first call that
/// planned it), its grant logged, and Redisson's TTL rule.
fn commit_window(limiter: &mut Limiter, i: usize, call: &Call<'_>, r: &Resolved, decided: &Decided<'_>) {
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
fn ttl_rule(limiter: &mut Limiter, kind: RateType, keep: u64, now: u64, clock_now: u64) {
    let (config_expires, expires) = ttl::ttl_rule(keep, limiter.config_expires, now, clock_now);
    if config_expires.is_some() {
        limiter.config_expires = config_expires;
    }
    if let (Some(expires), Some(bucket)) = (expires, limiter.bucket(kind, clock_now)) {
        bucket.expires = Some(expires);
    }
}
