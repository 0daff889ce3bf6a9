//! The runtime of [redlimit](https://docs.rs/redlimit): a distributed rate limiter that
//! keeps its state in Redis in exactly the layout of Redisson's `RRateLimiter`, so Rust
//! and Java services can share limiters, or in this process with the same semantics.
//!
//! - [`Client`]: the backend (Redis or memory), clock, key prefix, timeouts, client id.
//! - [`RateLimiter`]: Redisson's API: `try_set_rate`, `try_acquire`, `check`, ...
//! - [`Rule`] and [`Client::check_rules`]: several limits decided all-or-nothing in
//!   one script call.
//! - [`Decision`]: being limited is an outcome; [`Error`] is for failures and misuse.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), redlimit_runtime::Error> {
//! use redlimit_runtime::{Client, Rule};
//! use std::time::Duration;
//!
//! let client = Client::memory();
//! let rules = [
//!     Rule::new("rate_limit:order:user:42", 1, Duration::from_secs(60)),
//!     Rule::new("rate_limit:order", 100, Duration::from_secs(1)),
//! ];
//! assert!(client.check_rules(&rules).await?.allowed);
//! let refused = client.check_rules(&rules).await?;
//! assert_eq!(refused.refused_by, Some(0));
//! # Ok(()) }
//! ```

mod backend;
mod bucket;
mod builder;
mod checks;
mod client;
mod clock;
mod config;
mod config_log;
mod decision;
mod default_client;
mod error;
#[cfg(feature = "tonic")]
mod grpc;
mod key_buf;
pub mod keys;
mod limiter;
pub mod member;
pub(crate) mod observe;
mod overrides;
#[doc(hidden)]
pub mod private;
mod refusal;
mod refusal_cache;
mod registry;
#[cfg(feature = "axum")]
mod response;
mod rule;
mod site;
mod target;
#[cfg(test)]
mod test_support;
#[cfg(feature = "tls")]
mod tls;
mod waiting;

pub use backend::connection::cluster_nodes;
#[doc(hidden)]
pub use backend::connection::RawConnection;
#[doc(hidden)]
pub use backend::redis::delete_limiter_keys;
/// The acquire script as the library sends it (its recipe is `backend/scripts.rs`'s),
/// for measuring it beside other scripts.
#[doc(hidden)]
pub const ACQUIRE_SCRIPT: &str = backend::scripts::ACQUIRE.source;
pub use bucket::TokenBucket;
pub use builder::ClientBuilder;
pub use client::{
    Client, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_LIMITERS, DEFAULT_PREFIX,
};
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{RateLimiterArgs, RateLimiterConfig, RateType, MAX_RATE};
pub use decision::Decision;
pub use default_client::{default_client, set_default};
pub use error::Error;
pub use keys::LimiterKeys;
pub use limiter::RateLimiter;
pub use overrides::{OverrideOf, RateOverride, LIBRARY_SEGMENT};
pub use refusal::{FromRateLimited, Limit, RateLimited};
#[cfg(feature = "http")]
pub use refusal::{RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET};
#[cfg(feature = "axum")]
pub use response::ProblemJson;
pub use rule::{Algorithm, BucketShape, Rule};
pub use site::OnError;
pub use target::{redact_url, scrub_url_secrets};
