//! The in-process backend: `lua/acquire.lua` and friends, step for step, over maps.
//!
//! TTLs follow the same rules as the scripts, measured on the client's clock, and
//! expired limiters are swept so memory does not grow with the number of limiters
//! ever seen. Keys are never formatted: limiters are found by name, buckets by mode.

mod state;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use self::state::{Bucket, Store};
use super::{Call, ConfigChange, Outcome};
use crate::{Error, LimiterKeys, RateLimiterConfig, RateType};

/// How far a call's time may lag the newest grant and still be decided at that
/// grant's time (acquire.lua's REORDER).
const REORDER_MS: u64 = 1000;

/// Limiters are spread over this many independently locked shards, so threads
/// deciding different limiters rarely wait for each other.
const SHARDS: usize = 16;

pub(crate) struct MemoryBackend {
    shards: Box<[Mutex<Store>]>,
    /// Decisions so far: every `SWEEP_EVERY`th also sweeps the next shard in turn, so
    /// shards no traffic reaches are cleaned too.
    decisions: AtomicUsize,
}

const SWEEP_EVERY: usize = 256;

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend {
            shards: (0..SHARDS).map(|_| Mutex::new(Store::default())).collect(),
            decisions: AtomicUsize::new(0),
        }
    }
}

/// The shard of a limiter (FNV-1a of its name: cheap, and a hostile name can at worst
/// crowd one shard, which is then as fast as an unsharded map).
fn shard_of(name: &str) -> usize {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % SHARDS as u64) as usize
}

/// The shards one decision touches, locked in index order so that two decisions
/// over the same shards cannot deadlock.
struct Locked<'a> {
    guards: Vec<(usize, MutexGuard<'a, Store>)>,
}

impl Locked<'_> {
    fn store(&mut self, name: &str) -> &mut Store {
        let shard = shard_of(name);
        let (_, guard) = self
            .guards
            .iter_mut()
            .find(|(i, _)| *i == shard)
            .expect("every shard of the call is locked");
        guard
    }
}

/// What a decision does to one bucket, computed before anything is written.
struct Plan {
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
}

