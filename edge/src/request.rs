//! The request the layer serves, as the code it calls sees it: the client address the
//! layer read and an identity the application sets, for key templates
//! (`#[rate_limit(key = "llm:user:{request.identity}", ...)]`) in functions any number
//! of calls below the handler, without passing them down.
//!
//! While a [`RateLimitLayer`](crate::tower::RateLimitLayer) (tower's, or its actix-web
//! middleware) serves a request it has granted, everything the inner service runs in
//! that request's task is inside the request's [`Scope`]: the middleware after the
//! layer, the handler, the functions they await.
//!
//! - [`client_ip`]: the client address the layer read, with its trusted proxies (the
//!   layer's own, a `TrustedProxies` extension or application data set outside it):
//!   the [`ClientIp`] a handler behind the layer extracts. A forwarding header from a
//!   peer that is not a trusted proxy changes nothing.
//! - [`set_identity`]: the application's name for who is calling (the authenticated
//!   user, the tenant), set once per request by the middleware that authenticates it,
//!   inside the layer (after it), then [`identity`].
//!
//! A key naming a value the call does not have is refused, never keyed by an empty or
//! shared value: outside any request, a request without an identity, a server that
//! gives no peer address. A task a request spawns (`tokio::spawn`) is outside the
//! request unless it carries the scope: `current()` in the request, then
//! [`Scope::run`] around the spawned future.
//!
//! ```
//! # async fn demo() {
//! # mod redlimit { pub use redlimit_edge::request; }
//! // In the middleware that authenticates a request, after the layer:
//! redlimit::request::set_identity("user-42").unwrap();
//! // In a task the request spawns:
//! let scope = redlimit::request::current().unwrap();
//! tokio::spawn(scope.run(async {
//!     assert_eq!(redlimit::request::identity().as_deref(), Some("user-42"));
//! }));
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use redlimit_runtime::engine::{KeyBuf, RequestValue};

use crate::ClientIp;

scoped_tls::scoped_thread_local! {
    /// The scope of the request whose future this thread is polling: set by [`Scoped`]
    /// for each poll (the scope stays where the future holds it), and the one it
    /// replaced put back after, also when the poll panics.
    static CURRENT: Scope
}

/// `f` given the scope of the request being served; `None` outside any.
fn with_current<R>(f: impl FnOnce(&Scope) -> R) -> Option<R> {
    CURRENT.is_set().then(|| CURRENT.with(f))
}

pin_project_lite::pin_project! {
    /// A future inside a request's [`Scope`]: the scope is the current one while the
    /// future is polled and when it is dropped. What [`Scope::run`] makes.
    pub struct Scoped<F> {
        scope: Scope,
        #[pin]
        future: Option<F>,
    }

    impl<F> PinnedDrop for Scoped<F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            drop_in(this.scope, this.future);
        }
    }
}

impl<F> fmt::Debug for Scoped<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scoped")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl<F: Future> Future for Scoped<F> {
    type Output = F::Output;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        poll_in(this.scope, this.future, cx)
    }
}

/// `future` polled inside `scope`, and dropped there once it is ready (as it would be
/// when dropped unfinished): a [`Scoped`] future's poll, for a future of the layer's
/// own that holds the inner one and its scope side by side.
#[inline]
pub(crate) fn poll_in<F: Future>(
    scope: &Scope,
    mut future: Pin<&mut Option<F>>,
    cx: &mut Context<'_>,
) -> Poll<F::Output> {
    CURRENT.set(scope, || {
        let poll = future
            .as_mut()
            .as_pin_mut()
            .expect("a Scoped future polled after it completed")
            .poll(cx);
        if poll.is_ready() {
            future.set(None);
        }
        poll
    })
}

/// `future`, when it is not done, dropped inside `scope`.
pub(crate) fn drop_in<F>(scope: &Scope, mut future: Pin<&mut Option<F>>) {
    if future.is_some() {
        CURRENT.set(scope, || future.set(None));
    }
}

