//! The service: [`RateLimit`], what [`RateLimitLayer`](super::RateLimitLayer) wraps
//! around another service. Each request is decided before the inner service sees it;
//! a grant passes it on, inside the request's scope (`crate::request`), and adds the
//! RateLimit fields, a refusal is answered by the layer's responder. In process without a timeout the decision never waits, so it is
//! made where the service is called and the response future is the inner service's;
//! otherwise the decision (an `async fn` of the layer) and the inner call are boxed.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use redlimit_runtime::engine::Granted;
use redlimit_runtime::RateLimited;

use super::incoming::{TowerRequest, WholeRequest};
use super::request::{behind_router, calls_in_its_future, PathParams};
use super::respond::{decided_inside, PlainText, Respond};
use super::settle::{Held, Usage};
use super::shared::Shared;
use crate::request::{drop_in, poll_in, Outer, Scope};

/// The service [`RateLimitLayer`](super::RateLimitLayer) wraps around another.
#[derive(Clone)]
pub struct RateLimit<S, R = PlainText> {
    pub(super) inner: S,
    pub(super) shared: Arc<Shared>,
    pub(super) respond: R,
}

impl<S: fmt::Debug, R> fmt::Debug for RateLimit<S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, R, B, ResBody> Service<Request<B>> for RateLimit<S, R>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    R: Respond<ResBody>,
    B: Send + 'static,
    ResBody: 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    // Inlined into the caller (axum's boxed route): the response future is then made
    // where the caller keeps it, not copied out of this function's return.
    #[inline(always)]
    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        if !self.shared.decides_at_once {
            return self.waiting(request);
        }
        // Decided here, in process: its grant passed on to the inner service (polled
        // ready for it), or its refusal. The request is taken apart only when a rule
        // reads its head, or its path parameters are to be read.
        let routed = behind_router::<S>();
        let decided = 'decided: {
            if !self.shared.reads_head {
                if let Some(decided) = self.shared.decide_now(&mut WholeRequest(&mut request), routed) {
                    break 'decided decided;
                }
            }
            let (mut parts, body) = request.into_parts();
            let path = PathParams::read_now(self.shared.needs_path, &mut parts);
            let mut head = TowerRequest {
                parts: &mut parts,
                path: &path,
            };
            let decided = match self.shared.decide_now(&mut head, routed) {
                Some(decided) => decided,
                None => match self.decide_polled(&mut parts) {
                    Some(decided) => decided,
                    None => return self.waiting(Request::from_parts(parts, body)),
                },
            };
            request = Request::from_parts(parts, body);
            decided
        };
        let (granted, scope) = match decided {
            Ok(granted) => granted,
            Err(limited) => {
                let response = self.respond.refused(self.shared.answered(limited));
                return ResponseFuture {
                    kind: Kind::Refused {
                        response: Some(response),
                    },
                };
            }
        };
        let fields = self
            .shared
            .writes_fields()
            .then(|| (self.shared.clone(), granted));
        if calls_in_its_future::<S>() {
            // Written where it is returned: the inner future is not moved on its way.
            return ResponseFuture {
                kind: Kind::Granted {
                    future: Some(self.inner.call(request)),
                    scope,
                    fields,
                },
            };
        }
        let future = scope.call_inside(|| self.inner.call(request));
        ResponseFuture {
            kind: Kind::Granted {
                future: Some(future),
                scope,
                fields,
            },
        }
    }
}

impl<S, R> RateLimit<S, R>
where
    R: Clone,
{
    /// The request decided by the engine's general path, polled here: `None` if it
    /// would wait after all (it does not in process without a timeout: nothing it
    /// awaits sleeps or reads a connection), and the request takes the boxed path.
    fn decide_polled(&self, parts: &mut http::request::Parts) -> Option<Decided>
    where
        S: 'static,
    {
        let decision = std::pin::pin!(self.shared.decide(parts, behind_router::<S>(), Outer::Current));
        match decision.poll(&mut Context::from_waker(std::task::Waker::noop())) {
            Poll::Ready(decided) => Some(decided),
            Poll::Pending => {
                // Not reached: the debug assertion holds the tests to it. Were it
                // reached, the request would be decided again on the boxed path.
                debug_assert!(false, "an in-process decision waited");
                None
            }
        }
    }

    /// The decision (an `async fn` of the layer) and the inner call, boxed.
    fn waiting<B, ResBody>(&mut self, request: Request<B>) -> ResponseFuture<S::Future, ResBody, S::Error>
    where
        S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        R: Respond<ResBody>,
        B: Send + 'static,
        ResBody: 'static,
    {
        // The clone that was polled ready serves this request; the fresh one waits
        // for the next poll_ready.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        let respond = self.respond.clone();
        // The outer scope current now, where the layer is called: the request joins it
        // wherever its future is polled, as one decided at once does.
        let outer = Outer::take();
        if shared.settles {
            let reserving = Box::pin(reserved(shared.clone(), respond, inner, request, outer));
            return ResponseFuture {
                kind: Kind::Reserving { reserving, shared },
            };
        }
        let waiting = Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            match shared.decide(&mut parts, behind_router::<S>(), outer).await {
                Ok((granted, scope)) => {
                    let in_scope = !calls_in_its_future::<S>();
                    let request = Request::from_parts(parts, body);
                    let mut response = scope.call(in_scope, || inner.call(request)).await?;
                    shared.add_success_fields(&granted, &mut response);
                    Ok(response)
                }
                Err(limited) => Ok(respond.refused(shared.answered(limited))),
            }
        });
        ResponseFuture {
            kind: Kind::Waiting { waiting },
        }
    }
}

