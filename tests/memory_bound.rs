//! The bound on the limiters the in-process backend holds (`ClientBuilder::max_limiters`),
//! attacked as during a Redis outage, when `on_error = "local"` decides in process and
//! an attacker sprays distinct keys: through an axum server on loopback, a Redis client
//! whose redis-server was killed, the attribute, and a memory client. At the bound the
//! lightest limiter a rule made is let go into the summary of traces
//! (`redlimit_memory_evicted_total`): a spray is served, never resets an exhausted key,
//! never locks a new user out, and the limiters held (`redlimit_memory_limiters`) stop at
//! the bound. Only a
//! bound held by limiters configured by hand, or by requests in flight on settled rules,
//! refuses (`Error::MemoryFull`, 503 at the edge), counted in
//! `redlimit_memory_full_total` and logged once.
#![cfg(feature = "axum")]

use redlimit_test_support as support;

use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redlimit::tower::{Key, LayerRule, RateLimitLayer, Settle};
use redlimit::{rate_limit, Algorithm, Client, ManualClock, OnError, RateLimited, Rule};
use support::capture::Capture;
use support::http::{send, serve};
use support::RedisServer;

const MINUTE: Duration = Duration::from_secs(60);

/// The tests of this file one at a time: they read one process-wide counter.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `redlimit_memory_full_total` counted since the last call.
fn memory_full() -> u64 {
    counted("redlimit_memory_full_total")
}

/// `redlimit_memory_evicted_total` counted since the last call.
fn evicted() -> u64 {
    counted("redlimit_memory_evicted_total")
}

/// The gauge `redlimit_memory_limiters`: limiters held by in-process backends.
fn limiters_held() -> f64 {
    total("redlimit_memory_limiters")
}

/// The counter `name` counted since the last call.
fn counted(name: &str) -> u64 {
    static LAST: Mutex<Vec<(String, f64)>> = Mutex::new(Vec::new());
    let now = total(name);
    let mut last = LAST.lock().unwrap();
    let before = match last.iter_mut().find(|(n, _)| n == name) {
        Some((_, seen)) => std::mem::replace(seen, now),
        None => {
            last.push((name.to_owned(), now));
            0.0
        }
    };
    (now - before) as u64
}

/// The debugging recorder's snapshotter, and each metric's total so far.
type Recorded = (Snapshotter, Mutex<Vec<(String, f64)>>);

/// What the counter or gauge `name` adds up to since the recorder was installed (each
/// snapshot of the debugging recorder answers what changed since the one before).
fn total(name: &str) -> f64 {
    static RECORDED: OnceLock<Recorded> = OnceLock::new();
    let (snapshotter, totals) = RECORDED.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().unwrap();
        (snapshotter, Mutex::new(Vec::new()))
    });
    let mut totals = totals.lock().unwrap();
    for (key, .., value) in snapshotter.snapshot().into_vec() {
        let change = match value {
            DebugValue::Counter(n) => n as f64,
            DebugValue::Gauge(n) => n.into_inner(),
            _ => continue,
        };
        let key = key.key().name().to_owned();
        match totals.iter_mut().find(|(n, _)| *n == key) {
            Some((_, sum)) => *sum += change,
            None => totals.push((key, change)),
        }
    }
    totals.iter().filter(|(n, _)| n == name).map(|(_, sum)| sum).sum()
}

/// Times the bound was logged as a warning in `capture`.
fn warnings(capture: &Capture) -> usize {
    capture.text().matches("and none it may let go").count()
}

async fn status(addr: SocketAddr, key: &str) -> u16 {
    send(addr, "GET", "/", &[("x-api-key", key)]).await.status
}

#[tokio::test]
async fn a_spray_of_new_keys_during_an_outage_neither_resets_a_key_nor_locks_users_out() {
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

    // 10 times the bound in new keys, all but a few served; among them new users, each
    // limited to its rate. A new key is refused at most a few calls it did not make (a
    // shared cell of the summary whose filter says it may have written there counts
    // others' grants); the victim is refused throughout. The limiters held, read from the backends' gauge, never pass the
    // bound.
    let before = limiters_held();
    let mut most = 0.0f64;
    let (mut calls, mut refused) = (0, 0);
    let mut sprayed_refused = 0;
    for i in 0..SPRAY {
        let key = format!("spray-{i}");
        sprayed_refused += usize::from(status(addr, &key).await == 429);
        if i % 30 == 0 {
            assert_eq!(status(addr, "victim").await, 429, "after {i} sprayed keys");
            let user = format!("user-{i}");
            for _ in 0..5 {
                calls += 1;
                refused += u32::from(status(addr, &user).await == 429);
            }
            assert_eq!(status(addr, &user).await, 429, "{user} past its rate");
        }
        most = most.max(limiters_held() - before);
    }
    eprintln!(
        "10 times the bound in new keys: {sprayed_refused} of {SPRAY} sprayed keys and \
         {refused} of {calls} calls of new users refused"
    );
    assert!(
        sprayed_refused * 100 <= SPRAY,
        "{sprayed_refused} of {SPRAY} sprayed keys refused"
    );
    assert!(refused * 20 <= calls, "{refused} of {calls} refused");
    assert!(
        most <= MAX as f64 && most >= (MAX - 10) as f64,
        "{most} limiters held at most, the bound is {MAX}"
    );
    // The victim is still limited, for what is left of its minute.
    let refused = send(addr, "GET", "/", &[("x-api-key", "victim")]).await;
    assert_eq!(refused.status, 429);
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((40..=60).contains(&retry), "{retry}");
    // A key let go comes back as used: at most 4 more calls in its minute, not 5 (a
    // cell of the summary it shares with other sprayed keys counts theirs too: it may
    // grant fewer, never more).
    let mut granted = 0;
    for _ in 0..5 {
        granted += u32::from(status(addr, "spray-7").await == 200);
    }
    assert!(granted <= 4, "spray-7 came back with {granted} of 5 granted");
    let let_go = evicted();
    assert!(let_go >= (SPRAY - MAX) as u64, "{let_go} limiters were let go");
    assert_eq!(memory_full(), 0, "nothing was refused for the bound");
}

