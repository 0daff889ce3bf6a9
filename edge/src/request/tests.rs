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

/// A layer of one rule named `name` on each of its two paths: decided at once where
/// the service is called (in process, no timeout), and boxed (a timeout), where the
/// request is read in the layer's future.
fn on_both_paths(name: &str) -> [(&'static str, RateLimitLayer); 2] {
    let layer = |timeout: Option<Duration>| {
        let mut builder = RateLimitLayer::builder()
            .client(Client::memory())
            .rule(LayerRule::new(name.to_owned(), 100, Duration::from_secs(60)));
        if let Some(timeout) = timeout {
            builder = builder.timeout(timeout);
        }
        builder.build().unwrap()
    };
    [
        ("at once", layer(None)),
        ("boxed", layer(Some(Duration::from_millis(50)))),
    ]
}

#[tokio::test]
async fn an_identity_set_in_call_reaches_the_future_on_both_paths() {
    for (_, layer) in on_both_paths("scope-in-call") {
        assert_eq!(
            seen(layer).await,
            "Ok(()) Some(\"set-in-call\") Some(\"set-in-call\")"
        );
    }
}

/// The scope a request joins is the one current when the layer is called, on both
/// paths, wherever its future is then polled: called outside any request and polled
/// inside another's poll, it has a scope of its own; called inside a request and
/// polled outside any, it joins that request's.
#[tokio::test]
async fn a_request_joins_the_scope_current_where_the_layer_is_called_on_both_paths() {
    async fn body(response: Response<axum::body::Body>) -> String {
        let body = axum::body::to_bytes(response.into_body(), 1 << 10).await.unwrap();
        String::from_utf8(body.to_vec()).unwrap()
    }
    for (path, layer) in on_both_paths("scope-where-called") {
        let mut service = layer.layer(SetsInCall);
        // Called outside any request, polled inside another's.
        let called = service.call(Request::new(axum::body::Body::empty()));
        let response = scope_of("outer").run(called).await.unwrap();
        assert_eq!(
            body(response).await,
            "Ok(()) Some(\"set-in-call\") Some(\"set-in-call\")",
            "{path}: called outside any request"
        );
        // Called inside a request, polled outside any: its future made in the
        // request's and awaited after it.
        #[allow(clippy::async_yields_async)]
        let called = scope_of("outer")
            .run(async { service.call(Request::new(axum::body::Body::empty())) })
            .await;
        let response = called.await.unwrap();
        assert_eq!(
            body(response).await,
            "Err(AlreadySet) Some(\"outer\") Some(\"outer\")",
            "{path}: called inside a request"
        );
    }
}

/// Sets the identity in `call`; its future holds a guard reading the identity when
/// dropped, and waits for ever unless `finish`.
#[derive(Clone)]
struct DropsInScope {
    finish: bool,
    read: std::sync::Arc<std::sync::Mutex<Option<String>>>,
}

impl Service<Request<axum::body::Body>> for DropsInScope {
    type Response = Response<axum::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<axum::body::Body>) -> Self::Future {
        super::set_identity("dropping").unwrap();
        let (guard, finish) = (ReadsOnDrop(std::sync::Arc::clone(&self.read)), self.finish);
        Box::pin(async move {
            let _guard = guard;
            if !finish {
                std::future::pending::<()>().await;
            }
            Ok(Response::new(axum::body::Body::empty()))
        })
    }
}

/// The layer's response future drops the inner one inside the request's scope, when
/// it is dropped unfinished and when the inner future is done: on both paths.
#[test]
fn the_layer_drops_the_inner_future_inside_the_scope_on_both_paths() {
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    for timeout in [None, Some(Duration::from_secs(1))] {
        for finish in [false, true] {
            let mut layer = RateLimitLayer::builder()
                .client(Client::memory())
                .rule(LayerRule::new("drops", 100, Duration::from_secs(60)));
            if let Some(timeout) = timeout {
                layer = layer.timeout(timeout);
            }
            let read = std::sync::Arc::default();
            let inner = DropsInScope {
                finish,
                read: std::sync::Arc::clone(&read),
            };
            let mut service = layer.build().unwrap().layer(inner);
            let mut future = Box::pin(service.call(Request::new(axum::body::Body::empty())));
            assert_eq!(future.as_mut().poll(&mut cx).is_ready(), finish);
            drop(future);
            let seen = read.lock().unwrap().clone();
            assert_eq!(
                seen.as_deref(),
                Some("dropping"),
                "{timeout:?}, finished: {finish}"
            );
            assert_eq!(super::identity(), None);
        }
    }
}

/// A scope with `identity` set, as a layer opens one.
fn scope_of(identity: &str) -> super::Scope {
    let scope = super::Scope::new(Err("no peer in this test"));
    scope.set_identity(identity).unwrap();
    scope
}

/// Reads the identity when dropped.
struct ReadsOnDrop(std::sync::Arc<std::sync::Mutex<Option<String>>>);

impl Drop for ReadsOnDrop {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = super::identity();
    }
}

