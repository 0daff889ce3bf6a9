//! Rules: a limiter name with the configuration a call enforces on it.

use std::fmt;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::{RateLimiterConfig, RateType, MAX_PERMITS};

mod memo;
mod merge;

use memo::{Memo, NAME, OVERRIDDEN, SETTINGS};
pub use merge::MAX_RULES_PER_CALL;
pub(crate) use merge::{check_rule_count, merge, Merged};

/// One limit of a multi-rule decision ([`Client::check_rules`](crate::Client::check_rules)).
///
/// A rule owns its limiter's config: a missing config is created, and a stored config
/// that differs (a deploy changed the rate) is overwritten keeping the window, with a
/// warning naming both configs (at most once per limiter per 10 s). Limiters created
/// by rules get a
/// keep-alive equal to the interval, so idle per-user keys disappear on their own.
///
/// ```
/// use redlimit_runtime::{RateType, Rule};
/// use std::time::Duration;
///
/// let per_user = Rule::new("rate_limit:order:user:42", 5, Duration::from_secs(60));
/// let global = Rule::new("rate_limit:order", 100, Duration::from_secs(1)).mode(RateType::Overall);
/// assert_eq!(per_user.config().keep_alive, Some(Duration::from_secs(60)));
/// # let _ = global;
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Rule {
    name: String,
    config: RateLimiterConfig,
    permits: u64,
    algorithm: Algorithm,
    burst: Option<u64>,
    warmup: Option<Duration>,
    local_refusals: bool,
    /// Permits taken from Redis at once and served in process (1: none, see
    /// [`Rule::batch`]), and for how long.
    batch: u64,
    batch_lease: Option<Duration>,
    /// Its permits are an estimate a [`Reservation`](crate::Reservation) settles.
    settled: bool,
    /// The most a settle charges past the estimate (`None`: no cap).
    max_overdraft: Option<u64>,
    memo: Memo,
}

/// A batch's lease when none is set: a tenth of the interval, at most this long.
pub const DEFAULT_BATCH_LEASE_MAX: Duration = Duration::from_secs(1);

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule")
            .field("name", &self.name)
            .field("config", &self.config)
            .field("permits", &self.permits)
            .field("algorithm", &self.algorithm)
            .field("burst", &self.burst)
            .field("warmup", &self.warmup)
            .field("local_refusals", &self.local_refusals)
            .field("batch", &self.batch)
            .field("batch_lease", &self.batch_lease)
            .field("settled", &self.settled)
            .field("max_overdraft", &self.max_overdraft)
            .finish()
    }
}

/// A token bucket's shape: the most tokens it holds, and its warm-up in milliseconds
/// (0: none): what a token-bucket rule and its decision carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BucketShape {
    pub burst: u64,
    pub warmup_ms: u64,
}

impl BucketShape {
    /// A bucket holding `burst` and warming up over `warmup`, counted in whole
    /// milliseconds rounded up: a warm-up under 1 ms is 1 ms, not none.
    pub fn new(burst: u64, warmup: Option<Duration>) -> BucketShape {
        // In 64 bits (a whole second is whole milliseconds), saturating.
        let warmup_ms = warmup.map_or(0, |w| {
            w.as_secs()
                .checked_mul(1000)
                .and_then(|ms| ms.checked_add(u64::from(w.subsec_nanos().div_ceil(1_000_000))))
                .unwrap_or(u64::MAX)
        });
        BucketShape { burst, warmup_ms }
    }
}

/// How a rule counts its permits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Algorithm {
    /// Redisson's sliding log: no window of `interval` holds more than `rate` grants.
    /// The default, and the layout Java services share.
    #[default]
    SlidingWindow,
    /// A token bucket: `rate` tokens per `interval`, refilled continuously, holding at
    /// most `burst` (default: the rate). A quiet client may then spend a burst at once,
    /// while the long-run rate holds. One small hash per limiter, whatever the rate.
    TokenBucket,
}

impl Rule {
    /// `rate` permits per `interval` on the limiter `name` (the full key name: no
    /// prefix is added), overall mode, 1 permit per call, keep-alive = interval.
    pub fn new(name: impl Into<String>, rate: u64, interval: Duration) -> Self {
        Rule {
            name: name.into(),
            config: RateLimiterConfig::new(RateType::Overall, rate, interval).with_keep_alive(interval),
            permits: 1,
            algorithm: Algorithm::SlidingWindow,
            burst: None,
            warmup: None,
            local_refusals: true,
            batch: 1,
            batch_lease: None,
            settled: false,
            max_overdraft: None,
            memo: Memo::default(),
        }
    }

