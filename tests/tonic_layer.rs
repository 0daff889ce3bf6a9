//! `RateLimitLayer` on a real tonic server (cargo feature `tonic`), in front of the
//! standard health service, called by a real client over HTTP/2: each client address
//! (tonic's `TcpConnectInfo`) limited on its own, a refusal is `RESOURCE_EXHAUSTED`
//! with `retry-after` metadata and a `google.rpc.RetryInfo` detail, grants carry the
//! RateLimit fields as metadata; a status refused inside, by a `#[rate_limit]`
//! function the method calls, keeps its own.
#![cfg(feature = "tonic")]

use std::time::Duration;

use redlimit::tower::{Grpc, Key, LayerRule, RateLimitLayer};
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
    let mut health = health_behind(layer, health).await;
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
    let mut health = health_behind(layer, health).await;
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

mod refused_inside {
    //! A health service whose `check` calls a `#[rate_limit]` function, behind a layer
    //! that grants every call.

    use std::pin::Pin;
    use std::time::Duration;

    use redlimit::tower::{LayerRule, RateLimitLayer};
    use redlimit::{rate_limit, Client, RateLimited};
    use tokio_stream::Stream;
    use tonic::{Code, Request, Response, Status};
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_server::{Health, HealthServer};
    use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

    // A name of its own (`grpc:inner` would do too: no client address of the test's
    // `grpc` rule beside, keyed by it, is `inner`).
    #[rate_limit(key = "inner:grpc", rate = 1, interval = "60s")]
    async fn inner() -> Result<(), RateLimited> {
        Ok(())
    }

    struct InnerLimited;

    #[tonic::async_trait]
    impl Health for InnerLimited {
        async fn check(
            &self,
            _: Request<HealthCheckRequest>,
        ) -> Result<Response<HealthCheckResponse>, Status> {
            inner().await?;
            Ok(Response::new(HealthCheckResponse {
                status: ServingStatus::Serving as i32,
            }))
        }

        type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

        async fn watch(&self, _: Request<HealthCheckRequest>) -> Result<Response<Self::WatchStream>, Status> {
            Err(Status::unimplemented("watch"))
        }
    }

    /// The layer (1 000 a second, `X-RateLimit-*` on) grants both calls; the second
    /// is refused inside: its status carries the function's fields, which decided it,
    /// not the layer's grant (`"grpc-all";r=998`), nor the layer's `x-ratelimit-*`.
    #[tokio::test]
    async fn a_status_refused_inside_keeps_its_own_fields() {
        let _ = redlimit::set_default(Client::memory());
        let layer = RateLimitLayer::builder()
            .client(Client::memory())
            .x_ratelimit_headers(true)
            .rule(LayerRule::new("grpc-all", 1_000, Duration::from_secs(1)))
            .build()
            .unwrap()
            .grpc();
        let mut health = super::health_behind(layer, HealthServer::new(InnerLimited)).await;
        let ask = || {
            Request::new(HealthCheckRequest {
                service: String::new(),
            })
        };
        let granted = health.check(ask()).await.unwrap();
        let field = |metadata: &tonic::metadata::MetadataMap, name| {
            metadata.get(name).map(|v| v.to_str().unwrap().to_owned())
        };
        assert_eq!(
            field(granted.metadata(), "ratelimit-policy").as_deref(),
            Some("\"grpc-all\";q=1000;w=1")
        );
        assert_eq!(
            field(granted.metadata(), "x-ratelimit-limit").as_deref(),
            Some("1000")
        );

        let status = health.check(ask()).await.unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted);
        let metadata = status.metadata();
        assert_eq!(
            field(metadata, "ratelimit-policy").as_deref(),
            Some("\"inner:grpc\";q=1;w=60"),
            "{metadata:?}"
        );
        let retry = field(metadata, "retry-after").unwrap();
        assert_eq!(
            field(metadata, "ratelimit"),
            Some(format!("\"inner:grpc\";r=0;t={retry}")),
            "{metadata:?}"
        );
        assert_eq!(field(metadata, "x-ratelimit-limit"), None, "{metadata:?}");
        assert_eq!(field(metadata, "x-ratelimit-remaining"), None, "{metadata:?}");
    }
}

