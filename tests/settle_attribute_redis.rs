//! `#[rate_limit]` with `cost` and `settle` on a real redis-server: every scenario of
//! `settle_attribute/common.rs`, then the round trips a call costs, a settle Redis
//! does not answer (sent again in the background), and `on_error = "local"` settling
//! on the in-process limiter that granted while Redis is gone. The default client is
//! process-wide, so this binary runs one test that owns its server.

#[path = "settle_attribute/common.rs"]
mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{left, reported, ApiError};
use redlimit::{rate_limit, Client, ManualClock};
use redlimit_test_support::{monitor::Monitor, RedisServer};

const TIMEOUT: Duration = Duration::from_millis(200);

/// Run by [`outage`]'s body, once: what happens to Redis while the call runs.
type Hook = Box<dyn FnOnce() + Send>;
static IN_BODY: Mutex<Option<Hook>> = Mutex::new(None);

#[rate_limit(key = "outage:{user}", rate = 100, interval = "60s", cost = estimate, settle = reported, on_error = "local")]
async fn outage(user: u64, estimate: u64, used: u64) -> Result<u64, ApiError> {
    let hook = IN_BODY.lock().unwrap().take();
    if let Some(hook) = hook {
        hook();
    }
    Ok(used)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn costs_known_after_the_call_on_redis() {
    let server = Arc::new(RedisServer::start());
    let clock = ManualClock::new(1_700_000_000_000);
    let client = Client::builder()
        .clock(clock.clone())
        .command_timeout(TIMEOUT)
        .connect(&server.url())
        .await
        .unwrap();
    redlimit::set_default(client.clone()).unwrap();
    common::an_excess_is_a_debt(&client, &clock).await;
    common::what_is_not_used_goes_back(&client, &clock).await;
    common::mixed_rules_hold_together(&client, &clock).await;
    common::a_fallback_answers_a_refusal(&client, &clock).await;
    common::a_shadow_rule_is_settled_too(&client, &clock).await;
    common::a_waiting_call_settles_what_it_reserved(&client, &clock).await;
    common::hostile_values_keep_the_limit(&client, &clock).await;

    // Three rules reserved in one script call; the settle is one more, and none when
    // the estimate was what the call used.
    let scripts = |monitor: Monitor| {
        let commands = monitor.client_commands();
        commands.iter().filter(|c| c.starts_with("EVAL")).count()
    };
    let monitor = Monitor::start(server.port);
    common::complete(20, 100, 100).await.unwrap();
    assert_eq!(scripts(monitor), 1);
    let monitor = Monitor::start(server.port);
    common::complete(21, 100, 40).await.unwrap();
    assert_eq!(scripts(monitor), 2);
    clock.advance(common::MINUTE * 2);

    // Redis freezes while the body runs: the call still answers within the command
    // timeout, and its settle lands once Redis is back.
    let frozen = server.clone();
    *IN_BODY.lock().unwrap() = Some(Box::new(move || frozen.pause()));
    let started = Instant::now();
    assert_eq!(outage(2, 10, 60).await.unwrap(), 60);
    assert!(
        started.elapsed() < TIMEOUT + Duration::from_millis(150),
        "{:?}",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.resume();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(left(&client, "outage:2").await, 40, "60 counted, once");

    // Redis gone: `local` reserves on the in-process limiter, and settles there.
    Arc::into_inner(server).unwrap().stop();
    assert_eq!(outage(3, 10, 90).await.unwrap(), 90);
    let refused = outage(3, 20, 1).await.unwrap_err().refusal();
    assert!(
        refused.cause().is_none(),
        "refused by the in-process limiter: {refused:?}"
    );
    assert!(refused.retry_after().is_some());
    assert_eq!(outage(3, 10, 10).await.unwrap(), 10, "the 10 the settle left");
    assert!(outage(3, 1, 1).await.is_err());
}
