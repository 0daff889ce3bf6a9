//! Metrics and spans after known sequences of calls (cargo feature `metrics`, on by
//! default): grants, refusals, shadow refusals, an outage under each `on_error`
//! policy, waits, config rewrites, backend timings; the decision span and its Redis
//! child; interpolated keys only at trace level.
#![cfg(feature = "metrics")]

use redlimit_test_support as support;

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redlimit::{rate_limit, Client, RateLimited, RateType};
use support::capture::Capture;
use support::RedisServer;

/// Recorded values by metric name and sorted labels.
type Taken = HashMap<(String, Vec<(String, String)>), u64>;

/// The values recorded since the last call: counters by (name, sorted labels),
/// histograms as their number of samples.
fn take() -> Taken {
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
        .map(|(key, _, _, value)| {
            let mut labels: Vec<(String, String)> = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let value = match value {
                DebugValue::Counter(n) => n,
                DebugValue::Histogram(samples) => samples.len() as u64,
                DebugValue::Gauge(_) => 0,
            };
            ((key.key().name().to_owned(), labels), value)
        })
        .collect()
}

fn decisions(taken: &Taken, rule: &str, outcome: &str) -> u64 {
    let labels = vec![
        ("outcome".to_owned(), outcome.to_owned()),
        ("rule".to_owned(), rule.to_owned()),
    ];
    taken
        .get(&("redlimit_decisions_total".to_owned(), labels))
        .copied()
        .unwrap_or(0)
}

fn backend_calls(taken: &Taken, backend: &str, operation: &str) -> u64 {
    let labels = vec![
        ("backend".to_owned(), backend.to_owned()),
        ("operation".to_owned(), operation.to_owned()),
    ];
    taken
        .get(&("redlimit_backend_seconds".to_owned(), labels))
        .copied()
        .unwrap_or(0)
}

fn plain(taken: &Taken, name: &str) -> u64 {
    taken.get(&(name.to_owned(), Vec::new())).copied().unwrap_or(0)
}

#[rate_limit(key = "obs:order:{user}", rate = 2, interval = "60s")]
async fn order(user: u32) -> Result<(), RateLimited> {
    let _ = user;
    Ok(())
}

#[rate_limit(key = "obs:trial", rate = 1, interval = "60s", shadow = true)]
#[rate_limit(key = "obs:real", rate = 10, interval = "60s")]
async fn trial() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "obs:wait", rate = 1, interval = "300ms", timeout = "1s")]
async fn patient() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "obs:allow", rate = 1, interval = "60s", on_error = "allow")]
async fn lenient() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "obs:deny", rate = 1, interval = "60s", on_error = "deny")]
async fn strict() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "obs:local", rate = 1, interval = "60s", on_error = "local")]
async fn local() -> Result<(), RateLimited> {
    Ok(())
}

