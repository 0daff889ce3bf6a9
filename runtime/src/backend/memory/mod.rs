//! The in-process backend: `lua/acquire.lua` and friends, step for step, over maps.
//!
//! TTLs follow the same rules as the scripts, measured on the client's clock, and
//! expired limiters are swept so memory does not grow with the number of limiters
//! ever seen. Keys are never formatted: limiters are found by name, buckets by mode.
//!
//! What a decision costs does not grow with the number of limiters held: sweeping
//! goes round each shard's table a few buckets at a time (see [`MOST_SWEPT`]), and
//! the number of limiters held has a bound ([`crate::DEFAULT_MAX_LIMITERS`] unless
//! the builder says otherwise). At the bound a decision that would create a limiter
//! first sweeps its shard for expired ones; finding none, it is refused with
//! [`Error::MemoryFull`]: the limiters held are never dropped to make room, so no
//! key's window is ever forgotten early.

mod decide;
mod state;

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

pub(crate) use self::decide::OneRule;
use self::state::Store;
use super::Configure;
use crate::algorithm::ttl::ttl_rule;
use crate::{Error, LimiterKeys, RateLimiterConfig, RateType};

/// The most live limiters an in-process backend holds, unless
/// [`ClientBuilder::max_limiters`](crate::ClientBuilder::max_limiters) says otherwise.
pub const DEFAULT_MAX_LIMITERS: usize = 100_000;

/// Limiters are spread over this many independently locked shards, so threads
/// deciding different limiters rarely wait for each other.
const SHARDS: usize = 16;

/// Every `SWEEP_EVERY`th decision of a thread sweeps [`IN_TURN`] buckets of the next
/// shard in turn, so shards no traffic reaches are cleaned too. Counted per thread: a
/// counter shared by every thread would be written by all of them on every decision.
const SWEEP_EVERY: usize = 64;
const IN_TURN: usize = 32;
/// Buckets a decision sweeps in a shard for each limiter it created there, so that
/// new limiters pay for the sweeping they make necessary: a shard's table of `B`
/// buckets is gone round once every `B / 4` new limiters.
const PER_NEW: usize = 4;
/// Buckets a decision that needs a new limiter sweeps in each of its shards when the
/// backend holds its maximum, looking for expired limiters to make room.
const AT_BOUND: usize = 32;
/// The most buckets one decision of one rule sweeps, whatever the number of limiters
/// held: one turn, a search for room at the bound, and its own new limiter's share.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const MOST_SWEPT: u64 = (IN_TURN + AT_BOUND + PER_NEW) as u64;

pub(crate) struct MemoryBackend {
    /// Names come from callers (API keys, addresses), so they are hashed with a keyed
    /// hash ([`crate::keys::name_hash`]): once per rule, for the shard and for the
    /// shard's table alike.
    shards: Box<[Mutex<Store>]>,
    room: Room,
}

/// The bound on the limiters held, over every shard. Written only when a limiter is
/// created or dropped, never by a decision on limiters already held.
struct Room {
    held: AtomicUsize,
    max: usize,
    /// Whether reaching the bound has been logged.
    warned: AtomicBool,
}

impl Room {
    /// Takes room for `n` more limiters, unless that would pass the bound.
    fn take(&self, n: usize) -> bool {
        n == 0
            || self
                .held
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                    held.checked_add(n).filter(|&after| after <= self.max)
                })
                .is_ok()
    }

    fn give_back(&self, n: usize) {
        if n > 0 {
            self.held.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// The refusal of a new limiter `name` at the bound: counted, and logged the
    /// first time.
    fn refuse(&self, name: &str) -> Error {
        crate::observe::memory_full();
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                max_limiters = self.max,
                "the in-process rate limiter holds its maximum of {} live limiters: \
                 decisions that need a new limiter are refused until idle ones expire \
                 (limiters held are kept; raise ClientBuilder::max_limiters if this \
                 load is expected). Logged once.",
                self.max
            );
        }
        Error::MemoryFull {
            name: name.to_owned(),
            max: self.max,
        }
    }
}

thread_local! {
    static DECISIONS: Cell<usize> = const { Cell::new(0) };
}

#[cfg(test)]
impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend::new(DEFAULT_MAX_LIMITERS)
    }
}

