//! `RateLimitLayer` on a real tonic server (cargo feature `tonic`), in front of the
//! standard health service, called by a real client over HTTP/2: each client address
//! (tonic's `TcpConnectInfo`) limited on its own, a refusal is `RESOURCE_EXHAUSTED`
//! with `retry-after` metadata and a `google.rpc.RetryInfo` detail, grants carry the
//! RateLimit fields as metadata.
#![cfg(feature = "tonic")]

use std::time::Duration;

use redlimit::tower::{Key, LayerRule, RateLimitLayer};
use redlimit::Client;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_types::StatusExt;

#[tokio::test]
async fn a_limited_grpc_server_answers_resource_exhausted_with_the_retry_delay() {
    let client = Client::memory();
    let layer = RateLimitLayer::builder()
        .client(client.clone())
        .rule(LayerRule::new("grpc", 2, Duration::from_secs(60)).key(Key::client_ip()))
        .build()
        .unwrap()
        .grpc();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let ask = || {
        Request::new(HealthCheckRequest {
            service: String::new(),
        })
    };
    let first = health.check(ask()).await.unwrap();
    assert_eq!(first.metadata().get("ratelimit").unwrap(), "\"grpc\";r=1");
    assert_eq!(
        first.metadata().get("ratelimit-policy").unwrap(),
        "\"grpc\";q=2;w=60"
    );
    health.check(ask()).await.unwrap();

    let status = health.check(ask()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let retry: u64 = status
        .metadata()
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((59..=60).contains(&retry), "{retry}");
    let delay = status
        .get_details_retry_info()
        .expect("RetryInfo")
        .retry_delay
        .unwrap();
    assert!(
        delay > Duration::from_secs(58) && delay <= Duration::from_secs(60),
        "{delay:?}"
    );

    // The client's own limiter: its address from the connection.
    let limiter = client.rate_limiter("rate_limit:grpc:127.0.0.1");
    assert_eq!(limiter.available_permits().await.unwrap(), 0);
}

/// A rule that refuses calls without its metadata key: `UNAUTHENTICATED` naming it,
/// for a missing or blank value; a call with one is limited as usual.
#[tokio::test]
async fn a_grpc_call_without_the_rules_key_is_refused_when_the_rule_says_so() {
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .rule(
            LayerRule::new("grpc-key", 1, Duration::from_secs(60))
                .key(Key::header("x-api-key"))
                .missing_key(redlimit::tower::MissingKey::Unauthorized),
        )
        .build()
        .unwrap()
        .grpc();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let ask = |key: Option<&str>| {
        let mut request = Request::new(HealthCheckRequest {
            service: String::new(),
        });
        if let Some(key) = key {
            request.metadata_mut().insert("x-api-key", key.parse().unwrap());
        }
        request
    };
    for key in [None, Some(""), Some("  ")] {
        let status = health.check(ask(key)).await.unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated, "{key:?}");
        assert_eq!(status.message(), "this request needs the x-api-key header");
    }
    health.check(ask(Some("k1"))).await.unwrap();
    let status = health.check(ask(Some("k1"))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
}
