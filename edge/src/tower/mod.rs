//! A tower layer that rate-limits every request through it: one or more rules,
//! decided all-or-nothing in one round trip, keyed by what the request carries.
//!
//! ```
//! use std::time::Duration;
//! # use redlimit_edge as redlimit;
//! use redlimit::tower::{Key, LayerRule, RateLimitLayer};
//!
//! let layer = RateLimitLayer::builder()
//!     // 5 logins per minute per client address (behind trusted proxies, see below)
//!     .rule(LayerRule::new("login", 5, Duration::from_secs(60)).key(Key::client_ip()))
//!     // and 1 000 requests per second in all
//!     .rule(LayerRule::new("all", 1_000, Duration::from_secs(1)))
//!     .build()
//!     .unwrap();
//! # let _ = layer;
//! ```
//!
//! The limiter of a rule is `<client prefix><name>:<value>` (`rate_limit:login:
//! 198.51.100.7`), the value escaped as in the attribute's keys so that no caller can
//! reach another key; a rule keyed [`Key::global`] is `<prefix><name>`. A request a rule
//! finds no value for (no such header) shares one limiter with every other such
//! request of that rule: leaving a header out never escapes the limit.
//! A rule may refuse such requests instead, with 400 or 401 naming the header
//! ([`LayerRule::missing_key`]).
//!
//! The layer and its clones share their state: a limit on a router holds across all
//! its routes and every clone the server makes.

// One job per file, each importing only those before it in this order: `key` (where a
// rule's key comes from), `rule` (a rule's builder), `validate` (what a rule must be),
// `shared` (what a built layer keeps), `request` (what the server and the router put
// in a request), `incoming` (what the layer reads from a request, tower's or
// actix-web's), `per_request` (one request's keys and decision), `fields` (where a
// response's fields are written), `respond` (refusals and the RateLimit fields),
// `settle` (settled rules: the reservation held while the inner service runs),
// `service` and `layer` (tower's `Service` and `Layer`); `config` (with `serde`) reads
// rules from configuration into the builder. The actix-web middleware (`crate::actix`)
// uses the same rules, state and reading, through what is re-exported to the crate.

#[cfg(feature = "serde")]
mod config;
mod fields;
mod incoming;
mod key;
mod layer;
mod per_request;
mod request;
mod respond;
mod rule;
mod service;
mod settle;
mod shared;
mod validate;

pub use key::{Key, MissingKey};
pub use layer::{RateLimitLayer, RateLimitLayerBuilder};
/// The problem type of a 429 as problem+json ([`RateLimitLayerBuilder::problem_type`]).
#[cfg(any(feature = "axum", feature = "actix"))]
pub use redlimit_runtime::ProblemType;
pub use respond::{Grpc, PlainText, ProblemDetails, Respond};
pub use rule::LayerRule;
pub use service::{RateLimit, ResponseFuture};
pub use settle::{Settle, Usage};
pub use validate::InvalidLayer;

#[cfg(feature = "serde")]
pub use config::LayerConfig;

#[cfg(feature = "actix")]
pub(crate) use fields::Fields;
#[cfg(feature = "actix")]
pub(crate) use incoming::{Incoming, Line};
#[cfg(feature = "actix")]
pub(crate) use per_request::Keys;
#[cfg(feature = "actix")]
pub(crate) use request::{NoValue, Value};
#[cfg(feature = "actix")]
pub(crate) use shared::{KeyHeader, Shared};
#[cfg(feature = "serde")]
use validate::check_rule_fully;
