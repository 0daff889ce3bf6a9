//! What the in-process layer allocates for a granted request (cargo feature `axum`;
//! with `actix`, the actix-web middleware too), counted request for request against
//! the same request through a layer that passes it on (actix-web: the app alone):
//! nothing of its own keyed by a header or a bearer token; one keyed by the client's
//! address, behind a trusted proxy or not (the reading left on the request for the
//! handler's `ClientIp`); keyed by a path parameter, one in axum (its extractor's list
//! of parameters) and none in actix-web; beside a rule of every request, at most the
//! allocations of the rules built for the request. Sent down another path, a layer
//! allocated more on every request and failed here: one rule keyed by a path parameter
//! on the path of several rules, several rules with a path parameter's on the engine's
//! general path, and actix-web's header looked up by its text.
//!
//! The heap is counted for the whole process, so this binary holds one test.
#![cfg(feature = "axum")]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use axum::routing::get;
use axum::Router;
use redlimit::axum::TrustedProxies;
use redlimit::tower::{Key, LayerRule, RateLimitLayer};
use redlimit::{Algorithm, Client, ManualClock};
use tower_service::Service;

#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// A layer that gives back the service it wraps. It holds a pointer, as the rate
/// limiter's layer does: axum keeps a route's layer in a box it copies for each
/// request, which allocates for a layer of any size but none.
#[derive(Clone)]
struct PassThrough(#[allow(dead_code)] Arc<()>);

impl<S> tower_layer::Layer<S> for PassThrough {
    type Service = S;

    fn layer(&self, inner: S) -> S {
        inner
    }
}

/// The allocations each of 500 requests made (`requests(i)` the i-th, built before it
/// is counted), after 1 000 not counted; the clock, if any, moved a second before each.
fn allocations<S>(
    service: &mut S,
    clock: Option<&ManualClock>,
    requests: &dyn Fn(u32) -> Request<Body>,
) -> Vec<u64>
where
    S: Service<Request<Body>, Response = axum::response::Response>,
{
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut counts = Vec::new();
    for i in 0..1_500 {
        let request = requests(i);
        if let Some(clock) = clock {
            clock.advance(Duration::from_secs(1));
        }
        let before = dhat::HeapStats::get().total_blocks;
        {
            // (the response and its future dropped before the count)
            let future = std::pin::pin!(service.call(request));
            let answer = std::future::Future::poll(future, &mut cx);
            let std::task::Poll::Ready(Ok(response)) = answer else {
                panic!("request {i} waited or failed");
            };
            assert_eq!(response.status(), 200, "request {i}");
        }
        if i >= 1_000 {
            counts.push(dhat::HeapStats::get().total_blocks - before);
        }
    }
    counts
}

/// Holds `limited`, each request's allocations through the rate limiter's layer, to
/// `expected`: exactly, or at most for a layer of two rules (the second rule's key is
/// written into a new buffer, which grows more for the longer value); and below
/// `general`, the same layer's with a timeout (the boxed path), request for request:
/// the counts tell the paths apart.
fn check(case: &str, limited: &[u64], expected: &[u64], general: &[u64]) {
    match case.contains("beside") {
        true => assert!(
            limited
                .iter()
                .zip(expected)
                .all(|(limited, most)| limited <= most),
            "{case}: {limited:?} against at most {expected:?}"
        ),
        false => assert_eq!(limited, expected, "{case}"),
    }
    assert!(
        general.iter().zip(limited).all(|(general, fast)| general > fast),
        "{case}: {:?} with a timeout against {:?}",
        &general[..4],
        &limited[..4]
    );
}

/// What a rule is keyed by, the requests (`i` gives the i-th) and the allocations the
/// layer makes for each.
type Shape<R> = (&'static str, Key, R, u64);

/// An in-process layer of one rule keyed by `key` (beside a rule of every request for
/// a shape so named), on `clock`, without its success fields, trusting proxies in
/// 10.0.0.0/8 when keyed by the client's address (a layer with trusted proxies leaves
/// them on every request for the handler's `ClientIp`); `timeout` sends each request
/// on the boxed path (the engine's general path, in the layer's future).
fn layer(name: &str, algorithm: Algorithm, key: Key, clock: &ManualClock, timeout: bool) -> RateLimitLayer {
    let by_address = name.contains("address");
    let mut builder = RateLimitLayer::builder()
        .client(Client::builder().clock(clock.clone()).memory())
        .rule(
            LayerRule::new(name.to_owned(), 1_000, Duration::from_secs(60))
                .algorithm(algorithm)
                .key(key),
        )
        .success_fields(false);
    if name.contains("beside") {
        builder = builder.rule(LayerRule::new(
            format!("{name}-every-request"),
            1_000,
            Duration::from_secs(60),
        ));
    }
    let builder = match by_address {
        true => builder.trusted_proxies(TrustedProxies::new(["10.0.0.0/8"]).unwrap()),
        false => builder,
    };
    match timeout {
        true => builder.timeout(Duration::from_secs(1)),
        false => builder,
    }
    .build()
    .unwrap()
}

#[test]
fn a_granted_request_allocates_only_what_its_key_reads() {
    let _heap = dhat::Profiler::builder().testing().build();
    let root = || Router::new().route("/", get(|| async { "ok" }));
    let users = || Router::new().route("/users/{id}", get(|| async { "ok" }));
    let header = |i: u32| {
        Request::get("/")
            .header("x-api-key", if i % 2 == 0 { "key-a" } else { "key-b" })
            .body(Body::empty())
            .unwrap()
    };
    let peer = |i: u32| {
        let peer = SocketAddr::from(([192, 0, 2, 1 + (i % 2) as u8], 40_000));
        Request::get("/")
            .extension(axum::extract::ConnectInfo(peer))
            .body(Body::empty())
            .unwrap()
    };
    let proxied = |i: u32| {
        let client = if i % 2 == 0 { "192.0.2.1" } else { "192.0.2.2" };
        Request::get("/")
            .extension(axum::extract::ConnectInfo(SocketAddr::from((
                [10, 0, 0, 1],
                40_000,
            ))))
            .header("x-forwarded-for", client)
            .body(Body::empty())
            .unwrap()
    };
    let bearer = |i: u32| {
        let token = if i % 2 == 0 {
            "Bearer tok-a"
        } else {
            "BEARER  tok-b"
        };
        Request::get("/")
            .header("authorization", token)
            .body(Body::empty())
            .unwrap()
    };
    let path = |i: u32| {
        Request::get(if i % 2 == 0 { "/users/alice" } else { "/users/bob" })
            .body(Body::empty())
            .unwrap()
    };
    let shapes: [Shape<&dyn Fn(u32) -> Request<Body>>; 6] = [
        ("header", Key::header("x-api-key"), &header, 0),
        ("bearer", Key::header("authorization"), &bearer, 0),
        ("path", Key::path_param("id"), &path, 1),
        (
            "path beside a rule of every request",
            Key::path_param("id"),
            &path,
            11,
        ),
        ("address", Key::client_ip(), &peer, 1),
        ("address behind a proxy", Key::client_ip(), &proxied, 1),
    ];
    for algorithm in [Algorithm::SlidingWindow, Algorithm::TokenBucket] {
        let algorithm = &algorithm;
        for (shape, key, requests, own) in &shapes {
            let clock = ManualClock::new(1_000_000_000);
            let name = format!("allocations-{}-{algorithm:?}", shape.replace(' ', "-"));
            let rate_limited = layer(&name, *algorithm, key.clone(), &clock, false);
            let (limited, anchor) = match shape.starts_with("path") {
                true => (
                    allocations(&mut users().route_layer(rate_limited), Some(&clock), requests),
                    allocations(
                        &mut users().route_layer(PassThrough(Arc::new(()))),
                        None,
                        requests,
                    ),
                ),
                false => (
                    allocations(&mut root().layer(rate_limited), Some(&clock), requests),
                    allocations(&mut root().layer(PassThrough(Arc::new(()))), None, requests),
                ),
            };
            let expected: Vec<u64> = anchor.iter().map(|n| n + own).collect();
            let general = layer(&format!("{name}-general"), *algorithm, key.clone(), &clock, true);
            let general = match shape.starts_with("path") {
                true => allocations(&mut users().route_layer(general), Some(&clock), requests),
                false => allocations(&mut root().layer(general), Some(&clock), requests),
            };
            check(
                &format!("{algorithm:?} keyed by {shape}"),
                &limited,
                &expected,
                &general,
            );
        }
    }
    #[cfg(feature = "actix")]
    actix_allocations();
}

/// The same in actix-web (cargo feature `actix`): the layer as middleware, each request
/// counted against the same request to the app alone (actix-web does not box
/// middleware per request).
#[cfg(feature = "actix")]
fn actix_allocations() {
    use actix_web::dev::ServiceResponse;
    use actix_web::test::TestRequest;
    use actix_web::{test, web, App};

    /// The allocations each of 500 requests made, after 1 000 not counted; `make` is
    /// `TestRequest::to_request`, whose type actix-web does not name.
    async fn counted<S, Q, B>(
        service: &S,
        clock: Option<&ManualClock>,
        make: fn(TestRequest) -> Q,
        requests: fn(u32) -> TestRequest,
    ) -> Vec<u64>
    where
        S: actix_web::dev::Service<Q, Response = ServiceResponse<B>, Error = actix_web::Error>,
    {
        let mut counts = Vec::new();
        for i in 0..1_500 {
            let request = make(requests(i));
            if let Some(clock) = clock {
                clock.advance(Duration::from_secs(1));
            }
            let before = dhat::HeapStats::get().total_blocks;
            let response = service.call(request).await.unwrap();
            assert_eq!(response.status(), 200, "request {i}");
            drop(response);
            if i >= 1_000 {
                counts.push(dhat::HeapStats::get().total_blocks - before);
            }
        }
        counts
    }

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let route = || web::get().to(|| async { "ok" });
    let users = || web::resource("/users/{id}").route(web::get().to(|| async { "ok" }));
    let make = |request: TestRequest| request.to_request();
    type Requests = fn(u32) -> TestRequest;
    let shapes: [Shape<Requests>; 6] = [
        (
            "header",
            Key::header("x-api-key"),
            |i| {
                let key = if i % 2 == 0 { "key-a" } else { "key-b" };
                TestRequest::get().uri("/").insert_header(("x-api-key", key))
            },
            0,
        ),
        (
            "bearer",
            Key::header("authorization"),
            |i| {
                let token = if i % 2 == 0 {
                    "Bearer tok-a"
                } else {
                    "BEARER  tok-b"
                };
                TestRequest::get()
                    .uri("/")
                    .insert_header(("authorization", token))
            },
            0,
        ),
        (
            "path",
            Key::path_param("id"),
            |i| TestRequest::get().uri(if i % 2 == 0 { "/users/alice" } else { "/users/bob" }),
            0,
        ),
        (
            "path beside a rule of every request",
            Key::path_param("id"),
            |i| TestRequest::get().uri(if i % 2 == 0 { "/users/alice" } else { "/users/bob" }),
            10,
        ),
        (
            "address",
            Key::client_ip(),
            |i| {
                let peer = SocketAddr::from(([192, 0, 2, 1 + (i % 2) as u8], 40_000));
                TestRequest::get().uri("/").peer_addr(peer)
            },
            1,
        ),
        (
            "address behind a proxy",
            Key::client_ip(),
            |i| {
                let client = if i % 2 == 0 { "192.0.2.1" } else { "192.0.2.2" };
                let proxy = SocketAddr::from(([10, 0, 0, 1], 40_000));
                (TestRequest::get().uri("/").peer_addr(proxy)).insert_header(("x-forwarded-for", client))
            },
            1,
        ),
    ];
    for algorithm in [Algorithm::SlidingWindow, Algorithm::TokenBucket] {
        for (shape, key, requests, own) in &shapes {
            let clock = ManualClock::new(1_000_000_000);
            let name = format!("actix-allocations-{}-{algorithm:?}", shape.replace(' ', "-"));
            let count = |layer: Option<RateLimitLayer>, clock: Option<&ManualClock>| {
                runtime.block_on(async {
                    match (shape.starts_with("path"), layer) {
                        (true, Some(layer)) => {
                            let app = test::init_service(App::new().service(users().wrap(layer))).await;
                            counted(&app, clock, make, *requests).await
                        }
                        (true, None) => {
                            let app = test::init_service(App::new().service(users())).await;
                            counted(&app, clock, make, *requests).await
                        }
                        (false, Some(layer)) => {
                            let app = test::init_service(App::new().wrap(layer).route("/", route())).await;
                            counted(&app, clock, make, *requests).await
                        }
                        (false, None) => {
                            let app = test::init_service(App::new().route("/", route())).await;
                            counted(&app, clock, make, *requests).await
                        }
                    }
                })
            };
            let limited = count(
                Some(layer(&name, algorithm, key.clone(), &clock, false)),
                Some(&clock),
            );
            let expected: Vec<u64> = count(None, None).iter().map(|n| n + own).collect();
            let general = layer(&format!("{name}-general"), algorithm, key.clone(), &clock, true);
            let general = count(Some(general), Some(&clock));
            let case = format!("actix-web, {algorithm:?} keyed by {shape}");
            check(&case, &limited, &expected, &general);
        }
    }
}
