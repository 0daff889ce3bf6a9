//! A decision over one or more rules, as `lua/acquire.lua` makes it, phase for phase
//! and name for name: `load_rule` (each rule's config and the newest grant),
//! `plan_bucket` and `take` (each bucket once, then each rule's permits, writing
//! nothing), `commit` (the writes). The bucket plans Lua keeps in the table of the
//! first rule naming a bucket are this file's `BucketPlan`s; `state.rs`'s `Bucket` is
//! the stored state (the value and log keys). The usual call (one sliding-window rule
//! with its stored config) is decided first by `decide_one`, the twin of
//! `lua/acquire_plain.lua` for one rule, which leaves every other case to the phases
//! (several such rules: acquire_plain.lua decides them too, here the phases do).

use super::state::{Bucket, Store};
use super::tokens::{TokenPlan, Tokens};
use super::{shard_of, Locked, MemoryBackend, AT_BOUND, PER_NEW, REORDER_MS};
use crate::backend::{Call, ConfigChange, Outcome, RuleOutcome};
use crate::{Error, RateLimiterConfig, RateType};

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
    tokens: Option<TokenPlan>,
}

impl MemoryBackend {
    pub async fn acquire(&self, calls: &[Call<'_>], clock_now: u64) -> Result<Outcome, Error> {
        self.sweep_in_turn(clock_now);
        if let [call] = calls {
            // One rule: one hash, one shard, and the usual call decided on its own.
            let hash = self.hash(call.keys.config());
            let mut locked = Locked::One(self.lock_shard(shard_of(hash)));
            if let Some(outcome) = decide_one(locked.store(hash), call, hash, clock_now) {
                return Ok(outcome);
            }
            return decide(self, locked, calls, &[hash], clock_now);
        }
        let hashes: Vec<u64> = calls.iter().map(|c| self.hash(c.keys.config())).collect();
        let locked = self.lock_all(&hashes);
        decide(self, locked, calls, &hashes, clock_now)
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

/// The decision of `calls`, whose names hash to `hashes`, on their locked shards.
fn decide(
    backend: &MemoryBackend,
    mut locked: Locked<'_>,
    calls: &[Call<'_>],
    hashes: &[u64],
    clock_now: u64,
) -> Result<Outcome, Error> {
    // Phase 1, load_rule: each call's config, and the newest grant of its bucket.
    let mut resolved = Vec::with_capacity(calls.len());
    let mut newest = clock_now;
    for (call, &hash) in calls.iter().zip(hashes) {
        let name = call.keys.config();
        let limiters = &mut locked.store(hash).limiters;
        if let (Some(_), Some(rule)) = (call.bucket, call.rule) {
            // A token bucket: its state now, its plan once the time is settled.
            let limiter = limiters.get_hashed(hash, name);
            let stored = limiter.and_then(|l| l.tokens(rule.rate_type, clock_now).copied());
            if let Some(stored) = stored {
                newest = newest.max(stored.at);
            }
            resolved.push(Resolved {
                config: *rule,
                change: ConfigChange::Kept,
                mode_changed: false,
                plan: usize::MAX,
                hash,
                stored_tokens: stored,
                tokens: None,
            });
            continue;
        }
        let mut limiter = limiters.get_hashed(hash, name);
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
            newest = newest.max(score);
        }
        let mode_changed = matches!(change, ConfigChange::Changed(old) if old.rate_type != config.rate_type);
        resolved.push(Resolved {
            config,
            change,
            mode_changed,
            plan: 0,
            hash,
            stored_tokens: None,
            tokens: None,
        });
    }
    // A call overtaken by a slightly later one is decided at the later time, so
    // each log stays in time order (as in acquire.lua).
    let now = if newest - clock_now <= REORDER_MS {
        newest
    } else {
        clock_now
    };
    let now_i = now as i64;

    // Phase 2, plan_bucket and take: each bucket once, then each call's permits,
    // writing nothing.
    let mut plans: Vec<BucketPlan> = Vec::with_capacity(calls.len());
    let (mut refused, mut retry) = (None, 0i64);
    for i in 0..calls.len() {
        let call = &calls[i];
        let config = resolved[i].config;
        if let Some(shape) = call.bucket {
            let (plan, old) = TokenPlan::new(
                config.rate,
                config.interval_ms(),
                shape.burst,
                shape.warmup_ms,
                resolved[i].stored_tokens.as_ref(),
                now,
            );
            resolved[i].change = match (&resolved[i].stored_tokens, old) {
                (None, _) => ConfigChange::Created,
                (Some(_), Some(old)) => ConfigChange::Changed(RateLimiterConfig {
                    rate: old.rate,
                    interval: std::time::Duration::from_millis(old.interval),
                    ..config
                }),
                (Some(_), None) => ConfigChange::Kept,
            };
            if let Some(wait) = plan.wait(call.permits) {
                refused.get_or_insert(i);
                retry = retry.max(wait as i64);
            }
            resolved[i].tokens = Some(plan);
            continue;
        }
        let (name, kind) = (call.keys.config(), config.rate_type);
        let existing = plans
            .iter()
            .position(|p| p.kind == kind && calls[p.call].keys.config() == name);
        let at = match existing {
            Some(at) => at,
            None => {
                let hash = resolved[i].hash;
                let mut limiter = locked.store(hash).limiters.get_hashed(hash, name);
                let bucket = limiter.as_mut().and_then(|l| l.bucket(kind, clock_now));
                plans.push(plan_bucket(i, bucket.as_deref(), &resolved[i], now_i));
                plans.len() - 1
            }
        };
        resolved[i].plan = at;
        if call.permits == 0 {
            continue;
        }
        let plan = &mut plans[at];
        let (permits, rate) = (call.permits as i64, config.rate as i64);
        let interval = config.interval_ms() as i64;
        if plan.value - plan.spent < permits {
            let mut wait = None;
            if !plan.clear {
                let hash = resolved[i].hash;
                let limiter = locked.store(hash).limiters.get_hashed(hash, name);
                let empty = Bucket::default();
                let bucket = limiter.and_then(|l| l.bucket(kind, clock_now));
                let bucket = bucket.map_or(&empty, |b| &*b);
                let need = permits + plan.spent - plan.value;
                wait = bucket.wait_for(plan.skip, need, interval, now_i, plan.spent);
                if wait.is_none() {
                    // Value and log disagree (permits lost): the log is the authority.
                    plan.value = rate - plan.live;
                    plan.dirty = true;
                    if plan.value - plan.spent < permits {
                        let need = permits + plan.spent - plan.value;
                        let again = bucket.wait_for(plan.skip, need, interval, now_i, plan.spent);
                        wait = Some(again.unwrap_or(interval));
                    }
                }
            }
            if let Some(wait) = wait {
                refused.get_or_insert(i);
                retry = retry.max(wait);
            }
        }
        plan.spent += permits;
    }

    let granted = refused.is_none();
    let rules = resolved
        .iter()
        .zip(calls)
        .map(|(r, call)| {
            let left = match &r.tokens {
                Some(tokens) => tokens.left(if granted { call.permits } else { 0 }) as i64,
                None => {
                    let p = &plans[r.plan];
                    if granted {
                        p.value - p.spent
                    } else {
                        p.value
                    }
                }
            };
            RuleOutcome {
                left: left.max(0) as u64,
                config: r.change,
            }
        })
        .collect();
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
    Ok(Outcome {
        granted,
        refused,
        retry_ms: if granted { 0 } else { retry.max(0) as u64 },
        at_ms: now,
        rules,
    })
}

/// acquire_plain.lua's twin for one rule: one sliding-window rule whose stored config is its own, with
/// a value and no change of mode, decided without the phases' lists. `None`, before
/// anything is written, for every other case (a config to create or change, no
/// stored value or a value inflated by hand, a log short of the wait): [`decide`]
/// then decides the call from the start.
fn decide_one(store: &mut Store, call: &Call<'_>, hash: u64, clock_now: u64) -> Option<Outcome> {
    let rule = call
        .rule
        .filter(|r| call.bucket.is_none() && call.permits <= r.rate)?;
    let limiter = store.limiters.get_hashed(hash, call.keys.config())?;
    if limiter.live_config(clock_now)? != *rule {
        return None;
    }
    let keep = rule.keep_alive_ms();
    // Redisson's TTL rule, as commit applies it (no keep-alive: the config's own TTL).
    let expires = match keep {
        0 => limiter.config_expires.filter(|&t| t > clock_now),
        _ => None,
    };
    let bucket = limiter.bucket(rule.rate_type, clock_now)?;
    let mut value = bucket.value?;
    // load_rule: the newest grant, when newer than this call's time
    let newest = bucket.newest().unwrap_or(clock_now).max(clock_now);
    let now = if newest - clock_now <= REORDER_MS {
        newest
    } else {
        clock_now
    };
    let (permits, rate, interval) = (call.permits as i64, rule.rate as i64, rule.interval_ms() as i64);
    // plan_bucket: the value, plus what left the window
    let (skip, released) = bucket.stale(now as i64 - interval);
    if released > 0 && value + released as i64 > rate {
        return None;
    }
    value += released as i64;
    // take: enough permits, or the exact wait until the log releases them
    let mut wait = 0;
    if permits > 0 && value < permits {
        wait = bucket.wait_for(skip, permits - value, interval, now as i64, 0)?;
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
        if keep > 0 {
            bucket.expires = Some(now + keep);
        } else if expires.is_some() {
            bucket.expires = expires;
        }
        if keep > 0 {
            limiter.config_expires = Some(now + keep);
        }
    }
    Some(Outcome {
        granted,
        refused: (!granted).then_some(0),
        retry_ms: wait.max(0) as u64,
        at_ms: now,
        rules: smallvec::smallvec![RuleOutcome {
            left: value.max(0) as u64,
            config: ConfigChange::Kept,
        }],
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
    match bucket.value {
        None => plan.value = rate - plan.live,
        Some(_) if matches!(resolved.change, ConfigChange::Changed(_)) => plan.value = rate - plan.live,
        Some(value) if released > 0 => {
            let released = released as i64;
            plan.value = if value + released > rate {
                rate - plan.live
            } else {
                value + released
            };
        }
        Some(value) => {
            plan.value = value;
            plan.dirty = false;
        }
    }
    plan
}

/// Phase 3, commit: the writes `acquire.lua` makes.
/// What phases 1 and 2 decided, for `commit`.
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
    let Decided {
        resolved,
        plans,
        granted,
        now,
        clock_now,
    } = *decided;
    for (i, (call, r)) in calls.iter().zip(resolved).enumerate() {
        let name = call.keys.config();
        let store = locked.store(r.hash);
        if let Some(tokens) = &r.tokens {
            // A token bucket stores its refilled state, less what a grant took.
            let taken = if granted { call.permits } else { 0 };
            store
                .limiters
                .get_or_insert(r.hash, name)
                .set_tokens(r.config.rate_type, tokens.stored(taken));
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
        let plan = &plans[r.plan];
        let kind = r.config.rate_type;
        // Each bucket is settled once, by the first call that planned it.
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
        // Redisson's TTL rule: keepAliveTime on all three keys, else the config's TTL.
        // Counted from the decided time: an overtaken call's clock read earlier than the
        // moment it commits, and a keep-alive counted from that reading would end before
        // a grant at `now` has left the window.
        let expires = match r.config.keep_alive_ms() {
            0 => limiter.config_expires.filter(|&t| t > clock_now),
            keep => {
                limiter.config_expires = Some(now + keep);
                Some(now + keep)
            }
        };
        if let (Some(expires), Some(bucket)) = (expires, limiter.bucket(kind, clock_now)) {
            bucket.expires = Some(expires);
        }
    }
}
