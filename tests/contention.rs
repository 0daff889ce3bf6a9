//! Contention across processes: several OS processes, each with many tasks, hammer the
//! same limiters on one redis-server and report every grant with its decision time.
//! No sliding window of `interval` may hold more than `rate` grants, and under steady
//! demand the limiter must grant close to `rate` per window.
//!
//! The worker processes are this test binary run again on the ignored `worker` test.

use redlimit_test_support as support;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redlimit::{rate_limit, Algorithm, Client, RateLimited, RateType, Rule};
use support::RedisServer;

const RATE: u64 = 40;
const INTERVAL_MS: u64 = 400;
const RUN: Duration = Duration::from_millis(2500);
const PROCESSES: usize = 4;
const TASKS: usize = 12;
/// The token-bucket scenario's capacity, and the pause its workers make (from this
/// long after they are started).
const BURST: u64 = 20;
const PAUSE_AT: Duration = Duration::from_millis(900);
const PAUSE: Duration = Duration::from_millis(700);
/// The warming bucket's warm-up: it starts cold, and is cold again after the pause.
const WARMUP: Duration = Duration::from_millis(600);

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
        "token_bucket" => vec![Rule::new("contention:bucket", RATE, interval)
            .algorithm(Algorithm::TokenBucket)
            .burst(BURST)],
        "token_bucket_warming" => vec![Rule::new("contention:warming", RATE, interval)
            .algorithm(Algorithm::TokenBucket)
            .burst(BURST)
            .warmup(WARMUP)],
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
    if scenario == "restart" {
        return restart_worker(&url).await;
    }
    let client = Client::connect(&url).await.unwrap();
    let started = tokio::time::Instant::now();
    let deadline = started + RUN;
    // The token bucket's workers all pause at one wall-clock time, so the bucket fills
    // up again mid-run.
    let pause_at: u64 = std::env::var("CONTENTION_PAUSE_AT").unwrap().parse().unwrap();
    let from = started + Duration::from_millis(pause_at.saturating_sub(now_ms()));
    let pause = scenario.starts_with("token_bucket").then(|| (from, from + PAUSE));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let client = client.clone();
            let rules = rules(&scenario);
            tokio::spawn(async move {
                let mut grants = Vec::new();
                loop {
                    if let Some((from, to)) = pause {
                        let now = tokio::time::Instant::now();
                        if now >= from && now < to {
                            tokio::time::sleep_until(to).await;
                        }
                    }
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
    // A line of its own: the test harness has printed "test worker ... " unterminated.
    let mut out = String::from("\n");
    for task in tasks {
        for at in task.await.unwrap() {
            out.push_str(&format!("GRANT {} {at}\n", client.client_id()));
        }
    }
    print!("{out}");
}

const COMMAND_TIMEOUT: Duration = Duration::from_millis(200);

#[rate_limit(key = "contention:restart", rate = 40, interval = "400ms", on_error = "local")]
async fn guarded() -> Result<(), RateLimited> {
    Ok(())
}

/// A worker of the restart scenario: tasks call a decorated function while the test
/// kills and restarts Redis, and the worker reports its slowest call.
async fn restart_worker(url: &str) {
    let client = Client::builder()
        .command_timeout(COMMAND_TIMEOUT)
        .connect(url)
        .await
        .unwrap();
    redlimit::set_default(client).unwrap();
    let deadline = tokio::time::Instant::now() + RUN;
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            tokio::spawn(async move {
                let (mut calls, mut slowest) = (0u64, Duration::ZERO);
                while tokio::time::Instant::now() < deadline {
                    let started = Instant::now();
                    let outcome = guarded().await;
                    slowest = slowest.max(started.elapsed());
                    calls += 1;
                    if let Err(refused) = outcome {
                        let wait = refused.retry_after().unwrap_or(Duration::from_millis(5));
                        tokio::time::sleep(wait.min(Duration::from_millis(50))).await;
                    }
                }
                (calls, slowest)
            })
        })
        .collect();
    let (mut calls, mut slowest) = (0, Duration::ZERO);
    for task in tasks {
        let (c, s) = task.await.unwrap();
        calls += c;
        slowest = slowest.max(s);
    }
    println!("\nCALLS {calls} SLOWEST_MS {}", slowest.as_millis());
}

/// Runs the workers at once and answers the grant times, per client id. One scenario
/// at a time: three at once would share two cores among 144 tasks and measure the
/// machine, not the limiter.
fn run_workers(server: &RedisServer, scenario: &str) -> BTreeMap<String, Vec<u64>> {
    static_turn(|| spawn_and_collect(server, scenario))
}

/// Runs `f` while no other scenario runs.
fn static_turn<T>(f: impl FnOnce() -> T) -> T {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    f()
}

/// Starts `PROCESSES` workers of `scenario`: this test binary, run on `worker`.
fn spawn_workers(server: &RedisServer, scenario: &str) -> Vec<Child> {
    let exe = std::env::current_exe().unwrap();
    // One pause for all workers, on the wall clock, so that nobody asks during it.
    let pause_at = now_ms() + PAUSE_AT.as_millis() as u64;
    (0..PROCESSES)
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
                .env("CONTENTION_PAUSE_AT", pause_at.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap()
        })
        .collect()
}

