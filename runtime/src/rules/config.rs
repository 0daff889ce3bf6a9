//! A limiter's configuration, as stored in its Redis hash.

use std::time::Duration;

use crate::Error;

/// Whether one bucket is shared by every client or each client has its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RateType {
    /// One bucket shared by every client: the distributed limit (`type` = `0`).
    #[default]
    Overall,
    /// One bucket per client instance: each process gets the whole rate (`type` = `1`).
    PerClient,
}

impl RateType {
    pub(crate) fn as_redis(self) -> &'static str {
        match self {
            RateType::Overall => "0",
            RateType::PerClient => "1",
        }
    }
}

/// The largest rate and interval (ms) a limiter accepts: Redis scripts count in
/// doubles, which are exact up to 2^53.
pub const MAX_RATE: u64 = 1 << 53;

/// The most permits one call may take, whatever the rate: Redisson logs each grant's
/// permits in a 4-byte field.
pub const MAX_PERMITS: u64 = u32::MAX as u64;

/// Why a keep-alive shorter than the interval is refused (Redisson refuses it too).
pub(crate) const KEEP_ALIVE_SHORT: &str = "keep_alive is shorter than the interval: the keys could expire \
     while grants are still in the window, and a limiter made again would grant the rate twice in \
     one window; use at least the interval, or none (The parameter keepAliveTime should be greater \
     than or equal to rateInterval)";

/// A limiter's configuration: `rate` permits per `interval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RateLimiterConfig {
    /// Overall or per client.
    pub rate_type: RateType,
    /// Permits granted per interval.
    pub rate: u64,
    /// The sliding window, with millisecond precision.
    pub interval: Duration,
    /// When set, every acquire re-applies it as the TTL of the limiter's keys
    /// (Redisson's `keepAliveTime`), so idle limiters disappear.
    pub keep_alive: Option<Duration>,
}

impl RateLimiterConfig {
    /// `rate` permits per `interval`, without keep-alive.
    pub fn new(rate_type: RateType, rate: u64, interval: Duration) -> Self {
        RateLimiterConfig {
            rate_type,
            rate,
            interval,
            keep_alive: None,
        }
    }

    /// The same configuration with a keep-alive time.
    pub fn with_keep_alive(mut self, keep_alive: Duration) -> Self {
        self.keep_alive = Some(keep_alive);
        self
    }

    pub(crate) fn interval_ms(&self) -> u64 {
        self.interval.as_millis() as u64
    }

    pub(crate) fn keep_alive_ms(&self) -> u64 {
        self.keep_alive.map_or(0, |d| d.as_millis() as u64)
    }

    /// Checks the ranges Redisson and the scripts accept (rate from 1 to 2^53, an
    /// interval and keep-alive of whole milliseconds within them), naming the limiter
    /// `name` in the error.
    pub fn validate(&self, name: &str) -> Result<(), Error> {
        let problem = if self.rate == 0 {
            "rate is 0; it must be at least 1"
        } else if self.rate > MAX_RATE {
            "rate is above 2^53"
        } else if self.interval < Duration::from_millis(1) {
            "interval is below 1 ms; it must be at least 1 ms"
        } else if self.interval.as_millis() > u128::from(MAX_RATE) {
            "interval is above 2^53 ms"
        } else if self.interval.subsec_nanos() % 1_000_000 != 0 {
            // Redis and Redisson count it in milliseconds: a fraction dropped would
            // shorten every window, and let more through than the rate.
            "interval is not a whole number of milliseconds; give it in whole ms \
             (Duration::from_millis)"
        } else if self
            .keep_alive
            .is_some_and(|k| k.as_millis() > u128::from(MAX_RATE))
        {
            "keep_alive is above 2^53 ms"
        } else if self.keep_alive.is_some_and(|k| k < Duration::from_millis(1)) {
            "keep_alive is below 1 ms; use None for no keep-alive"
        } else if self.keep_alive.is_some_and(|k| k < self.interval) {
            KEEP_ALIVE_SHORT
        } else {
            return Ok(());
        };
        Err(Error::InvalidConfig {
            name: name.to_owned(),
            problem,
        })
    }

