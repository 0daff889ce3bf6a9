//! The metrics of a call with settled rules (cargo feature `metrics`): the reservation
//! counters labelled with each settled rule's key template, `by_hand` for
//! `Client::reserve`, and the decision counters of every rule as for any call.
#![cfg(feature = "metrics")]

use std::collections::HashMap;
use std::future::Future;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use redlimit::{rate_limit, Client, RateLimited, Reserved, Rule};

fn reported(result: &Result<u64, RateLimited>) -> u64 {
    *result.as_ref().unwrap_or(&0)
}

#[rate_limit(key = "m:tokens:{user}", rate = 1_000, interval = "60s", cost = estimate, settle = reported)]
#[rate_limit(key = "m:requests:{user}", rate = 10, interval = "60s")]
async fn metered(user: u64, estimate: u64, used: u64) -> Result<u64, RateLimited> {
    Ok(used)
}

#[tokio::test]
async fn reservations_are_counted_per_settled_rule() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    let client = Client::memory();
    redlimit::set_default(client.clone()).unwrap();

    metered(1, 100, 30).await.unwrap();
    metered(1, 100, 250).await.unwrap();
    let rule = Rule::new("by-hand:tokens", 1_000, std::time::Duration::from_secs(60));
    let Reserved::Granted(reservation) = client.reserve(&[rule.settled().permits(40)]).await.unwrap() else {
        panic!("refused");
    };
    reservation.settle(10).await.unwrap();

    let counted: HashMap<(String, String), u64> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let DebugValue::Counter(n) = value else {
                return None;
            };
            let labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            Some(((key.key().name().to_owned(), labels.join(",")), n))
        })
        .collect();
    let get = |name: &str, labels: &str| counted.get(&(name.to_owned(), labels.to_owned())).copied();
    let tokens = "rule=m:tokens:{user}";
    assert_eq!(get("redlimit_reserved_permits_total", tokens), Some(200));
    assert_eq!(get("redlimit_settled_permits_total", tokens), Some(280));
    assert_eq!(get("redlimit_refunded_permits_total", tokens), Some(70));
    assert_eq!(get("redlimit_overdrawn_permits_total", tokens), Some(150));
    let requests = "rule=m:requests:{user}";
    assert_eq!(
        get("redlimit_reserved_permits_total", requests),
        None,
        "not settled"
    );
    for rule in ["m:tokens:{user}", "m:requests:{user}"] {
        let labels = format!("rule={rule},outcome=allowed");
        assert_eq!(get("redlimit_decisions_total", &labels), Some(2), "{labels}");
    }
    assert_eq!(get("redlimit_reserved_permits_total", "rule=by_hand"), Some(40));
    assert_eq!(get("redlimit_refunded_permits_total", "rule=by_hand"), Some(30));

    // A settle whose task ends unfinished with the runtime running it (Redis frozen,
    // then the client's runtime shut down): counted abandoned, not lost silently.
    let server = std::sync::Arc::new(redlimit_test_support::RedisServer::start());
    let frozen = server.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let client = runtime.block_on(Client::connect(&frozen.url())).unwrap();
        // Two settled rules of one settle: one settle abandoned, counted once.
        let rule = |name: &str| Rule::new(name, 1_000, std::time::Duration::from_secs(60));
        let rules = [
            rule("m:abandoned-a").settled().permits(10),
            rule("m:abandoned-b").settled().permits(10),
        ];
        let reserve = client.reserve(&rules);
        let Reserved::Granted(reservation) = runtime.block_on(reserve).unwrap() else {
            panic!("refused");
        };
        frozen.pause();
        runtime.block_on(async {
            let mut settle = Box::pin(reservation.settle(900));
            let waker = std::task::Waker::noop();
            let polled = settle.as_mut().poll(&mut std::task::Context::from_waker(waker));
            assert!(polled.is_pending(), "the settle waits on the frozen server");
        });
        runtime.shutdown_background();
    })
    .join()
    .unwrap();
    // (A snapshot takes what counters counted since the last: gathered until the count
    // shows, the task's end running on the runtime's threads as it shuts down.)
    let mut abandoned = Vec::new();
    let started = std::time::Instant::now();
    while abandoned.is_empty() && started.elapsed() < std::time::Duration::from_secs(2) {
        std::thread::sleep(std::time::Duration::from_millis(10));
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            if key.key().name() == "redlimit_settles_abandoned_total" {
                let labels: Vec<String> = key.key().labels().map(|l| l.value().to_owned()).collect();
                abandoned.push((labels, value));
            }
        }
    }
    server.resume();
    assert_eq!(
        abandoned,
        vec![(vec!["by_hand".to_owned()], DebugValue::Counter(1))],
        "the settle's task ended with its runtime: counted abandoned, once"
    );
}
