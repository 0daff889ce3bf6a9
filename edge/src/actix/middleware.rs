//! The middleware: a [`RateLimitLayer`] is an actix-web `Transform`, and
//! [`RateLimitMiddleware`] the service it wraps around another. Each request is
//! decided before the inner service sees it, by the same code as the tower layer's; a
//! grant passes it on, inside the request's scope (`crate::request`), and adds the
//! RateLimit fields, a refusal is answered by the
//! layer's [`Respond`]. In process without a timeout the decision is made where the
//! service is called and the response future is the inner service's; otherwise the
//! decision and the inner call are boxed.

use std::fmt;
use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::{Error, HttpMessage};
use redlimit_runtime::engine::Granted;
use redlimit_runtime::RateLimited;

use super::request::ActixRequest;
use super::respond::{decided_inside, Respond};
use crate::request::{Outer, Scope, Scoped};
use crate::tower::{Keys, RateLimitLayer, Shared, Usage};

impl<S, B, R> Transform<S, ServiceRequest> for RateLimitLayer<R>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
    R: Respond,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = Error;
    type Transform = RateLimitMiddleware<S, R>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, inner: S) -> Self::Future {
        ready(Ok(RateLimitMiddleware {
            inner: Rc::new(inner),
            shared: self.shared.clone(),
            respond: self.respond.clone(),
        }))
    }
}

/// The service a [`RateLimitLayer`] wraps around another in actix-web (`App::wrap`,
/// `Scope::wrap`, `Resource::wrap`).
pub struct RateLimitMiddleware<S, R> {
    inner: Rc<S>,
    shared: Arc<Shared>,
    respond: R,
}

impl<S, R> fmt::Debug for RateLimitMiddleware<S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitMiddleware").finish_non_exhaustive()
    }
}

impl<S, B, R> Service<ServiceRequest> for RateLimitMiddleware<S, R>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
    R: Respond,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = Error;
    type Future = MiddlewareFuture<S::Future, B>;

    actix_web::dev::forward_ready!(inner);

    fn call(&self, request: ServiceRequest) -> Self::Future {
        let now = (self.shared.client.as_ref()).filter(|_| self.shared.decides_at_once);
        if let Some(client) = now {
            match self
                .shared
                .decide_on_now(client, &mut ActixRequest::new(&request), false)
            {
                Some(Ok((granted, scope))) => return self.granted(request, granted, scope),
                Some(Err(limited)) => return self.refused(request, limited),
                // Not reached: in process without a timeout nothing the decision awaits
                // waits (a debug assertion holds the tests to it). Were it reached, the
                // request would be read again and decided on the boxed path.
                None => {}
            }
        }
        let read = (self.shared).read(&mut ActixRequest::new(&request), false, false, Outer::Current);
        let (keys, scope) = match read {
            Ok(read) => read,
            Err(limited) => return self.refused(request, limited),
        };
        self.waiting(request, keys, scope)
    }
}

impl<S, B, R> RateLimitMiddleware<S, R>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
    R: Respond,
{
    /// A request granted here: the inner service's future, in the request's scope, the
    /// fields added when it ends.
    fn granted(
        &self,
        request: ServiceRequest,
        granted: Granted,
        scope: Scope,
    ) -> MiddlewareFuture<S::Future, B> {
        MiddlewareFuture {
            kind: Kind::Granted {
                fields: self
                    .shared
                    .writes_fields()
                    .then(|| (self.shared.clone(), granted)),
                future: scope.call(true, || self.inner.call(request)),
            },
        }
    }

    /// A request refused here: the responder's response.
    fn refused(&self, request: ServiceRequest, limited: RateLimited) -> MiddlewareFuture<S::Future, B> {
        let response = self.respond.refused(self.shared.answered(limited));
        let kind = Kind::Refused {
            response: Some(request.into_response(response).map_into_right_body()),
        };
        MiddlewareFuture { kind }
    }

    /// A request whose decision waits (Redis, a timeout): the decision and the inner
    /// call, boxed.
    fn waiting(&self, request: ServiceRequest, keys: Keys, scope: Scope) -> MiddlewareFuture<S::Future, B> {
        let inner = self.inner.clone();
        let shared = self.shared.clone();
        let respond = self.respond.clone();
        let waiting = Box::pin(async move {
            if shared.settles {
                return settled(&shared, respond, inner, request, keys, scope).await;
            }
            match shared.decide_keys(keys).await {
                Ok(granted) => {
                    let mut response = scope.call(true, || inner.call(request)).await?;
                    shared.add_fields(&granted, &mut response);
                    Ok(response.map_into_left_body())
                }
                Err(limited) => Ok(request
                    .into_response(respond.refused(shared.answered(limited)))
                    .map_into_right_body()),
            }
        });
        MiddlewareFuture {
            kind: Kind::Waiting { waiting },
        }
    }
}

