//! [`ClientIp`] as an actix-web extractor: the peer is actix-web's, the trusted
//! proxies a [`TrustedProxies`] in the application data (`App::app_data`; none trusted
//! without one), or the ones of the [`RateLimitLayer`](crate::tower::RateLimitLayer)
//! the request came through: behind the middleware, `ClientIp` is the client it read,
//! with its setting. A request whose application data and middleware name different
//! settings is refused (500), so a handler never sees a client other than the one its
//! limit counted. The same rules as axum's extractor, read by the same code.

use std::future::{ready, Ready};

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpMessage, HttpRequest};

use super::request::client_ip;
use crate::client_ip::{one_setting, ReadBy};
use crate::{ClientIp, TrustedProxies};

/// The missing peer address, said to whoever runs the server.
const NO_PEER: &str = "ClientIp needs the peer address: actix-web's HttpServer gives it; a request \
                       made without a server needs one (TestRequest::peer_addr)";

impl FromRequest for ClientIp {
    type Error = actix_web::Error;
    type Future = Ready<Result<ClientIp, actix_web::Error>>;

    fn from_request(request: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(read(request).map_err(actix_web::error::ErrorInternalServerError))
    }
}

/// The request's client, or what its server's set-up lacks.
fn read(request: &HttpRequest) -> Result<ClientIp, &'static str> {
    let extensions = request.extensions();
    let read = extensions.get::<ReadBy>();
    let trusted = one_setting([
        request.app_data::<TrustedProxies>(),
        read.map(|read| &read.trusted),
    ])?;
    if let Some(client) = read.and_then(|read| read.client) {
        return Ok(client);
    }
    let peer = request.peer_addr().ok_or(NO_PEER)?;
    let untrusted = TrustedProxies::default();
    Ok(client_ip(
        request.headers(),
        trusted.unwrap_or(&untrusted),
        peer.ip(),
    ))
}