    /// The rule of one call of `spec`: `name`, `permits`, at `rate` per `interval` (the
    /// spec's own or an override's), as `Rule::new` and the setters would make it.
    pub(crate) fn of_spec(
        name: String,
        spec: &crate::RuleSpec,
        permits: u64,
        rate: u64,
        interval: Duration,
    ) -> Self {
        let (algorithm, burst, warmup) = match spec.bucket {
            Some(shape) => (
                Algorithm::TokenBucket,
                Some(shape.burst),
                Some(Duration::from_millis(shape.warmup_ms)),
            ),
            None => (Algorithm::SlidingWindow, None, None),
        };
        Rule {
            name,
            config: RateLimiterConfig::new(spec.mode, rate, interval).with_keep_alive(interval),
            permits,
            algorithm,
            burst,
            warmup,
            local_refusals: spec.local_refusals,
            batch: 1,
            batch_lease: None,
            settled: spec.settled,
            max_overdraft: spec.max_overdraft,
            memo: Memo::default(),
        }
    }

    /// The rule after a setter: its settings must be checked again.
    fn changed(self) -> Self {
        self.memo.checked.fetch_and(!SETTINGS, Ordering::Relaxed);
        self
    }

    /// Whether this rule's name and settings have been found good since its last
    /// change.
    #[inline]
    pub(crate) fn is_checked(&self) -> bool {
        self.memo.checked.load(Ordering::Acquire) & (NAME | SETTINGS) == NAME | SETTINGS
    }

    /// Whether the settings have been found good since the last change.
    pub(crate) fn settings_checked(&self) -> bool {
        self.memo.checked.load(Ordering::Acquire) & SETTINGS != 0
    }

    /// Notes that every check of the rule passed.
    pub(crate) fn mark_checked(&self) {
        // (Release: a thread that sees the bits sees the window kept before them)
        self.keep_window_ms();
        self.memo.checked.fetch_or(NAME | SETTINGS, Ordering::Release);
    }

    /// Keeps the settings' window and keep-alive in ms, for [`window_ms`](Rule::window_ms).
    fn keep_window_ms(&self) {
        let ms = [self.config.interval_ms(), self.config.keep_alive_ms()];
        for (kept, ms) in self.memo.window_ms.iter().zip(ms) {
            kept.store(ms, Ordering::Relaxed);
        }
    }

    /// The interval and keep-alive (0: none) of the rule's config in whole ms, as
    /// [`RateLimiterConfig::interval_ms`] and `keep_alive_ms` give them, kept when its
    /// settings were found good: for a rule whose settings are (every setter makes it
    /// checked again), without their arithmetic on every call.
    #[inline]
    pub(crate) fn window_ms(&self) -> (u64, u64) {
        debug_assert!(self.settings_checked(), "a rule's window read before its checks");
        let [interval, keep_alive] = self
            .memo
            .window_ms
            .each_ref()
            .map(|ms| ms.load(Ordering::Relaxed));
        (interval, keep_alive)
    }

    /// Notes that the rule's rate and window are an override's (`rules::overrides`),
    /// not its own: a stored config it rewrites was most likely its own before.
    pub(crate) fn mark_overridden(&self) {
        self.memo.checked.fetch_or(OVERRIDDEN, Ordering::Relaxed);
    }

    /// Whether [`mark_overridden`](Rule::mark_overridden) was called.
    pub(crate) fn is_overridden(&self) -> bool {
        self.memo.checked.load(Ordering::Relaxed) & OVERRIDDEN != 0
    }

    /// Marks the rule's settings known good: those of a description checked once for
    /// every call made from it (an [`Engine`](crate::engine::Engine)'s rule at its
    /// own rate, window and permits). Its name is still checked on its first call.
    pub(crate) fn mark_settings_checked(&self) {
        self.keep_window_ms();
        self.memo.checked.fetch_or(SETTINGS, Ordering::Release);
    }

    /// The hash of the rule's name ([`name_hash`](crate::keys::name_hash)), computed on
    /// the first call and kept.
    #[inline]
    pub(crate) fn name_hash(&self) -> u64 {
        match self.memo.hash.load(Ordering::Relaxed) {
            0 => {
                let hash = crate::keys::name_hash(&self.name);
                self.memo.hash.store(hash, Ordering::Relaxed);
                hash
            }
            hash => hash,
        }
    }

