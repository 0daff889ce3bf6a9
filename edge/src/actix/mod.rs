//! redlimit in actix-web (cargo feature `actix`): the layer's rules as middleware, the
//! [`ClientIp`] extractor, and refusals as responses.
//!
//! A [`RateLimitLayer`] is actix-web middleware as it is a tower layer: the same
//! rules ([`LayerRule`], [`Key`], [`MissingKey`], exempt values, costs, shadow rules,
//! `on_error`), the same settings and configuration (`LayerConfig` with `serde`),
//! decided by the same code, with the same RateLimit fields on granted responses and
//! the same refusals (plain text, or `application/problem+json` with
//! [`RateLimitLayer::problem_json`]; your own with a [`Respond`]). Wrap an app, a
//! scope or a resource with it:
//!
//! ```no_run
//! use std::time::Duration;
//! use actix_web::{web, App, HttpServer};
//! # mod redlimit { pub use redlimit_edge::actix; }
//! use redlimit::actix::{Key, LayerRule, RateLimitLayer, TrustedProxies};
//!
//! async fn show() -> &'static str {
//!     "a user\n"
//! }
//!
//! # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = RateLimitLayer::builder()
//!     // 100 requests a minute per client address, behind the proxies of 10.0.0.0/8
//!     .rule(LayerRule::new("api", 100, Duration::from_secs(60)).key(Key::client_ip()))
//!     .trusted_proxies(TrustedProxies::new(["10.0.0.0/8"])?)
//!     .build()?;
//! HttpServer::new(move || {
//!     App::new().service(web::scope("/api").wrap(layer.clone()).route("/user", web::get().to(show)))
//! })
//! .bind(("0.0.0.0", 8080))?
//! .run()
//! .await?;
//! # Ok(()) }
//! ```
//!
//! Where actix-web differs from tower, and what the middleware does there:
//!
//! - Path parameters ([`Key::path_param`]) are those matched where the middleware is
//!   (`match_info`): wrap the resource, or a scope whose own path has the parameter.
//!   Elsewhere a rule keyed by one refuses as misconfigured (500).
//! - Trusted proxies come from the layer
//!   ([`trusted_proxies`](RateLimitLayerBuilder::trusted_proxies)) or from a
//!   [`TrustedProxies`] in the application data (`App::app_data`), never both unless
//!   they are the same; the handler's [`ClientIp`] is the client the layer read.
//! - [`Key::with`] and [`LayerRule::cost`] read the request's head as `http` 1's
//!   `Parts`: actix-web's (`http` 0.2's) is copied once for a request a rule reads it
//!   for.
//! - A rule settled by [`Settle::usage`] puts its [`Usage`] in the request's
//!   extensions: the handler takes it as `web::ReqData<Usage>`.
//!
//! A handler that returns `Result<T, RateLimited>` (or `actix_web::Error`) or
//! `HttpResponse` answers a refusal of `#[rate_limit]` as the middleware does; so does
//! [`ProblemJson`] as problem+json.

mod client_ip;
mod middleware;
mod request;
mod respond;

pub use middleware::{MiddlewareFuture, RateLimitMiddleware};
pub use respond::Respond;

#[cfg(feature = "serde")]
pub use crate::tower::LayerConfig;
pub use crate::tower::{
    InvalidLayer, Key, LayerRule, MissingKey, PlainText, ProblemDetails, RateLimitLayer,
    RateLimitLayerBuilder, Settle, Usage,
};
pub use crate::{ClientIp, ForwardedHeader, InvalidProxy, TrustedProxies, DEFAULT_IPV6_PREFIX};
pub use redlimit_runtime::{
    ProblemJson, ProblemType, RateLimited, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT,
    X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
