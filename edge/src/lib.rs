//! redlimit at the HTTP edge: who the client is, even behind proxies, without
//! believing what a client writes about itself.
//!
//! - [`TrustedProxies`] and [`ClientIp`]: the client's address from the peer and
//!   the forwarding headers trusted proxies wrote, walked from the right.
//! - With the `axum` feature, [`ClientIp`] is an extractor (see [`axum`]).

mod client_ip;

pub use client_ip::{ClientIp, InvalidProxy, TrustedProxies, DEFAULT_IPV6_PREFIX};

#[cfg(feature = "axum")]
pub mod axum;
