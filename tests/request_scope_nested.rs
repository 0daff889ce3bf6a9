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

/// Two layers, as a global one and a `route_layer` nest: the identity the
/// authentication set between them reaches the calls behind the inner one, and stays
/// set once (the inner layer keeps the outer's scope, it does not open a new one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_layers_share_one_scope() {
    use axum::routing::get;
    let client = Client::memory();
    async fn authenticated(
        request: axum::extract::Request,
        next: axum::middleware::Next,
    ) -> axum::response::Response {
        common::authenticate(request.headers().get("x-user").map(|value| value.as_bytes()));
        next.run(request).await
    }
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