impl MemoryBackend {
    /// A backend holding at most `max` limiters.
    pub fn new(max: usize) -> Self {
        MemoryBackend {
            shards: (0..SHARDS).map(|_| Mutex::new(Store::new())).collect(),
            room: Room {
                held: AtomicUsize::new(0),
                max,
                warned: AtomicBool::new(false),
            },
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
        crate::keys::name_hash(name)
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

    /// Sweeps [`IN_TURN`] buckets of one shard in turn every `SWEEP_EVERY` decisions
    /// of this thread, unless that shard is busy.
    #[inline]
    fn sweep_in_turn(&self, now: u64) {
        let n = DECISIONS.with(|d| {
            let n = d.get();
            d.set(n.wrapping_add(1));
            n
        });
        if n % SWEEP_EVERY == 0 {
            self.sweep_shard_in_turn(n / SWEEP_EVERY, now);
        }
    }

    #[cold]
    fn sweep_shard_in_turn(&self, turn: usize, now: u64) {
        if let Ok(mut store) = self.shards[turn % SHARDS].try_lock() {
            let dropped = store.sweep(now, IN_TURN);
            self.room.give_back(dropped);
        }
    }

    /// Sweeps `buckets` buckets of `store`.
    fn sweep(&self, store: &mut Store, now: u64, buckets: usize) {
        let dropped = store.sweep(now, buckets);
        self.room.give_back(dropped);
    }

    /// Room for the limiter `name` (hash `hash`) in `store`, when it is not held yet:
    /// at the bound, after sweeping [`AT_BOUND`] buckets for it. Writes nothing but
    /// what the sweep drops.
    fn room_for(&self, store: &mut Store, hash: u64, name: &str, now: u64) -> Result<(), Error> {
        if store.limiters.contains(hash, name) {
            return Ok(());
        }
        if !self.room.take(1) {
            self.sweep(store, now, AT_BOUND);
            if !self.room.take(1) {
                return Err(self.room.refuse(name));
            }
        }
        self.sweep(store, now, PER_NEW);
        Ok(())
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
        let hash = self.hash(keys.config());
        let mut store = self.lock_shard(shard_of(hash));
        if let Some(limiter) = store.limiters.get_hashed(hash, keys.config()) {
            if limiter.live_config(now).is_some() {
                return Ok(false);
            }
        }
        self.room_for(&mut store, hash, keys.config(), now)?;
        let limiter = store.limiters.get_or_insert(hash, keys.config());
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
        self.room_for(&mut store, hash, keys.config(), now)?;
        let limiter = store.limiters.get_or_insert(hash, keys.config());
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
        let (config_expires, expires) = ttl_rule(config.keep_alive_ms(), limiter.config_expires, now, now);
        if config_expires.is_some() {
            limiter.config_expires = config_expires;
        }
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
        if limiter.is_empty() && store.limiters.remove(keys.config()) {
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
            // Past the keep-alive, new traffic sweeps the idle limiters away, a few
            // buckets of a shard in turn: 16 shards of 1 024 buckets, 32 buckets
            // every 64 decisions.
            let keys = LimiterKeys::new("hot", "c").unwrap();
            for call in 0..40_000u64 {
                let calls = [Call {
                    keys: keys.borrowed(),
                    permits: 1,
                    rule: Some(&config),
                    bucket: None,
                }];
                backend.acquire(&calls, 2_000 + call * 10).await.unwrap();
            }
        });
        assert_eq!(backend.len(), 1);
    }

    /// One rule of `rate` per 60 s on `name`, with the keep-alive rules give.
    fn call_on<'a>(keys: &'a LimiterKeys, config: &'a RateLimiterConfig) -> [Call<'a>; 1] {
        [Call {
            keys: keys.borrowed(),
            permits: 1,
            rule: Some(config),
            bucket: None,
        }]
    }

    fn minute(rate: u64) -> RateLimiterConfig {
        RateLimiterConfig::new(RateType::Overall, rate, Duration::from_secs(60))
            .with_keep_alive(Duration::from_secs(60))
    }

    /// Limiters every sweep of `backend` has looked at so far.
    fn swept(backend: &MemoryBackend) -> u64 {
        backend.shards.iter().map(|s| s.lock().unwrap().swept).sum()
    }

