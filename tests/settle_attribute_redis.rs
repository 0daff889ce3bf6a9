//! `#[rate_limit]` with `cost` and `settle` on a real redis-server: every scenario of
//! `settle_attribute/common.rs`, then the round trips a call costs, a settle Redis
//! does not answer (sent again in the background), and `on_error = "local"` settling
//! on the in-process limiter that granted while Redis is gone. The default client is
//! process-wide, so this binary runs one test that owns its server.

#[path = "settle_attribute/common.rs"]
mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use common::{left, reported, ApiError};
use redlimit::{rate_limit, Client, ManualClock};
use redlimit_test_support::{monitor::Monitor, RedisServer};

const TIMEOUT: Duration = Duration::from_millis(200);

/// A call polled until its body has returned (`common::RETURNED`), then dropped
/// after that poll if it is still waiting: its caller gone.
struct GoneAsItReturns<F>(Option<F>);

impl<F: Future + Unpin> Future for GoneAsItReturns<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let call = self.0.as_mut().expect("polled after it answered");
        match Pin::new(call).poll(cx) {
            Poll::Ready(answer) => Poll::Ready(Some(answer)),
            Poll::Pending if common::RETURNED.load(Ordering::SeqCst) => {
                self.0 = None;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// `common::complete` for `user`, estimating 10 and using 900, its caller gone in
/// the poll in which the body returned: `None` when it was still waiting then.
async fn gone_as_it_returns(user: u64) -> Option<Result<common::Completion, ApiError>> {
    common::RETURNED.store(false, Ordering::SeqCst);
    let call = std::pin::pin!(common::complete(user, 10, 900));
    GoneAsItReturns(Some(call)).await
}

/// [`gone_as_it_returns`] on a thread of its own, on a runtime `builder` makes for
/// the call and ends after it.
fn on_a_runtime_of_its_own(user: u64, mut builder: tokio::runtime::Builder) {
    std::thread::spawn(move || {
        let runtime = builder.enable_all().build().unwrap();
        let answered = runtime.block_on(gone_as_it_returns(user));
        assert!(
            answered.is_none(),
            "the call waited on its settle after the body returned"
        );
        drop(runtime);
    })
    .join()
    .unwrap();
}

/// Waits until each of `users`' token limiters counts the 900 its call used (9 100 of
/// 10 000 left), 2 s at most each.
async fn all_charged(client: &Client, users: std::ops::Range<u64>, how: &str) {
    for user in users {
        let name = format!("llm:tokens:user:{user}");
        let charged = async {
            while left(client, &name).await != 9_100 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let waited = tokio::time::timeout(Duration::from_secs(2), charged).await;
        let now = left(client, &name).await;
        assert!(
            waited.is_ok(),
            "user {user}, {how}: 900 used of 10 reserved, {now} left"
        );
    }
}

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

    // The caller gone in the poll in which the body returned (a client that hung up,
    // a `select!` branch taken): the settle, sent from a task of its own, still lands.
    for user in 30..40 {
        assert!(gone_as_it_returns(user).await.is_none());
    }
    all_charged(&client, 30..40, "its caller gone").await;

    // The same from a caller on a current-thread runtime of its own, ended right
    // after (a synchronous wrapper around each call): the settle runs on the client's
    // runtime, not on the caller's, which ends with the tasks it holds.
    for user in 40..45 {
        on_a_runtime_of_its_own(user, tokio::runtime::Builder::new_current_thread());
    }
    all_charged(&client, 40..45, "on a runtime that ended").await;

    // And from callers each on a multi-thread runtime made for the call and ended
    // after it, the settle's script flushed so that it takes more than one round
    // trip: the settle runs on the client's runtime, which outlives them.
    for user in 45..48 {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut server.raw().await)
            .await
            .unwrap();
        on_a_runtime_of_its_own(user, tokio::runtime::Builder::new_multi_thread());
    }
    all_charged(&client, 45..48, "on a runtime made for the call").await;

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
