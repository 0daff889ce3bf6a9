//! The request's identity reaching the attribute, through an axum server on loopback
//! deciding on Redis: a service function two calls below the handler limited on
//! GLOBAL, IP and USER by `{request.client_ip}` and `{request.identity}`, the client
//! address the layer read behind its trusted proxy, an identity the application's
//! middleware sets; refusals outside any request, without an identity, in a spawned
//! task that does not carry the scope; hostile identities kept to their own keys.
#![cfg(feature = "axum")]

#[path = "request_scope/common.rs"]
mod common;

use redlimit::Client;
use redlimit_test_support::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_dimensions_on_redis_behind_axum() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    redlimit::set_default(client.clone()).unwrap();
    common::outside_any_request(&client).await;
    let addr = common::serve_axum(&client).await;
    common::scenario(addr, &client).await;
    every_key_is_a_rule_s(&server).await;
    without_a_peer_address().await;
}

/// A router called without the peer's address (no `ConnectInfo`): the layer, keying
/// by nothing of the client, grants; the client address the function keys by is
/// missing, and the call is refused, saying how to serve the router.
async fn without_a_peer_address() {
    use axum::body::Body;
    use tower_service::Service;
    let mut app = axum::Router::new()
        .route(
            "/ask",
            axum::routing::get(|| async { common::reply(common::answer("hi".into()).await).1 }),
        )
        .layer(common::layer(redlimit::default_client().unwrap()));
    let request = axum::http::Request::get("/ask").body(Body::empty()).unwrap();
    let response = app.call(request).await.unwrap();
    let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
    let body = String::from_utf8(body.to_vec()).unwrap();
    assert!(
        body.starts_with(
            "rule 1 key \"\": rule `llm:ip:{request.client_ip}` keys by the request's client address \
             ({request.client_ip}), which this call does not have: the client address needs the peer's: \
             serve axum with into_make_service_with_connect_info::<SocketAddr>()"
        ),
        "{body}"
    );
}

/// Every key in Redis belongs to a limiter of the layer or of one of the three rules,
/// its value one escaped segment: no hostile identity wrote anything else.
async fn every_key_is_a_rule_s(server: &RedisServer) {
    let mut raw = server.raw().await;
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut raw).await.unwrap();
    assert!(keys.len() > 20, "{keys:?}");
    for key in keys {
        let name = key
            .strip_prefix('{')
            .and_then(|rest| rest.split_once('}'))
            .map_or(key.as_str(), |(name, _)| name);
        let value = ["rate_limit:llm:ip:", "rate_limit:llm:user:"]
            .into_iter()
            .find_map(|family| name.strip_prefix(family));
        match value {
            Some(value) => assert!(!value.is_empty() && !value.contains([':', '{', '}']), "{key}"),
            None => assert!(
                ["rate_limit:llm:global", "rate_limit:edge"].contains(&name),
                "{key}"
            ),
        }
    }
}
