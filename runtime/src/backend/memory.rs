//! The in-process backend: `lua/acquire.lua` and friends, step for step, over maps.
//!
//! State is grouped by limiter name; each limiter has its config and one bucket
//! (available permits plus the grant log) per value key, so the overall bucket and
//! each client's per_client bucket are separate, as in Redis. TTLs follow the same
//! rules as the scripts, measured on the client's clock, and expired limiters are swept
//! so memory does not grow with the number of limiters ever seen.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{Call, ConfigChange, Outcome};
use crate::{Error, LimiterKeys, RateLimiterConfig, RateType};

/// How far a call's time may lag the newest grant and still be decided at that
/// grant's time (acquire.lua's REORDER).
const REORDER_MS: u64 = 1000;

#[derive(Default)]
pub(crate) struct MemoryBackend {
    store: Mutex<Store>,
}

#[derive(Default)]
struct Store {
    limiters: HashMap<String, Limiter>,
    /// Calls since the last sweep, and the map's size after it.
    calls: usize,
    swept_len: usize,
    seq: u64,
}

#[derive(Default)]
struct Limiter {
    config: Option<RateLimiterConfig>,
    config_expires: Option<u64>,
    /// Keyed by the bucket's value key (`{NAME}:value` or `{NAME}:value:ID`).
    buckets: HashMap<String, Bucket>,
}

#[derive(Default)]
struct Bucket {
    value: Option<i64>,
    /// (score, sequence) -> permits; the sequence stands in for the random member.
    log: BTreeMap<(u64, u64), u32>,
    /// Sum of the permits in `log`.
    total: u64,
    expires: Option<u64>,
}

impl Bucket {
    fn is_empty(&self) -> bool {
        self.value.is_none() && self.log.is_empty()
    }

    /// Entries with score <= cutoff, and their permits.
    fn stale(&self, cutoff: i64) -> (usize, u64) {
        if cutoff < 0 {
            return (0, 0);
        }
        self.log
            .range(..=(cutoff as u64, u64::MAX))
            .fold((0, 0), |(n, sum), (_, &p)| (n + 1, sum + u64::from(p)))
    }

    /// Milliseconds until `need` permits of the log after its first `skip` entries
    /// have left the window; `None` when it holds fewer (plus `pending`).
    fn wait_for(&self, skip: usize, need: i64, interval: i64, now: i64, pending: i64) -> Option<i64> {
        let mut acc = 0i64;
        for (&(score, _), &p) in self.log.iter().skip(skip) {
            acc += i64::from(p);
            if acc >= need {
                return Some(score as i64 + interval - now);
            }
        }
        (acc + pending >= need).then_some(interval)
    }
}

impl Limiter {
    fn live_config(&mut self, now: u64) -> Option<RateLimiterConfig> {
        if self.config_expires.is_some_and(|t| t <= now) {
            self.config = None;
            self.config_expires = None;
        }
        self.config
    }

    fn bucket(&mut self, key: &str, now: u64) -> Option<&mut Bucket> {
        if self
            .buckets
            .get(key)
            .is_some_and(|b| b.expires.is_some_and(|t| t <= now))
        {
            self.buckets.remove(key);
        }
        self.buckets.get_mut(key)
    }

    fn is_empty(&self) -> bool {
        self.config.is_none() && self.buckets.is_empty()
    }

    fn expire_all(&mut self, now: u64) {
        self.live_config(now);
        self.buckets
            .retain(|_, b| b.expires.is_none_or(|t| t > now) && !b.is_empty());
    }
}

/// What a decision does to one bucket, computed before anything is written.
struct Plan {
    name: String,
    key: String,
    cutoff: i64,
    live: i64,
    value: i64,
    skip: usize,
    spent: i64,
    dirty: bool,
    clear: bool,
}

fn bucket_key(keys: &LimiterKeys, kind: RateType) -> &str {
    match kind {
        RateType::Overall => &keys.value,
        RateType::PerClient => &keys.client_value,
    }
}

