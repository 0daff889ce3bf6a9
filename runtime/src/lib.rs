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

// On docs.rs (`--cfg docsrs`, a nightly rustdoc): each item behind a cargo feature
// says which one.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod algorithm;
mod backend;
mod client;
pub mod duration;
#[doc(hidden)]
pub mod engine;
mod handles;
pub mod keys;
pub(crate) mod observe;
mod outcomes;
#[doc(hidden)]
pub mod private;
mod render;
mod reserve;
mod rules;
#[cfg(test)]
mod test_support;

pub use backend::memory::DEFAULT_MAX_LIMITERS;
pub use backend::redis::connection::cluster_nodes;
#[doc(hidden)]
pub use backend::redis::connection::RawConnection;
#[doc(hidden)]
pub use backend::redis::delete_limiter_keys;
/// The acquire script as the library sends it (its recipe is in
/// `backend/redis/scripts.rs`), for measuring it beside other scripts.
#[doc(hidden)]
pub const ACQUIRE_SCRIPT: &str = backend::redis::scripts::ACQUIRE.source;
/// The settle script as the library sends it, for sending one settle twice.
#[doc(hidden)]
pub const SETTLE_SCRIPT: &str = backend::redis::scripts::SETTLE.source;
// For the CLI's `inspect`: the server's eviction policy, read as a client reads it.
#[doc(hidden)]
pub use backend::redis::server::{read_eviction, Eviction};
pub use backend::redis::target::{redact_url, scrub_url_secrets};
pub use client::builder::ClientBuilder;
pub use client::clock::{Clock, ManualClock, SystemClock};
pub use client::default_client::{default_client, set_default};
pub use client::{Client, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX};
pub use handles::bucket::TokenBucket;
pub use handles::limiter::RateLimiter;
pub use keys::member;
pub use keys::LimiterKeys;
pub use keys::LIBRARY_SEGMENT;
pub use outcomes::decision::Decision;
pub use outcomes::error::Error;
pub use outcomes::refusal::{FromRateLimited, Limit, RateLimited};
#[cfg(feature = "http")]
pub use outcomes::refusal::{
    RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
#[cfg(feature = "tonic")]
#[doc(hidden)]
pub use render::grpc::RefusalStatus;
#[cfg(any(feature = "axum", feature = "actix"))]
#[doc(hidden)]
pub use render::http::RefusalResponse;
#[cfg(any(feature = "axum", feature = "actix"))]
pub use render::problem::{ProblemJson, ProblemType};
pub use reserve::{Reservation, Reserved, RuleSettled, Settled};
pub use rules::config::{RateLimiterArgs, RateLimiterConfig, RateType, MAX_PERMITS, MAX_RATE};
pub use rules::overrides::{OverrideOf, RateOverride};
pub use rules::rule::{Algorithm, BucketShape, Rule, MAX_RULES_PER_CALL};
pub use rules::spec::OnError;
#[doc(hidden)]
pub use rules::spec::RuleSpec;
