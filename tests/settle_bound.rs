//! The bound a settled sliding window holds, checked from outside: 8 tasks in 2
//! processes reserve random estimates on one limiter of one redis-server and settle
//! random actual amounts, and every window of the real grant times holds at most the
//! rate plus the excess of the grants in it (what each was settled with beyond its
//! estimate). The same with a cap on one call's excess.

use redlimit_test_support as support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rand::RngExt;
use redlimit::{Client, Reserved, Rule};
use support::RedisServer;

const RATE: u64 = 1_000;
const INTERVAL_MS: u64 = 1_000;
const TASKS: usize = 4;
const RUN: Duration = Duration::from_secs(3);

/// One grant: its time (its score in the log), the permits reserved, the permits
/// counted once settled.
#[derive(Debug, Clone, Copy)]
struct Grant {
    at: u64,
    estimate: u64,
    counted: u64,
}

/// The rule of every call: `cap`, the most one settle charges past its estimate.
fn rule(name: &str, cap: Option<u64>) -> Rule {
    let rule = Rule::new(name, RATE, Duration::from_millis(INTERVAL_MS)).settled();
    match cap {
        Some(cap) => rule.max_overdraft(cap),
        None => rule,
    }
}

/// `TASKS` tasks reserving and settling on `url` for `RUN`: their grants.
async fn work(url: &str, name: &str, cap: Option<u64>) -> Vec<Grant> {
    let client = Client::connect(url).await.unwrap();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (client, name) = (client.clone(), name.to_owned());
            tokio::spawn(async move {
                let mut grants = Vec::new();
                let end = Instant::now() + RUN;
                while Instant::now() < end {
                    let (estimate, used, pause) = {
                        let mut rng = rand::rng();
                        let estimate = rng.random_range(1..=50);
                        let used = [0, estimate / 2, estimate, estimate * 2, rng.random_range(0..=150)]
                            [rng.random_range(0..5)];
                        (estimate, used, rng.random_range(0..=15))
                    };
                    match client
                        .reserve(&[rule(&name, cap).permits(estimate)])
                        .await
                        .unwrap()
                    {
                        Reserved::Granted(reservation) => {
                            let at = reservation.decision().at_ms;
                            tokio::time::sleep(Duration::from_millis(pause)).await;
                            let settled = reservation.settle(used).await.unwrap();
                            let counted = match &settled.rules[0] {
                                r if r.applied => r.counted,
                                _ => estimate,
                            };
                            grants.push(Grant {
                                at,
                                estimate,
                                counted,
                            });
                        }
                        Reserved::Refused(decision) => {
                            let wait = decision.retry_after.unwrap_or_default();
                            tokio::time::sleep(wait.min(Duration::from_millis(20))).await;
                        }
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
    grants
}

/// The other process: this test binary, run on `worker`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the tests below, in a process of its own"]
async fn worker() {
    let url = std::env::var("SETTLE_URL").unwrap();
    let name = std::env::var("SETTLE_NAME").unwrap();
    let cap = std::env::var("SETTLE_CAP").ok().map(|c| c.parse().unwrap());
    for g in work(&url, &name, cap).await {
        println!("GRANT {} {} {}", g.at, g.estimate, g.counted);
    }
}

/// Both processes' grants on `name`, with `cap`.
async fn grants_of_two_processes(server: &RedisServer, name: &str, cap: Option<u64>) -> Vec<Grant> {
    let mut child = Command::new(std::env::current_exe().unwrap());
    child
        .args([
            "worker",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SETTLE_URL", server.url())
        .env("SETTLE_NAME", name)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(cap) = cap {
        child.env("SETTLE_CAP", cap.to_string());
    }
    let child = child.spawn().unwrap();
    let mut grants = work(&server.url(), name, cap).await;
    let output = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    assert!(output.status.success(), "the other process failed");
    let theirs = String::from_utf8(output.stdout).unwrap();
    let before = grants.len();
    for line in theirs.lines().filter_map(|l| l.strip_prefix("GRANT ")) {
        let n: Vec<u64> = line.split(' ').map(|w| w.parse().unwrap()).collect();
        grants.push(Grant {
            at: n[0],
            estimate: n[1],
            counted: n[2],
        });
    }
    assert!(before > 0 && grants.len() > before, "both processes were granted");
    grants.sort_by_key(|g| g.at);
    grants
}

/// Checks every window (t - interval, t] ending at a grant: its counted permits
/// against the rate plus its grants' excess. Answers the most counted in a window,
/// and the most by which a window went past the rate.
fn check_every_window(grants: &[Grant]) -> (u64, u64) {
    let (mut most, mut most_over) = (0, 0);
    let mut start = 0;
    for end in 0..grants.len() {
        while grants[end].at - grants[start].at >= INTERVAL_MS {
            start += 1;
        }
        let window = &grants[start..=end];
        let counted: u64 = window.iter().map(|g| g.counted).sum();
        let excess: u64 = window.iter().map(|g| g.counted.saturating_sub(g.estimate)).sum();
        assert!(
            counted <= RATE + excess,
            "the window ending at {} holds {counted}, more than {RATE} + its excess {excess}",
            grants[end].at
        );
        most = most.max(counted);
        most_over = most_over.max(counted.saturating_sub(RATE));
    }
    (most, most_over)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_window_holds_the_rate_plus_the_excess_of_its_grants() {
    let server = RedisServer::start();
    let grants = grants_of_two_processes(&server, "bound:open", None).await;
    let (most, over) = check_every_window(&grants);
    let overdrawn = grants.iter().filter(|g| g.counted > g.estimate).count();
    println!(
        "{} grants, {overdrawn} overdrew; busiest window {most}, {over} past the rate",
        grants.len()
    );
    assert!(overdrawn > 20, "the run must overdraw: {overdrawn}");
    assert!(over > 0, "and go past the rate, by the excess: {over}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_excess_bounds_every_window_by_the_cap() {
    const CAP: u64 = 20;
    let server = RedisServer::start();
    let grants = grants_of_two_processes(&server, "bound:capped", Some(CAP)).await;
    assert!(grants.iter().all(|g| g.counted <= g.estimate + CAP));
    let (most, over) = check_every_window(&grants);
    // The stated bound with a cap: the rate plus the cap for each grant in the window
    // that overdrew.
    let mut start = 0;
    for end in 0..grants.len() {
        while grants[end].at - grants[start].at >= INTERVAL_MS {
            start += 1;
        }
        let window = &grants[start..=end];
        let overdrew = window.iter().filter(|g| g.counted > g.estimate).count() as u64;
        let counted: u64 = window.iter().map(|g| g.counted).sum();
        assert!(
            counted <= RATE + CAP * overdrew,
            "{counted} > {RATE} + {CAP} x {overdrew}"
        );
    }
    println!(
        "{} grants; busiest window {most}, {over} past the rate",
        grants.len()
    );
}
