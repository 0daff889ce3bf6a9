//! Clock skew between clients sharing a limiter.
//!
//! Guarantee on the clients' clocks (Redisson's model): when the clients' clocks differ
//! by at most D, a permit granted at true time t is granted again no sooner than
//! t + interval - D, so no true-time window of `interval - D` holds more than `rate`
//! grants (and a window of `interval` at most `rate * ceil(interval / (interval - D))`).
//! On the server's clock (`ClientBuilder::server_time`) skew does not matter: no window
//! of `interval` holds more than `rate`.

use redlimit_test_support as support;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use redlimit::{Client, Clock, ManualClock, Rule};
use support::RedisServer;

const SKEW_MS: u64 = 2_000;

/// The most grants in any window [t, t + length) of `times`.
fn busiest(times: &mut [u64], length: u64) -> usize {
    times.sort_unstable();
    let (mut most, mut start) = (0, 0);
    for end in 0..times.len() {
        while times[end] - times[start] >= length {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

/// A true clock read through a fixed offset, as a host whose clock is off.
struct Skewed {
    truth: Arc<dyn Fn() -> u64 + Send + Sync>,
    offset: i64,
}

impl Clock for Skewed {
    fn now_ms(&self) -> u64 {
        ((self.truth)() as i64 + self.offset) as u64
    }
}

#[tokio::test]
async fn skewed_client_clocks_keep_the_stated_bound() {
    let server = RedisServer::start();
    let truth = ManualClock::new(1_700_000_000_000);
    let clients: Vec<Client> = {
        let mut clients = Vec::new();
        for offset in [SKEW_MS as i64, -(SKEW_MS as i64)] {
            let read = truth.clone();
            let clock = Skewed {
                truth: Arc::new(move || read.now_ms()),
                offset,
            };
            clients.push(
                Client::builder()
                    .clock(clock)
                    .connect(&server.url())
                    .await
                    .unwrap(),
            );
        }
        clients
    };
    let (rate, interval) = (10, 10_000u64);
    let rule = [Rule::new("skew:shared", rate, Duration::from_millis(interval)).keep_alive(None)];
    let mut rng = StdRng::seed_from_u64(3);
    let mut grants = Vec::new();
    for _ in 0..1_500 {
        truth.advance(Duration::from_millis(rng.random_range(0..150)));
        let client = &clients[rng.random_range(0..2)];
        if client.check_rules(&rule).await.unwrap().allowed {
            grants.push(truth.now_ms());
        }
    }
    let d = 2 * SKEW_MS;
    let short = busiest(&mut grants, interval - d);
    let full = busiest(&mut grants, interval);
    println!(
        "{} grants; busiest {}-ms window {short}, busiest {interval}-ms window {full}",
        grants.len(),
        interval - d
    );
    assert!(short as u64 <= rate, "{short} grants within interval - D");
    assert!(full as u64 <= 2 * rate, "{full} grants within one interval");
    assert!(
        full as u64 > rate,
        "this run shows what skew costs: {full} in one interval"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_time_makes_skew_irrelevant() {
    let server = RedisServer::start();
    let system_ms = || SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    let mut clients = Vec::new();
    for offset in [SKEW_MS as i64, -(SKEW_MS as i64)] {
        let clock = Skewed {
            truth: Arc::new(system_ms),
            offset,
        };
        let client = Client::builder()
            .clock(clock)
            .server_time(true)
            .connect(&server.url())
            .await
            .unwrap();
        clients.push(client);
    }
    let (rate, interval) = (20u64, 300u64);
    let rule = Rule::new("skew:server_time", rate, Duration::from_millis(interval));
    let run = Duration::from_millis(1_500);
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let client = clients[i % 2].clone();
            let rules = [rule.clone()];
            tokio::spawn(async move {
                let deadline = tokio::time::Instant::now() + run;
                let mut grants = Vec::new();
                while tokio::time::Instant::now() < deadline {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    let decision = client.check_rules_for(&rules, left).await.unwrap();
                    if decision.allowed {
                        let off_by = decision.at_ms.abs_diff(system_ms());
                        assert!(
                            off_by < 500,
                            "decided at the server's time, not the client's: {off_by} ms"
                        );
                        grants.push(decision.at_ms);
                    }
                }
                grants
            })
        })
        .collect();
    let mut grants = Vec::new();
    for task in tasks {
        grants.extend(task.await.unwrap());
    }
    let most = busiest(&mut grants, interval);
    println!(
        "{} grants on the server's clock, busiest window {most}",
        grants.len()
    );
    assert!(
        most as u64 <= rate,
        "{most} grants in one window of the server's clock"
    );
    assert!(grants.len() as u64 >= 3 * rate, "the limiter kept granting");
}
