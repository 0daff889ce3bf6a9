//! Rules: a limiter name with the configuration a call enforces on it.

use std::time::Duration;

use crate::{RateLimiterConfig, RateType};

/// One limit of a multi-rule decision ([`Client::check_rules`](crate::Client::check_rules)).
///
/// A rule owns its limiter's config: a missing config is created, and a stored config
/// that differs (a deploy changed the rate) is overwritten keeping the window, with a
/// warning logged once per limiter per process. Limiters created by rules get a
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    name: String,
    config: RateLimiterConfig,
    permits: u64,
}

impl Rule {
    /// `rate` permits per `interval` on the limiter `name` (the full key name: no
    /// prefix is added), overall mode, 1 permit per call, keep-alive = interval.
    pub fn new(name: impl Into<String>, rate: u64, interval: Duration) -> Self {
        Rule {
            name: name.into(),
            config: RateLimiterConfig::new(RateType::Overall, rate, interval).with_keep_alive(interval),
            permits: 1,
        }
    }

    /// Overall (shared by every client) or per client.
    pub fn mode(mut self, mode: RateType) -> Self {
        self.config.rate_type = mode;
        self
    }

    /// Permits each call takes (default 1; at most the rate).
    pub fn permits(mut self, permits: u64) -> Self {
        self.permits = permits;
        self
    }

    /// The keep-alive time of the limiter's keys (`None`: keys never expire, as with
    /// a plain Redisson limiter).
    pub fn keep_alive(mut self, keep_alive: Option<Duration>) -> Self {
        self.config.keep_alive = keep_alive;
        self
    }

    /// The limiter's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The configuration the rule enforces.
    pub fn config(&self) -> &RateLimiterConfig {
        &self.config
    }

    /// Permits each call takes.
    pub fn permits_per_call(&self) -> u64 {
        self.permits
    }
}
