//! redlimit: distributed rate limiting for async Rust, in the Redis layout of
//! Redisson's `RRateLimiter`, so Rust and Java services can share one limiter.
//!
//! Without Redis it runs in process with the same semantics. See
//! [`Client`], [`RateLimiter`] and [`Client::check_rules`], the attribute
//! [`rate_limit`], and the [`guide`], a chapter per subject.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), redlimit::Error> {
//! use redlimit::{Client, RateType};
//! use std::time::Duration;
//!
//! let limiter = Client::memory().rate_limiter("rate_limit:user:42");
//! limiter.try_set_rate(RateType::Overall, 5, Duration::from_secs(60)).await?;
//! assert!(limiter.try_acquire(1).await?);
//! assert_eq!(limiter.available_permits().await?, 4);
//! # Ok(()) }
//! ```

// On docs.rs (`--cfg docsrs`, a nightly rustdoc): each item behind a cargo feature
// says which one.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[doc = include_str!("../docs/attribute.md")]
pub use redlimit_macros::rate_limit;

#[doc(hidden)]
pub use redlimit_runtime::ACQUIRE_SCRIPT;
#[doc(hidden)]
pub use redlimit_runtime::SETTLE_SCRIPT;
pub use redlimit_runtime::{
    default_client, keys, member, set_default, Algorithm, BucketShape, Client, ClientBuilder, Clock,
    Decision, Error, FromRateLimited, Limit, LimiterKeys, ManualClock, OnError, OverrideOf, RateLimited,
    RateLimiter, RateLimiterArgs, RateLimiterConfig, RateOverride, RateType, Reservation, Reserved, Rule,
    RuleSettled, Settled, SystemClock, TokenBucket, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_LIMITERS, DEFAULT_PREFIX, MAX_PERMITS, MAX_RATE, MAX_RULES_PER_CALL,
};

/// At the HTTP edge with axum (cargo feature `axum`): [`ClientIp`](axum::ClientIp),
/// the client's address behind [`TrustedProxies`](axum::TrustedProxies), usable in
/// keys: `#[rate_limit(key = "login:{ip}", ...)] async fn login(ip: ClientIp, ...)`.
///
/// A refused handler answers 429 with `Retry-After` and the IETF RateLimit fields when
/// it returns `Result<T, RateLimited>` or `axum::response::Response`; [`axum::ProblemJson`]
/// answers the same as `application/problem+json`, a 429 of the registered
/// quota-exceeded type naming the refusing policy (or `about:blank`,
/// [`axum::ProblemType`]).
#[cfg(feature = "axum")]
pub mod axum {
    pub use redlimit_edge::{ClientIp, ForwardedHeader, InvalidProxy, TrustedProxies, DEFAULT_IPV6_PREFIX};
    pub use redlimit_runtime::{
        ProblemJson, ProblemType, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING,
        X_RATELIMIT_RESET,
    };
}

// A tower layer (cargo feature `tower`, included in `axum` and `tonic`): the module,
// with its own documentation (limiter names, keyless requests, clones sharing state).
#[cfg(feature = "tower")]
#[doc(inline)]
pub use redlimit_edge::tower;

// The request the layer serves (cargo feature `tower`, included in `axum`, `actix` and
// `tonic`): its client address and an identity the application sets, for the code it
// calls; the module, with its own documentation.
#[cfg(feature = "tower")]
#[doc(inline)]
pub use redlimit_edge::request;

// actix-web (cargo feature `actix`): the layer's rules as middleware, the ClientIp
// extractor, refusals as responses; the module, with its own documentation.
#[cfg(feature = "actix")]
#[doc(inline)]
pub use redlimit_edge::actix;

pub mod guide;

/// The README's examples, compiled as doc tests so they stay true. Its layer example
/// needs the `axum` feature, which the README's test command turns on with every other.
#[doc = include_str!("../README.md")]
#[cfg(all(doctest, feature = "axum"))]
pub struct ReadmeDoctests;

/// What `#[rate_limit]` expands into. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use redlimit_macros::expand;
    pub use redlimit_runtime::private::*;

    /// Where `{request.client_ip}` and `{request.identity}` are read from: the request
    /// scope of the layer, built with the `tower` feature; without it, a key naming
    /// them does not compile, and the error says which feature to enable.
    #[derive(Debug)]
    pub struct Request;

    #[cfg(feature = "tower")]
    impl RequestValues for Request {
        fn write(value: RequestValue, key: &mut KeyBuf) -> Result<(), &'static str> {
            redlimit_edge::request::write_key(value, key)
        }
    }
}