    #[test]
    fn a_decision_sweeps_a_bounded_number_of_limiters() {
        let backend = MemoryBackend::new(200_000);
        let config = minute(5);
        block_on(async {
            for user in 0..100_000 {
                let keys = LimiterKeys::new(&format!("user:{user}"), "c").unwrap();
                backend.acquire(&call_on(&keys, &config), 1_000).await.unwrap();
            }
            // Every limiter is live: a sweep finds nothing to drop, yet looks.
            let hot = LimiterKeys::new("hot", "c").unwrap();
            let hot_config = minute(1_000_000);
            let mut most = 0;
            for call in 0..5_000u64 {
                let before = swept(&backend);
                backend
                    .acquire(&call_on(&hot, &hot_config), 2_000 + call)
                    .await
                    .unwrap();
                most = most.max(swept(&backend) - before);
            }
            assert!(
                most <= MOST_SWEPT,
                "one decision swept {most} limiters, more than {MOST_SWEPT}"
            );
        });
    }

    #[test]
    fn distinct_keys_cannot_grow_the_table_past_its_bound() {
        let backend = MemoryBackend::default();
        let config = minute(5);
        block_on(async {
            for user in 0..DEFAULT_MAX_LIMITERS + 1_000 {
                let keys = LimiterKeys::new(&format!("spray:{user}"), "c").unwrap();
                let _ = backend.acquire(&call_on(&keys, &config), 1_000).await;
            }
        });
        assert!(
            backend.len() <= DEFAULT_MAX_LIMITERS,
            "{} limiters held, the bound is {DEFAULT_MAX_LIMITERS}",
            backend.len()
        );
    }

