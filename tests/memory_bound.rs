//! The bound on the limiters the in-process backend holds (`ClientBuilder::max_limiters`),
//! attacked as during a Redis outage, when `on_error = "local"` decides in process and
//! an attacker sprays distinct keys: through an axum server on loopback, a Redis client
//! whose redis-server was killed, the attribute, and a memory client. A spray of ten
//! times the bound never resets an exhausted key, never takes more limiters than the
//! bound (each new one past it evicts one, counted in `redlimit_memory_evicted_total`),
//! and never locks a new user out; only a table of limiters set by hand, which cannot
//! be evicted, refuses (`Error::MemoryFull`, counted in `redlimit_memory_full_total`).
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
use support::http::{send, serve};
use support::RedisServer;

const MINUTE: Duration = Duration::from_secs(60);

/// The tests of this file one at a time: they read one process-wide counter.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `redlimit_memory_full_total` counted since the last call.
fn memory_full() -> u64 {
    counted("redlimit_memory_full_total")
}

/// The counter `name` counted since the last snapshot (a snapshot takes every
/// counter's count).
fn counted(name: &str) -> u64 {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    static SEEN: std::sync::Mutex<Vec<(String, u64)>> = std::sync::Mutex::new(Vec::new());
    let snapshotter = SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().unwrap();
        snapshotter
    });
    let mut seen = SEEN.lock().unwrap();
    for (key, .., value) in snapshotter.snapshot().into_vec() {
        if let DebugValue::Counter(n) = value {
            seen.push((key.key().name().to_owned(), n));
        }
    }
    let mut total = 0;
    seen.retain(|(counter, n)| {
        if counter == name {
            total += n;
        }
        counter != name
    });
    total
}

async fn status(addr: SocketAddr, key: &str) -> u16 {
    send(addr, "GET", "/", &[("x-api-key", key)]).await.status
}

/// `redlimit_memory_evicted_total` counted since the last call.
fn evicted() -> u64 {
    counted("redlimit_memory_evicted_total")
}

#[tokio::test]
async fn a_spray_of_new_keys_during_an_outage_neither_resets_a_key_nor_locks_new_users_out() {
    const MAX: usize = 300;
    const SPRAY: usize = 10 * MAX;
    let _serial = SERIAL.lock().await;
    memory_full();
    evicted();
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

    // Ten times the bound in distinct keys, each served; a new user every 100 of them
    // is served too: at least 4 of its 5 (a start from a sprayed key's trace sharing
    // both its cells costs it that key's 1 of 5), never more than 5; the victim stays
    // limited.
    let mut short = 0;
    for i in 0..SPRAY {
        assert_eq!(status(addr, &format!("spray-{i}")).await, 200, "spray {i}");
        if i % 100 == 0 {
            let user = format!("user-{i}");
            let mut served = 0;
            for _ in 0..6 {
                served += u32::from(status(addr, &user).await == 200);
            }
            assert!((4..=5).contains(&served), "{user}: served {served} of its 5");
            short += u32::from(served < 5);
            assert_eq!(status(addr, "victim").await, 429, "after {i} sprayed keys");
        }
    }
    eprintln!(
        "new users served one short of their rate: {short} of {}",
        SPRAY / 100
    );
    let refused = send(addr, "GET", "/", &[("x-api-key", "victim")]).await;
    assert_eq!(refused.status, 429);
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((50..=60).contains(&retry), "{retry}");
    // Every new limiter past the bound took an evicted one's room (a limiter evicted
    // and made again from its trace, the victim's or a user's between two calls,
    // counts each time): the victim and the first MAX - 1 keys filled it.
    let made = 1 + SPRAY + SPRAY / 100;
    let evicted = evicted();
    assert!(
        evicted >= (made - MAX) as u64,
        "{evicted} evicted for {made} keys"
    );
    assert_eq!(memory_full(), 0);
}

#[rate_limit(key = "bound:{user}", rate = 5, interval = "60s", on_error = "local")]
async fn local(user: u64) -> Result<(), RateLimited> {
    let _ = user;
    Ok(())
}

/// The attribute under `on_error = "local"` during an outage, and the layer on a
/// memory client under `on_error = "allow"`: past the bound new keys are decided on
/// limiters made room for, and a key evicted and back is held to its rate; a table of
/// limiters set by hand, which nothing could write back, refuses with the cause.
#[tokio::test]
async fn past_the_bound_keys_are_decided_and_each_holds_its_rate() {
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
    for _ in 0..5 {
        local(0).await.unwrap();
    }
    for user in 1..MAX as u64 + 200 {
        local(user).await.unwrap();
    }
    let refused = local(0).await.unwrap_err();
    assert!(
        refused.cause().is_none(),
        "limited, not refused for the bound: {refused:?}"
    );
    assert!(refused.retry_after().is_some());

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
    for _ in 0..5 {
        assert_eq!(status(addr, "k0").await, 200);
    }
    for i in 1..MAX + 200 {
        assert_eq!(status(addr, &format!("k{i}")).await, 200);
    }
    assert_eq!(status(addr, "k0").await, 429, "never let through");
    assert_eq!(memory_full(), 0);

    // Limiters set by hand (no keep-alive) are never evicted: at the bound, refused.
    let by_hand = Client::builder().max_limiters(MAX).memory();
    for i in 0..MAX {
        let limiter = by_hand.rate_limiter(format!("rate_limit:hand:{i}"));
        assert!(limiter
            .try_set_rate(redlimit::RateType::Overall, 5, MINUTE)
            .await
            .unwrap());
    }
    let error = by_hand
        .check_rules(&[Rule::new("rate_limit:bound:new", 5, MINUTE)])
        .await
        .unwrap_err();
    assert!(matches!(error, Error::MemoryFull { max: MAX, .. }), "{error}");
    assert_eq!(
        error.to_string(),
        "in-process rate limiter full: it holds its maximum of 50 live limiters, none of them a \
         rule's that could be evicted, so the new limiter `rate_limit:bound:new` is refused until \
         idle ones expire; raise ClientBuilder::max_limiters if this many limiters set by hand are \
         expected"
    );
    assert_eq!(memory_full(), 1);
}