/// The scope is the current one while its future is polled, nested scopes each in
/// turn, and none is left behind once a poll returns.
#[test]
fn a_scope_is_current_only_while_its_future_is_polled() {
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    let mut polls = 0;
    let outer = scope_of("outer").run(std::future::poll_fn(|cx| {
        polls += 1;
        let before = super::identity();
        let inner = std::pin::pin!(scope_of("inner").run(async { super::identity() }));
        let Poll::Ready(inside) = inner.poll(cx) else {
            unreachable!("the inner future does not wait")
        };
        let after = super::identity();
        if polls == 1 {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready((before, inside, after))
    }));
    let mut outer = std::pin::pin!(outer);
    assert!(outer.as_mut().poll(&mut cx).is_pending());
    assert_eq!(super::identity(), None, "between polls");
    let Poll::Ready(seen) = outer.poll(&mut cx) else {
        panic!("the second poll is ready")
    };
    let outer = Some("outer".to_owned());
    assert_eq!(seen, (outer.clone(), Some("inner".to_owned()), outer));
    assert_eq!(super::identity(), None, "after");
}

/// A future dropped unfinished, or finished, is dropped inside its scope: what its
/// destructors read is the request's.
#[test]
fn a_scoped_future_is_dropped_inside_its_scope() {
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    for finish in [false, true] {
        let read = std::sync::Arc::default();
        let guard = ReadsOnDrop(std::sync::Arc::clone(&read));
        let mut future = Box::pin(scope_of("dropping").run(async move {
            let _guard = guard;
            if !finish {
                std::future::pending::<()>().await;
            }
        }));
        let polled = future.as_mut().poll(&mut cx);
        assert_eq!(polled.is_ready(), finish);
        drop(future);
        assert_eq!(
            *read.lock().unwrap(),
            Some("dropping".to_owned()),
            "finished: {finish}"
        );
        assert_eq!(super::identity(), None);
    }
}

/// A poll that panics leaves the scope it replaced in place, as it was.
#[test]
fn a_panicking_poll_puts_the_outer_scope_back() {
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    let outer = scope_of("outer").run(std::future::poll_fn(|cx| {
        let mut inner = std::pin::pin!(scope_of("inner").run(async {
            panic!("a handler panics");
        }));
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = inner.as_mut().poll(cx);
        }));
        assert!(caught.is_err());
        Poll::Ready(super::identity())
    }));
    let Poll::Ready(after) = std::pin::pin!(outer).poll(&mut cx) else {
        panic!("ready at once")
    };
    assert_eq!(after, Some("outer".to_owned()));
    assert_eq!(super::identity(), None);
}

/// An unfinished future of a scope dropped while another scope is being read (a
/// scope's clone dropping what it holds) is dropped inside its own scope.
#[test]
fn a_scoped_future_dropped_while_another_scope_is_read_is_dropped_inside_its_own() {
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    let read = std::sync::Arc::default();
    let guard = ReadsOnDrop(std::sync::Arc::clone(&read));
    let mut inner = Box::pin(scope_of("inner").run(async move {
        let _guard = guard;
        std::future::pending::<()>().await;
    }));
    assert!(inner.as_mut().poll(&mut cx).is_pending());
    let outer = std::pin::pin!(scope_of("outer").run(async move {
        let dropped = super::with_current(move |_| drop(inner));
        (dropped, super::identity())
    }));
    let Poll::Ready(seen) = outer.poll(&mut cx) else {
        panic!("ready at once")
    };
    assert_eq!(
        seen,
        (Some(()), Some("outer".to_owned())),
        "the outer scope is back"
    );
    assert_eq!(*read.lock().unwrap(), Some("inner".to_owned()));
}

/// An unfinished future of a scope held by a thread-local, dropped as its thread
/// ends (after the scope's own storage was first used): dropped inside its scope,
/// without a panic.
#[test]
fn a_scoped_future_dropped_as_its_thread_ends_is_dropped_inside_its_scope() {
    type Held = std::cell::RefCell<Vec<Pin<Box<dyn Future<Output = ()>>>>>;
    thread_local!(static HELD: Held = const { std::cell::RefCell::new(Vec::new()) });
    let read = std::sync::Arc::default();
    let guard = ReadsOnDrop(std::sync::Arc::clone(&read));
    let ended = std::thread::spawn(move || {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        // The scope's storage used first, then the one holding the future.
        assert!(std::pin::pin!(scope_of("first").run(async {}))
            .poll(&mut cx)
            .is_ready());
        let mut future: Pin<Box<dyn Future<Output = ()>>> = Box::pin(scope_of("held").run(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        }));
        assert!(future.as_mut().poll(&mut cx).is_pending());
        HELD.with(|held| held.borrow_mut().push(future));
    })
    .join();
    assert!(ended.is_ok());
    assert_eq!(*read.lock().unwrap(), Some("held".to_owned()));
}

/// An identity's conversion is the application's code: it runs before the scope is
/// read, so it may use scopes of its own.
#[test]
fn an_identity_is_converted_before_the_scope_is_read() {
    struct Polls;
    impl From<Polls> for String {
        fn from(_: Polls) -> String {
            let waker = std::task::Waker::noop();
            let mut other = Box::pin(scope_of("other").run(std::future::pending::<()>()));
            assert!(other.as_mut().poll(&mut Context::from_waker(waker)).is_pending());
            drop(other);
            super::identity().unwrap_or_default() + "-converted"
        }
    }
    let waker = std::task::Waker::noop();
    let future = std::pin::pin!(super::Scope::new(Err("no peer in this test"))
        .run(async { (super::set_identity(Polls), super::identity()) }));
    let Poll::Ready(seen) = future.poll(&mut Context::from_waker(waker)) else {
        panic!("ready at once")
    };
    assert_eq!(seen, (Ok(()), Some("-converted".to_owned())));
}