#[rate_limit(key = "bound:{user}", rate = 5, interval = "60s", on_error = "local")]
async fn local(user: u64) -> Result<(), RateLimited> {
    let _ = user;
    Ok(())
}

/// A token bucket let go between its user's calls by a spray of new keys, and made
/// again from its trace at each: it keeps the part of a token it refilled, so its user
/// is granted as often as with no spray (the tokens rounded to whole ones at each
/// recall, a user calling every 5 s on 5 a minute, a token every 12 s, was never
/// granted again), and never more. The spray is of another rule's keys: sliding
/// windows, whose traces the summary keeps apart from buckets', so the user's trace
/// always has a cell of its own; sprayed as buckets of the same kind, a trace that has
/// to share a cell with theirs counts at least what each counted, and the user is
/// granted as often or less, never more.
#[tokio::test]
async fn a_bucket_let_go_between_calls_keeps_what_it_refilled() {
    const MAX: usize = 8;
    let _serial = SERIAL.lock().await;
    let granted = |spray: usize, sprayed: Algorithm| async move {
        let clock = ManualClock::new(1_700_000_000_000);
        let memory = Client::builder().clock(clock.clone()).max_limiters(MAX).memory();
        let rule = |name: &'static str, algorithm: Algorithm| {
            RateLimitLayer::builder()
                .client(memory.clone())
                .rule(
                    LayerRule::new(name, 5, MINUTE)
                        .algorithm(algorithm)
                        .key(Key::header("x-api-key")),
                )
                .build()
                .unwrap()
        };
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(rule("tokens", Algorithm::TokenBucket))
            .merge(
                Router::new()
                    .route("/spray", get(|| async { "ok" }))
                    .layer(rule("sprayed", sprayed)),
            );
        let addr = serve(app).await;
        for _ in 0..5 {
            assert_eq!(status(addr, "user").await, 200);
        }
        assert_eq!(status(addr, "user").await, 429, "the burst spent");
        let mut granted = 0;
        for round in 0..40 {
            for i in 0..spray {
                let key = format!("spray:{round}:{i}");
                let sent = send(addr, "GET", "/spray", &[("x-api-key", &key)]).await;
                assert_eq!(sent.status, 200);
            }
            clock.advance(Duration::from_secs(5));
            if status(addr, "user").await == 200 {
                granted += 1;
            }
        }
        granted
    };
    let alone = granted(0, Algorithm::SlidingWindow).await;
    // 200 s at a token every 12 s: 16 tokens
    assert_eq!(alone, 16);
    evicted();
    for spray in [MAX, 2 * MAX] {
        assert_eq!(
            granted(spray, Algorithm::SlidingWindow).await,
            alone,
            "a spray of {spray} windows between calls"
        );
        let beside_buckets = granted(spray, Algorithm::TokenBucket).await;
        assert!(
            beside_buckets <= alone,
            "a spray of {spray} buckets between calls: {beside_buckets} granted"
        );
    }
    let evicted = evicted();
    // (at least a table a round: each round sends MAX keys or more into a full one)
    assert!(evicted >= 4 * 40 * MAX as u64, "the spray made room: {evicted}");
}