/// One sequence, in order: the recorder's counters are global to this binary.
#[tokio::test(flavor = "current_thread")]
async fn metrics_count_every_outcome_and_backend_call() {
    take();
    // An in-process layer, deciding where it is called (first: before any subscriber
    // makes tracing report debug spans wanted): each request counted once.
    #[cfg(feature = "axum")]
    {
        use redlimit::tower::{LayerRule, RateLimitLayer};
        let layer = RateLimitLayer::builder()
            .client(Client::memory())
            .rule(LayerRule::new("obs:layer", 2, Duration::from_secs(60)))
            .build()
            .unwrap();
        let addr = support::http::serve_route("/", |app| app.layer(layer)).await;
        take();
        for _ in 0..3 {
            support::http::send(addr, "GET", "/", &[]).await;
        }
        let taken = take();
        assert_eq!(decisions(&taken, "obs:layer", "allowed"), 2);
        assert_eq!(decisions(&taken, "obs:layer", "limited"), 1);
    }

    let server = RedisServer::start();
    let client = Client::builder()
        .command_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .connect_lazy(&server.url())
        .unwrap();
    redlimit::set_default(client.clone()).unwrap();

    for _ in 0..3 {
        let _ = order(7).await;
    }
    let _ = order(8).await;
    let taken = take();
    assert_eq!(decisions(&taken, "obs:order:{user}", "allowed"), 3);
    assert_eq!(decisions(&taken, "obs:order:{user}", "limited"), 1);
    assert_eq!(backend_calls(&taken, "redis", "acquire"), 4);

    for _ in 0..3 {
        trial().await.unwrap();
    }
    let taken = take();
    assert_eq!(decisions(&taken, "obs:real", "allowed"), 3);
    assert_eq!(decisions(&taken, "obs:trial", "shadow_limited"), 2);
    assert_eq!(
        decisions(&taken, "obs:trial", "allowed"),
        0,
        "shadow rules never count allowed"
    );

    // A call that waited for its permit: one wait recorded; one that did not: none.
    patient().await.unwrap();
    patient().await.unwrap();
    let taken = take();
    assert_eq!(plain(&taken, "redlimit_wait_seconds"), 1);
    assert_eq!(decisions(&taken, "obs:wait", "allowed"), 2);

    // A stored config the rule differs from: rewritten, and counted once.
    client
        .rate_limiter("rate_limit:obs:order:9")
        .try_set_rate(RateType::Overall, 5, Duration::from_secs(60))
        .await
        .unwrap();
    order(9).await.unwrap();
    let taken = take();
    assert_eq!(plain(&taken, "redlimit_config_changes_total"), 1);
    assert_eq!(backend_calls(&taken, "redis", "try_set_rate"), 1);

    spans_and_fields().await;
    take();

    // The outage: each rule counts its own policy.
    drop(server);
    lenient().await.unwrap();
    assert!(strict().await.is_err());
    local().await.unwrap();
    assert!(local().await.is_err(), "limited in process");
    let taken = take();
    assert_eq!(decisions(&taken, "obs:allow", "error_allowed"), 1);
    assert_eq!(decisions(&taken, "obs:deny", "error_denied"), 1);
    assert_eq!(decisions(&taken, "obs:local", "error_local"), 2);
    assert_eq!(
        decisions(&taken, "obs:local", "limited"),
        1,
        "the in-process refusal"
    );
    assert_eq!(decisions(&taken, "obs:allow", "allowed"), 0);
    assert_eq!(
        backend_calls(&taken, "redis", "acquire"),
        4,
        "failed calls are timed too"
    );
    assert_eq!(
        backend_calls(&taken, "memory", "acquire"),
        0,
        "the in-process backend has no round trip to time"
    );
}

/// The decision span with its fields, the Redis call inside it, and the key only in a
/// trace-level event (under a subscriber that takes every level).
async fn spans_and_fields() {
    let capture = Capture::default();
    let guard = tracing::subscriber::set_default(capture.clone());
    order(10).await.unwrap();
    patient().await.unwrap();
    patient().await.unwrap();
    drop(guard);
    let text = capture.text();
    let lines: Vec<&str> = text.lines().collect();
    let decide = lines
        .iter()
        .find(|l| l.starts_with("span redlimit.decide") && l.contains("rules=obs:order:{user}"))
        .unwrap_or_else(|| panic!("{text}"));
    let id = decide.split_whitespace().nth(2).unwrap();
    let recorded = |field: &str| {
        lines
            .iter()
            .any(|l| l.starts_with(&format!("record {id} ")) && l.contains(field))
    };
    assert!(recorded("backend=\"redis\""), "{text}");
    assert!(recorded("outcome=\"allowed\""), "{text}");
    assert!(recorded("remaining=1"), "{text}");
    assert!(
        text.contains("span redlimit.redis")
            && text.contains("db.system.name=\"redis\"")
            && text.contains("db.operation.name=\"EVALSHA\""),
        "{text}"
    );
    // The waiting call: its span says how long it waited.
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("record ") && l.contains("waited_ms=")),
        "{text}"
    );
    // The interpolated key: only in trace-level events.
    let with_key: Vec<&&str> = lines.iter().filter(|l| l.contains("obs:order:10")).collect();
    assert!(!with_key.is_empty(), "{text}");
    assert!(with_key.iter().all(|l| l.starts_with("TRACE")), "{with_key:?}");
}
