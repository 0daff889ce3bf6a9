//! The command timeout as the defaults set it (250 ms), against a frozen server
//! (SIGSTOP: connections open, nothing answers), with margins that catch a call
//! waiting twice: a plain call, and a function with a `timeout` whose wait is cut
//! by the outage.

use redlimit_test_support as support;

use std::time::{Duration, Instant};

use redlimit::{rate_limit, Client, Error, RateLimited, Rule, DEFAULT_COMMAND_TIMEOUT};
use support::RedisServer;

/// What the scheduler may add to a timeout on a loaded 2-core machine. Well under a
/// second timeout, so a call that waits twice fails.
const MARGIN: Duration = Duration::from_millis(100);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_command_timeout_bounds_a_call_to_a_frozen_server() {
    assert_eq!(DEFAULT_COMMAND_TIMEOUT, Duration::from_millis(250));
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    // Connected, but not one command sent yet: its timeout is the command's.
    let fresh = Client::connect(&server.url()).await.unwrap();
    let rules = [Rule::new("rate_limit:frozen", 100, Duration::from_secs(60))];
    assert!(client.check_rules(&rules).await.unwrap().allowed);
    server.pause();
    let err = fresh.check_rules(&rules).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Timeout {
                connecting: false,
                ..
            }
        ),
        "{err:?}"
    );
    let mut worst = Duration::ZERO;
    for _ in 0..3 {
        let started = Instant::now();
        let err = client.check_rules(&rules).await.unwrap_err();
        let took = started.elapsed();
        assert!(
            matches!(err, Error::Timeout { after, connecting: false } if after == DEFAULT_COMMAND_TIMEOUT),
            "{err:?}"
        );
        assert!(
            took >= DEFAULT_COMMAND_TIMEOUT,
            "answered before the timeout: {took:?}"
        );
        assert!(took <= DEFAULT_COMMAND_TIMEOUT + MARGIN, "{took:?}");
        worst = worst.max(took - DEFAULT_COMMAND_TIMEOUT);
    }
    println!("worst overshoot of the command timeout: {worst:?}");
    server.resume();
}

#[rate_limit(key = "timeouts:wait", rate = 1, interval = "900ms", timeout = "1s")]
async fn waits_up_to_a_second() -> Result<(), RateLimited> {
    Ok(())
}

/// The wait for a permit is cut by the outage: the attempt at 900 ms times out at
/// 1150 ms (one decision past the deadline), then `on_error = "local"` decides in
/// process on what is left of the deadline (nothing), and grants (a fresh local
/// limiter). So a function with a `timeout` answers within that timeout plus one
/// decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_function_answers_within_its_timeout_plus_one_decision() {
    let server = RedisServer::start();
    redlimit::set_default(Client::connect(&server.url()).await.unwrap()).unwrap();
    waits_up_to_a_second().await.unwrap();
    let started = Instant::now();
    let call = tokio::spawn(waits_up_to_a_second());
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.pause();
    let result = call.await.unwrap();
    let took = started.elapsed();
    server.resume();
    result.unwrap();
    let bound = Duration::from_secs(1) + DEFAULT_COMMAND_TIMEOUT;
    assert!(
        took >= Duration::from_millis(1100),
        "the attempt at 900 ms timed out: {took:?}"
    );
    assert!(took <= bound + MARGIN, "{took:?}");
    println!("a waiting call through an outage took {took:?} (bound {bound:?})");
}