    /// Reads the hash fields (`rate`, `interval`, `type`, `keepAliveTime`).
    /// `Ok(None)` when `rate`, `interval` or `type` is missing (not initialized).
    pub(crate) fn from_fields<'a>(
        key: &str,
        fields: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Option<Self>, Error> {
        let (mut rate, mut interval, mut kind, mut keep) = (None, None, None, None);
        for (field, value) in fields {
            match field {
                "rate" => rate = Some(value),
                "interval" => interval = Some(value),
                "type" => kind = Some(value),
                "keepAliveTime" => keep = Some(value),
                _ => {}
            }
        }
        let (Some(rate), Some(interval), Some(kind)) = (rate, interval, kind) else {
            return Ok(None);
        };
        let bad = |field: &'static str, value: &str| Error::CorruptConfig {
            key: key.to_owned(),
            field,
            value: crate::outcomes::error::quoted(value),
        };
        // (as the scripts read a field: digits only, up to 2^53 read as text)
        let number = |field: &'static str, value: &str| -> Result<u64, Error> {
            crate::algorithm::stored_number(value).ok_or_else(|| bad(field, value))
        };
        let rate_type = match kind {
            "0" => RateType::Overall,
            "1" => RateType::PerClient,
            other => return Err(bad("type", other)),
        };
        let parsed_rate = number("rate", rate)?;
        if parsed_rate == 0 {
            return Err(bad("rate", rate));
        }
        let interval_ms = number("interval", interval)?;
        if interval_ms == 0 {
            return Err(bad("interval", interval));
        }
        let keep_ms = match keep {
            Some(k) => number("keepAliveTime", k)?,
            None => 0,
        };
        Ok(Some(RateLimiterConfig {
            rate_type,
            rate: parsed_rate,
            interval: Duration::from_millis(interval_ms),
            keep_alive: (keep_ms > 0).then(|| Duration::from_millis(keep_ms)),
        }))
    }
}

/// Redisson 4.4's `RateLimiterArgs`: a config, and whether writing it keeps the
/// window, for [`RateLimiter::set_rate_with`](crate::RateLimiter::set_rate_with) and
/// [`RateLimiter::update_rate_with`](crate::RateLimiter::update_rate_with).
///
/// ```
/// use redlimit_runtime::{RateLimiterArgs, RateType};
/// use std::time::Duration;
///
/// let args = RateLimiterArgs::new(RateType::Overall, 100, Duration::from_secs(60))
///     .keep_alive(Duration::from_secs(300))
///     .keep_state(true);
/// assert_eq!(args.config().rate, 100);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimiterArgs {
    pub(crate) config: RateLimiterConfig,
    pub(crate) keep_state: bool,
}

impl RateLimiterArgs {
    /// `rate` permits per `interval`, no keep-alive, restarting the window.
    pub fn new(mode: RateType, rate: u64, interval: Duration) -> Self {
        RateLimiterConfig::new(mode, rate, interval).into()
    }

    /// Redisson's `keepAliveTime`: at least the interval.
    pub fn keep_alive(mut self, keep_alive: Duration) -> Self {
        self.config.keep_alive = Some(keep_alive);
        self
    }

    /// Keep the window (available = rate - permits still in it) instead of
    /// restarting it (Redisson's `keepState`, default false).
    pub fn keep_state(mut self, keep_state: bool) -> Self {
        self.keep_state = keep_state;
        self
    }

    /// The config written.
    pub fn config(&self) -> &RateLimiterConfig {
        &self.config
    }
}

impl From<RateLimiterConfig> for RateLimiterArgs {
    fn from(config: RateLimiterConfig) -> Self {
        RateLimiterArgs {
            config,
            keep_state: false,
        }
    }
}
