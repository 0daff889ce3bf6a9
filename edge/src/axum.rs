//! [`ClientIp`] as an axum extractor.
//!
//! The peer address comes from `ConnectInfo<SocketAddr>` (serve with
//! `into_make_service_with_connect_info::<SocketAddr>()`), the trusted proxies from a
//! [`TrustedProxies`] extension set on the router (none trusted without one).
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use axum::{routing::post, Extension, Router};
//! use redlimit_edge::{ClientIp, TrustedProxies};
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

use crate::{ClientIp, TrustedProxies};

impl<S: Send + Sync> FromRequestParts<S> for ClientIp {
    type Rejection = (StatusCode, &'static str);

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let Some(ConnectInfo(peer)) = parts.extensions.get::<ConnectInfo<SocketAddr>>() else {
            return Err((
                StatusCode::INTERNAL_SERVER_ERROR,
                "ClientIp needs the peer address: serve the router with \
                 into_make_service_with_connect_info::<SocketAddr>()",
            ));
        };
        let client = match parts.extensions.get::<TrustedProxies>() {
            Some(trusted) => trusted.client_ip(peer.ip(), &parts.headers),
            None => TrustedProxies::default().client_ip(peer.ip(), &parts.headers),
        };
        Ok(client)
    }
}