/// Why a call has no value of the request: outside any request.
const OUTSIDE: &str = "the call is outside any request the layer serves (RateLimitLayer, or its actix-web \
                       middleware, in front of the handler); a task spawned while serving one is outside \
                       it too unless it carries the request's scope (redlimit::request::current(), then \
                       Scope::run around the spawned future)";

/// Why a request has no identity, and which middleware must set it.
const NO_IDENTITY: &str =
    "no identity is set for this request: the middleware that authenticates it, inside \
                           the layer (after it, nearer the handler), must call \
                           redlimit::request::set_identity before the rate-limited call";

/// One request the layer serves: what the code it calls may key by. Its clones share
/// the request's identity.
pub struct Scope {
    /// The client address, or why the layer could not read one.
    client_ip: Result<ClientIp, &'static str>,
    /// The identity, shared by the scope's clones: made when first set or shared (a
    /// clone, a nested layer), so a request that needs none allocates nothing for it.
    identity: OnceLock<Arc<Identity>>,
}

/// A request's identity, set once.
type Identity = OnceLock<Box<str>>;

impl Clone for Scope {
    /// A scope sharing this one's identity (set before or after the clone).
    fn clone(&self) -> Scope {
        Scope {
            client_ip: self.client_ip,
            identity: OnceLock::from(self.shared().clone()),
        }
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope")
            .field("client_ip", &self.client_ip)
            .field("identity", &self.identity())
            .finish()
    }
}

/// Why [`set_identity`] set nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdentityError {
    /// Called outside any request the layer serves.
    OutsideRequest,
    /// The request has an identity already: one is set once per request.
    AlreadySet,
    /// The identity is empty or all whitespace: no one.
    Empty,
}

impl fmt::Display for IdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IdentityError::OutsideRequest => {
                "set_identity was called outside any request the layer serves: call it in middleware \
                 inside the layer (after it), or in a task that carries the request's scope (Scope::run)"
            }
            IdentityError::AlreadySet => {
                "this request's identity is already set: it is set once, by the middleware that \
                 authenticates the request"
            }
            IdentityError::Empty => "an identity must not be empty or all whitespace",
        })
    }
}

impl std::error::Error for IdentityError {}

impl Scope {
    /// A request's scope, with the client address the layer read (or why it has none).
    pub(crate) fn new(client_ip: Result<ClientIp, &'static str>) -> Scope {
        Scope {
            client_ip,
            identity: OnceLock::new(),
        }
    }

    /// The scope of the request being served: the one an outer layer opened for it when
    /// there is one (so an identity set between two layers reaches the calls behind
    /// the inner one, and is still set once), else a new one with `client_ip`.
    pub(crate) fn for_request(client_ip: Result<ClientIp, &'static str>) -> Scope {
        with_current(Scope::clone).unwrap_or_else(|| Scope::new(client_ip))
    }

    /// [`for_request`](Scope::for_request) joining `outer`, the outer scope the request
    /// joins (`Outer`).
    #[inline(always)]
    pub(crate) fn joining(client_ip: Result<ClientIp, &'static str>, outer: Outer) -> Scope {
        match outer {
            Outer::Current => Scope::for_request(client_ip),
            Outer::Taken(outer) => outer.unwrap_or_else(|| Scope::new(client_ip)),
        }
    }

    /// The identity this scope shares with its clones, made when first asked for.
    fn shared(&self) -> &Arc<Identity> {
        self.identity.get_or_init(Arc::default)
    }

    /// The client address the layer read, behind its trusted proxies; `None` when the
    /// server gave no peer address.
    pub fn client_ip(&self) -> Option<ClientIp> {
        self.client_ip.ok()
    }

    /// The identity set for the request, if any.
    pub fn identity(&self) -> Option<&str> {
        self.identity.get()?.get().map(|identity| &**identity)
    }