/// A request whose rules include settled ones: reserved, the inner service called with
/// the [`Usage`](crate::tower::Usage) in the request's extensions when the rules record
/// one, and settled once the response's head says what was used (or when the last
/// `Usage` is dropped).
async fn settled<S, B, R>(
    shared: &Arc<Shared>,
    respond: R,
    inner: Rc<S>,
    request: ServiceRequest,
    keys: Keys,
    scope: Scope,
) -> Result<ServiceResponse<EitherBody<B>>, Error>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
    R: Respond,
{
    let outer = request.extensions().get::<Usage>().cloned();
    let mut held = match shared.reserve_keys(keys, outer).await {
        Ok(held) => held,
        Err(limited) => {
            let refused = respond.refused(shared.answered(limited));
            return Ok(request.into_response(refused).map_into_right_body());
        }
    };
    if let Some(usage) = held.usage() {
        request.extensions_mut().insert(usage);
    }
    let mut response = scope.call(true, || inner.call(request)).await?;
    // The response keeps its request, and with it the extension's handle: taken out,
    // so that a handler done with its `Usage` is settled before the head goes out.
    response.request().extensions_mut().remove::<Usage>();
    let headers = response.headers();
    held.read_head(|name| name.lines_in(headers).map(|value| value.as_bytes()));
    let granted = held.finish().await;
    shared.add_fields(&granted, &mut response);
    Ok(response.map_into_left_body())
}

impl Shared {
    /// The RateLimit fields of a granted response, when the layer adds them and the
    /// response was not decided inside ([`decided_inside`]).
    fn add_fields<B>(&self, granted: &Granted, response: &mut ServiceResponse<B>) {
        if self.writes_fields() && !decided_inside(response.response()) {
            self.success_fields(granted, response.headers_mut());
        }
    }
}

type Boxed<B> = Pin<Box<dyn Future<Output = Result<ServiceResponse<EitherBody<B>>, Error>>>>;

pin_project_lite::pin_project! {
    /// The response future of [`RateLimitMiddleware`]: the inner service's for a
    /// request decided at once, the refusal's response, or the boxed decision and
    /// inner call.
    pub struct MiddlewareFuture<F, B> {
        #[pin]
        kind: Kind<F, B>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<F, B> {
        Granted {
            #[pin]
            future: Scoped<F>,
            fields: Option<(Arc<Shared>, Granted)>,
        },
        Refused {
            response: Option<ServiceResponse<EitherBody<B>>>,
        },
        Waiting {
            waiting: Boxed<B>,
        },
    }
}

impl<F, B> fmt::Debug for MiddlewareFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MiddlewareFuture").finish_non_exhaustive()
    }
}

impl<F, B> Future for MiddlewareFuture<F, B>
where
    F: Future<Output = Result<ServiceResponse<B>, Error>>,
{
    type Output = Result<ServiceResponse<EitherBody<B>>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Granted { future, fields } => {
                let mut response = std::task::ready!(future.poll(cx))?;
                if let Some((shared, granted)) = fields.take() {
                    shared.add_fields(&granted, &mut response);
                }
                Poll::Ready(Ok(response.map_into_left_body()))
            }
            KindProj::Refused { response } => Poll::Ready(Ok(response
                .take()
                .expect("a refused request's future is polled once"))),
            KindProj::Waiting { waiting } => waiting.as_mut().poll(cx),
        }
    }
}
