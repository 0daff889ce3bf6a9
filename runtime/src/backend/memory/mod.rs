//! The in-process backend: `lua/acquire.lua` and friends, step for step, over maps.
//!
//! TTLs follow the same rules as the scripts, measured on the client's clock, and
//! expired limiters are swept so memory does not grow with the number of limiters
//! ever seen. Keys are never formatted: limiters are found by name, buckets by mode.

mod decide;
mod state;
mod tokens;

use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use self::state::Store;
use super::Configure;
use crate::{Error, LimiterKeys, RateLimiterConfig, RateType};

/// How far a call's time may lag the newest grant and still be decided at that
/// grant's time (REORDER in lua/call_time.lua).
const REORDER_MS: u64 = 1000;

/// Limiters are spread over this many independently locked shards, so threads
/// deciding different limiters rarely wait for each other.
const SHARDS: usize = 16;

pub(crate) struct MemoryBackend {
    shards: Box<[Mutex<Store>]>,
    /// Names come from callers (API keys, addresses), so they are hashed with a
    /// randomly keyed SipHash, as std's map does: once per decision, for the shard and
    /// for the shard's table alike.
    hasher: RandomState,
}

/// Every `SWEEP_EVERY`th decision of a thread also sweeps the next shard in turn, so
/// shards no traffic reaches are cleaned too. Counted per thread: a counter shared by
/// every thread would be written by all of them on every decision.
const SWEEP_EVERY: usize = 256;

thread_local! {
    static DECISIONS: Cell<usize> = const { Cell::new(0) };
}

impl Default for MemoryBackend {
    fn default() -> Self {
        let hasher = RandomState::new();
        MemoryBackend {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Store::new(hasher.clone())))
                .collect(),
            hasher,
        }
    }
}

/// The shard of a limiter whose name hashes to `hash`: bits the shard's table does not
/// use to place it (it takes the low bits, and the top seven as tags).
fn shard_of(hash: u64) -> usize {
    (hash >> 32) as usize % SHARDS
}

