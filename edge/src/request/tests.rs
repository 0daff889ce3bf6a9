//! The request's scope around a service that is not axum's `Route`, whose `call` runs
//! inside the scope too: an identity set there reaches its future and the scope a
//! task carries, on both of the layer's paths.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use redlimit_runtime::Client;
use tower_layer::Layer;
use tower_service::Service;

use crate::tower::{LayerRule, RateLimitLayer};

/// Sets the identity in `call`, and answers what its future sees of it.
#[derive(Clone)]
struct SetsInCall;

impl Service<Request<axum::body::Body>> for SetsInCall {
    type Response = Response<axum::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<axum::body::Body>) -> Self::Future {
        let set = super::set_identity("set-in-call");
        Box::pin(async move {
            let carried = super::current().and_then(|scope| scope.identity().map(str::to_owned));
            let seen = format!("{set:?} {:?} {carried:?}", super::identity());
            Ok(Response::new(axum::body::Body::from(seen)))
        })
    }
}

async fn seen(layer: RateLimitLayer) -> String {
    let mut service = layer.layer(SetsInCall);
    let response = service
        .call(Request::new(axum::body::Body::empty()))
        .await
        .unwrap();
    let body = axum::body::to_bytes(response.into_body(), 1 << 10).await.unwrap();
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test]
async fn an_identity_set_in_call_reaches_the_future_on_both_paths() {
    let rule = || LayerRule::new("scope-in-call", 100, Duration::from_secs(60));
    let at_once = RateLimitLayer::builder()
        .client(Client::memory())
        .rule(rule())
        .build()
        .unwrap();
    // A timeout takes the boxed path.
    let boxed = RateLimitLayer::builder()
        .client(Client::memory())
        .timeout(Duration::from_millis(50))
        .rule(rule())
        .build()
        .unwrap();
    for layer in [at_once, boxed] {
        assert_eq!(
            seen(layer).await,
            "Ok(()) Some(\"set-in-call\") Some(\"set-in-call\")"
        );
    }
}
