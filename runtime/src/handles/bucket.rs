//! [`TokenBucket`]: one token bucket by hand, as [`RateLimiter`](crate::RateLimiter)
//! is one sliding window.

use std::time::Duration;

use crate::backend::{Outcome, RuleCall};
use crate::{Client, Decision, Error, LimiterKeys, RateLimiterConfig, RateType, Rule};

/// A token bucket: `rate` tokens per `interval`, refilled continuously, at most `burst`
/// held (see the guide's "Token buckets", `redlimit::guide::token_buckets`, for its
/// layout). The handle carries the config; the bucket adopts it on the next decision,
/// keeping its whole tokens up to the burst, so changing the rate
/// ([`with_rate`](TokenBucket::with_rate)) keeps the state. There is no keep-alive to
/// set: a bucket's key expires by itself once the bucket is full again.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), redlimit_runtime::Error> {
/// use redlimit_runtime::{Client, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new(1_700_000_000_000);
/// let client = Client::builder().clock(clock.clone()).memory();
/// let bucket = client.token_bucket("api:7", 10, Duration::from_secs(1)).burst(20);
/// assert!(bucket.try_acquire(20).await?);
/// assert!(!bucket.try_acquire(1).await?);
/// // A token every 100 ms.
/// clock.advance(Duration::from_millis(40));
/// assert_eq!(bucket.check(1).await?.retry_after, Some(Duration::from_millis(60)));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct TokenBucket {
    client: Client,
    rule: Rule,
    keys: Option<LimiterKeys>,
}

impl Client {
    /// A token bucket on the key `{name}:bucket` (used as given: no prefix),
    /// refilling `rate` tokens per `interval` and holding at most `rate` (see
    /// [`TokenBucket::burst`](crate::TokenBucket::burst)).
    pub fn token_bucket(&self, name: impl Into<String>, rate: u64, interval: Duration) -> crate::TokenBucket {
        crate::TokenBucket::new(self, name.into(), rate, interval)
    }
}

impl TokenBucket {
    /// The bucket [`Client::token_bucket`] makes.
    pub(crate) fn new(client: &Client, name: String, rate: u64, interval: Duration) -> TokenBucket {
        let rule = Rule::new(name, rate, interval).algorithm(crate::Algorithm::TokenBucket);
        let keys = LimiterKeys::with_client(rule.name().to_owned(), client.shared_client_id()).ok();
        TokenBucket {
            client: client.clone(),
            rule,
            keys,
        }
    }

    /// The most tokens the bucket holds (default: the rate).
    pub fn burst(mut self, burst: u64) -> Self {
        self.rule = self.rule.burst(burst);
        self
    }

    /// Warms up over `warmup` after the bucket has been idle: a cold bucket grants
    /// about a third of its burst at once and refills at a third of the rate, rising
    /// to the full rate as tokens are taken (see [`Rule::warmup`]). Zero: no warm-up.
    pub fn warmup(mut self, warmup: Duration) -> Self {
        self.rule = self.rule.warmup(warmup);
        self
    }

    /// One bucket shared by every client (default), or one per client.
    pub fn mode(mut self, mode: RateType) -> Self {
        self.rule = self.rule.mode(mode);
        self
    }

    /// The same bucket at another rate and interval (the burst and warm-up stay): the
    /// stored state adopts it on the next decision, keeping its whole tokens.
    pub fn with_rate(mut self, rate: u64, interval: Duration) -> Self {
        let burst = self.rule.capacity().unwrap_or(rate);
        let mode = self.rule.config().rate_type;
        let name = self.rule.name().to_owned();
        let mut rule = Rule::new(name, rate, interval)
            .algorithm(crate::Algorithm::TokenBucket)
            .mode(mode)
            .burst(burst);
        if let Some(warmup) = self.rule.warmup_period() {
            rule = rule.warmup(warmup);
        }
        self.rule = rule;
        self
    }

    /// The bucket's name.
    pub fn name(&self) -> &str {
        self.rule.name()
    }

    /// The rate, interval and mode this handle decides with.
    pub fn config(&self) -> &RateLimiterConfig {
        self.rule.config()
    }

    /// The most tokens the bucket holds.
    pub fn capacity(&self) -> u64 {
        self.rule.capacity().unwrap_or(self.rule.config().rate)
    }

    waiting_methods!(
        "tokens",
        "Takes `permits` tokens if the bucket has them now; never waits."
    );

    /// Takes `permits` tokens if the bucket has them now, answering how many whole
    /// tokens remain or exactly how long until it has them.
    pub async fn check(&self, permits: u64) -> Result<Decision, Error> {
        let rule = self.rule.clone().permits(permits);
        self.client.check_rules(std::slice::from_ref(&rule)).await
    }

    /// Whole tokens in the bucket now; takes nothing, writes nothing.
    pub async fn available(&self) -> Result<u64, Error> {
        Ok(self.run(0).await?.rules[0].left)
    }

    /// Deletes the bucket (it is full again), announced as a reset
    /// ([`Client::announce_reset`](crate::Client::announce_reset)); true when it existed. Refuses
    /// ([`Error::NotALimiter`]), deleting nothing, when its key holds something that
    /// is not a token bucket's state.
    pub async fn delete(&self) -> Result<bool, Error> {
        let keys = self.keys()?;
        self.client.forget_refusal(self.rule.name());
        let mode = self.rule.config().rate_type;
        let deleted = self
            .client
            .backend()
            .delete_bucket(keys, mode, self.client.now_ms())
            .await?;
        self.client.announce_reset_made(self.rule.name(), true).await;
        Ok(deleted)
    }

    /// The bucket's keys, or why the name cannot be a limiter's.
    fn keys(&self) -> Result<&LimiterKeys, Error> {
        match &self.keys {
            Some(keys) => Ok(keys),
            None => Err(crate::keys::check_name(self.rule.name()).expect_err("a name keys were refused for")),
        }
    }

    async fn run(&self, permits: u64) -> Result<Outcome, Error> {
        let keys = self.keys()?;
        self.rule.config().validate(self.rule.name())?;
        let shape = self.rule.shape().expect("a token bucket's rule");
        crate::rules::fit::check_bucket(self.rule.name(), shape, self.rule.config())?;
        let calls = [RuleCall {
            keys: keys.borrowed(),
            permits,
            rule: Some(self.rule.config()),
            bucket: Some(shape),
            reserved: None,
        }];
        self.client.backend().acquire(&calls, self.client.now_ms()).await
    }
}