/// The shards one decision touches, locked in index order so that two decisions
/// over the same shards cannot deadlock. One shard (the usual call) needs no list.
enum Locked<'a> {
    One(MutexGuard<'a, Store>),
    Many(Vec<(usize, MutexGuard<'a, Store>)>),
}

impl Locked<'_> {
    /// The store of the limiter whose name hashes to `hash`.
    fn store(&mut self, hash: u64) -> &mut Store {
        match self {
            Locked::One(guard) => guard,
            Locked::Many(guards) => {
                let shard = shard_of(hash);
                let (_, guard) = guards
                    .iter_mut()
                    .find(|(i, _)| *i == shard)
                    .expect("every shard of the call is locked");
                guard
            }
        }
    }

    /// Runs `f` on every locked shard's store.
    fn each_store(&mut self, mut f: impl FnMut(&mut Store)) {
        match self {
            Locked::One(guard) => f(guard),
            Locked::Many(guards) => guards.iter_mut().for_each(|(_, guard)| f(guard)),
        }
    }
}

impl MemoryBackend {
    /// The shard of `name`, locked. A panic elsewhere cannot leave a half-made
    /// decision (every mutation happens after all checks), so poisoning is ignored.
    fn lock(&self, name: &str) -> MutexGuard<'_, Store> {
        self.lock_shard(shard_of(self.hash(name)))
    }

    fn lock_shard(&self, shard: usize) -> MutexGuard<'_, Store> {
        self.shards[shard].lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The hash of a limiter name, for [`shard_of`] and the shard's table.
    fn hash(&self, name: &str) -> u64 {
        self.hasher.hash_one(name)
    }

    /// The shards of the limiters whose names hash to `hashes`, locked.
    fn lock_all(&self, hashes: &[u64]) -> Locked<'_> {
        let first = hashes.first().map_or(0, |&h| shard_of(h));
        if hashes.iter().skip(1).all(|&h| shard_of(h) == first) {
            return Locked::One(self.lock_shard(first));
        }
        let mut shards: Vec<usize> = hashes.iter().map(|&h| shard_of(h)).collect();
        shards.sort_unstable();
        shards.dedup();
        Locked::Many(shards.into_iter().map(|i| (i, self.lock_shard(i))).collect())
    }

    /// Sweeps one shard in turn every `SWEEP_EVERY` decisions of this thread, unless
    /// it is busy.
    fn sweep_in_turn(&self, now: u64) {
        let n = DECISIONS.with(|d| {
            let n = d.get();
            d.set(n.wrapping_add(1));
            n
        });
        if n % SWEEP_EVERY == 0 {
            if let Ok(mut store) = self.shards[(n / SWEEP_EVERY) % SHARDS].try_lock() {
                store.sweep(now);
            }
        }
    }

    pub async fn delete_bucket(&self, keys: &LimiterKeys, mode: RateType, now: u64) -> Result<bool, Error> {
        let mut store = self.lock(keys.config());
        let Some(limiter) = store.limiters.get_mut(keys.config()) else {
            return Ok(false);
        };
        let existed = limiter.tokens(mode, now).is_some();
        limiter.remove_tokens(mode);
        Ok(existed)
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
        if config.keep_alive_ms() > 0 {
            limiter.config_expires = Some(now + config.keep_alive_ms());
        }
        Ok(true)
    }

    /// `lua/configure.lua`, step for step.
    pub async fn configure(
        &self,
        keys: &LimiterKeys,
        config: &RateLimiterConfig,
        how: Configure,
        now: u64,
    ) -> Result<bool, Error> {
        let mut store = self.lock(keys.config());
        let exists = store
            .limiters
            .get_mut(keys.config())
            .is_some_and(|l| l.live_config(now).is_some());
        if how.require_exists && !exists {
            return Ok(false);
        }
        let limiter = store.limiter_or_insert(keys.config());
        let old = limiter.live_config(now);
        limiter.config = Some(*config);
        let keep = config.keep_alive_ms();
        if keep > 0 {
            limiter.config_expires = Some(now + keep);
        }
        if old.is_some_and(|old| old.rate_type != config.rate_type) {
            limiter.remove_bucket(RateType::Overall);
            limiter.remove_bucket(RateType::PerClient);
            return Ok(true);
        }
        if !how.keep_state {
            limiter.remove_bucket(config.rate_type);
            return Ok(true);
        }
        let expires = limiter.config_expires.filter(|&t| t > now);
        if let Some(bucket) = limiter.bucket(config.rate_type, now) {
            let (skip, released) = bucket.stale(now as i64 - config.interval_ms() as i64);
            bucket.remove_first(skip, released);
            if bucket.value.is_some() || bucket.total > 0 {
                bucket.value = Some(config.rate as i64 - bucket.total as i64);
            }
            if expires.is_some() {
                bucket.expires = expires;
            }
        }
        Ok(true)
    }

    /// `lua/release.lua`, step for step: the permits come out of the newest grants.
    pub async fn release(&self, keys: &LimiterKeys, permits: u64, now: u64) -> Result<(), Error> {
        let mut store = self.lock(keys.config());
        let not_initialized = || Error::NotInitialized {
            name: keys.config().to_owned(),
        };
        let limiter = store
            .limiters
            .get_mut(keys.config())
            .ok_or_else(not_initialized)?;
        let config = limiter.live_config(now).ok_or_else(not_initialized)?;
        let expires = match config.keep_alive_ms() {
            0 => limiter.config_expires.filter(|&t| t > now),
            keep => {
                limiter.config_expires = Some(now + keep);
                Some(now + keep)
            }
        };
        let rate = config.rate as i64;
        let bucket = limiter.bucket_or_default(config.rate_type);
        let (skip, released) = bucket.stale(now as i64 - config.interval_ms() as i64);
        bucket.remove_first(skip, released);
        let live = bucket.total as i64;
        let mut value = match bucket.value {
            None => rate - live,
            Some(value) if value + released as i64 > rate => rate - live,
            Some(value) => value + released as i64,
        };
        let taken = bucket.take_newest(permits);
        value = (value + taken as i64).min(rate);
        bucket.value = Some(value);
        if expires.is_some() {
            bucket.expires = expires;
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

    /// Deletes the sliding window's state (config, values, logs) and keeps the token
    /// buckets of the same name, whose keys are others (as the Redis backend's DEL).
    pub async fn delete(&self, keys: &LimiterKeys, now: u64) -> Result<bool, Error> {
        let mut store = self.lock(keys.config());
        let Some(limiter) = store.limiters.get_mut(keys.config()) else {
            return Ok(false);
        };
        limiter.expire_all(now);
        let existed = limiter.remove_window();
        if limiter.is_empty() {
            store.limiters.remove(keys.config());
        }
        Ok(existed)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Call, ConfigChange};

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
            keys: keys.borrowed(),
            permits: 1,
            rule: Some(&config),
            bucket: None,
        }];
        let out = block_on(backend.acquire(&calls, 1_000)).unwrap();
        assert!(out.granted);
        assert_eq!(
            out.rules.to_vec(),
            vec![crate::backend::RuleOutcome {
                left: 1,
                config: ConfigChange::Created
            }]
        );
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
                    keys: keys.borrowed(),
                    permits: 1,
                    rule: Some(&config),
                    bucket: None,
                }];
                backend.acquire(&calls, 1_000).await.unwrap();
            }
            assert_eq!(backend.len(), 10_000);
            // Past the keep-alive, new traffic sweeps the idle limiters away.
            let keys = LimiterKeys::new("hot", "c").unwrap();
            for call in 0..6_000u64 {
                let calls = [Call {
                    keys: keys.borrowed(),
                    permits: 1,
                    rule: Some(&config),
                    bucket: None,
                }];
                backend.acquire(&calls, 2_000 + call * 100).await.unwrap();
            }
        });
        assert_eq!(backend.len(), 1);
    }
}
