//! What the server and the router put in a request for the layer to read: axum's
//! matched path parameters, the peer's address (axum's `ConnectInfo`, tonic's
//! `TcpConnectInfo`, a `SocketAddr` extension), and whether the layer sits where a
//! route has matched.

use std::borrow::Cow;
use std::future::Future;
use std::net::SocketAddr;

use http::request::Parts;

/// A path parameter's layer outside the router, where no route has matched yet.
pub(super) const OUTSIDE_ROUTER: &str =
    "no route has matched where the layer is: path parameters exist inside \
                                         the Router; add the layer with Router::route_layer or Router::layer \
                                         (directly, not inside another layer), or on a route";

/// The missing peer address, said to whoever runs the server.
pub(super) const NO_PEER: &str = "the client address needs the peer's: serve axum with \
                                  into_make_service_with_connect_info::<SocketAddr>(), or insert a \
                                  SocketAddr extension";

/// A rule's value for a request: `Ok(None)` for a global rule, `Ok(Some(""))` when the
/// request carries none, `Err` when the layer cannot read it where it is mounted.
pub(crate) type Value<'a> = Result<Option<Cow<'a, str>>, NoValue>;

/// Why a rule has no value for a request.
#[derive(Debug, Clone, Copy)]
pub(crate) enum NoValue {
    /// The layer cannot read it where it is mounted: what to change.
    Misconfigured(&'static str),
    /// A path parameter of a request no route matched.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    NotRouted,
    /// A header sent more than once.
    Repeated,
}

/// The matched path parameters, read once per request when a rule needs them.
#[cfg(feature = "axum")]
pub(super) enum PathParams {
    Unread,
    Matched(axum::extract::RawPathParams),
    /// A parameter is not UTF-8: the handler rejects it anyway; such requests share
    /// one limiter.
    NotUtf8,
    /// No route matched (the router's fallback), or the layer is outside the router.
    Missing,
}

#[cfg(not(feature = "axum"))]
pub(super) enum PathParams {
    Unread,
}

impl PathParams {
    #[cfg(feature = "axum")]
    pub(super) async fn read(needed: bool, parts: &mut Parts) -> PathParams {
        use axum::extract::rejection::RawPathParamsRejection;
        use axum::extract::{FromRequestParts, RawPathParams};
        if !needed {
            return PathParams::Unread;
        }
        // The router's fallback, or no router yet: no route matched.
        if parts.extensions.get::<axum::extract::MatchedPath>().is_none() {
            return PathParams::Missing;
        }
        match RawPathParams::from_request_parts(parts, &()).await {
            Ok(params) => PathParams::Matched(params),
            Err(RawPathParamsRejection::InvalidUtf8InPathParam(_)) => PathParams::NotUtf8,
            Err(_) => PathParams::Missing,
        }
    }

    #[cfg(not(feature = "axum"))]
    pub(super) async fn read(_: bool, _: &mut Parts) -> PathParams {
        PathParams::Unread
    }

    /// [`read`](PathParams::read) where it is called: axum's extractor reads the
    /// request's extensions and never waits. `Unread` were it to wait (the request then
    /// takes the general path, which reads them again).
    pub(super) fn read_now(needed: bool, parts: &mut Parts) -> PathParams {
        let read = std::pin::pin!(PathParams::read(needed, parts));
        match read.poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
            std::task::Poll::Ready(path) => path,
            std::task::Poll::Pending => PathParams::Unread,
        }
    }

    #[cfg(feature = "axum")]
    pub(super) fn get(&self, name: &str) -> Value<'_> {
        let missing = "the path parameter is not in the route that matched: add the layer with \
                       Router::route_layer, or on the routes whose path has it";
        match self {
            PathParams::Matched(params) => params
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| Some(Cow::Borrowed(value)))
                .ok_or(NoValue::Misconfigured(missing)),
            PathParams::NotUtf8 => Ok(Some(Cow::Borrowed(""))),
            PathParams::Unread => Err(NoValue::Misconfigured(missing)),
            PathParams::Missing => Err(NoValue::NotRouted),
        }
    }

    #[cfg(all(feature = "actix", not(feature = "axum")))]
    pub(super) fn get(&self, _: &str) -> Value<'_> {
        Err(NoValue::Misconfigured(
            "path parameters of a tower service are axum's: enable the `axum` feature",
        ))
    }
}

/// The peer's address, from whichever server put it in the request's extensions.
pub(super) fn peer_addr(extensions: &http::Extensions) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(addr)) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(*addr);
    }
    #[cfg(feature = "tonic")]
    if let Some(info) = extensions.get::<tonic::transport::server::TcpConnectInfo>() {
        if let Some(addr) = info.remote_addr() {
            return Some(addr);
        }
    }
    extensions.get::<SocketAddr>().copied()
}

/// Whether the layer wraps what an axum `Router` routes to (`Router::layer`,
/// `route_layer`, a `MethodRouter`'s layer): there, a request without path parameters
/// matched no route. Anywhere else (around the whole router, inside another layer) no
/// route has matched yet, and a path parameter's rule refuses as misconfigured.
#[cfg(feature = "axum")]
pub(super) fn behind_router<S: 'static>() -> bool {
    std::any::TypeId::of::<S>() == std::any::TypeId::of::<axum::routing::Route>()
}

#[cfg(not(feature = "axum"))]
#[allow(clippy::extra_unused_type_parameters)]
pub(super) fn behind_router<S: 'static>() -> bool {
    false
}

/// Whether `S`'s `call` runs nothing of the application, so that only its future needs
/// the request's scope: axum's `Route`, whose `call` makes a future that calls the
/// route's service when first polled (as [`behind_router`] knows it).
pub(super) fn calls_in_its_future<S: 'static>() -> bool {
    behind_router::<S>()
}