impl MemoryBackend {
    fn lock(&self) -> MutexGuard<'_, Store> {
        // A panic elsewhere cannot leave a half-made decision: every mutation below
        // happens after all checks, so the state is usable even after poisoning.
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub async fn acquire(&self, calls: &[Call<'_>], now: u64) -> Result<Outcome, Error> {
        let mut store = self.lock();
        store.sweep_if_due(now);

        // Phase 1: resolve each rule's config, writing nothing.
        let mut resolved = Vec::with_capacity(calls.len());
        for call in calls {
            let name = &call.keys.config;
            let limiter = store.limiters.get_mut(name.as_str());
            let stored = limiter.and_then(|l| l.live_config(now));
            let (config, change) = match (call.rule, stored) {
                (Some(rule), Some(old)) if *rule == old => (old, ConfigChange::Kept),
                (Some(rule), Some(_)) => (*rule, ConfigChange::Changed),
                (Some(rule), None) => (*rule, ConfigChange::Created),
                (None, Some(old)) => (old, ConfigChange::Kept),
                (None, None) => return Err(Error::NotInitialized { name: name.clone() }),
            };
            if call.permits > config.rate {
                return Err(Error::PermitsExceedRate {
                    name: name.clone(),
                    permits: call.permits,
                    rate: config.rate,
                });
            }
            resolved.push((config, change, stored));
        }

        // A call that reaches the state after a slightly later one is decided at the
        // later time, so each log stays in time order (as in acquire.lua).
        let newest = calls
            .iter()
            .zip(&resolved)
            .filter_map(|(call, (config, _, _))| {
                let limiter = store.limiters.get_mut(call.keys.config.as_str())?;
                let bucket = limiter.bucket(bucket_key(call.keys, config.rate_type), now)?;
                bucket.log.last_key_value().map(|(&(score, _), _)| score)
            })
            .max()
            .unwrap_or(now);
        let clock_now = now;
        let now = if newest > now && newest - now <= REORDER_MS {
            newest
        } else {
            now
        };
        let now_i = now as i64;

        // Phase 2: plan each bucket once and take each rule's permits, writing nothing.
        let mut configs = Vec::with_capacity(calls.len());
        let mut plans: Vec<Plan> = Vec::with_capacity(calls.len());
        let (mut refused, mut retry) = (None, 0i64);
        for (i, (call, &(config, change, stored))) in calls.iter().zip(&resolved).enumerate() {
            let name = &call.keys.config;
            let rate = config.rate as i64;
            let interval = config.interval_ms() as i64;
            let key = bucket_key(call.keys, config.rate_type);
            let mode_changed = change == ConfigChange::Changed
                && stored.is_some_and(|old| old.rate_type != config.rate_type);
            let at = match plans.iter().position(|p| p.key == key) {
                Some(at) => at,
                None => {
                    let limiter = store.limiters.get_mut(name.as_str());
                    let bucket = limiter.and_then(|l| l.bucket(key, clock_now));
                    plans.push(plan(name, key, bucket, &config, change, mode_changed, now_i));
                    plans.len() - 1
                }
            };
            let plan = &mut plans[at];
            if call.permits > 0 {
                let permits = call.permits as i64;
                if plan.value - plan.spent < permits {
                    let mut wait = None;
                    if !plan.clear {
                        let bucket = store.limiters.get(name.as_str()).and_then(|l| l.buckets.get(key));
                        let empty = Bucket::default();
                        let bucket = bucket.unwrap_or(&empty);
                        let need = permits + plan.spent - plan.value;
                        wait = bucket.wait_for(plan.skip, need, interval, now_i, plan.spent);
                        if wait.is_none() {
                            plan.value = rate - plan.live;
                            plan.dirty = true;
                            if plan.value - plan.spent < permits {
                                let need = permits + plan.spent - plan.value;
                                wait = Some(
                                    bucket
                                        .wait_for(plan.skip, need, interval, now_i, plan.spent)
                                        .unwrap_or(interval),
                                );
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
            configs.push((config, change, at));
        }

        let granted = refused.is_none();
        let probe = calls.iter().all(|c| c.permits == 0);
        let rules = configs
            .iter()
            .map(|&(_, change, at)| {
                let p = &plans[at];
                let left = if granted { p.value - p.spent } else { p.value };
                (left.max(0) as u64, change)
            })
            .collect();
        if !probe {
            store.seq = commit(&mut store, calls, &configs, &plans, granted, now, clock_now);
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
        let mut store = self.lock();
        let limiter = store.limiters.entry(keys.config.clone()).or_default();
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
        let mut store = self.lock();
        let limiter = store.limiters.entry(keys.config.clone()).or_default();
        limiter.live_config(now);
        limiter.config = Some(*config);
        limiter.buckets.remove(bucket_key(keys, config.rate_type));
        Ok(())
    }

    pub async fn update_rate(
        &self,
        keys: &LimiterKeys,
        config: &RateLimiterConfig,
        now: u64,
    ) -> Result<(), Error> {
        let mut store = self.lock();
        let limiter = store.limiters.entry(keys.config.clone()).or_default();
        let old = limiter.live_config(now);
        limiter.config = Some(*config);
        let key = bucket_key(keys, config.rate_type);
        if old.map(|c| c.rate_type) != Some(config.rate_type) {
            limiter.buckets.remove(key);
            return Ok(());
        }
        if let Some(bucket) = limiter.bucket(key, now) {
            let cutoff = now as i64 - config.interval_ms() as i64;
            let (skip, released) = bucket.stale(cutoff);
            remove_first(bucket, skip, released);
            if bucket.value.is_some() || bucket.total > 0 {
                bucket.value = Some(config.rate as i64 - bucket.total as i64);
            }
        }
        Ok(())
    }

    pub async fn config(&self, keys: &LimiterKeys, now: u64) -> Result<Option<RateLimiterConfig>, Error> {
        let mut store = self.lock();
        Ok(store
            .limiters
            .get_mut(&keys.config)
            .and_then(|l| l.live_config(now)))
    }

    pub async fn keep_alive(&self, keys: &LimiterKeys, keep_ms: u64, now: u64) -> Result<(), Error> {
        let mut store = self.lock();
        let limiter = store.limiters.get_mut(&keys.config);
        let Some((limiter, mut config)) = limiter.and_then(|l| l.live_config(now).map(|c| (l, c))) else {
            return Err(Error::NotInitialized {
                name: keys.config.clone(),
            });
        };
        config.keep_alive = (keep_ms > 0).then(|| std::time::Duration::from_millis(keep_ms));
        limiter.config = Some(config);
        let expires = (keep_ms > 0).then_some(now + keep_ms);
        limiter.config_expires = expires;
        if let Some(bucket) = limiter.bucket(bucket_key(keys, config.rate_type), now) {
            bucket.expires = expires;
        }
        Ok(())
    }

    pub async fn expire(&self, keys: &LimiterKeys, ttl_ms: u64, now: u64) -> Result<bool, Error> {
        let mut store = self.lock();
        let Some(limiter) = store.limiters.get_mut(&keys.config) else {
            return Ok(false);
        };
        limiter.expire_all(now);
        for key in [&keys.value, &keys.client_value] {
            if let Some(bucket) = limiter.buckets.get_mut(key.as_str()) {
                bucket.expires = Some(now + ttl_ms);
            }
        }
        if limiter.config.is_none() {
            return Ok(false);
        }
        limiter.config_expires = Some(now + ttl_ms);
        Ok(true)
    }

    pub async fn delete(&self, keys: &LimiterKeys, now: u64) -> Result<bool, Error> {
        let mut store = self.lock();
        let Some(limiter) = store.limiters.get_mut(&keys.config) else {
            return Ok(false);
        };
        limiter.expire_all(now);
        let mut deleted = limiter.config.take().is_some();
        limiter.config_expires = None;
        for key in [&keys.value, &keys.client_value] {
            deleted |= limiter.buckets.remove(key.as_str()).is_some();
        }
        if limiter.is_empty() {
            store.limiters.remove(&keys.config);
        }
        Ok(deleted)
    }

    pub async fn is_exists(&self, keys: &LimiterKeys, now: u64) -> Result<bool, Error> {
        let mut store = self.lock();
        Ok(store
            .limiters
            .get_mut(&keys.config)
            .is_some_and(|l| l.live_config(now).is_some()))
    }

    /// Number of limiters held (live or not yet swept); for tests of the sweep.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().limiters.len()
    }
}

/// Plans one bucket: release what left the window, rebuild a lost value from the log.
fn plan(
    name: &str,
    key: &str,
    bucket: Option<&mut Bucket>,
    config: &RateLimiterConfig,
    change: ConfigChange,
    mode_changed: bool,
    now: i64,
) -> Plan {
    let rate = config.rate as i64;
    let cutoff = now - config.interval_ms() as i64;
    let mut plan = Plan {
        name: name.to_owned(),
        key: key.to_owned(),
        cutoff,
        live: 0,
        value: rate,
        skip: 0,
        spent: 0,
        dirty: true,
        clear: mode_changed,
    };
    if mode_changed {
        return plan;
    }
    let empty = Bucket::default();
    let bucket = bucket.map_or(&empty, |b| &*b);
    let (skip, released) = bucket.stale(cutoff);
    let live = (bucket.total - released) as i64;
    plan.skip = skip;
    plan.live = live;
    match bucket.value {
        None => plan.value = rate - live,
        Some(_) if change == ConfigChange::Changed => plan.value = rate - live,
        Some(value) if released > 0 => {
            let released = released as i64;
            plan.value = if value + released > rate {
                rate - live
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

fn remove_first(bucket: &mut Bucket, n: usize, permits: u64) {
    for _ in 0..n {
        bucket.log.pop_first();
    }
    bucket.total -= permits;
}

/// Phase 2 of a decision: the writes `acquire.lua` makes. Returns the next sequence.
fn commit(
    store: &mut Store,
    calls: &[Call<'_>],
    configs: &[(RateLimiterConfig, ConfigChange, usize)],
    plans: &[Plan],
    granted: bool,
    now: u64,
    clock_now: u64,
) -> u64 {
    for (call, (config, change, _)) in calls.iter().zip(configs) {
        if *change != ConfigChange::Kept {
            let limiter = store.limiters.entry(call.keys.config.clone()).or_default();
            limiter.config = Some(*config);
        }
    }
    for plan in plans {
        let limiter = store.limiters.entry(plan.name.clone()).or_default();
        if plan.clear {
            limiter.buckets.remove(&plan.key);
        } else if let Some(bucket) = limiter.bucket(&plan.key, clock_now) {
            let (skip, released) = bucket.stale(plan.cutoff);
            remove_first(bucket, skip, released);
        }
        if granted || plan.dirty {
            let bucket = limiter.buckets.entry(plan.key.clone()).or_default();
            bucket.value = Some(if granted {
                plan.value - plan.spent
            } else {
                plan.value
            });
        }
    }
    let mut seq = store.seq;
    for (call, (config, _, at)) in calls.iter().zip(configs) {
        let limiter = store.limiters.entry(call.keys.config.clone()).or_default();
        if granted {
            let bucket = limiter.buckets.entry(plans[*at].key.clone()).or_default();
            seq += 1;
            bucket.log.insert((now, seq), call.permits as u32);
            bucket.total += call.permits;
        }
        // Redisson's TTL rule: keepAliveTime on all three keys, else the config's TTL.
        let expires = match config.keep_alive_ms() {
            0 => limiter.config_expires.filter(|&t| t > clock_now),
            keep => {
                limiter.config_expires = Some(clock_now + keep);
                Some(clock_now + keep)
            }
        };
        if let (Some(expires), Some(bucket)) = (expires, limiter.buckets.get_mut(&plans[*at].key)) {
            bucket.expires = Some(expires);
        }
    }
    seq
}

impl Store {
    /// Drops expired limiters once the map has doubled or enough calls went by, so
    /// the work is constant per call on average.
    fn sweep_if_due(&mut self, now: u64) {
        self.calls += 1;
        let len = self.limiters.len();
        if len < 2 * self.swept_len.max(512) && self.calls < (len / 2).max(1024) {
            return;
        }
        self.limiters.retain(|_, limiter| {
            limiter.expire_all(now);
            !limiter.is_empty()
        });
        self.calls = 0;
        self.swept_len = self.limiters.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn rule(keys: &LimiterKeys, config: &RateLimiterConfig) -> Outcome {
        let backend = MemoryBackend::default();
        let calls = [Call {
            keys,
            permits: 1,
            rule: Some(config),
        }];
        futures_lite(backend.acquire(&calls, 1_000)).unwrap()
    }

    /// Drives a future that never waits (the memory backend never does).
    fn futures_lite<F: std::future::Future>(f: F) -> F::Output {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(f)
    }

    #[test]
    fn a_rule_creates_its_config_and_grants() {
        let keys = LimiterKeys::new("a", "c").unwrap();
        let config = RateLimiterConfig::new(RateType::Overall, 2, Duration::from_secs(1));
        let out = rule(&keys, &config);
        assert!(out.granted);
        assert_eq!(out.rules, vec![(1, ConfigChange::Created)]);
    }

    #[test]
    fn idle_limiters_are_swept() {
        let backend = MemoryBackend::default();
        let config = RateLimiterConfig::new(RateType::Overall, 5, Duration::from_millis(100))
            .with_keep_alive(Duration::from_millis(100));
        futures_lite(async {
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
            for call in 0..6_000u64 {
                let keys = LimiterKeys::new("hot", "c").unwrap();
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