    fn bucket_call<'a>(keys: &'a LimiterKeys, config: &'a RateLimiterConfig) -> [Call<'a>; 1] {
        [Call {
            keys: keys.borrowed(),
            permits: 1,
            rule: Some(config),
            bucket: Some(crate::BucketShape {
                burst: 5,
                warmup_ms: 0,
            }),
        }]
    }

    fn is_full(result: Result<crate::backend::Outcome, Error>) -> bool {
        matches!(result, Err(Error::MemoryFull { max: 100, .. }))
    }

    #[test]
    fn at_the_bound_new_keys_are_refused_and_the_held_ones_kept() {
        let backend = MemoryBackend::new(100);
        let config = minute(5);
        block_on(async {
            // An exhausted key, and 99 others: the bound.
            let victim = LimiterKeys::new("victim", "c").unwrap();
            for _ in 0..5 {
                assert!(
                    backend
                        .acquire(&call_on(&victim, &config), 1_000)
                        .await
                        .unwrap()
                        .granted
                );
            }
            for user in 0..99 {
                let keys = LimiterKeys::new(&format!("user:{user}"), "c").unwrap();
                assert!(
                    backend
                        .acquire(&call_on(&keys, &config), 1_000)
                        .await
                        .unwrap()
                        .granted
                );
            }
            // A spray of new keys, sliding windows and token buckets: each refused.
            for user in 0..10_000u64 {
                let keys = LimiterKeys::new(&format!("spray:{user}"), "c").unwrap();
                let now = 1_000 + user;
                assert!(is_full(backend.acquire(&call_on(&keys, &config), now).await));
                assert!(is_full(backend.acquire(&bucket_call(&keys, &config), now).await));
                assert!(backend.len() <= 100, "{} limiters held", backend.len());
            }
            // By hand too.
            let keys = LimiterKeys::new("by-hand", "c").unwrap();
            assert!(matches!(
                backend.try_set_rate(&keys, &config, 20_000).await,
                Err(Error::MemoryFull { max: 100, .. })
            ));
            let how = Configure {
                keep_state: true,
                require_exists: false,
            };
            assert!(matches!(
                backend.configure(&keys, &config, how, 20_000).await,
                Err(Error::MemoryFull { max: 100, .. })
            ));
            // A call of a held limiter and a new one: refused, and nothing spent.
            let held = LimiterKeys::new("user:0", "c").unwrap();
            let both = [
                call_on(&held, &config)[0].clone(),
                call_on(&keys, &config)[0].clone(),
            ];
            assert!(is_full(backend.acquire(&both, 20_000).await));
            let ask = [Call {
                permits: 0,
                ..call_on(&held, &config)[0].clone()
            }];
            let left = backend.acquire(&ask, 20_000);
            assert_eq!(left.await.unwrap().rules[0].left, 4);
            // The exhausted key stays exhausted: the spray reset nothing.
            let out = backend.acquire(&call_on(&victim, &config), 30_000).await.unwrap();
            assert!(!out.granted);
            assert_eq!(out.retry_ms, 31_000);
            // Once the windows and keep-alives are over, the expired limiters make
            // room (swept at the bound, a few buckets per decision).
            // (The refusal at 30 s kept the victim's limiter alive for another 60 s, as
            // Redisson's keep-alive does.)
            let later = 30_000 + 60_000 + 1;
            let mut admitted = 0;
            for user in 0..1_000 {
                let keys = LimiterKeys::new(&format!("after:{user}"), "c").unwrap();
                if let Ok(out) = backend.acquire(&call_on(&keys, &config), later).await {
                    assert!(out.granted);
                    admitted += 1;
                }
                assert!(backend.len() <= 100);
            }
            assert_eq!(admitted, 100, "every expired limiter's room, and no more");
        });
    }

    #[test]
    fn the_count_of_limiters_held_is_exact_whatever_the_operations() {
        let backend = MemoryBackend::new(50);
        let short = RateLimiterConfig::new(RateType::Overall, 3, Duration::from_millis(500))
            .with_keep_alive(Duration::from_millis(500));
        let kept = RateLimiterConfig::new(RateType::PerClient, 3, Duration::from_millis(500));
        let how = Configure {
            keep_state: true,
            require_exists: false,
        };
        let mut seed = 7u64;
        let mut next = move |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        block_on(async {
            for step in 0..20_000u64 {
                let now = 1_000 + step * 7;
                let a = LimiterKeys::new(&format!("k:{}", next(80)), "c").unwrap();
                let b = LimiterKeys::new(&format!("k:{}", next(80)), "c").unwrap();
                let config = if next(2) == 0 { &short } else { &kept };
                let _ = match next(8) {
                    0 => backend.acquire(&call_on(&a, config), now).await.map(|_| true),
                    1 => backend.acquire(&bucket_call(&a, &short), now).await.map(|_| true),
                    2 => {
                        let calls = [
                            call_on(&a, config)[0].clone(),
                            call_on(&b, &short)[0].clone(),
                            bucket_call(&a, &short)[0].clone(),
                        ];
                        backend.acquire(&calls, now).await.map(|_| true)
                    }
                    3 => backend.try_set_rate(&a, config, now).await,
                    4 => backend.configure(&a, config, how, now).await,
                    5 => backend.delete(&a, now).await,
                    6 => backend.delete_bucket(&a, RateType::Overall, now).await,
                    _ => backend.expire(&a, 100, now).await,
                };
                let held = backend.room.held.load(Ordering::Relaxed);
                assert_eq!(held, backend.len(), "after step {step}");
                assert!(held <= 50);
            }
        });
    }

    #[test]
    fn a_limiter_without_keep_alive_is_never_swept_and_counts_towards_the_bound() {
        let backend = MemoryBackend::new(2);
        let forever = RateLimiterConfig::new(RateType::Overall, 5, Duration::from_secs(1));
        let by_hand = LimiterKeys::new("by-hand", "c").unwrap();
        let config = minute(5);
        let later = 1_000 + 20_000 * 61_000;
        block_on(async {
            assert!(backend.try_set_rate(&by_hand, &forever, 1_000).await.unwrap());
            // Two weeks of decisions on other keys, each expired before the next.
            for call in 0..20_000u64 {
                let keys = LimiterKeys::new(&format!("k:{call}"), "c").unwrap();
                let _ = backend
                    .acquire(&call_on(&keys, &config), 1_000 + call * 61_000)
                    .await;
            }
            // Every shard swept whole: what is left is what never expires.
            for shard in backend.shards.iter() {
                backend.sweep(&mut shard.lock().unwrap(), later, usize::MAX);
            }
            assert_eq!(backend.len(), 1);
            assert!(backend.is_exists(&by_hand, later).await.unwrap());
            // It holds one of the two places.
            let a = LimiterKeys::new("a", "c").unwrap();
            let b = LimiterKeys::new("b", "c").unwrap();
            assert!(
                backend
                    .acquire(&call_on(&a, &config), later)
                    .await
                    .unwrap()
                    .granted
            );
            assert!(matches!(
                backend.acquire(&call_on(&b, &config), later).await,
                Err(Error::MemoryFull { max: 2, .. })
            ));
        });
    }
}
