//! The metrics of a call with settled rules (cargo feature `metrics`): the reservation
//! counters labelled with each settled rule's key template, `by_hand` for
//! `Client::reserve`, and the decision counters of every rule as for any call.
#![cfg(feature = "metrics")]

use std::collections::HashMap;

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
}
