//! `RateLimiter`: Redisson's `RRateLimiter` API in Rust names.

use std::fmt;
use std::time::Duration;

use crate::backend::{Configure, RuleCall};
use crate::rules::checks::check_permits;
use crate::{Client, Decision, Error, LimiterKeys, RateLimiterArgs, RateLimiterConfig, RateType};

/// One limiter, named as in Redis. Get it from [`Client::rate_limiter`].
///
/// Its writes (setting the rate, keep-alive or TTL, deleting it) touch only a
/// limiter's keys: when the name is one of the library's own keys (the override table
/// `<prefix>overrides`, a refusal report `<prefix>refused:*`), or a key under it holds
/// what a limiter does not keep there (another program's string, a hash without
/// `rate`, `interval` and `type`), they fail with [`Error::NotALimiter`] and write
/// nothing. A name that does not exist yet becomes a limiter.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), redlimit_runtime::Error> {
/// use redlimit_runtime::{Client, RateType};
/// use std::time::Duration;
///
/// let limiter = Client::memory().rate_limiter("rate_limit:user:42");
/// limiter.try_set_rate(RateType::Overall, 2, Duration::from_secs(1)).await?;
/// assert!(limiter.try_acquire(1).await?);
/// assert!(limiter.try_acquire(1).await?);
/// let refused = limiter.check(1).await?;
/// assert!(!refused.allowed && refused.retry_after.is_some());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RateLimiter {
    client: Client,
    name: String,
    /// `None` when the name would split across cluster slots; every call then fails.
    keys: Option<LimiterKeys>,
}

impl Client {
    /// A limiter on the key `name`, used as given (no prefix), as Redisson's
    /// `getRateLimiter(name)`.
    pub fn rate_limiter(&self, name: impl Into<String>) -> RateLimiter {
        RateLimiter::new(self.clone(), name.into())
    }
}

impl RateLimiter {
    pub(crate) fn new(client: Client, name: String) -> Self {
        let keys = LimiterKeys::with_client(name.clone(), client.shared_client_id()).ok();
        RateLimiter { client, name, keys }
    }

    /// The limiter's name: its config key.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its five Redis keys as seen by this client.
    pub fn keys(&self) -> Result<&LimiterKeys, Error> {
        match &self.keys {
            Some(keys) => Ok(keys),
            None => Err(LimiterKeys::new(&self.name, "").unwrap_err()),
        }
    }

    fn checked(&self, config: &RateLimiterConfig) -> Result<&LimiterKeys, Error> {
        let keys = self.writable()?;
        config.validate(&self.name)?;
        Ok(keys)
    }

    /// The keys, for a write: refused when the name is one of the library's own keys
    /// (the override table, a refusal report), whatever it holds.
    fn writable(&self) -> Result<&LimiterKeys, Error> {
        let keys = self.keys()?;
        let prefix = self.client.prefix();
        match crate::keys::library_key(prefix, &self.name) {
            Some(what) => Err(Error::NotALimiter {
                key: self.name.clone(),
                role: "config",
                found: format!("is {what} of the clients with the key prefix `{prefix}`"),
            }),
            None => Ok(keys),
        }
    }

    /// Sets the config only if none exists (three HSETNX, as Redisson): answers whether
    /// this call's config took effect. A deploy that changes the rate does not change
    /// an existing limiter; use [`update_rate`](Self::update_rate) for that.
    pub async fn try_set_rate(&self, mode: RateType, rate: u64, interval: Duration) -> Result<bool, Error> {
        self.try_set_config(&RateLimiterConfig::new(mode, rate, interval))
            .await
    }

    /// [`try_set_rate`](Self::try_set_rate) with a full config (keep-alive included).
    pub async fn try_set_config(&self, config: &RateLimiterConfig) -> Result<bool, Error> {
        let keys = self.checked(config)?;
        self.client.forget_refusal(&self.name);
        self.client
            .backend()
            .try_set_rate(keys, config, self.client.now_ms())
            .await
    }