    /// Keeps `hash` as the hash of the rule's name, computed by whoever built the name
    /// (it must be [`name_hash`](crate::keys::name_hash)'s).
    #[inline]
    pub(crate) fn keep_hash(&self, hash: u64) {
        debug_assert_eq!(hash, crate::keys::name_hash(&self.name), "{}", self.name);
        self.memo.hash.store(hash, Ordering::Relaxed);
    }

    /// Takes up to `k` permits from Redis in one grant and serves them in this client
    /// for at most a short lease (see [`batch_lease`](Rule::batch_lease)), giving back
    /// what it did not use when the lease ends (default 1: no batching). At most the
    /// rate; a sliding window only. Calls of this rule alone batch ([`Client::check_rules`]
    /// with several rules goes to Redis every time), and only on Redis: an in-process
    /// client decides every call exactly.
    ///
    /// What it changes: a permit counts in Redis from when its batch was taken, and is
    /// used up to a lease `L` later. So every window of `interval - L` holds at most
    /// `rate` permits used, and every window of `interval` at most `rate + N * k`, for
    /// `N` clients batching the limiter; up to `N * k` permits may sit unused in
    /// batches for up to `L` while another client is refused (see the guide's chapter on
    /// batches, `redlimit::guide::batches`).
    ///
    /// [`Client::check_rules`]: crate::Client::check_rules
    pub fn batch(mut self, k: u64) -> Self {
        self.batch = k;
        self.changed()
    }

    /// How long a batch is served before what it did not use goes back: more than
    /// zero and less than the interval (default: a tenth of the interval, at most 1 s).
    /// Counted in whole milliseconds, rounded up.
    pub fn batch_lease(mut self, lease: Duration) -> Self {
        self.batch_lease = Some(lease);
        self.changed()
    }

    /// The rule without a lease set (the default lease, if it batches).
    pub(crate) fn without_batch_lease(mut self) -> Self {
        self.batch_lease = None;
        self.changed()
    }

    /// The permits one grant takes from Redis (1: no batching).
    pub fn batch_size(&self) -> u64 {
        self.batch
    }

    /// How long a batch is served, in milliseconds: the lease set, rounded up to whole
    /// milliseconds, else a tenth of the interval (at least 1 ms, at most 1 s).
    pub fn batch_lease_ms(&self) -> u64 {
        match self.batch_lease {
            Some(lease) => u64::try_from(lease.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX),
            None => (self.config.interval_ms() / 10).clamp(1, DEFAULT_BATCH_LEASE_MAX.as_millis() as u64),
        }
    }

    /// Refuses a batch that cannot hold: see [`batch`](Rule::batch).
    pub(crate) fn check_batch(&self) -> Result<(), crate::Error> {
        let problem = if self.batch == 0 {
            "batch must be at least 1 (1: no batching)"
        } else if self.batch > self.config.rate {
            "batch exceeds the rate: a batch is at most the permits one interval grants"
        } else if self.batch > u64::from(u32::MAX) {
            "batch above 4294967295 does not fit the permits log's 4-byte field"
        } else if self.batch > 1 && self.algorithm == Algorithm::TokenBucket {
            "batch is for the sliding window: a token bucket's grants are not served in batches"
        } else if self.batch_lease.is_some() && self.batch == 1 {
            "batch_lease is a batch's: set batch above 1, or remove batch_lease"
        } else if self.batch_lease.is_some_and(|l| l.is_zero()) {
            "batch_lease must be more than zero"
        } else if self.batch > 1 && self.batch_lease_ms() >= self.config.interval_ms() {
            "batch_lease must be shorter than the interval (the default, a tenth of it, needs an \
             interval of at least 2 ms)"
        } else {
            return Ok(());
        };
        Err(crate::Error::InvalidConfig {
            name: self.name.clone(),
            problem,
        })
    }

    /// Whether a refusal Redis gave this rule's limiter may be answered again by the
    /// client, without a round trip, until its wait is over (default: yes; see
    /// [`ClientBuilder::local_refusals`](crate::ClientBuilder::local_refusals)).
    pub fn local_refusals(mut self, on: bool) -> Self {
        self.local_refusals = on;
        self.changed()
    }

    /// Whether [`local_refusals`](Rule::local_refusals) is on.
    pub fn answers_refusals_locally(&self) -> bool {
        self.local_refusals
    }