/// A request through a layer with settled rules: its rules reserved, and the inner
/// service called with the [`Usage`](super::Usage) in the request's extensions when
/// the rules record one; the response, with what the layer holds of the reservation
/// (settled by [`ResponseFuture`] once the head is read).
async fn reserved<S, R, B, ResBody>(
    shared: Arc<Shared>,
    respond: R,
    mut inner: S,
    request: Request<B>,
    outer: Outer,
) -> Result<Reserved<ResBody>, S::Error>
where
    S: Service<Request<B>, Response = Response<ResBody>> + 'static,
    R: Respond<ResBody>,
{
    let (mut parts, body) = request.into_parts();
    let path = PathParams::read(shared.needs_path, &mut parts).await;
    let read = shared.read(
        &mut TowerRequest {
            parts: &mut parts,
            path: &path,
        },
        behind_router::<S>(),
        false,
        outer,
    );
    let outer_usage = parts.extensions.get::<Usage>().cloned();
    let held = match read {
        Ok((keys, scope)) => shared
            .reserve_keys(keys, outer_usage)
            .await
            .map(|held| (held, scope)),
        Err(limited) => Err(limited),
    };
    let (held, scope) = match held {
        Ok(held) => held,
        Err(limited) => return Ok(Reserved::Refused(respond.refused(shared.answered(limited)))),
    };
    if let Some(usage) = held.usage() {
        parts.extensions.insert(usage);
    }
    let request = Request::from_parts(parts, body);
    let response = scope
        .call(!calls_in_its_future::<S>(), || inner.call(request))
        .await?;
    Ok(Reserved::Granted(response, held))
}

/// What [`reserved`] answers.
enum Reserved<ResBody> {
    Refused(Response<ResBody>),
    Granted(Response<ResBody>, Held),
}

/// A request's decision: its grant and scope, or its refusal.
type Decided = Result<(Granted, Scope), RateLimited>;

impl Shared {
    /// The RateLimit fields of a granted response, when the layer adds them and the
    /// response was not decided inside ([`decided_inside`]).
    fn add_success_fields<B>(&self, granted: &Granted, response: &mut Response<B>) {
        if self.writes_fields() && !decided_inside(response) {
            self.success_fields(granted, response.headers_mut());
        }
    }
}

type Boxed<ResBody, E> = Pin<Box<dyn Future<Output = Result<Response<ResBody>, E>> + Send>>;

pin_project_lite::pin_project! {
    /// The response future of [`RateLimit`]: the inner service's for a request decided
    /// at once, the refusal's response, or the boxed decision and inner call.
    pub struct ResponseFuture<F, ResBody, E> {
        #[pin]
        kind: Kind<F, ResBody, E>,
    }

    impl<F, ResBody, E> PinnedDrop for ResponseFuture<F, ResBody, E> {
        fn drop(this: Pin<&mut Self>) {
            // A granted request's inner future unfinished is dropped in its scope.
            if let KindProj::Granted { future, scope, .. } = this.project().kind.project() {
                drop_in(scope, future);
            }
        }
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<F, ResBody, E> {
        // The inner future in the request's scope, as `Scoped` holds it, written
        // here rather than in a `Scoped` so that it is not moved once more.
        Granted {
            #[pin]
            future: Option<F>,
            scope: Scope,
            fields: Option<(Arc<Shared>, Granted)>,
        },
        Refused {
            response: Option<Response<ResBody>>,
        },
        Waiting {
            waiting: Boxed<ResBody, E>,
        },
        Reserving {
            reserving: Pin<Box<dyn Future<Output = Result<Reserved<ResBody>, E>> + Send>>,
            shared: Arc<Shared>,
        },
        Settling {
            response: Option<Response<ResBody>>,
            settle: Pin<Box<dyn Future<Output = Granted> + Send>>,
            shared: Arc<Shared>,
        },
    }
}

impl<F, ResBody, E> fmt::Debug for ResponseFuture<F, ResBody, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, ResBody, E> Future for ResponseFuture<F, ResBody, E>
where
    F: Future<Output = Result<Response<ResBody>, E>>,
{
    type Output = Result<Response<ResBody>, E>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut kind = self.as_mut().project().kind;
        if let KindProj::Reserving { reserving, shared } = kind.as_mut().project() {
            let (response, mut held) = match std::task::ready!(reserving.as_mut().poll(cx))? {
                Reserved::Refused(response) => return Poll::Ready(Ok(response)),
                Reserved::Granted(response, held) => (response, held),
            };
            let headers = response.headers();
            held.read_head(|name| headers.get_all(&**name).iter().map(http::HeaderValue::as_bytes));
            let shared = shared.clone();
            kind.set(Kind::Settling {
                response: Some(response),
                settle: Box::pin(held.finish()),
                shared,
            });
        }
        match kind.project() {
            KindProj::Granted {
                future,
                scope,
                fields,
            } => {
                // Without fields to add, the inner poll's answer as it is (not taken
                // out of its `Poll` and put back).
                if fields.is_none() {
                    return poll_in(scope, future, cx);
                }
                let mut response = std::task::ready!(poll_in(scope, future, cx))?;
                if let Some((shared, granted)) = fields.take() {
                    shared.add_success_fields(&granted, &mut response);
                }
                Poll::Ready(Ok(response))
            }
            KindProj::Refused { response } => Poll::Ready(Ok(response
                .take()
                .expect("a refused request's future is polled once"))),
            KindProj::Waiting { waiting } => waiting.as_mut().poll(cx),
            KindProj::Reserving { .. } => unreachable!("a reservation's response is settled above"),
            KindProj::Settling {
                response,
                settle,
                shared,
            } => {
                let granted = std::task::ready!(settle.as_mut().poll(cx));
                let mut response = response.take().expect("a settled response is answered once");
                shared.add_success_fields(&granted, &mut response);
                Poll::Ready(Ok(response))
            }
        }
    }
}