    /// Overwrites the config and restarts the window: the state of the new mode is
    /// deleted for this client (both modes' state when the mode changes). Calling it
    /// before every acquire never limits.
    pub async fn set_rate(&self, mode: RateType, rate: u64, interval: Duration) -> Result<(), Error> {
        self.set_config(&RateLimiterConfig::new(mode, rate, interval))
            .await
    }

    /// [`set_rate`](Self::set_rate) with a full config.
    pub async fn set_config(&self, config: &RateLimiterConfig) -> Result<(), Error> {
        self.set_rate_with(&RateLimiterArgs::from(*config)).await
    }

    /// Overwrites the config keeping the window, when the limiter exists (Redisson
    /// 4.4's `updateRate` with `keepState`); answers false, writing nothing, when it
    /// has no config. Available = rate - permits still in the window; when the window
    /// holds more than a lowered rate, the difference is owed (the stored value goes
    /// below zero, and a Java client's `availablePermits()` reads that negative number
    /// until enough old grants leave), so the new rate is never exceeded. A change of
    /// mode deletes both modes' state.
    pub async fn update_rate(&self, mode: RateType, rate: u64, interval: Duration) -> Result<bool, Error> {
        self.update_config(&RateLimiterConfig::new(mode, rate, interval))
            .await
    }

    /// [`update_rate`](Self::update_rate) with a full config.
    pub async fn update_config(&self, config: &RateLimiterConfig) -> Result<bool, Error> {
        self.update_rate_with(&RateLimiterArgs::from(*config).keep_state(true))
            .await
    }

    /// Redisson 4.4's `setRate(RateLimiterArgs)`: writes the config, creating the
    /// limiter when missing; the window restarts unless `args` keep the state.
    pub async fn set_rate_with(&self, args: &RateLimiterArgs) -> Result<(), Error> {
        self.configure(args, false).await.map(|_| ())
    }

    /// Redisson 4.4's `updateRate(RateLimiterArgs)`: like
    /// [`set_rate_with`](Self::set_rate_with) on an existing limiter only; answers
    /// false, writing nothing, when it has no config. As in Redisson, the window
    /// restarts unless `args` keep the state.
    pub async fn update_rate_with(&self, args: &RateLimiterArgs) -> Result<bool, Error> {
        self.configure(args, true).await
    }

    async fn configure(&self, args: &RateLimiterArgs, require_exists: bool) -> Result<bool, Error> {
        let keys = self.checked(&args.config)?;
        let how = Configure {
            keep_state: args.keep_state,
            require_exists,
        };
        self.client.forget_refusal(&self.name);
        let changed = self
            .client
            .backend()
            .configure(keys, &args.config, how, self.client.now_ms())
            .await?;
        if changed {
            // (a config of the other mode clears every client's `per_client` state at
            // that client's next call, which writes its own mode back: its batch ends)
            let leaves_per_client = args.config.rate_type == crate::RateType::PerClient;
            self.client
                .announce_reset_made(&self.name, leaves_per_client)
                .await;
        }
        Ok(changed)
    }

    /// Gives `permits` back (Redisson's `release`), for permits a caller took and did
    /// not use: they are taken out of the newest grants in the log and added to the
    /// available permits, at most up to the rate. Unlike Redisson's, which leaves the
    /// log as it is (its grants are then counted back a second time when they leave
    /// the window, and the limiter grants more than its rate while its log stays
    /// busy), value + permits in the log = rate still holds afterwards, so no window
    /// holds more grants than the rate apart from those given back. 0 does nothing.
    pub async fn release(&self, permits: u64) -> Result<(), Error> {
        if permits == 0 {
            return Ok(());
        }
        let keys = self.keys()?;
        self.client.forget_refusal(&self.name);
        self.client
            .backend()
            .release(keys, permits, self.client.now_ms())
            .await
    }

    waiting_methods!("permits", "Takes `permits` if available now; never waits.");

