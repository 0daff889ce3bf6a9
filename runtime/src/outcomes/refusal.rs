//! How a rate-limited function says no: [`RateLimited`], and [`FromRateLimited`] to
//! turn it into the function's return type.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::Error;

/// A call refused by `#[rate_limit]`: which limit, for how long, and why.
///
/// Implements [`std::error::Error`], so `Box<dyn Error>`, `anyhow::Error` and any
/// `E: From<RateLimited>` can carry it.
#[derive(Debug, Clone)]
pub struct RateLimited {
    pub(crate) key: String,
    pub(crate) retry_after: Option<Duration>,
    pub(crate) message: Option<Cow<'static, str>>,
    pub(crate) rule: usize,
    pub(crate) cause: Option<Arc<Error>>,
    /// Boxed: a refusal stays small enough to return by value.
    pub(crate) limit: Option<Box<Limit>>,
    /// The response adds `X-RateLimit-Limit`, `-Remaining` and `-Reset`.
    pub(crate) x_ratelimit: bool,
    /// A 429 as problem+json is of type `about:blank`, not the registered
    /// quota-exceeded type (`ProblemType`); read only with the `axum` feature.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) about_blank: bool,
    /// Permits the refusing rule's limiter had left (fewer than the call asked for):
    /// what a 429's `RateLimit` and `X-RateLimit-Remaining` fields say.
    pub(crate) remaining: u64,
}

/// The limit a refusal came from: what the IETF `RateLimit-Policy` field describes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// The rule's name: its key template as written (`login:{ip}`), the function's
    /// path when it has no `key`, or a layer rule's name. Never an interpolated key.
    pub name: Cow<'static, str>,
    /// Permits per window.
    pub rate: u64,
    /// The window.
    pub window: Duration,
    /// A token bucket's burst (the most tokens it holds); `None` for a sliding window.
    pub burst: Option<u64>,
}

impl Limit {
    /// The IETF `RateLimit-Policy` field of this limit: `"<name>";q=<rate>;w=<window
    /// in seconds, rounded up>`, and a token bucket's burst in a parameter of the
    /// library's own, `;redlimit-burst=<burst>` (the draft's convention for a
    /// service's parameters: a prefixed name).
    pub fn policy_field(&self) -> String {
        let window = seconds_up(self.window).max(1);
        let mut field = format!("{};q={};w={window}", sf_string(&self.name), self.rate);
        if let Some(burst) = self.burst {
            field.push_str(";redlimit-burst=");
            field.push_str(&burst.to_string());
        }
        field
    }

    /// The IETF `RateLimit` field: `"<name>";r=<remaining>`, with `;t=<seconds>` when
    /// the time until enough permits return is known (a refusal's `retry_after`,
    /// rounded up).
    pub fn state_field(&self, remaining: u64, reset: Option<Duration>) -> String {
        let mut field = format!("{};r={remaining}", sf_string(&self.name));
        if let Some(reset) = reset {
            field.push_str(";t=");
            field.push_str(&seconds_up(reset).to_string());
        }
        field
    }
}

/// `RateLimit-Policy: "<name>";q=<rate>;w=<window s>`, with `;redlimit-burst=<burst>`
/// for a token bucket (see [`Limit::policy_field`]).
#[cfg(feature = "http")]
pub const RATELIMIT_POLICY: http::HeaderName = http::HeaderName::from_static("ratelimit-policy");
/// `RateLimit: "<name>";r=<remaining>;t=<seconds until it resets>` (see
/// [`Limit::state_field`]).
#[cfg(feature = "http")]
pub const RATELIMIT: http::HeaderName = http::HeaderName::from_static("ratelimit");

/// `X-RateLimit-Limit: <rate>`, beside the IETF fields when asked for (see
/// [`RateLimited::x_ratelimit`]).
#[cfg(feature = "http")]
pub const X_RATELIMIT_LIMIT: http::HeaderName = http::HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining: <permits left>`.
#[cfg(feature = "http")]
pub const X_RATELIMIT_REMAINING: http::HeaderName = http::HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset: <seconds until a refused request would pass>` (a delta, as the
/// IETF field's `t`, not a timestamp), on refusals.
#[cfg(feature = "http")]
pub const X_RATELIMIT_RESET: http::HeaderName = http::HeaderName::from_static("x-ratelimit-reset");

/// A name as the RateLimit fields and a problem's `violated-policies` carry it:
/// printable ASCII as written, anything else `_` (what a structured-field string may
/// hold, RFC 9651).
pub(crate) fn policy_name(name: &str) -> Cow<'_, str> {
    if name.bytes().all(|b| (b' '..=b'~').contains(&b)) {
        return Cow::Borrowed(name);
    }
    Cow::Owned(
        name.chars()
            .map(|c| if (' '..='~').contains(&c) { c } else { '_' })
            .collect(),
    )
}