/// A key from metadata is one value however a client spells it over HTTP/2: with
/// spaces or tabs around it (which h2 passes on where an HTTP/1 server drops them),
/// or, for binary metadata (`-bin`), with its base64 padding or without (tonic reads
/// both). A rule of 2 a minute: 2 of the 10 spellings of each value granted.
#[tokio::test]
async fn spellings_of_one_metadata_value_share_its_limiter() {
    let key = [
        "abc", "abc ", " abc", "abc\t", "\t abc  ", "abc", "abc ", " abc", "abc\t", "  abc",
    ];
    assert_eq!(granted_of("x-api-key", &key).await, 2, "{key:?}");
    let user = [
        "YQ==", "YQ", "YQ=", "YQ", "YQ==", "YQ", "YQ==", "YQ", "YQ=", " YQ ",
    ];
    assert_eq!(granted_of("x-user-bin", &user).await, 2, "{user:?}");
}

/// An exempt value is read as a request's value is: listed with its padding or with
/// spaces around it, it still exempts each spelling of the value (a rule of 1 a
/// minute: all 6 granted).
#[tokio::test]
async fn an_exempt_value_exempts_every_spelling_of_it() {
    let padded = LayerRule::new("exempt-bin", 1, Duration::from_secs(60))
        .key(Key::header("x-tenant-bin"))
        .exempt(["YQ=="]);
    let users = ["YQ==", "YQ", "YQ=", "YQ==", " YQ", "YQ"];
    assert_eq!(granted_by(padded, "x-tenant-bin", &users).await, 6, "{users:?}");
    let spaced = LayerRule::new("exempt-key", 1, Duration::from_secs(60))
        .key(Key::header("x-tenant"))
        .exempt([" vip\t"]);
    let tenants = ["vip", " vip", "vip ", "\tvip", "vip", "  vip  "];
    assert_eq!(granted_by(spaced, "x-tenant", &tenants).await, 6, "{tenants:?}");
}

/// How many of `values`, each sent once as metadata `name` to a server limiting
/// `name` to 2 a minute, are granted.
async fn granted_of(name: &'static str, values: &[&str]) -> usize {
    let rule = LayerRule::new(name, 2, Duration::from_secs(60)).key(Key::header(name));
    granted_by(rule, name, values).await
}

/// How many of `values`, each sent once as metadata `name` to a server with `rule`,
/// are granted.
async fn granted_by(rule: LayerRule, name: &'static str, values: &[&str]) -> usize {
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .rule(rule)
        .build()
        .unwrap()
        .grpc();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let mut health = health_behind(layer, health).await;
    let mut granted = 0;
    for value in values {
        let mut headers = axum::http::HeaderMap::new();
        headers.insert(name, axum::http::HeaderValue::from_str(value).unwrap());
        let mut request = Request::new(HealthCheckRequest {
            service: String::new(),
        });
        *request.metadata_mut() = tonic::metadata::MetadataMap::from_headers(headers);
        match health.check(request).await {
            Ok(_) => granted += 1,
            Err(status) => assert_eq!(status.code(), Code::ResourceExhausted, "{value:?}: {status:?}"),
        }
    }
    granted
}

/// `health` (a health service) behind `layer` on a real tonic server on loopback, and
/// a client of it over HTTP/2.
async fn health_behind<T: tonic_health::pb::health_server::Health>(
    layer: RateLimitLayer<Grpc>,
    health: tonic_health::pb::health_server::HealthServer<T>,
) -> HealthClient<Channel> {
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
    HealthClient::new(channel)
}
