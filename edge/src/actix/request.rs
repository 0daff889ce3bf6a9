//! An actix-web request as the layer reads it: [`Incoming`] for `ServiceRequest`. Its
//! headers are `http` 0.2's, read as bytes; the peer is actix-web's; path parameters
//! are those matched where the middleware is (`match_info`); the trusted proxies come
//! from application data. Closures (`Key::with`, costs) see a copy of the head as
//! `http` 1's, made when one asks for it.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::net::{IpAddr, SocketAddr};
use std::sync::LazyLock;

use actix_router::Quoter;

use actix_web::dev::ServiceRequest;
use actix_web::HttpMessage;
use http::request::Parts;

use crate::client_ip::ReadBy;
use crate::tower::{Incoming, KeyHeader, Line, NoValue, Value};
use crate::{ClientIp, TrustedProxies};

/// A path parameter missing where the middleware is: what to change.
const NO_PARAM: &str = "the path parameter is not in the path matched where the middleware is: wrap \
                        the resource (web::resource(path).wrap), or a scope whose own path has it";

/// The missing peer address, said to whoever runs the server.
pub(super) const NO_PEER: &str = "the client address needs the peer's: actix-web's HttpServer gives it; \
                                  a request made without a server needs one (TestRequest::peer_addr)";

/// A request through the actix-web middleware.
pub(super) struct ActixRequest<'a> {
    request: &'a ServiceRequest,
    head: OnceCell<Parts>,
}

impl<'a> ActixRequest<'a> {
    pub(super) fn new(request: &'a ServiceRequest) -> Self {
        ActixRequest {
            request,
            head: OnceCell::new(),
        }
    }
}

impl Incoming for ActixRequest<'_> {
    const NO_PEER: &'static str = NO_PEER;

    fn lines(&self, name: &KeyHeader) -> impl DoubleEndedIterator<Item = Line<'_>> {
        let lines = name.lines_in(self.request.headers());
        lines.map(|value| Line::new(value.as_bytes(), value.to_str().ok()))
    }

    fn peer(&self) -> Option<SocketAddr> {
        self.request.peer_addr()
    }

    fn client_ip(&self, trusted: &TrustedProxies, peer: IpAddr) -> ClientIp {
        client_ip(self.request.headers(), trusted, peer)
    }

    fn path_param(&self, name: &str) -> Value<'_> {
        match self.request.match_info().get(name) {
            Some(value) => Ok(Some(decoded(value))),
            None => Err(NoValue::Misconfigured(NO_PARAM)),
        }
    }

    fn path_read(&self) -> bool {
        true
    }

    fn settings<T>(&self, f: impl FnOnce(Option<&TrustedProxies>, Option<&ReadBy>) -> T) -> T {
        let extensions = self.request.extensions();
        f(
            self.request.app_data::<TrustedProxies>(),
            extensions.get::<ReadBy>(),
        )
    }

    fn leave(&mut self, read: ReadBy) {
        self.request.extensions_mut().insert(read);
    }

    fn head(&self) -> &Parts {
        self.head.get_or_init(|| head(self.request))
    }
}

/// A path parameter as the handler's `web::Path` reads it: the router decodes a path
/// but for `%25`, `%2F` and `%2B`, kept in the case the client sent them, so that one
/// value has many spellings (`a+b`, `a%2Bb`, `a%2bb`); each is decoded, and bytes
/// that are not UTF-8 are replaced, as `web::Path` does.
fn decoded(value: &str) -> Cow<'_, str> {
    static FULL: LazyLock<Quoter> = LazyLock::new(|| Quoter::new(b"", b""));
    match FULL.requote(value.as_bytes()) {
        Some(bytes) => Cow::Owned(String::from_utf8_lossy(&bytes).into_owned()),
        None => Cow::Borrowed(value),
    }
}

/// The client behind `peer` given actix-web's headers.
pub(super) fn client_ip(
    headers: &actix_web::http::header::HeaderMap,
    trusted: &TrustedProxies,
    peer: IpAddr,
) -> ClientIp {
    trusted.client_ip_from(peer, || {
        let lines = headers.get_all(trusted.forwarding_header().actix_name());
        lines.map(|value| value.as_bytes())
    })
}

/// The request's head as `http` 1's: method, URI, version and headers.
fn head(request: &ServiceRequest) -> Parts {
    use actix_web::http::Version;
    let mut head = http::Request::new(()).into_parts().0;
    head.method = http::Method::from_bytes(request.method().as_str().as_bytes()).unwrap_or_default();
    head.uri = http::Uri::try_from(request.uri().to_string()).unwrap_or_default();
    head.version = match request.version() {
        Version::HTTP_09 => http::Version::HTTP_09,
        Version::HTTP_10 => http::Version::HTTP_10,
        Version::HTTP_2 => http::Version::HTTP_2,
        Version::HTTP_3 => http::Version::HTTP_3,
        _ => http::Version::HTTP_11,
    };
    for (name, value) in request.headers() {
        let name = http::HeaderName::from_bytes(name.as_str().as_bytes());
        let value = http::HeaderValue::from_bytes(value.as_bytes());
        // Both parse: what `http` 0.2 accepts, 1 accepts.
        if let (Ok(name), Ok(value)) = (name, value) {
            head.headers.append(name, value);
        }
    }
    head
}
