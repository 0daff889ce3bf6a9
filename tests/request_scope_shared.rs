//! A layer rule keyed by the client address (`{client ip}` to the registry of rule shapes)
//! and a `#[rate_limit]` key naming `{request.client_ip}`, the address the layer read:
//! one dimension, so one shape, counting one limiter per client; never refused as
//! overlapping rules. In a binary of its own: its calls decide on the default client,
//! in process, and the registry is the process's.
#![cfg(feature = "axum")]

use std::time::Duration;

use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use redlimit::tower::{Key, LayerRule, RateLimitLayer};
use redlimit::{rate_limit, Client, RateLimited};
use redlimit_test_support::http::{send, serve};

#[rate_limit(key = "signin:{request.client_ip}", rate = 4, interval = "60s")]
async fn signin() -> Result<(), RateLimited> {
    Ok(())
}

/// Each request spends one permit at the layer and one in the handler's function, of
/// the same limiter: the second request leaves none, the third is refused by the
/// layer, naming its rule.
#[tokio::test]
async fn a_layer_rule_and_an_attribute_keyed_by_the_client_address_count_one_limiter() {
    let client = Client::memory();
    redlimit::set_default(client.clone()).unwrap();
    let layer = RateLimitLayer::builder()
        .client(client.clone())
        .rule(LayerRule::new("signin", 4, Duration::from_secs(60)).key(Key::client_ip()))
        .build()
        .unwrap();
    let handler = || async {
        match signin().await {
            Ok(()) => "in".into_response(),
            Err(refused) => refused.into_response(),
        }
    };
    let addr = serve(Router::new().route("/signin", get(handler)).layer(layer)).await;
    for left in [2, 0] {
        let reply = send(addr, "GET", "/signin", &[]).await;
        assert_eq!((reply.status, reply.body.as_str()), (200, "in"), "{reply:?}");
        let limiter = client.rate_limiter("rate_limit:signin:127.0.0.1");
        assert_eq!(limiter.available_permits().await.unwrap(), left);
    }
    let refused = send(addr, "GET", "/signin", &[]).await;
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.header("ratelimit-policy"), Some("\"signin\";q=4;w=60"));
}
