//! redlimit at the HTTP edge: who the client is, even behind proxies, without
//! believing what a client writes about itself.
//!
//! - [`TrustedProxies`] and [`ClientIp`]: the client's address from the peer and
//!   the one forwarding header trusted proxies write, walked from the right.
//! - With the `axum` feature, [`ClientIp`] is an extractor (see [`axum`]).
//! - With the `tower` feature, [`tower::RateLimitLayer`] limits every request through a
//!   router or a gRPC server (`axum` and `tonic` add their responses); with `serde`,
//!   its rules read from configuration (`tower::LayerConfig`).
//! - With the `tower` feature, [`request`]: the client address and an identity the
//!   application sets, for the functions a request the layer serves calls, without
//!   passing them down (`{request.client_ip}` and `{request.identity}` in key
//!   templates).
//! - With the `actix` feature, the same layer is actix-web middleware, and
//!   [`ClientIp`] an actix-web extractor (see [`actix`]).

// On docs.rs (`--cfg docsrs`, a nightly rustdoc): each item behind a cargo feature
// says which one.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod client_ip;

pub use client_ip::{ClientIp, ForwardedHeader, InvalidProxy, TrustedProxies, DEFAULT_IPV6_PREFIX};

#[cfg(feature = "actix")]
pub mod actix;
#[cfg(feature = "axum")]
pub mod axum;
#[cfg(feature = "tower")]
pub mod request;
#[cfg(feature = "tower")]
pub mod tower;
