//! The in-process twins of the scripts that manage a limiter rather than decide a
//! call: `lua/try_set_rate.lua`, `lua/configure.lua`, `lua/release.lua`,
//! `lua/keep_alive.lua`, `lua/expire.lua` and `lua/reset.lua` (a limiter's
//! deletion, and a token bucket's), with the reads of its config beside them.

use std::time::Duration;

use super::{shard_of, MemoryBackend};
use crate::algorithm::ttl::ttl_rule;
use crate::backend::Configure;
use crate::{Error, LimiterKeys, RateLimiterConfig, RateType};

impl MemoryBackend {
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
        let hash = self.hash(keys.config());
        let mut store = self.lock_shard(shard_of(hash));
        if let Some(limiter) = store.limiters.get_hashed(hash, keys.config()) {
            if limiter.live_config(now).is_some() {
                return Ok(false);
            }
        }
        self.room_for(&mut store, hash, keys.config(), now, &[hash])?;
        let limiter = store.limiters.get_or_insert(hash, keys.config());
        // Configured by hand: kept at the bound (its config is no rule's).
        limiter.by_rule = false;
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
        let hash = self.hash(keys.config());
        let mut store = self.lock_shard(shard_of(hash));
        let exists = store
            .limiters
            .get_hashed(hash, keys.config())
            .is_some_and(|l| l.live_config(now).is_some());
        if how.require_exists && !exists {
            return Ok(false);
        }
        self.room_for(&mut store, hash, keys.config(), now, &[hash])?;
        let limiter = store.limiters.get_or_insert(hash, keys.config());
        limiter.by_rule = false;
        let old = limiter.live_config(now);
        limiter.config = Some(*config);
        let keep = config.keep_alive_ms();
        // A keep-alive removed takes its expiry with it (the config's, and the kept
        // window's below).
        let kept_alive = old.is_some_and(|old| old.keep_alive_ms() > 0);
        if keep > 0 {
            limiter.config_expires = Some(now + keep);
        } else if kept_alive {
            limiter.config_expires = None;
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
            } else if kept_alive {
                bucket.expires = None;
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
        let expires = ttl_rule(config.keep_alive_ms(), &mut limiter.config_expires, now, now);
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
        if keep_ms > 0 && keep_ms < config.interval_ms() {
            // As `lua/keep_alive.lua` refuses it, and Redisson.
            return Err(Error::InvalidConfig {
                name: keys.config().to_owned(),
                problem: crate::rules::config::KEEP_ALIVE_SHORT,
            });
        }
        config.keep_alive = (keep_ms > 0).then(|| Duration::from_millis(keep_ms));
        limiter.config = Some(config);
        limiter.by_rule = false;
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
        limiter.by_rule = false;
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
        if limiter.removable() && store.limiters.remove(keys.config()) {
            self.room.give_back(1);
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
}