    /// Overall (shared by every client) or per client.
    pub fn mode(mut self, mode: RateType) -> Self {
        self.config.rate_type = mode;
        self.changed()
    }

    /// Permits each call takes (default 1; at most the rate).
    pub fn permits(mut self, permits: u64) -> Self {
        self.permits = permits;
        self.changed()
    }

    /// The keep-alive time of the limiter's keys (`None`: keys never expire, as with
    /// a plain Redisson limiter).
    pub fn keep_alive(mut self, keep_alive: Option<Duration>) -> Self {
        self.config.keep_alive = keep_alive;
        self.changed()
    }

    /// The sliding window (default) or a token bucket.
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self.changed()
    }

    /// A token bucket's capacity: the most tokens it holds, so the largest burst
    /// (default: the rate). Only for [`Algorithm::TokenBucket`].
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self.changed()
    }

    /// A token bucket's warm-up: after the bucket has been idle, a permit costs up to
    /// 3 tokens, falling back to 1 as permits are taken, so a cold service first sees
    /// about a third of the burst and of the rate, rising to the full rate over about
    /// `warmup` (see "Warm-up" in the guide, `redlimit::guide::token_buckets`). Only
    /// for [`Algorithm::TokenBucket`]; a zero warm-up is none, and one under 1 ms
    /// counts as 1 ms.
    pub fn warmup(mut self, warmup: Duration) -> Self {
        self.warmup = Some(warmup);
        self.changed()
    }

    /// A token bucket's warm-up, if it has one.
    pub fn warmup_period(&self) -> Option<Duration> {
        self.warmup.filter(|_| self.algorithm == Algorithm::TokenBucket)
    }

    /// A token bucket's capacity and warm-up (`None` for a sliding window).
    #[inline]
    pub(crate) fn shape(&self) -> Option<BucketShape> {
        Some(BucketShape::new(self.capacity()?, self.warmup_period()))
    }

    /// Whether a burst or a warm-up was set (a sliding window refuses them).
    pub(crate) fn has_bucket_settings(&self) -> bool {
        self.burst.is_some() || self.warmup.is_some()
    }

    /// The rule's algorithm.
    pub fn counted_by(&self) -> Algorithm {
        self.algorithm
    }

    /// A token bucket's capacity (`None` for a sliding window).
    pub fn capacity(&self) -> Option<u64> {
        match self.algorithm {
            Algorithm::SlidingWindow => None,
            Algorithm::TokenBucket => Some(self.burst.unwrap_or(self.config.rate)),
        }
    }

    /// The most permits one call may take: the rate, or a token bucket's capacity,
    /// and never more than [`MAX_PERMITS`] (what a grant's log field holds).
    #[inline]
    pub(crate) fn most_permits(&self) -> u64 {
        self.capacity().unwrap_or(self.config.rate).min(MAX_PERMITS)
    }

    /// The limiter's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The limiter's name, the rule done with.
    #[inline]
    pub(crate) fn into_name(self) -> String {
        self.name
    }

    /// The configuration the rule enforces.
    pub fn config(&self) -> &RateLimiterConfig {
        &self.config
    }

    /// Permits each call takes.
    pub fn permits_per_call(&self) -> u64 {
        self.permits
    }

    /// Counts what a call actually used, known after it: its permits are the call's
    /// estimate, which [`Client::reserve`](crate::Client::reserve) takes like any
    /// call's, and [`Reservation::settle`](crate::Reservation::settle) replaces with the
    /// actual amount: what was not used goes back, what was used beyond it is charged
    /// even past the limit (a debt that later calls wait out). A rule not settled
    /// counts its permits as taken (1 per call: the requests beside the tokens).
    pub fn settled(mut self) -> Self {
        self.settled = true;
        self.changed()
    }

    /// Whether the rule is [`settled`](Rule::settled).
    pub fn is_settled(&self) -> bool {
        self.settled
    }

    /// The most a settle charges past this rule's estimate (default: all of it). What
    /// a call used beyond `estimate + most` is not counted, and
    /// [`Settled::uncharged`](crate::Settled::uncharged) says how much: so one window
    /// holds at most the rate plus `most` for each grant in it that overdrew.
    pub fn max_overdraft(mut self, most: u64) -> Self {
        self.max_overdraft = Some(most);
        self.changed()
    }

    /// The cap [`max_overdraft`](Rule::max_overdraft) set, if any.
    pub fn overdraft_cap(&self) -> Option<u64> {
        self.max_overdraft
    }
}

#[cfg(test)]
mod tests;
