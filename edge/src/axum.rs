//! [`ClientIp`] as an axum extractor.
//!
//! The peer address comes from `ConnectInfo<SocketAddr>` (serve with
//! `into_make_service_with_connect_info::<SocketAddr>()`), the trusted proxies from a
//! [`TrustedProxies`] extension set on the router (none trusted without one), or from
//! the [`RateLimitLayer`](crate::tower::RateLimitLayer) the request came through: behind
//! a layer, `ClientIp` is the client the layer read, with the layer's setting. A
//! request whose extension and layer name different settings is refused (500), so a
//! handler never sees a client other than the one its limit counted.
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use axum::{routing::post, Extension, Router};
//! # mod redlimit { pub mod axum { pub use redlimit_edge::{ClientIp, TrustedProxies}; } }
//! use redlimit::axum::{ClientIp, TrustedProxies};
//!
//! async fn login(ip: ClientIp) -> String {
//!     format!("hello {ip}")
//! }
//!
//! # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//! let app = Router::new()
//!     .route("/login", post(login))
//!     .layer(Extension(TrustedProxies::new(["10.0.0.0/8"])?));
//! let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(()) }
//! ```

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::StatusCode;

use crate::client_ip::{one_setting, ReadBy};
use crate::{ClientIp, TrustedProxies};

impl<S: Send + Sync> FromRequestParts<S> for ClientIp {
    type Rejection = (StatusCode, &'static str);

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let misconfigured = |problem| (StatusCode::INTERNAL_SERVER_ERROR, problem);
        let read = parts.extensions.get::<ReadBy>();
        let trusted = one_setting([
            parts.extensions.get::<TrustedProxies>(),
            read.map(|read| &read.trusted),
        ])
        .map_err(misconfigured)?;
        if let Some(client) = read.and_then(|read| read.client) {
            return Ok(client);
        }
        let Some(ConnectInfo(peer)) = parts.extensions.get::<ConnectInfo<SocketAddr>>() else {
            return Err(misconfigured(
                "ClientIp needs the peer address: serve the router with \
                 into_make_service_with_connect_info::<SocketAddr>()",
            ));
        };
        Ok(match trusted {
            Some(trusted) => trusted.client_ip(peer.ip(), &parts.headers),
            None => TrustedProxies::default().client_ip(peer.ip(), &parts.headers),
        })
    }
}
