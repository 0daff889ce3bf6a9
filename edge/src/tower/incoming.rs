//! What the layer reads from a request, whichever server's it is: [`Incoming`], and
//! tower's `http::Request` (its head and its matched path parameters) as one. The
//! rules' keys, costs and trusted-proxy settings are read through it alone, so tower's
//! service and actix-web's middleware decide a request the same way.

use std::net::{IpAddr, SocketAddr};

use super::shared::KeyHeader;
use http::request::Parts;

#[cfg(any(feature = "axum", feature = "actix"))]
use super::request::Value;
use super::request::{peer_addr, PathParams, NO_PEER};
use crate::client_ip::ReadBy;
use crate::{ClientIp, TrustedProxies};

/// A request as the layer reads it.
pub(crate) trait Incoming {
    /// What to change when the request has no peer address, said to whoever runs the
    /// server.
    const NO_PEER: &'static str;

    /// Every line of header `name` as received, in order (`get_all`).
    fn lines(&self, name: &KeyHeader) -> impl DoubleEndedIterator<Item = Line<'_>>;

    /// The address that connected.
    fn peer(&self) -> Option<SocketAddr>;

    /// The client behind `peer`, reading the forwarding header `trusted` names.
    fn client_ip(&self, trusted: &TrustedProxies, peer: IpAddr) -> ClientIp;

    /// A path parameter of the route that matched.
    #[cfg(any(feature = "axum", feature = "actix"))]
    fn path_param(&self, name: &str) -> Value<'_>;

    /// Whether the path parameters are at hand for [`path_param`](Incoming::path_param)
    /// (a tower request's are read beforehand, when a rule is keyed by one).
    fn path_read(&self) -> bool;

    /// `f` given the trusted proxies the request carries (an extension, application
    /// data) and what an outer layer read.
    fn settings<T>(&self, f: impl FnOnce(Option<&TrustedProxies>, Option<&ReadBy>) -> T) -> T;

    /// Leaves on the request what the layer read, for the handler's [`ClientIp`].
    fn leave(&mut self, read: ReadBy);

    /// The request's head as `http` 1's, for [`Key::with`](super::Key::with) and
    /// [`LayerRule::cost`](super::LayerRule::cost).
    fn head(&self) -> &Parts;
}

/// A header line as received, without the spaces and tabs around it: its bytes, and
/// the same as text when the header's own check finds them visible ASCII (the usual
/// value), so that the usual value is not checked as UTF-8 again.
#[derive(Clone, Copy)]
pub(crate) struct Line<'a> {
    pub(crate) bytes: &'a [u8],
    ascii: Option<&'a str>,
}

impl<'a> Line<'a> {
    /// The line of `value`, an `http` 1 header's.
    #[inline]
    pub(crate) fn of(value: &'a http::HeaderValue) -> Self {
        Line::trimmed(value.as_bytes(), value.to_str().ok())
    }

    /// The line from its bytes and their text when visible ASCII (a server's own
    /// header type's check).
    #[cfg(feature = "actix")]
    #[inline]
    pub(crate) fn new(bytes: &'a [u8], ascii: Option<&'a str>) -> Self {
        Line::trimmed(bytes, ascii)
    }

    /// The line without the spaces and tabs around it, HTTP's optional whitespace:
    /// an HTTP/1 server drops them, HTTP/2 leaves them in, and a value is one value
    /// however many a client sends. (The usual value has none: two bytes looked at.)
    #[inline]
    fn trimmed(bytes: &'a [u8], ascii: Option<&'a str>) -> Self {
        let space = |b: &u8| *b == b' ' || *b == b'\t';
        if !bytes.first().is_some_and(space) && !bytes.last().is_some_and(space) {
            return Line { bytes, ascii };
        }
        let start = bytes.iter().position(|b| !space(b)).unwrap_or(bytes.len());
        let end = bytes
            .iter()
            .rposition(|b| !space(b))
            .map_or(start, |last| last + 1);
        Line {
            bytes: &bytes[start..end],
            // (spaces and tabs are ASCII: the text is cut where the bytes are)
            ascii: ascii.map(|text| &text[start..end]),
        }
    }

    /// The line as text, when it is UTF-8.
    #[inline]
    pub(crate) fn text(self) -> Option<&'a str> {
        self.ascii.or_else(|| std::str::from_utf8(self.bytes).ok())
    }
}

/// A tower request's head, and its path parameters read beforehand (an extractor's
/// future in axum).
pub(super) struct TowerRequest<'a> {
    pub(super) parts: &'a mut Parts,
    #[cfg_attr(not(any(feature = "axum", feature = "actix")), allow(dead_code))]
    pub(super) path: &'a PathParams,
}

impl Incoming for TowerRequest<'_> {
    const NO_PEER: &'static str = NO_PEER;

    fn lines(&self, name: &KeyHeader) -> impl DoubleEndedIterator<Item = Line<'_>> {
        self.parts.headers.get_all(&**name).iter().map(Line::of)
    }

    fn peer(&self) -> Option<SocketAddr> {
        peer_addr(&self.parts.extensions)
    }

    fn client_ip(&self, trusted: &TrustedProxies, peer: IpAddr) -> ClientIp {
        trusted.client_ip(peer, &self.parts.headers)
    }

    #[cfg(any(feature = "axum", feature = "actix"))]
    fn path_param(&self, name: &str) -> Value<'_> {
        self.path.get(name)
    }

    fn path_read(&self) -> bool {
        !matches!(self.path, PathParams::Unread)
    }

    fn settings<T>(&self, f: impl FnOnce(Option<&TrustedProxies>, Option<&ReadBy>) -> T) -> T {
        let extensions = &self.parts.extensions;
        f(extensions.get::<TrustedProxies>(), extensions.get::<ReadBy>())
    }

    fn leave(&mut self, read: ReadBy) {
        self.parts.extensions.insert(read);
    }

    fn head(&self) -> &Parts {
        self.parts
    }
}

/// A tower request read whole, its head not taken apart from its body: for a layer
/// none of whose rules reads the head as `Parts` (`Shared::reads_head`), where taking
/// it apart and putting it back would be all the work there is. No path parameters:
/// a rule keyed by one is decided from the parts, after they are read.
pub(super) struct WholeRequest<'a, B>(pub(super) &'a mut http::Request<B>);

impl<B> Incoming for WholeRequest<'_, B> {
    const NO_PEER: &'static str = NO_PEER;

    fn lines(&self, name: &KeyHeader) -> impl DoubleEndedIterator<Item = Line<'_>> {
        self.0.headers().get_all(&**name).iter().map(Line::of)
    }

    fn peer(&self) -> Option<SocketAddr> {
        peer_addr(self.0.extensions())
    }

    fn client_ip(&self, trusted: &TrustedProxies, peer: IpAddr) -> ClientIp {
        trusted.client_ip(peer, self.0.headers())
    }

    #[cfg(any(feature = "axum", feature = "actix"))]
    fn path_param(&self, _: &str) -> Value<'_> {
        PathParams::Unread.get("")
    }

    fn path_read(&self) -> bool {
        false
    }

    fn settings<T>(&self, f: impl FnOnce(Option<&TrustedProxies>, Option<&ReadBy>) -> T) -> T {
        let extensions = self.0.extensions();
        f(extensions.get::<TrustedProxies>(), extensions.get::<ReadBy>())
    }

    fn leave(&mut self, read: ReadBy) {
        self.0.extensions_mut().insert(read);
    }

    fn head(&self) -> &Parts {
        unreachable!("a layer whose rules read the request's head takes its parts apart")
    }
}