    /// Sets the request's identity, once: see [`set_identity`].
    pub fn set_identity(&self, identity: impl Into<String>) -> Result<(), IdentityError> {
        let identity = identity.into();
        if identity.trim().is_empty() {
            return Err(IdentityError::Empty);
        }
        self.shared()
            .set(identity.into_boxed_str())
            .map_err(|_| IdentityError::AlreadySet)
    }

    /// `future` run inside this request's scope: how a task the request spawns
    /// (`tokio::spawn(scope.run(work))`) keeps keying by the request's values.
    #[inline(always)]
    pub fn run<F: Future>(self, future: F) -> Scoped<F> {
        Scoped {
            scope: self,
            future: Some(future),
        }
    }

    /// The future `call` makes, run in this scope, `call` itself run in it too (a
    /// service's `call`, before its future runs). `in_scope` false: `call` runs
    /// nothing of the application (axum's `Route`), and is called outside the scope.
    #[inline(always)]
    pub(crate) fn call<F: Future>(self, in_scope: bool, call: impl FnOnce() -> F) -> Scoped<F> {
        let future = match in_scope {
            true => self.call_inside(call),
            false => call(),
        };
        Scoped {
            scope: self,
            future: Some(future),
        }
    }

    /// `call` run inside this scope, for a future that will run in it too ([`poll_in`]).
    #[inline(always)]
    pub(crate) fn call_inside<F>(&self, call: impl FnOnce() -> F) -> F {
        CURRENT.set(self, call)
    }
}

/// Which outer scope a request joins: the one an outer layer opened for the request
/// being served when the layer was called. A request read where the layer is called
/// looks for it then (`Current`); one read later, in the layer's future, takes it
/// when the layer is called, so that where the future is first polled (inside
/// another request's poll, or outside any) does not change it.
pub(crate) enum Outer {
    Current,
    Taken(Option<Scope>),
}

impl Outer {
    /// The outer scope current now, taken for a request read later.
    pub(crate) fn take() -> Outer {
        Outer::Taken(current())
    }
}

/// The scope of the request being served, to carry into a task it spawns; `None`
/// outside any request.
pub fn current() -> Option<Scope> {
    with_current(Scope::clone)
}

/// Sets the identity of the request being served (the authenticated user, the
/// tenant), which `{request.identity}` in a key template reads. Call it once per
/// request, in the middleware that authenticates it, inside the layer (after it):
/// `Err` outside any request, when the request has one already, or for an empty or
/// all-whitespace identity. Any other text is accepted: written into a key, it is
/// escaped and, past 128 bytes, digested, as every value of a key template is.
pub fn set_identity(identity: impl Into<String>) -> Result<(), IdentityError> {
    // Converted first: the conversion is the application's code, which runs before
    // the current scope is read.
    let identity: String = identity.into();
    with_current(|scope| scope.set_identity(identity)).unwrap_or(Err(IdentityError::OutsideRequest))
}

/// The identity of the request being served; `None` outside any request or before
/// one is set.
pub fn identity() -> Option<String> {
    with_current(|scope| scope.identity().map(str::to_owned)).flatten()
}

/// The client address of the request being served, as the layer read it; `None`
/// outside any request or when the server gave no peer address.
pub fn client_ip() -> Option<ClientIp> {
    with_current(Scope::client_ip).flatten()
}

/// Writes `value` of the request being served into `key`, escaped; `Err` says why
/// there is none. What a key template's `{request.client_ip}` and
/// `{request.identity}` expand to. Not a public API.
#[doc(hidden)]
pub fn write_key(value: RequestValue, key: &mut KeyBuf) -> Result<(), &'static str> {
    with_current(|scope| match value {
        RequestValue::ClientIp => {
            let client = scope.client_ip?;
            key.value(&client);
            Ok(())
        }
        RequestValue::Identity => {
            key.value_str(scope.identity().ok_or(NO_IDENTITY)?);
            Ok(())
        }
    })
    .unwrap_or(Err(OUTSIDE))
}

#[cfg(all(test, feature = "axum"))]
mod tests;
