//! The bound on the limiters the in-process backend holds (`ClientBuilder::max_limiters`),
//! attacked as during a Redis outage, when `on_error = "local"` decides in process and
//! an attacker sprays distinct keys: through an axum server on loopback, a Redis client
//! whose redis-server was killed, the attribute, and a memory client. A spray never
//! resets an exhausted key, never takes more limiters than the bound, and each call it
//! makes past the bound is refused as documented (503 at the edge, `Error::MemoryFull`
//! under every `on_error`), counted in `redlimit_memory_full_total` and logged once.
#![cfg(feature = "axum")]

use redlimit_test_support as support;

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redlimit::tower::{Key, LayerRule, RateLimitLayer};
use redlimit::{rate_limit, Client, Error, OnError, RateLimited, Rule};
use support::capture::Capture;
use support::http::{send, serve};
use support::RedisServer;

const MINUTE: Duration = Duration::from_secs(60);

/// The tests of this file one at a time: they read one process-wide counter.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `redlimit_memory_full_total` counted since the last call.
fn memory_full() -> u64 {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    let snapshotter = SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().unwrap();
        snapshotter
    });
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "redlimit_memory_full_total")
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum()
}

/// Times the bound was logged in `capture`.
fn warnings(capture: &Capture) -> usize {
    capture.text().matches("holds its maximum of").count()
}

async fn status(addr: SocketAddr, key: &str) -> u16 {
    send(addr, "GET", "/", &[("x-api-key", key)]).await.status
}

#[tokio::test]
async fn a_spray_of_new_keys_during_an_outage_cannot_reset_a_key_or_pass_the_bound() {
    const MAX: usize = 300;
    const SPRAY: usize = 2_000;
    let _serial = SERIAL.lock().await;
    memory_full();
    let capture = Capture::default();
    let _log = tracing::subscriber::set_default(capture.clone());
    let server = RedisServer::start();
    let client = Client::builder()
        .max_limiters(MAX)
        .connect(&server.url())
        .await
        .unwrap();
    // on_error local is the layer's default.
    let layer = RateLimitLayer::builder()
        .client(client)
        .rule(LayerRule::new("api", 5, MINUTE).key(Key::header("x-api-key")))
        .build()
        .unwrap();
    let addr = serve(Router::new().route("/", get(|| async { "ok" })).layer(layer)).await;
    drop(server);

    // Decided in process: the victim spends its 5 and is limited.
    for _ in 0..5 {
        assert_eq!(status(addr, "victim").await, 200);
    }
    assert_eq!(status(addr, "victim").await, 429);

    let (mut granted, mut full) = (0, 0);
    for i in 0..SPRAY {
        match send(addr, "GET", "/", &[("x-api-key", &format!("spray-{i}"))]).await {
            reply if reply.status == 200 => granted += 1,
            reply if reply.status == 503 => {
                assert_eq!(reply.body, "Service temporarily unavailable\n");
                assert_eq!(reply.header("retry-after"), None);
                full += 1;
            }
            reply => panic!("spray {i}: {reply:?}"),
        }
        if i % 250 == 0 {
            assert_eq!(status(addr, "victim").await, 429, "after {i} sprayed keys");
        }
    }
    // Every sprayed key that got in holds a limiter: the room the bound left, no more.
    assert_eq!(granted, MAX - 1, "the victim holds one limiter");
    assert_eq!(full, SPRAY - (MAX - 1));
    // The victim is still limited, for what is left of its minute; the keys already
    // held keep their windows.
    let refused = send(addr, "GET", "/", &[("x-api-key", "victim")]).await;
    assert_eq!(refused.status, 429);
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((50..=60).contains(&retry), "{retry}");
    assert_eq!(status(addr, "spray-0").await, 200);
    assert_eq!(memory_full(), full as u64);
    assert_eq!(warnings(&capture), 1, "{}", capture.text());
}

#[rate_limit(key = "bound:{user}", rate = 5, interval = "60s", on_error = "local")]
async fn local(user: u64) -> Result<(), RateLimited> {
    let _ = user;
    Ok(())
}

/// The attribute under `on_error = "local"` during an outage, and the layer on a
/// memory client under `on_error = "allow"`: past the bound both refuse, with the cause.
#[tokio::test]
async fn past_the_bound_calls_are_refused_under_every_on_error() {
    const MAX: usize = 50;
    let _serial = SERIAL.lock().await;
    memory_full();
    let server = RedisServer::start();
    let client = Client::builder()
        .max_limiters(MAX)
        .connect(&server.url())
        .await
        .unwrap();
    redlimit::set_default(client).unwrap();
    drop(server);
    for user in 0..MAX as u64 {
        local(user).await.unwrap();
    }
    for user in MAX as u64..MAX as u64 + 20 {
        let refused = local(user).await.unwrap_err();
        let cause = refused.cause().expect("refused for the bound");
        assert!(matches!(cause, Error::MemoryFull { max: MAX, .. }), "{cause}");
        assert_eq!(refused.retry_after(), None);
    }
    assert_eq!(memory_full(), 20);

    let memory = Client::builder().max_limiters(MAX).memory();
    let layer = RateLimitLayer::builder()
        .client(memory.clone())
        .rule(
            LayerRule::new("allow", 5, MINUTE)
                .key(Key::header("x-api-key"))
                .on_error(OnError::Allow),
        )
        .build()
        .unwrap();
    let addr = serve(Router::new().route("/", get(|| async { "ok" })).layer(layer)).await;
    for i in 0..MAX {
        assert_eq!(status(addr, &format!("k{i}")).await, 200);
    }
    for i in MAX..MAX + 20 {
        assert_eq!(status(addr, &format!("k{i}")).await, 503, "never let through");
    }
    assert_eq!(memory_full(), 20);

    // The message says what happened and what to do.
    let error = memory
        .check_rules(&[Rule::new("rate_limit:bound:new", 5, MINUTE)])
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "in-process rate limiter full: it holds its maximum of 50 live limiters, so the new \
         limiter `rate_limit:bound:new` is refused until idle ones expire; raise \
         ClientBuilder::max_limiters if this many keys are expected"
    );
}
