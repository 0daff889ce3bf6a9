//! The service: [`RateLimit`], what [`RateLimitLayer`](super::RateLimitLayer) wraps
//! around another service. Each request is decided before the inner service sees it;
//! a grant passes it on and adds the RateLimit fields, a refusal is answered by the
//! layer's responder. Its future is boxed: the decision is an `async fn` of the layer.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::request::behind_router;
use super::respond::{PlainText, Respond};
use super::shared::Shared;

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
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The clone that was polled ready serves this request; the fresh one waits
        // for the next poll_ready.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        let respond = self.respond.clone();
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            match shared.decide(&mut parts, behind_router::<S>()).await {
                Ok(granted) => {
                    let mut response = inner.call(Request::from_parts(parts, body)).await?;
                    if shared.success_fields || shared.x_ratelimit {
                        shared.success_fields(&granted, response.headers_mut());
                    }
                    Ok(response)
                }
                Err(limited) => Ok(respond.refused(limited.x_ratelimit(shared.x_ratelimit))),
            }
        })
    }
}