impl MemoryBackend {
    /// The shard of `name`, locked. A panic elsewhere cannot leave a half-made
    /// decision (every mutation happens after all checks), so poisoning is ignored.
    fn lock(&self, name: &str) -> MutexGuard<'_, Store> {
        self.shards[shard_of(name)]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_all(&self, calls: &[Call<'_>]) -> Locked<'_> {
        let mut shards: Vec<usize> = calls.iter().map(|c| shard_of(c.keys.config())).collect();
        shards.sort_unstable();
        shards.dedup();
        let guards = shards
            .into_iter()
            .map(|i| (i, self.shards[i].lock().unwrap_or_else(PoisonError::into_inner)))
            .collect();
        Locked { guards }
    }

    /// Sweeps one shard in turn every `SWEEP_EVERY` decisions, unless it is busy.
    fn sweep_in_turn(&self, now: u64) {
        let n = self.decisions.fetch_add(1, Ordering::Relaxed);
        if n % SWEEP_EVERY == 0 {
            if let Ok(mut store) = self.shards[(n / SWEEP_EVERY) % SHARDS].try_lock() {
                store.sweep(now);
            }
        }
    }

    pub async fn acquire(&self, calls: &[Call<'_>], clock_now: u64) -> Result<Outcome, Error> {
        self.sweep_in_turn(clock_now);
        let mut locked = self.lock_all(calls);
        for (_, store) in &mut locked.guards {
            store.sweep_if_due(clock_now);
        }

        // Phase 1: each call's config, and the newest grant of its bucket.
        let mut resolved = Vec::with_capacity(calls.len());
        let mut newest = clock_now;
        for call in calls {
            let name = call.keys.config();
            let mut limiter = locked.store(name).limiters.get_mut(name);
            let stored = limiter.as_mut().and_then(|l| l.live_config(clock_now));
            let (config, change) = match (call.rule, stored) {
                (Some(rule), Some(old)) if *rule == old => (old, ConfigChange::Kept),
                (Some(rule), Some(_)) => (*rule, ConfigChange::Changed),
                (Some(rule), None) => (*rule, ConfigChange::Created),
                (None, Some(old)) => (old, ConfigChange::Kept),
                (None, None) => {
                    return Err(Error::NotInitialized {
                        name: name.to_owned(),
                    })
                }
            };
            if call.permits > config.rate {
                return Err(Error::PermitsExceedRate {
                    name: name.to_owned(),
                    permits: call.permits,
                    rate: config.rate,
                });
            }
            if let Some(score) = limiter.and_then(|l| l.bucket(config.rate_type, clock_now)?.newest()) {
                newest = newest.max(score);
            }
            let mode_changed = change == ConfigChange::Changed
                && stored.is_some_and(|old| old.rate_type != config.rate_type);
            resolved.push(Resolved {
                config,
                change,
                mode_changed,
                plan: 0,
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

        // Phase 2: plan each bucket once and take each call's permits, writing nothing.
        let mut plans: Vec<Plan> = Vec::with_capacity(calls.len());
        let (mut refused, mut retry) = (None, 0i64);
        for i in 0..calls.len() {
            let call = &calls[i];
            let config = resolved[i].config;
            let (name, kind) = (call.keys.config(), config.rate_type);
            let existing = plans
                .iter()
                .position(|p| p.kind == kind && calls[p.call].keys.config() == name);
            let at = match existing {
                Some(at) => at,
                None => {
                    let mut limiter = locked.store(name).limiters.get_mut(name);
                    let bucket = limiter.as_mut().and_then(|l| l.bucket(kind, clock_now));
                    plans.push(plan(i, bucket.as_deref(), &resolved[i], now_i));
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
                    let limiter = locked.store(name).limiters.get_mut(name);
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
            .map(|r| {
                let p = &plans[r.plan];
                let left = if granted { p.value - p.spent } else { p.value };
                (left.max(0) as u64, r.change)
            })
            .collect();
        if calls.iter().any(|c| c.permits > 0) {
            commit(&mut locked, calls, &resolved, &plans, granted, now, clock_now);
        }
        Ok(Outcome {
            granted,
            refused,
            retry_ms: if granted { 0 } else { retry.max(0) as u64 },
            at_ms: now,
            rules,
        })
    }

    pub async fn try_set_rate(
        &self,
        keys: &LimiterKeys,
        config: &RateLimiterConfig,
        now: u64,
    ) -> Result<bool, Error> {
        let mut store = self.lock(keys.config());
        let limiter = store.limiter_or_insert(keys.config());
        if limiter.live_config(now).is_some() {
            return Ok(false);
        }
        limiter.config = Some(*config);
        Ok(true)
    }

    pub async fn set_rate(
        &self,
        keys: &LimiterKeys,
        config: &RateLimiterConfig,
        now: u64,
    ) -> Result<(), Error> {
        let mut store = self.lock(keys.config());
        let limiter = store.limiter_or_insert(keys.config());
        limiter.live_config(now);
        limiter.config = Some(*config);
        limiter.remove_bucket(config.rate_type);
        Ok(())
    }

    pub async fn update_rate(
        &self,
        keys: &LimiterKeys,
        config: &RateLimiterConfig,
        now: u64,
    ) -> Result<(), Error> {
        let mut store = self.lock(keys.config());
        let limiter = store.limiter_or_insert(keys.config());
        let old = limiter.live_config(now);
        limiter.config = Some(*config);
        if old.map(|c| c.rate_type) != Some(config.rate_type) {
            limiter.remove_bucket(config.rate_type);
            return Ok(());
        }
        if let Some(bucket) = limiter.bucket(config.rate_type, now) {
            let (skip, released) = bucket.stale(now as i64 - config.interval_ms() as i64);
            bucket.remove_first(skip, released);
            if bucket.value.is_some() || bucket.total > 0 {
                bucket.value = Some(config.rate as i64 - bucket.total as i64);
            }
        }
        Ok(())
    }

    pub async fn config(&self, keys: &LimiterKeys, now: u64) -> Result<Option<RateLimiterConfig>, Error> {
        let mut store = self.lock(keys.config());
        Ok(store
            .limiters
            .get_mut(keys.config())
            .and_then(|l| l.live_config(now)))
    }

    pub async fn keep_alive(&self, keys: &LimiterKeys, keep_ms: u64, now: u64) -> Result<(), Error> {
        let mut store = self.lock(keys.config());
        let limiter = store.limiters.get_mut(keys.config());
        let Some((limiter, mut config)) = limiter.and_then(|l| l.live_config(now).map(|c| (l, c))) else {
            return Err(Error::NotInitialized {
                name: keys.config().to_owned(),
            });
        };
        config.keep_alive = (keep_ms > 0).then(|| Duration::from_millis(keep_ms));
        limiter.config = Some(config);
        let expires = (keep_ms > 0).then_some(now + keep_ms);
        limiter.config_expires = expires;
        if let Some(bucket) = limiter.bucket(config.rate_type, now) {
            bucket.expires = expires;
        }
        Ok(())
    }

    pub async fn expire(&self, keys: &LimiterKeys, ttl_ms: u64, now: u64) -> Result<bool, Error> {
        let mut store = self.lock(keys.config());
        let Some(limiter) = store.limiters.get_mut(keys.config()) else {
            return Ok(false);
        };
        limiter.expire_all(now);
        for bucket in limiter.buckets_mut() {
            bucket.expires = Some(now + ttl_ms);
        }
        if limiter.config.is_none() {
            return Ok(false);
        }
        limiter.config_expires = Some(now + ttl_ms);
        Ok(true)
    }

    pub async fn delete(&self, keys: &LimiterKeys, now: u64) -> Result<bool, Error> {
        let mut store = self.lock(keys.config());
        let Some(mut limiter) = store.limiters.remove(keys.config()) else {
            return Ok(false);
        };
        limiter.expire_all(now);
        Ok(!limiter.is_empty())
    }

    pub async fn is_exists(&self, keys: &LimiterKeys, now: u64) -> Result<bool, Error> {
        let mut store = self.lock(keys.config());
        Ok(store
            .limiters
            .get_mut(keys.config())
            .is_some_and(|l| l.live_config(now).is_some()))
    }

    /// Number of limiters held (live or not yet swept); for tests of the sweep.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap().limiters.len()).sum()
    }
}

/// Plans one bucket: release what left the window, rebuild a lost value from the log.
fn plan(call: usize, bucket: Option<&Bucket>, resolved: &Resolved, now: i64) -> Plan {
    let config = &resolved.config;
    let rate = config.rate as i64;
    let cutoff = now - config.interval_ms() as i64;
    let mut plan = Plan {
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
        Some(_) if resolved.change == ConfigChange::Changed => plan.value = rate - plan.live,
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

/// Phase 3 of a decision: the writes `acquire.lua` makes.
fn commit(
    locked: &mut Locked<'_>,
    calls: &[Call<'_>],
    resolved: &[Resolved],
    plans: &[Plan],
    granted: bool,
    now: u64,
    clock_now: u64,
) {
    for (i, (call, r)) in calls.iter().zip(resolved).enumerate() {
        let name = call.keys.config();
        let store = locked.store(name);
        store.seq += 1;
        let seq = store.seq;
        // A kept config means the limiter exists: one lookup, no insertion.
        let limiter = match r.change {
            ConfigChange::Kept => store.limiters.get_mut(name).expect("found in phase 1"),
            _ => store.limiter_or_insert(name),
        };
        if r.change != ConfigChange::Kept {
            limiter.config = Some(r.config);
        }
        let plan = &plans[r.plan];
        let kind = r.config.rate_type;
        // Each bucket is settled once, by the first call that planned it.
        if plan.call == i {
            if plan.clear {
                limiter.remove_bucket(kind);
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
            bucket.log.insert((now, seq), call.permits as u32);
            bucket.total += call.permits;
        }
        // Redisson's TTL rule: keepAliveTime on all three keys, else the config's TTL.
        let expires = match r.config.keep_alive_ms() {
            0 => limiter.config_expires.filter(|&t| t > clock_now),
            keep => {
                limiter.config_expires = Some(clock_now + keep);
                Some(clock_now + keep)
            }
        };
        if let (Some(expires), Some(bucket)) = (expires, limiter.bucket(kind, clock_now)) {
            bucket.expires = Some(expires);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn a_rule_creates_its_config_and_grants() {
        let backend = MemoryBackend::default();
        let keys = LimiterKeys::new("a", "c").unwrap();
        let config = RateLimiterConfig::new(RateType::Overall, 2, Duration::from_secs(1));
        let calls = [Call {
            keys: &keys,
            permits: 1,
            rule: Some(&config),
        }];
        let out = block_on(backend.acquire(&calls, 1_000)).unwrap();
        assert!(out.granted);
        assert_eq!(out.rules, vec![(1, ConfigChange::Created)]);
    }

    #[test]
    fn idle_limiters_are_swept() {
        let backend = MemoryBackend::default();
        let config = RateLimiterConfig::new(RateType::Overall, 5, Duration::from_millis(100))
            .with_keep_alive(Duration::from_millis(100));
        block_on(async {
            for user in 0..10_000 {
                let keys = LimiterKeys::new(&format!("user:{user}"), "c").unwrap();
                let calls = [Call {
                    keys: &keys,
                    permits: 1,
                    rule: Some(&config),
                }];
                backend.acquire(&calls, 1_000).await.unwrap();
            }
            assert_eq!(backend.len(), 10_000);
            // Past the keep-alive, new traffic sweeps the idle limiters away.
            let keys = LimiterKeys::new("hot", "c").unwrap();
            for call in 0..6_000u64 {
                let calls = [Call {
                    keys: &keys,
                    permits: 1,
                    rule: Some(&config),
                }];
                backend.acquire(&calls, 2_000 + call * 100).await.unwrap();
            }
        });
        assert_eq!(backend.len(), 1);
    }
}
