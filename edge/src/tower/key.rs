//! Key sources: where a rule's key value comes from ([`Key`]), and what a rule does
//! with a request that has none ([`MissingKey`]).

use std::fmt;
use std::sync::Arc;

use http::request::Parts;

/// A request's key value for a rule, computed from the request.
pub(super) type KeyFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// Where a rule's key comes from.
#[derive(Clone)]
pub struct Key(pub(super) KeyKind, pub(super) Secret);

/// Whether a key's values are secrets, written as their digest.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Secret(pub(super) bool);

#[derive(Clone)]
pub(super) enum KeyKind {
    Global,
    ClientIp,
    Header(String),
    #[cfg(any(feature = "axum", feature = "actix"))]
    PathParam(String),
    /// The closure, and its type: what tells two closures' limiters apart.
    With(Arc<KeyFn>, std::any::TypeId),
}

impl Key {
    /// One limiter for every request.
    pub fn global() -> Key {
        Key(KeyKind::Global, Secret(false))
    }

    /// The client's address (without port; IPv6 grouped by prefix), from the peer and
    /// the forwarding header written by [`TrustedProxies`](crate::TrustedProxies) (set with
    /// [`RateLimitLayerBuilder::trusted_proxies`](super::RateLimitLayerBuilder::trusted_proxies),
    /// or as a request extension such as axum's `Extension` outside the layer, or
    /// actix-web's application data; none trusted without either). The peer comes
    /// from axum's `ConnectInfo<SocketAddr>`, tonic's `TcpConnectInfo`, a `SocketAddr`
    /// extension, or actix-web's peer address; a request with none of them is refused
    /// as misconfigured (500). The handler's [`ClientIp`](crate::ClientIp) is the
    /// address the layer keyed by.
    pub fn client_ip() -> Key {
        Key(KeyKind::ClientIp, Secret(false))
    }

    /// A request header's value, such as `x-api-key`. Requests without it share one
    /// limiter (per rule); a value that is not UTF-8 keys by its bytes (each byte that
    /// is not part of UTF-8 written `%XX` in the limiter's name), so it shares a limiter
    /// with no other value. Long values are digested, as in the attribute's keys.
    /// Spaces and tabs around the value are not part of it (an HTTP/1 server drops
    /// them, HTTP/2 passes them on), and a gRPC binary header's value (a name ending
    /// `-bin`) is keyed without its base64 padding, which tonic reads or not alike.
    /// An `Authorization` or `Proxy-Authorization` value is keyed as one credential:
    /// its scheme in lower case and one space before the rest (`Bearer t`, `bearer t`
    /// and `BEARER  t` are one value, as schemes are case-insensitive); for a credential
    /// the application reads otherwise, key by it with [`Key::with`].
    pub fn header(name: &str) -> Key {
        Key(KeyKind::Header(name.to_owned()), Secret(false))
    }

    /// A matched path parameter, such as `user_id` in `/users/{user_id}` (axum,
    /// actix-web). Path parameters exist once a route matched: in axum, add the layer
    /// with `Router::route_layer`, `Router::layer` or on the route itself. Under
    /// `Router::layer`, a request no route matches goes on to the router's fallback
    /// (404) without this rule, the other rules still deciding; so does one the
    /// fallback serves (static files, a router given to `fallback_service`) and one
    /// for a service given to `nest_service`: no route of the router matched it, and
    /// its path parameters are the inner router's. Nest a router with `nest`, or add
    /// the layer inside the inner router. In actix-web, wrap the
    /// resource, or a scope whose own path has the parameter
    /// (`web::scope("/users/{user_id}")`): the middleware sees the parameters matched
    /// where it is. A matched route without the parameter (a misspelt name), and a
    /// layer outside the router, are refused as misconfigured (500), never let through
    /// unlimited; a parameter that is not UTF-8 shares one limiter with all such.
    /// The key is the parameter's text, percent-decoded as the framework's `Path`
    /// extractor decodes it: a handler that parses it as a number reads `7`, `07` and
    /// `+7` as one, which are three limiters here; key such a parameter with
    /// [`Key::with`], parsing it as the handler does.
    #[cfg(any(feature = "axum", feature = "actix"))]
    pub fn path_param(name: &str) -> Key {
        Key(KeyKind::PathParam(name.to_owned()), Secret(false))
    }