fn spawn_and_collect(server: &RedisServer, scenario: &str) -> BTreeMap<String, Vec<u64>> {
    let children = spawn_workers(server, scenario);
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

/// The most grants in any window [t, t + interval), and the fewest and the mean number
/// of grants in the windows starting every 10 ms from the first grant to one interval
/// before the last (the steady state).
fn windows(times: &mut [u64]) -> (usize, usize, f64) {
    times.sort_unstable();
    let most = busiest(times, INTERVAL_MS);
    let (first, last) = (times[0], times[times.len() - 1]);
    let starts: Vec<u64> = (first..=last.saturating_sub(INTERVAL_MS)).step_by(10).collect();
    let in_window = |t: u64| times.iter().filter(|&&g| g >= t && g < t + INTERVAL_MS).count();
    let counts: Vec<usize> = starts.iter().map(|&t| in_window(t)).collect();
    let mean = counts.iter().sum::<usize>() as f64 / counts.len().max(1) as f64;
    let fewest = counts.iter().copied().min().unwrap_or(0);
    (most, fewest, mean)
}

fn check(scenario: &str, times: &mut [u64], rate: u64) {
    let (most, fewest, mean) = windows(times);
    println!(
        "{scenario}: {} grants, busiest window {most}, quietest {fewest}, {mean:.1} per window",
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

/// The most grants in any window of `length` ms (`times` sorted).
fn busiest(times: &[u64], length: u64) -> usize {
    let mut most = 0;
    let mut start = 0;
    for end in 0..times.len() {
        while times[end] - times[start] >= length {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

/// Runs a token-bucket scenario's workers and checks that in any window of T ms they
/// got at most the burst plus what T refills; answers every grant's time, in order.
fn bucket_grants_within_bound(server: &RedisServer, scenario: &str) -> Vec<u64> {
    let grants = run_workers(server, scenario);
    let mut all: Vec<u64> = grants.into_values().flatten().collect();
    all.sort_unstable();
    for length in [1, 50, 100, 200, 400, 1000, 2500] {
        let most = busiest(&all, length) as u64;
        let bound = BURST + RATE * length / INTERVAL_MS;
        println!("{scenario}: busiest {length} ms window {most}, bound {bound}");
        assert!(
            most <= bound,
            "{scenario}: {most} grants in {length} ms, bound {bound}"
        );
    }
    all
}

#[test]
fn one_token_bucket_across_processes_never_over_grants() {
    let server = RedisServer::start();
    let all = bucket_grants_within_bound(&server, "token_bucket");
    // Under demand it grants the rate: most of what the time outside the pause refills.
    let active = (RUN - PAUSE).as_millis() as u64;
    let expected = RATE * active / INTERVAL_MS;
    println!(
        "token bucket: {} grants, {expected} refilled outside the pause",
        all.len()
    );
    assert!(
        all.len() as u64 >= expected * 8 / 10,
        "only {} grants, {expected} refilled while workers asked",
        all.len()
    );
}

#[test]
fn a_warming_token_bucket_across_processes_never_over_grants_and_starts_slow() {
    let server = RedisServer::start();
    let all = bucket_grants_within_bound(&server, "token_bucket_warming");
    // Cold at first: a permit costs up to 3 tokens, so the first 200 ms grant well
    // below the burst and the refill (20 + 20 without a warm-up).
    let first = all.iter().take_while(|&&at| at < all[0] + 200).count();
    println!("warming bucket: {first} grants in the first 200 ms, 40 without a warm-up");
    assert!(first <= 30, "{first} grants in the first 200 ms of a cold bucket");
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

#[test]
fn processes_ride_out_a_redis_restart_and_leave_consistent_state() {
    static_turn(|| {
        let server = RedisServer::start();
        let children = spawn_workers(&server, "restart");
        std::thread::sleep(Duration::from_millis(700));
        let port = server.stop();
        std::thread::sleep(Duration::from_millis(500));
        let server = RedisServer::start_on(port);
        let restarted = now_ms();
        for child in children {
            let output = child.wait_with_output().unwrap();
            assert!(output.status.success(), "a worker failed (panicked or errored)");
            let out = String::from_utf8(output.stdout).unwrap();
            let line = out
                .lines()
                .find(|l| l.starts_with("CALLS "))
                .unwrap_or_else(|| panic!("no report in {out:?}"));
            let words: Vec<&str> = line.split(' ').collect();
            let (calls, slowest): (u64, u64) = (words[1].parse().unwrap(), words[3].parse().unwrap());
            assert!(calls > 100, "the worker kept calling: {calls}");
            let bound = COMMAND_TIMEOUT.as_millis() as u64 + 250;
            assert!(
                slowest <= bound,
                "a call took {slowest} ms, more than the command timeout plus a margin"
            );
        }
        // Redis decided again after the restart, and its state is consistent.
        let client = redis::Client::open(server.url()).unwrap();
        let mut conn = client.get_connection().unwrap();
        let (value, log): (i64, Vec<(Vec<u8>, f64)>) = redis::pipe()
            .atomic()
            .get("{rate_limit:contention:restart}:value")
            .zrange_withscores("{rate_limit:contention:restart}:permits", 0, -1)
            .query(&mut conn)
            .unwrap();
        assert!(
            log.iter().any(|(_, score)| *score as u64 >= restarted),
            "no grant by Redis after the restart"
        );
        let in_log: i64 = log
            .iter()
            .map(|(m, _)| i64::from(redlimit::member::decode_permits(m).unwrap()))
            .sum();
        assert_eq!(
            value + in_log,
            40,
            "available {value} + permits in the log {in_log} = rate"
        );
    });
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}