    /// Takes `permits` if available now, answering how many remain or how long to wait.
    pub async fn check(&self, permits: u64) -> Result<Decision, Error> {
        check_permits(&self.name, permits, None)?;
        let outcome = self.run(permits, self.client.now_ms()).await?;
        Ok(outcome.decision())
    }

    /// Permits available now (released grants included); takes nothing, writes nothing.
    pub async fn available_permits(&self) -> Result<u64, Error> {
        Ok(self.run(0, self.client.now_ms()).await?.rules[0].left)
    }

    async fn run(&self, permits: u64, now: u64) -> Result<crate::backend::Outcome, Error> {
        let keys = self.keys()?;
        self.client.forget_refusal(&self.name);
        let calls = [RuleCall {
            keys: keys.borrowed(),
            permits,
            rule: None,
            bucket: None,
            reserved: None,
        }];
        self.client.backend().acquire(&calls, now).await
    }

    /// The stored config, or `None` when the limiter is not initialized.
    pub async fn config(&self) -> Result<Option<RateLimiterConfig>, Error> {
        let keys = self.keys()?;
        self.client.backend().config(keys, self.client.now_ms()).await
    }

    /// Sets Redisson's `keepAliveTime`: every acquire attempt re-applies it as the TTL
    /// of the limiter's keys, so an idle limiter disappears. Applied to the keys now
    /// too. `Duration::ZERO` removes it (and the TTLs). A keep-alive shorter than the
    /// stored interval is refused, as Redisson refuses it.
    pub async fn keep_alive(&self, keep_alive: Duration) -> Result<(), Error> {
        let keys = self.writable()?;
        self.client.forget_refusal(&self.name);
        let keep_ms = keep_alive.as_millis() as u64;
        if keep_alive > Duration::ZERO {
            RateLimiterConfig::new(RateType::Overall, 1, Duration::from_millis(1))
                .with_keep_alive(keep_alive)
                .validate(&self.name)?;
        }
        self.client
            .backend()
            .keep_alive(keys, keep_ms, self.client.now_ms())
            .await
    }

    /// Sets a TTL on all five keys; answers whether the config exists and got it.
    /// Counted in whole milliseconds, a fraction rounded up (never shorter than
    /// asked); `Duration::ZERO` expires the keys now, as `PEXPIRE 0` does. Above
    /// 2^53 ms it is refused with [`Error::InvalidConfig`].
    pub async fn expire(&self, ttl: Duration) -> Result<bool, Error> {
        let keys = self.writable()?;
        let ttl_ms = match u64::try_from(ttl.as_nanos().div_ceil(1_000_000)) {
            Ok(ms) if ms <= crate::rules::config::MAX_RATE => ms,
            _ => {
                return Err(Error::InvalidConfig {
                    name: self.name.clone(),
                    problem: "the TTL is above 2^53 ms",
                })
            }
        };
        self.client.forget_refusal(&self.name);
        self.client
            .backend()
            .expire(keys, ttl_ms, self.client.now_ms())
            .await
    }

    /// Deletes all five keys; answers whether anything was deleted. Every process
    /// using this Redis and prefix drops the refusal it keeps of the limiter and ends
    /// its batch of it within about a second, this one at once (so do `set_rate` and
    /// `update_rate`: see [`Client::announce_reset`]).
    pub async fn delete(&self) -> Result<bool, Error> {
        let keys = self.writable()?;
        self.client.forget_refusal(&self.name);
        let deleted = self.client.backend().delete(keys, self.client.now_ms()).await?;
        self.client.announce_reset_made(&self.name, true).await;
        Ok(deleted)
    }

    /// Whether the config key exists.
    pub async fn is_exists(&self) -> Result<bool, Error> {
        let keys = self.keys()?;
        self.client.backend().is_exists(keys, self.client.now_ms()).await
    }
}

impl fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("name", &self.name)
            .field("client", &self.client)
            .finish()
    }
}