/// A settled rule's limiter is held while its reservation waits to be settled (let go,
/// the settle's excess would be lost): requests in flight on as many keys as the bound
/// hold it, and a new key is refused with 503 until one of them ends; then it is served.
#[tokio::test]
async fn requests_in_flight_on_settled_rules_hold_the_bound_until_they_end() {
    const MAX: usize = 4;
    let _serial = SERIAL.lock().await;
    memory_full();
    let memory = Client::builder().max_limiters(MAX).memory();
    let layer = RateLimitLayer::builder()
        .client(memory)
        .rule(
            LayerRule::new("metered", 1_000, MINUTE)
                .key(Key::header("x-api-key"))
                .settle(Settle::header("x-used")),
        )
        .build()
        .unwrap();
    let (open, opened) = tokio::sync::watch::channel(false);
    let entered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let inside = entered.clone();
    // the requests of keys `slow..`, counted in, wait until `open`
    let handler = move |headers: axum::http::HeaderMap| {
        let (mut opened, inside) = (opened.clone(), inside.clone());
        async move {
            if headers["x-api-key"].as_bytes().starts_with(b"slow") {
                inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = opened.wait_for(|open| *open).await;
            }
            ([("x-used", "1")], "ok")
        }
    };
    let addr = serve(Router::new().route("/", get(handler)).layer(layer)).await;
    let in_flight: Vec<_> = (0..MAX)
        .map(|i| tokio::spawn(async move { status(addr, &format!("slow{i}")).await }))
        .collect();
    // each reservation made and waiting in its handler, however slow the machine
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while entered.load(std::sync::atomic::Ordering::SeqCst) < MAX {
        assert!(
            std::time::Instant::now() < deadline,
            "the requests never reached their handler"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        status(addr, "new").await,
        503,
        "the bound held by requests in flight"
    );
    assert_eq!(memory_full(), 1);
    open.send(true).unwrap();
    for request in in_flight {
        assert_eq!(request.await.unwrap(), 200);
    }
    assert_eq!(status(addr, "new").await, 200, "served once they ended");
}

/// A reservation's limiter whose state all expired while it waited (swept) or was
/// deleted by hand stays held for it, empty: a later reservation of the name holds
/// the same limiter, and the first one, let go, takes away only its own hold. So the
/// later one's limiter is not let go at the bound while it waits (a new key is refused
/// `MemoryFull`), and is once it is settled. (Before, the first one's drop took the
/// later one's hold, and the new key was served by letting its limiter go.)
#[tokio::test]
async fn a_reservation_let_go_takes_no_later_reservations_hold() {
    let _serial = SERIAL.lock().await;
    memory_full();
    let second = Duration::from_secs(1);
    let settled = |name: &str| Rule::new(name, 10, second).keep_alive(Some(second)).settled();
    let reserve = |client: Client, name: &'static str| async move {
        match client.reserve(&[settled(name)]).await.unwrap() {
            redlimit::Reserved::Granted(reservation) => reservation,
            refused => panic!("{name} refused: {refused:?}"),
        }
    };
    for how in ["swept", "deleted"] {
        let clock = ManualClock::new(1_700_000_000_000);
        let client = Client::builder().max_limiters(2).clock(clock.clone()).memory();
        let first = reserve(client.clone(), "a").await;
        clock.advance(Duration::from_secs(10));
        if how == "swept" {
            // every part of `a` expired, and swept in turn by the calls on `b`
            let busy = [Rule::new("b", 1_000_000, second)];
            for _ in 0..3_000 {
                assert!(client.check_rules(&busy).await.unwrap().allowed);
            }
        } else {
            client.rate_limiter("a").delete().await.unwrap();
        }
        clock.advance(Duration::from_secs(10));
        let later = reserve(client.clone(), "a").await;
        drop(first);
        let other = reserve(client.clone(), "b").await;
        let new = client.reserve(&[settled("c")]).await;
        assert!(
            matches!(new, Err(redlimit::Error::MemoryFull { .. })),
            "{how}: a new key with both limiters held: {new:?}"
        );
        later.settle(1).await.unwrap();
        drop(other);
        assert!(
            matches!(
                client.reserve(&[settled("c")]).await,
                Ok(redlimit::Reserved::Granted(_))
            ),
            "{how}: served once they were settled"
        );
    }
    assert_eq!(memory_full(), 2);
}

/// The attribute under `on_error = "local"` during an outage and the layer on a memory
/// client serve new keys past the bound; a bound held by limiters configured by hand
/// refuses them, with the cause.
#[tokio::test]
async fn past_the_bound_rules_let_go_and_limiters_set_by_hand_are_kept() {
    const MAX: usize = 50;
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
    redlimit::set_default(client).unwrap();
    drop(server);
    for user in 0..MAX as u64 + 20 {
        local(user).await.unwrap();
    }
    // Each user's limiter, held or let go, counts its call.
    for _ in 0..4 {
        local(3).await.unwrap();
    }
    assert!(local(3).await.is_err(), "user 3 past its rate");
    assert_eq!(memory_full(), 0);

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
    for i in 0..MAX + 20 {
        assert_eq!(status(addr, &format!("k{i}")).await, 200);
    }

    // Limiters configured by hand are never let go: a bound of them refuses.
    for i in 0..MAX {
        let limiter = memory.rate_limiter(format!("hand:{i}"));
        assert!(limiter
            .try_set_rate(redlimit::RateType::Overall, 5, MINUTE)
            .await
            .unwrap());
    }
    for i in 0..20 {
        assert_eq!(status(addr, &format!("late{i}")).await, 503, "never let through");
    }
    assert_eq!(memory_full(), 20);
    assert_eq!(warnings(&capture), 1, "{}", capture.text());
    for i in 0..MAX {
        assert!(memory
            .rate_limiter(format!("hand:{i}"))
            .is_exists()
            .await
            .unwrap());
    }
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