/// A name as a structured-field string (RFC 9651): [`policy_name`] quoted, `"` and `\`
/// escaped.
pub(crate) fn sf_string(name: &str) -> String {
    let name = policy_name(name);
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

impl RateLimited {
    /// The limiter's key (prefix included) of the rule that refused.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// How long until the same call would pass; `None` when the refusal came from a
    /// backend failure under `on_error = "deny"`.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The rule's `message`, if it has one.
    pub fn message(&self) -> Option<&str> {
        self.message.as_deref()
    }

    /// Which rule refused: the index of its attribute on the function, in source order.
    pub fn rule(&self) -> usize {
        self.rule
    }

    /// What refused the call when no limit was reached: the backend failure behind a
    /// refusal under `on_error = "deny"` ([`Error::is_backend_failure`]), or the
    /// call's own misuse or missing value (a settled rule's estimate of 0, a request
    /// without the key's value under a rule that refuses those), which any policy
    /// refuses.
    pub fn cause(&self) -> Option<&Error> {
        self.cause.as_deref()
    }

    /// The permits the refusing rule's limiter had left when it refused (fewer than
    /// the call asked for; 0 when it refused for a cause): what a 429's `RateLimit`
    /// field says as `r`.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// The refusing rule's limit (its name, rate and window).
    pub fn limit(&self) -> Option<&Limit> {
        self.limit.as_deref()
    }

    /// Whether the 429 this refusal answers with (cargo feature `axum`) also carries
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining` (0) and `X-RateLimit-Reset` (the
    /// seconds `Retry-After` gives), beside the IETF fields; default false.
    pub fn x_ratelimit(mut self, on: bool) -> Self {
        self.x_ratelimit = on;
        self
    }
}

impl fmt::Display for RateLimited {
    /// The rule's message, or what refused the call: its limit, the backend failing
    /// (under `on_error = "deny"`), or the call itself (a misuse or a request without
    /// the key's value: no limit was reached, and no backend failed).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = crate::keys::shown(&self.key);
        match (&self.message, &self.cause) {
            (Some(message), _) => f.write_str(message)?,
            (None, Some(cause)) if !cause.is_backend_failure() => {
                // (a request without the key's value has no limiter to name)
                return if self.key.is_empty() {
                    write!(f, "call refused without a decision: {cause}")
                } else {
                    write!(f, "call refused without a decision for `{key}`: {cause}")
                };
            }
            (None, _) => write!(f, "rate limit exceeded for `{key}`")?,
        }
        if let Some(wait) = self.retry_after {
            write!(f, "; retry after {} ms", wait.as_millis())?;
        }
        match &self.cause {
            Some(cause) if cause.is_backend_failure() => {
                write!(f, "; refused because the rate limiter is unavailable: {cause}")
            }
            Some(cause) => write!(f, "; refused: {cause}"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for RateLimited {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause.as_deref().map(|e| e as _)
    }
}

/// Builds a function's return value from a refusal, for `#[rate_limit]` without a
/// `fallback`.
///
/// Implemented for `Result<T, E>` where `E: From<RateLimited>`; implement it for your
/// own return types (an HTTP response with status 429, say):
///
/// ```
/// use redlimit_runtime::{FromRateLimited, RateLimited};
///
/// struct Response { status: u16, body: String }
///
/// impl FromRateLimited for Response {
///     fn from_rate_limited(limited: RateLimited) -> Self {
///         Response { status: 429, body: limited.to_string() }
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot express a rate-limit refusal",
    label = "a #[rate_limit] function without `fallback` must return a type implementing `FromRateLimited`",
    note = "return `Result<T, E>` with `E: From<redlimit::RateLimited>`, implement `redlimit::FromRateLimited` for `{Self}`, or give the attribute a `fallback = path::to::fn`; an axum handler can return `Result<T, redlimit::RateLimited>` or `axum::response::Response` (cargo feature `axum`) instead of `impl IntoResponse`"
)]
pub trait FromRateLimited {
    /// The value the function returns when refused.
    fn from_rate_limited(limited: RateLimited) -> Self;
}

impl<T, E: From<RateLimited>> FromRateLimited for Result<T, E> {
    fn from_rate_limited(limited: RateLimited) -> Self {
        Err(E::from(limited))
    }
}

/// Whole seconds, rounded up: a client that waits that long is not refused again.
pub(crate) fn seconds_up(wait: Duration) -> u64 {
    wait.as_millis().div_ceil(1000) as u64
}
