//! Contention across processes: several OS processes, each with many tasks, hammer the
//! same limiters on one redis-server and report every grant with its decision time.
//! No sliding window of `interval` may hold more than `rate` grants, and under steady
//! demand the limiter must grant close to `rate` per window.
//!
//! The worker processes are this test binary run again on the ignored `worker` test.

mod support;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redlimit::{Client, RateType, Rule};
use support::RedisServer;

const RATE: u64 = 40;
const INTERVAL_MS: u64 = 400;
const RUN: Duration = Duration::from_millis(2500);
const PROCESSES: usize = 4;
const TASKS: usize = 12;

/// The rules a worker decides, by scenario name.
fn rules(scenario: &str) -> Vec<Rule> {
    let interval = Duration::from_millis(INTERVAL_MS);
    match scenario {
        "one" => vec![Rule::new("contention:one", RATE, interval)],
        "stacked" => vec![
            Rule::new("contention:stacked:a", RATE * 2, interval),
            Rule::new("contention:stacked:b", RATE, interval),
            Rule::new("contention:stacked:c", RATE + 5, interval),
        ],
        "per_client" => vec![Rule::new("contention:per_client", RATE, interval).mode(RateType::PerClient)],
        other => panic!("unknown scenario {other}"),
    }
}

/// A worker process: `TASKS` tasks decide the scenario's rules until `RUN` is over,
/// waiting for the reported time after each refusal, and print each grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the contention tests in worker processes"]
async fn worker() {
    let url = std::env::var("CONTENTION_URL").expect("CONTENTION_URL");
    let scenario = std::env::var("CONTENTION_SCENARIO").expect("CONTENTION_SCENARIO");
    let client = Client::connect(&url).await.unwrap();
    let deadline = tokio::time::Instant::now() + RUN;
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let client = client.clone();
            let rules = rules(&scenario);
            tokio::spawn(async move {
                let mut grants = Vec::new();
                loop {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    if left.is_zero() {
                        return grants;
                    }
                    let decision = client.check_rules_for(&rules, left).await.unwrap();
                    if decision.allowed {
                        grants.push(decision.at_ms);
                    }
                }
            })
        })
        .collect();
    let mut out = String::new();
    for task in tasks {
        for at in task.await.unwrap() {
            out.push_str(&format!("GRANT {} {at}\n", client.client_id()));
        }
    }
    print!("{out}");
}

/// Runs the workers at once and answers the grant times, per client id. One scenario
/// at a time: three at once would share two cores among 144 tasks and measure the
/// machine, not the limiter.
fn run_workers(server: &RedisServer, scenario: &str) -> BTreeMap<String, Vec<u64>> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "worker",
                    "--exact",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("CONTENTION_URL", server.url())
                .env("CONTENTION_SCENARIO", scenario)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut grants: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for child in children {
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "a worker failed");
        for line in String::from_utf8(output.stdout).unwrap().lines() {
            let mut words = line.split(' ');
            if words.next() == Some("GRANT") {
                let client = words.next().unwrap().to_owned();
                let at: u64 = words.next().unwrap().parse().unwrap();
                grants.entry(client).or_default().push(at);
            }
        }
    }
    assert_eq!(grants.len(), PROCESSES, "every worker granted something");
    grants
}

/// The most grants in any window [t, t + interval), and the mean number of grants in
/// the windows starting every 10 ms from the first grant to one interval before the
/// last (the steady state).
fn windows(times: &mut [u64]) -> (usize, f64) {
    times.sort_unstable();
    let mut most = 0;
    let mut start = 0;
    for end in 0..times.len() {
        while times[end] - times[start] >= INTERVAL_MS {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    let (first, last) = (times[0], times[times.len() - 1]);
    let starts: Vec<u64> = (first..=last.saturating_sub(INTERVAL_MS)).step_by(10).collect();
    let in_window = |t: u64| times.iter().filter(|&&g| g >= t && g < t + INTERVAL_MS).count();
    let mean = starts.iter().map(|&t| in_window(t)).sum::<usize>() as f64 / starts.len().max(1) as f64;
    (most, mean)
}

fn check(scenario: &str, times: &mut [u64], rate: u64) {
    let (most, mean) = windows(times);
    println!(
        "{scenario}: {} grants, busiest window {most}, {mean:.1} per window",
        times.len()
    );
    assert!(
        most as u64 <= rate,
        "{scenario}: {most} grants in one window, rate {rate}"
    );
    assert!(
        mean >= 0.9 * rate as f64,
        "{scenario}: only {mean:.1} grants per window under steady demand, rate {rate}"
    );
}

#[test]
fn one_limiter_across_processes_never_over_grants() {
    let server = RedisServer::start();
    let grants = run_workers(&server, "one");
    let mut all: Vec<u64> = grants.into_values().flatten().collect();
    check("one limiter", &mut all, RATE);
}

#[test]
fn three_stacked_rules_across_processes_hold_the_tightest() {
    let server = RedisServer::start();
    let grants = run_workers(&server, "stacked");
    let mut all: Vec<u64> = grants.into_values().flatten().collect();
    check("three stacked rules", &mut all, RATE);
}

#[test]
fn per_client_gives_each_process_its_own_rate() {
    let server = RedisServer::start();
    let started = Instant::now();
    let grants = run_workers(&server, "per_client");
    for (client, mut times) in grants {
        check(&format!("per_client {client}"), &mut times, RATE);
    }
    assert!(started.elapsed() < RUN * 4);
}
