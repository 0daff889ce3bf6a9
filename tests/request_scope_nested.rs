//! Two tower layers on one router (a global layer and a `route_layer`, or two nested
//! `layer`s): the request's identity set between them reaches the attribute's calls
//! behind the inner one, once. In a binary of its own: its calls decide on the default
//! client, in process.
#![cfg(feature = "axum")]

// (Of what the request-scope tests share, this file takes the service and the layer.)
#[allow(dead_code)]
#[path = "request_scope/common.rs"]
mod common;

use redlimit::Client;

/// The application's authentication, as middleware inside the outer layer.
async fn authenticated(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    common::authenticate(request.headers().get("x-user").map(|value| value.as_bytes()));
    next.run(request).await
}

/// Two layers, as a global one and a `route_layer` nest: the identity the
/// authentication set between them reaches the calls behind the inner one, and stays
/// set once (the inner layer keeps the outer's scope, it does not open a new one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_layers_share_one_scope() {
    use axum::routing::get;
    let client = Client::memory();
    async fn replaced() -> String {
        // A later middleware or the handler cannot replace the identity.
        format!("{:?}", redlimit::request::set_identity("mallory"))
    }
    let app = axum::Router::new()
        .route("/replace", get(replaced))
        .route(
            "/ask",
            get(|| async {
                let (status, body) = common::reply(common::answer("hi".into()).await);
                (axum::http::StatusCode::from_u16(status).unwrap(), body)
            }),
        )
        .layer(common::layer(&client))
        .layer(axum::middleware::from_fn(authenticated))
        .layer(common::layer(&client));
    let addr = redlimit_test_support::http::serve(app).await;
    let (from, user) = ("198.51.100.77", Some("nested-bob"));
    let replaced = common::ask(addr, "127.0.0.1", "/replace", from, user).await;
    assert_eq!(replaced.body, "Err(AlreadySet)");
    let mut granted = 0;
    for _ in 0..10 {
        let reply = common::ask(addr, "127.0.0.1", "/ask", from, user).await;
        assert_ne!(reply.status, 500, "{}", reply.body);
        granted += usize::from(reply.status == 200);
    }
    assert_eq!(granted, 2, "the user's own limit of 2 holds behind both layers");
}

/// A handler that sends a request through another router's layer in process: the
/// sub-request joins the scope current where the layer's service is called (behind a
/// router, when the router's future is first polled), on both of the layer's paths
/// (decided at once, and boxed by a timeout). Awaited in the handler, it joins the
/// handler's request, so the attribute behind it keys by the handler's identity and
/// client address and the user's limit of 2 holds through the sub-requests; spawned,
/// it is outside any request, as any spawned task is, and refused as misuse; spawned
/// carrying the handler's scope, it joins the request again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_request_joins_the_handler_request_where_the_layer_is_called() {
    use axum::routing::get;
    use redlimit::tower::{LayerRule, RateLimitLayer};
    use std::time::Duration;
    use tower_service::Service;

    #[derive(Clone, Copy, Debug)]
    enum Sent {
        Awaited,
        Spawned,
        Carried,
    }
    let client = Client::memory();
    let granted = (200, "completed hi".to_owned());
    let cases = [
        (None, Sent::Awaited, 1),
        (None, Sent::Spawned, 2),
        (None, Sent::Carried, 3),
        (Some(Duration::from_secs(1)), Sent::Awaited, 4),
        (Some(Duration::from_secs(1)), Sent::Spawned, 5),
        (Some(Duration::from_secs(1)), Sent::Carried, 6),
    ];
    for (timeout, sent, n) in cases {
        let mut layer = RateLimitLayer::builder()
            .client(client.clone())
            .rule(LayerRule::new("sub-requests", 10_000, Duration::from_secs(60)));
        if let Some(timeout) = timeout {
            layer = layer.timeout(timeout);
        }
        let inner = axum::Router::new()
            .route(
                "/ask",
                get(|| async {
                    let (status, body) = common::reply(common::answer("hi".into()).await);
                    (axum::http::StatusCode::from_u16(status).unwrap(), body)
                }),
            )
            .layer(layer.build().unwrap());
        let forward = move || {
            let mut inner = inner.clone();
            async move {
                let request = axum::http::Request::get("/ask")
                    .body(axum::body::Body::empty())
                    .unwrap();
                let called = inner.call(request);
                let response = match sent {
                    Sent::Awaited => called.await,
                    Sent::Spawned => tokio::spawn(called).await.unwrap(),
                    Sent::Carried => {
                        let scope = redlimit::request::current().expect("inside the request");
                        tokio::spawn(scope.run(called)).await.unwrap()
                    }
                };
                let response = response.unwrap();
                let status = response.status();
                let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
                (status, String::from_utf8(body.to_vec()).unwrap())
            }
        };
        let app = axum::Router::new()
            .route("/forward", get(forward))
            .layer(axum::middleware::from_fn(authenticated))
            .layer(common::layer(&client));
        let addr = redlimit_test_support::http::serve(app).await;
        let (from, user) = (format!("198.51.100.{}", 80 + n), format!("sub-user-{n}"));
        let mut replies = Vec::new();
        for _ in 0..3 {
            let reply = common::ask(addr, "127.0.0.1", "/forward", &from, Some(&user)).await;
            replies.push((reply.status, reply.body));
        }
        let case = format!("{sent:?}, timeout {timeout:?}");
        match sent {
            Sent::Awaited | Sent::Carried => assert_eq!(
                replies,
                [
                    granted.clone(),
                    granted.clone(),
                    (429, "refused by rule 2".to_owned())
                ],
                "{case}"
            ),
            Sent::Spawned => {
                for (status, body) in &replies {
                    assert_eq!(*status, 500, "{case}: {body}");
                    assert!(body.contains("which this call does not have"), "{case}: {body}");
                }
            }
        }
    }
}