    /// A value computed from the request's head; `None` when it has none (those
    /// requests share one limiter, per rule). In actix-web the head is a copy made as
    /// `http` 1's (method, URI, version, headers; no extensions), once per request
    /// that a rule reads it for.
    pub fn with<F>(key: F) -> Key
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        Key(
            KeyKind::With(Arc::new(key), std::any::TypeId::of::<F>()),
            Secret(false),
        )
    }

    /// This key's values are secrets (an API key, a bearer token): each is written as
    /// `%#` and 32 hex digits of its SHA-256 (`api:%#9f86d0...`), so the limiters'
    /// names, their keys in Redis, the refusal reports `redlimit watch` reads and every
    /// message or log line quoting them hold no part of it. Values differ as their
    /// digests do (128 bits), and a value no request sends (none, or only whitespace)
    /// shares the rule's one limiter of no value as before. A digest hides a value
    /// that cannot be guessed, not one drawn from few (a PIN): it is the same in every
    /// process, so that they share limiters. A [`Key::global`] has no value to keep
    /// secret: a layer with such a rule does not build (`InvalidLayer`).
    ///
    /// ```
    /// # use redlimit_edge as redlimit;
    /// use redlimit::tower::{Key, LayerRule};
    /// use std::time::Duration;
    ///
    /// let rule = LayerRule::new("api", 100, Duration::from_secs(1))
    ///     .key(Key::header("authorization").secret());
    /// ```
    pub fn secret(self) -> Key {
        Key(self.0, Secret(true))
    }

    /// Whether every request has a value for this key (a client address always has one).
    pub(super) fn always_present(&self) -> bool {
        matches!(self.0, KeyKind::Global | KeyKind::ClientIp)
    }

    /// The key's value in the attribute's template syntax, named after its source
    /// (`ip` for [`Key::client_ip`], as an attribute keyed by a `ClientIp` parameter
    /// named `ip` writes it; `header x-user` and `path id`, which no client address
    /// and no parameter of a function is named, so that a value a caller chooses is
    /// never counted as the address the layer read); `None` for [`Key::global`],
    /// whose limiter has no value.
    pub(super) fn template_value(&self) -> Option<String> {
        let value = self.source_value()?;
        // (a secret's values are its digests: a source of its own)
        Some(match self.1 {
            Secret(true) => format!("{value} secret"),
            Secret(false) => value,
        })
    }

    fn source_value(&self) -> Option<String> {
        Some(match &self.0 {
            KeyKind::Global => return None,
            KeyKind::ClientIp => redlimit_runtime::engine::CLIENT_IP_VALUE.to_owned(),
            KeyKind::Header(header) => format!("header {}", header.to_ascii_lowercase()),
            #[cfg(any(feature = "axum", feature = "actix"))]
            KeyKind::PathParam(param) => format!("path {param}"),
            // each closure is a type of its own: two closures are two shapes (a value one
            // computes never reaches the limiters of another's), one closure built twice one
            KeyKind::With(_, closure) => {
                use std::hash::{Hash, Hasher};
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                closure.hash(&mut hasher);
                format!("with {:016x}", hasher.finish())
            }
        })
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.source(f)?;
        match self.1 {
            Secret(true) => f.write_str(".secret()"),
            Secret(false) => Ok(()),
        }
    }
}

impl Key {
    fn source(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            KeyKind::Global => f.write_str("Key::global()"),
            KeyKind::ClientIp => f.write_str("Key::client_ip()"),
            KeyKind::Header(name) => write!(f, "Key::header({name:?})"),
            #[cfg(any(feature = "axum", feature = "actix"))]
            KeyKind::PathParam(name) => write!(f, "Key::path_param({name:?})"),
            KeyKind::With(..) => f.write_str("Key::with(..)"),
        }
    }
}

/// What a rule does with a request that has no value for its key: no such header, an
/// empty or all-whitespace one (any Unicode whitespace: a no-break space is no value
/// either), `None` from [`Key::with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum MissingKey {
    /// All such requests share one limiter of the rule (the default): leaving the
    /// value out never escapes the limit.
    #[default]
    Share,
    /// Refused with 400 Bad Request, the body naming what is missing (`This request
    /// needs the x-api-key header`); nothing is spent.
    BadRequest,
    /// Refused the same way with 401 Unauthorized (for a key that is a credential).
    /// The response has no `WWW-Authenticate`: the scheme is the application's.
    Unauthorized,
}
