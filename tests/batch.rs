//! Hot limits served in batches (`Rule::batch`), against a real redis-server: the
//! bound every window of real use times holds across processes, a batch never serving
//! past its lease nor more than it holds, its unused permits given back through its own
//! log member only, and misuse refused.

use redlimit_test_support as support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::RngExt;
use redis::AsyncCommands;
use redlimit::{Algorithm, Client, Error, ManualClock, Rule};
use support::RedisServer;

const T0: u64 = 1_700_000_000_000;
const MINUTE: Duration = Duration::from_secs(60);

fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn evalshas(commands: &[String]) -> usize {
    commands
        .iter()
        .filter(|c| c.as_str() == "EVALSHA" || c.as_str() == "EVAL")
        .count()
}

async fn clocked(server: &RedisServer, clock: &ManualClock) -> Client {
    Client::builder()
        .clock(clock.clone())
        .connect(&server.url())
        .await
        .unwrap()
}

/// The log of `name` (overall mode) as Redisson reads it: (permits, score) per member.
async fn log_of(conn: &mut redis::aio::MultiplexedConnection, name: &str) -> Vec<(u32, u64)> {
    let members: Vec<(Vec<u8>, u64)> = conn
        .zrange_withscores(format!("{{{name}}}:permits"), 0, -1)
        .await
        .unwrap();
    members
        .into_iter()
        .map(|(m, score)| (redlimit::member::decode_permits(&m).unwrap(), score))
        .collect()
}

async fn value_of(conn: &mut redis::aio::MultiplexedConnection, name: &str) -> Option<u64> {
    conn.get(format!("{{{name}}}:value")).await.unwrap()
}

// ---- The bound, across processes ------------------------------------------------

const BOUND_NAME: &str = "rate_limit:batch:bound";
const BOUND_RATE: u64 = 40;
const BOUND_INTERVAL_MS: u64 = 1_000;
const BOUND_K: u64 = 10;
const BOUND_LEASE_MS: u64 = 200;
const PROCESSES: usize = 4;
const TASKS: usize = 2;
const RUN_MS: u64 = 6_000;

fn bound_rule() -> Rule {
    Rule::new(BOUND_NAME, BOUND_RATE, Duration::from_millis(BOUND_INTERVAL_MS))
        .batch(BOUND_K)
        .batch_lease(Duration::from_millis(BOUND_LEASE_MS))
}

/// The most of `times` (sorted) in any window `[s, s + width)`.
fn most_in_a_window(times: &[u64], width: u64) -> (usize, u64) {
    let (mut most, mut at, mut end) = (0, 0, 0);
    for (start, &s) in times.iter().enumerate() {
        while end < times.len() && times[end] < s + width {
            end += 1;
        }
        if end - start > most {
            (most, at) = (end - start, s);
        }
    }
    (most, at)
}

/// Run by `every_window_of_real_use_times_holds_the_bound_across_processes` in
/// processes of its own (this test binary run again): hammers the limiter until
/// `RUN_MS` after the agreed start, writing the time of every grant to a file.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "run by the cross-process test in child processes"]
async fn child_hammers_one_batched_limiter() {
    let url = std::env::var("REDLIMIT_BATCH_URL").expect("run by the cross-process test");
    let out = std::env::var("REDLIMIT_BATCH_OUT").unwrap();
    let start: u64 = std::env::var("REDLIMIT_BATCH_START").unwrap().parse().unwrap();
    let client = Client::connect(&url).await.unwrap();
    tokio::time::sleep(Duration::from_millis(start.saturating_sub(wall_ms()))).await;
    let quiet_until = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (client, quiet_until) = (client.clone(), quiet_until.clone());
            tokio::spawn(async move { hammer(client, start + RUN_MS, quiet_until).await })
        })
        .collect();
    let mut times = Vec::new();
    for task in tasks {
        times.extend(task.await.unwrap());
    }
    let text: Vec<String> = times.iter().map(u64::to_string).collect();
    std::fs::write(out, text.join("\n")).unwrap();
}

/// Calls until `end`; now and then the whole process falls quiet for up to longer
/// than the interval, so that batches are left partly unused (their rest must go back
/// rather than be served later). Answers the time of each grant, checked to be a real
/// instant of its call.
async fn hammer(client: Client, end: u64, quiet_until: Arc<AtomicU64>) -> Vec<u64> {
    let rule = [bound_rule()];
    let mut times = Vec::new();
    while wall_ms() < end {
        let quiet = quiet_until.load(Ordering::Relaxed).saturating_sub(wall_ms());
        if quiet > 0 {
            tokio::time::sleep(Duration::from_millis(quiet)).await;
            continue;
        }
        let before = wall_ms();
        let decision = client.check_rules(&rule).await.unwrap();
        let after = wall_ms();
        if decision.allowed {
            assert!(
                (before..=after).contains(&decision.at_ms),
                "a grant's time {} is an instant of its call [{before}, {after}]",
                decision.at_ms
            );
            times.push(decision.at_ms);
        }
        let (quiet_for, pause) = {
            let mut rng = rand::rng();
            let quiet_for = rng.random_range(BOUND_LEASE_MS..BOUND_INTERVAL_MS + 2 * BOUND_LEASE_MS);
            let falls_quiet = decision.allowed && rng.random_range(0..16) == 0;
            let pause = if decision.allowed {
                0
            } else {
                rng.random_range(1..4)
            };
            (falls_quiet.then_some(quiet_for), pause)
        };
        if let Some(quiet_for) = quiet_for {
            quiet_until.fetch_max(after + quiet_for, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    times
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_window_of_real_use_times_holds_the_bound_across_processes() {
    let server = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("redlimit-batch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let start = wall_ms() + 1_500;
    let children: Vec<_> = (0..PROCESSES)
        .map(|i| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--ignored",
                    "--exact",
                    "child_hammers_one_batched_limiter",
                    "--test-threads=1",
                ])
                .env("REDLIMIT_BATCH_URL", server.url())
                .env("REDLIMIT_BATCH_OUT", dir.join(format!("{i}.txt")))
                .env("REDLIMIT_BATCH_START", start.to_string())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a child process failed");
    }
    let mut times: Vec<u64> = Vec::new();
    for i in 0..PROCESSES {
        let text = std::fs::read_to_string(dir.join(format!("{i}.txt"))).unwrap();
        times.extend(text.lines().map(|l| l.parse::<u64>().unwrap()));
    }
    std::fs::remove_dir_all(&dir).unwrap();
    times.sort_unstable();
    check_bound(&times);
}

/// Every window of `interval - lease` holds at most `rate` uses, every window of
/// `interval` at most `rate + N * k`; and the limiter was kept busy (the first bound
/// was nearly reached).
fn check_bound(times: &[u64]) {
    let (short, at) = most_in_a_window(times, BOUND_INTERVAL_MS - BOUND_LEASE_MS);
    assert!(
        short as u64 <= BOUND_RATE,
        "{short} uses in the window of interval - lease from {at} (rate {BOUND_RATE})"
    );
    assert!(
        short as u64 >= BOUND_RATE * 9 / 10,
        "the limiter was kept busy: some window of interval - lease came near the rate ({short})"
    );
    let (long, at) = most_in_a_window(times, BOUND_INTERVAL_MS);
    let most = BOUND_RATE + PROCESSES as u64 * BOUND_K;
    assert!(
        long as u64 <= most,
        "{long} uses in the window of the interval from {at} (rate + N*k = {most})"
    );
    eprintln!(
        "{} grants; most in a window of {} ms: {short} (bound {BOUND_RATE}); of {} ms: {long} (bound {most})",
        times.len(),
        BOUND_INTERVAL_MS - BOUND_LEASE_MS,
        BOUND_INTERVAL_MS
    );
}

// ---- One client, on a manual clock -----------------------------------------------

/// Loads the acquire and give-back scripts into the server (a first call also loads
/// its script, one more command): a client of its own takes a batch and is dropped.
async fn warm_up_scripts(server: &RedisServer) {
    let client = Client::connect(&server.url()).await.unwrap();
    let rule = [Rule::new("rate_limit:batch:warm", 10, MINUTE).batch(5)];
    assert!(client.check_rules(&rule).await.unwrap().allowed);
    drop(client);
    let mut raw = server.raw().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while value_of(&mut raw, "rate_limit:batch:warm").await != Some(9) {
        assert!(
            std::time::Instant::now() < deadline,
            "the warm-up batch given back"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_batch_serves_at_most_k_and_never_after_its_lease() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let client = clocked(&server, &clock).await;
    let mut raw = server.raw().await;
    let name = "rate_limit:batch:lease";
    let rule = [Rule::new(name, 100, MINUTE)
        .batch(5)
        .batch_lease(Duration::from_secs(2))];
    warm_up_scripts(&server).await;
    // The first call takes the batch: one script call, one member of 5 permits.
    let monitor = support::monitor::Monitor::start(server.port);
    assert!(client.check_rules(&rule).await.unwrap().allowed);
    let commands = monitor.client_commands();
    assert_eq!(evalshas(&commands), 1, "{commands:?}");
    assert_eq!(log_of(&mut raw, name).await, [(5, T0)]);
    // Four more within the lease: served here, no round trip.
    clock.set(T0 + 1_999);
    let monitor = support::monitor::Monitor::start(server.port);
    for _ in 0..4 {
        let granted = client.check_rules(&rule).await.unwrap();
        assert!(granted.allowed);
        assert_eq!(granted.at_ms, T0 + 1_999);
    }
    assert_eq!(
        evalshas(&monitor.client_commands()),
        0,
        "within the lease, from the batch"
    );
    // The sixth: the batch holds no more, so the next one is taken.
    let monitor = support::monitor::Monitor::start(server.port);
    assert!(client.check_rules(&rule).await.unwrap().allowed);
    assert_eq!(
        evalshas(&monitor.client_commands()),
        1,
        "more than k: a new batch"
    );
    assert_eq!(log_of(&mut raw, name).await, [(5, T0), (5, T0 + 1_999)]);
    // Its lease ends at T0 + 1 999 + 2 000 on the client's clock (long before it ends
    // in real time): a call then is Redis's again (the sweeper or the call gives the
    // batch back, and the call takes a new one).
    let monitor = support::monitor::Monitor::start(server.port);
    clock.set(T0 + 3_999);
    assert!(client.check_rules(&rule).await.unwrap().allowed);
    let expected = [(5, T0), (1, T0 + 1_999), (5, T0 + 3_999)];
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut log = log_of(&mut raw, name).await;
        log.sort_unstable_by_key(|&(_, score)| score);
        if log == expected {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "1 of the second batch used: {log:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let commands = monitor.client_commands();
    assert_eq!(evalshas(&commands), 2, "given back, and taken anew: {commands:?}");
}

#[tokio::test]
async fn unused_permits_come_back_through_the_batch_s_own_member_only() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let batching = clocked(&server, &clock).await;
    let other = clocked(&server, &clock).await;
    let mut raw = server.raw().await;
    let name = "rate_limit:batch:give_back";
    let batched = [Rule::new(name, 20, MINUTE)
        .batch(10)
        .batch_lease(Duration::from_secs(3))];
    let plain = [Rule::new(name, 20, MINUTE)];
    assert!(batching.check_rules(&batched).await.unwrap().allowed);
    // Later grants of another client: the newest entries of the log.
    for step in 1..=5 {
        clock.set(T0 + step);
        assert!(other.check_rules(&plain).await.unwrap().allowed);
    }
    assert_eq!(value_of(&mut raw, name).await, Some(5));
    // The lease ends; the sweeper gives back the 9 the batch did not use.
    clock.set(T0 + 3_000);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while value_of(&mut raw, name).await != Some(14) {
        assert!(std::time::Instant::now() < deadline, "9 permits given back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let log = log_of(&mut raw, name).await;
    let expected: Vec<(u32, u64)> = [(1, T0)]
        .into_iter()
        .chain((1..=5).map(|s| (1, T0 + s)))
        .collect();
    assert_eq!(
        log, expected,
        "the batch's member holds what it used; the later grants are whole"
    );
    // Another client takes what came back, and no more.
    for _ in 0..14 {
        assert!(other.check_rules(&plain).await.unwrap().allowed);
    }
    assert!(!other.check_rules(&plain).await.unwrap().allowed);
    // Once the window of the first grants is over, the limiter holds its rate again.
    clock.set(T0 + 60_000 + 6);
    assert_eq!(other.check_rules(&plain).await.unwrap().remaining, 20 - 14 - 1);
}

/// A batch given back while it is alone in its log (the usual per-key limiter): the log
/// keeps its expiry, so an idle limiter's keys still disappear on their own.
#[tokio::test]
async fn a_batch_given_back_alone_in_its_log_keeps_the_log_s_expiry() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let batching = clocked(&server, &clock).await;
    let mut raw = server.raw().await;
    let name = "rate_limit:batch:alone";
    let batched = [Rule::new(name, 10, MINUTE)
        .batch(5)
        .batch_lease(Duration::from_secs(1))];
    assert!(batching.check_rules(&batched).await.unwrap().allowed);
    clock.set(T0 + 1_000);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while value_of(&mut raw, name).await != Some(9) {
        assert!(std::time::Instant::now() < deadline, "4 permits given back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(log_of(&mut raw, name).await, vec![(1, T0)]);
    let pttl: i64 = redis::cmd("PTTL")
        .arg(format!("{{{name}}}:permits"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(pttl > 0, "the log keeps its expiry (PTTL {pttl} ms)");
}

/// A lease also ends in real time: a client whose clock steps back and stalls (here a
/// manual clock set back, then never moved) does not keep serving a batch past its lease.
#[tokio::test]
async fn a_lease_ends_in_real_time_whatever_the_client_s_clock() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let client = clocked(&server, &clock).await;
    let name = "rate_limit:batch:stalled";
    let rule = [Rule::new(name, 100, MINUTE)
        .batch(5)
        .batch_lease(Duration::from_secs(2))];
    warm_up_scripts(&server).await;
    assert!(client.check_rules(&rule).await.unwrap().allowed);
    let monitor = support::monitor::Monitor::start(server.port);
    assert!(client.check_rules(&rule).await.unwrap().allowed);
    assert_eq!(
        evalshas(&monitor.client_commands()),
        0,
        "within the lease, from the batch"
    );
    // The client's clock steps back, then never moves; 2 s pass in real time.
    clock.set(T0 - 500);
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let monitor = support::monitor::Monitor::start(server.port);
    assert!(client.check_rules(&rule).await.unwrap().allowed);
    let commands = monitor.client_commands();
    assert!(
        evalshas(&commands) >= 1,
        "the lease is over in real time: {commands:?}"
    );
}

#[tokio::test]
async fn a_dropped_client_gives_its_batch_back() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let other = clocked(&server, &clock).await;
    let mut raw = server.raw().await;
    let name = "rate_limit:batch:drop";
    let batching = clocked(&server, &clock).await;
    let batched = [Rule::new(name, 10, MINUTE).batch(10)];
    assert!(batching.check_rules(&batched).await.unwrap().allowed);
    assert!(
        !other
            .check_rules(&[Rule::new(name, 10, MINUTE)])
            .await
            .unwrap()
            .allowed
    );
    drop(batching);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while value_of(&mut raw, name).await != Some(9) {
        assert!(
            std::time::Instant::now() < deadline,
            "9 permits given back on drop"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(log_of(&mut raw, name).await, [(1, T0)]);
}

/// A batch given back over a value inflated by hand (above the rate, or past 2^53,
/// which a double rounds) leaves the value as it is, for the next call to rebuild from
/// the log: capped at the rate, it granted the whole rate again beside the batch's used
/// permit (10 of a rate of 10 where 9 are left).
#[tokio::test]
async fn a_batch_given_back_over_an_inflated_value_leaves_it_to_be_rebuilt() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let other = clocked(&server, &clock).await;
    let mut raw = server.raw().await;
    for (case, inflated) in [("above", "1000"), ("past", "9007199254740993")] {
        let name = format!("rate_limit:batch:inflated:{case}");
        let batching = clocked(&server, &clock).await;
        assert!(
            batching
                .check_rules(&[Rule::new(&name, 10, MINUTE).batch(10)])
                .await
                .unwrap()
                .allowed
        );
        let _: () = redis::cmd("SET")
            .arg(format!("{{{name}}}:value"))
            .arg(inflated)
            .query_async(&mut raw)
            .await
            .unwrap();
        drop(batching);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while log_of(&mut raw, &name).await != [(1, T0)] {
            assert!(
                std::time::Instant::now() < deadline,
                "{case}: 9 permits given back"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let value: String = redis::cmd("GET")
            .arg(format!("{{{name}}}:value"))
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(value, inflated, "{case}: left as it was");
        let mut granted = 0;
        for _ in 0..20 {
            granted += u32::from(
                other
                    .check_rules(&[Rule::new(&name, 10, MINUTE)])
                    .await
                    .unwrap()
                    .allowed,
            );
        }
        assert_eq!(granted, 9, "{case}: the rate less the batch's used permit");
    }
}

#[tokio::test]
async fn a_refused_batch_asks_for_what_is_left_then_answers_the_call_s_refusal() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let client = clocked(&server, &clock).await;
    let other = clocked(&server, &clock).await;
    let mut raw = server.raw().await;
    let name = "rate_limit:batch:refused";
    let plain = [Rule::new(name, 10, MINUTE)];
    let batched = [Rule::new(name, 10, MINUTE).batch(5)];
    for _ in 0..7 {
        assert!(other.check_rules(&plain).await.unwrap().allowed);
    }
    // 3 left: refused for 5, then granted 3 (a batch of 3).
    let monitor = support::monitor::Monitor::start(server.port);
    let granted = client.check_rules(&batched).await.unwrap();
    assert!(granted.allowed);
    assert_eq!(evalshas(&monitor.client_commands()), 2);
    assert!(
        log_of(&mut raw, name).await.contains(&(3, T0)),
        "a batch of the 3 left"
    );
    assert!(client.check_rules(&batched).await.unwrap().allowed);
    assert!(client.check_rules(&batched).await.unwrap().allowed);
    // None left: refused for 5, then for the call's 1, with its own wait (the first
    // of the log leaves the window in a minute).
    let refused = client.check_rules(&batched).await.unwrap();
    assert!(!refused.allowed);
    assert_eq!(refused.retry_after, Some(MINUTE));
    let exact = other.check_rules(&plain).await.unwrap();
    assert_eq!(refused, exact, "the refusal Redis gives a plain call");
    // That refusal is the call's own, one permit short: kept, and answered again in
    // process until its wait ends (see tests/local_refusals.rs).
    let monitor = support::monitor::Monitor::start(server.port);
    for _ in 0..10 {
        assert_eq!(client.check_rules(&batched).await.unwrap(), exact);
    }
    assert_eq!(evalshas(&monitor.client_commands()), 0);
}

#[tokio::test]
async fn an_in_process_client_decides_every_call_exactly() {
    let client = Client::memory();
    let rule = [Rule::new("rate_limit:batch:memory", 3, MINUTE).batch(3)];
    let mut granted = 0;
    for _ in 0..10 {
        granted += usize::from(client.check_rules(&rule).await.unwrap().allowed);
    }
    assert_eq!(granted, 3);
}

#[tokio::test]
async fn misuse_of_batch_refuses_and_writes_nothing() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let memory = Client::memory();
    let base = || Rule::new("rate_limit:batch:misuse", 10, Duration::from_secs(1));
    let bad = [
        (base().batch(0), "at least 1"),
        (base().batch(11), "exceeds the rate"),
        (base().batch(u64::MAX), "exceeds the rate"),
        (
            Rule::new("rate_limit:batch:misuse", 1 << 40, Duration::from_secs(1)).batch(1 << 33),
            "4-byte field",
        ),
        (
            base().batch(2).algorithm(Algorithm::TokenBucket),
            "sliding window",
        ),
        (
            base().batch_lease(Duration::from_millis(100)),
            "set batch above 1",
        ),
        (base().batch(2).batch_lease(Duration::ZERO), "more than zero"),
        (
            base().batch(2).batch_lease(Duration::from_secs(1)),
            "shorter than the interval",
        ),
        (
            Rule::new("rate_limit:batch:misuse", 10, Duration::from_millis(1)).batch(2),
            "shorter than the interval",
        ),
    ];
    for (rule, says) in bad {
        for client in [&client, &memory] {
            match client.check_rules(std::slice::from_ref(&rule)).await {
                Err(Error::InvalidConfig { problem, .. }) => {
                    assert!(problem.contains(says), "{rule:?}: {problem}")
                }
                other => panic!("{rule:?}: {other:?}"),
            }
        }
    }
    let keys: Vec<String> = server.raw().await.keys("*").await.unwrap();
    assert!(keys.is_empty(), "nothing written: {keys:?}");
}

#[tokio::test]
async fn a_batch_serves_only_its_own_limiter_and_rule() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let client = clocked(&server, &clock).await;
    let mut raw = server.raw().await;
    let lease = Duration::from_secs(30);
    let a = Rule::new("rate_limit:batch:a", 10, MINUTE)
        .batch(5)
        .batch_lease(lease);
    let b = Rule::new("rate_limit:batch:b", 10, MINUTE)
        .batch(5)
        .batch_lease(lease);
    assert!(
        client
            .check_rules(std::slice::from_ref(&a))
            .await
            .unwrap()
            .allowed
    );
    assert!(
        client
            .check_rules(std::slice::from_ref(&b))
            .await
            .unwrap()
            .allowed
    );
    assert_eq!(
        log_of(&mut raw, "rate_limit:batch:b").await,
        [(5, T0)],
        "b took its own batch"
    );
    // The same limiter under another rule (another batch size): the batch of the
    // first rule is closed and gives back the 4 it did not use; the new rule takes its own.
    let other = Rule::new("rate_limit:batch:a", 10, MINUTE)
        .batch(3)
        .batch_lease(lease);
    assert!(
        client
            .check_rules(std::slice::from_ref(&other))
            .await
            .unwrap()
            .allowed
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut log = log_of(&mut raw, "rate_limit:batch:a").await;
        log.sort_unstable();
        if log == [(1, T0), (3, T0)] && value_of(&mut raw, "rate_limit:batch:a").await == Some(6) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the closed batch gave back 4: {log:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Several rules at once go to Redis every time.
    let monitor = support::monitor::Monitor::start(server.port);
    for _ in 0..3 {
        client.check_rules(&[a.clone(), b.clone()]).await.unwrap();
    }
    assert_eq!(evalshas(&monitor.client_commands()), 3);
    // So do calls for more permits than a batch holds, each taking only its own.
    let big = Rule::new("rate_limit:batch:big", 100, MINUTE).batch(5).permits(6);
    let monitor = support::monitor::Monitor::start(server.port);
    for _ in 0..3 {
        assert!(
            client
                .check_rules(std::slice::from_ref(&big))
                .await
                .unwrap()
                .allowed
        );
    }
    assert_eq!(evalshas(&monitor.client_commands()), 3);
    assert_eq!(log_of(&mut raw, "rate_limit:batch:big").await, [(6, T0); 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_callers_wait_for_one_take_instead_of_each_taking_a_batch() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let client = clocked(&server, &clock).await;
    let mut raw = server.raw().await;
    let name = "rate_limit:batch:single_flight";
    let rule = Rule::new(name, 100, MINUTE).batch(10);
    let barrier = Arc::new(tokio::sync::Barrier::new(20));
    let callers: Vec<_> = (0..20)
        .map(|_| {
            let (client, rule, barrier) = (client.clone(), rule.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                client.check_rules(&[rule]).await.unwrap().allowed
            })
        })
        .collect();
    for caller in callers {
        assert!(caller.await.unwrap());
    }
    assert_eq!(
        log_of(&mut raw, name).await,
        [(10, T0), (10, T0)],
        "20 calls: two batches of 10, one after the other"
    );
}

#[derive(Debug)]
struct Limited(#[allow(dead_code)] redlimit::RateLimited);

impl From<redlimit::RateLimited> for Limited {
    fn from(limited: redlimit::RateLimited) -> Self {
        Limited(limited)
    }
}

#[redlimit::rate_limit(
    key = "batch:attr:{user}",
    rate = 10,
    interval = "60s",
    batch = 5,
    batch_lease = "30s"
)]
async fn batched_by_user(user: &str) -> Result<(), Limited> {
    Ok(())
}

/// The attribute's `batch` through the process's default client (the only test of this
/// binary that sets it): a caller's values each reach their own limiter's batch and
/// keys, never another's.
#[tokio::test]
async fn attack_the_attribute_s_batch_with_callers_values() {
    let server = RedisServer::start();
    redlimit::set_default(Client::connect(&server.url()).await.unwrap()).unwrap();
    let mut raw = server.raw().await;
    let bob = "rate_limit:batch:attr:bob";
    batched_by_user("bob").await.unwrap();
    let bob_log: Vec<u32> = log_of(&mut raw, bob).await.into_iter().map(|(p, _)| p).collect();
    assert_eq!(bob_log, [5], "bob's first call took a batch of 5");
    let hostile = [
        "bob:",
        "bob}",
        "{bob}",
        "bob:permits",
        "redlimit:rules",
        "bob\u{0}",
        "x}:{bob",
    ];
    for value in hostile {
        // Each is its own limiter of 10 a minute.
        let mut granted = 0;
        for _ in 0..20 {
            granted += usize::from(batched_by_user(value).await.is_ok());
        }
        assert_eq!(granted, 10, "{value:?} has a limiter of its own");
    }
    for _ in 0..9 {
        batched_by_user("bob").await.unwrap();
    }
    assert!(batched_by_user("bob").await.is_err(), "bob's 10 per minute hold");
    let bob_log: Vec<u32> = log_of(&mut raw, bob).await.into_iter().map(|(p, _)| p).collect();
    assert_eq!(bob_log, [5, 5], "only bob's calls took from bob's limiter");
    // Every key is one of these limiters' own (its name, or `{name}:` and a suffix),
    // or the library's: the values escaped, none reaching another's.
    let escape = |v: &str| {
        v.replace('%', "%25")
            .replace(':', "%3A")
            .replace('{', "%7B")
            .replace('}', "%7D")
    };
    let names: Vec<String> = std::iter::once("bob")
        .chain(hostile)
        .map(|v| format!("rate_limit:batch:attr:{}", escape(v)))
        .collect();
    let keys: Vec<String> = raw.keys("*").await.unwrap();
    for key in &keys {
        let own = names
            .iter()
            .any(|name| key == name || key.starts_with(&format!("{{{name}}}:")));
        assert!(
            own || key.starts_with("rate_limit:redlimit:"),
            "a caller's value reached the key {key:?}"
        );
    }
    for name in &names {
        assert!(keys.contains(name), "{name} kept its config: {keys:?}");
    }
}

#[tokio::test]
async fn a_per_client_batch_is_given_back_to_its_own_client_s_keys() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let client = clocked(&server, &clock).await;
    let mut raw = server.raw().await;
    let name = "rate_limit:batch:per_client";
    let rule = [Rule::new(name, 10, MINUTE)
        .mode(redlimit::RateType::PerClient)
        .batch(5)];
    assert!(client.check_rules(&rule).await.unwrap().allowed);
    let id = client.client_id().to_owned();
    let (permits, value) = (
        format!("{{{name}}}:permits:{id}"),
        format!("{{{name}}}:value:{id}"),
    );
    let log = |members: Vec<Vec<u8>>| -> Vec<u32> {
        members
            .iter()
            .map(|m| redlimit::member::decode_permits(m).unwrap())
            .collect()
    };
    assert_eq!(log(raw.zrange(&permits, 0, -1).await.unwrap()), [5]);
    drop(client);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while raw.get::<_, Option<u64>>(&value).await.unwrap() != Some(9) {
        assert!(
            std::time::Instant::now() < deadline,
            "4 given back to this client's value"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(log(raw.zrange(&permits, 0, -1).await.unwrap()), [1]);
    let overall: Vec<String> = raw.keys(format!("{{{name}}}:permits")).await.unwrap();
    assert!(overall.is_empty(), "the overall log was never written");
}

#[tokio::test]
async fn a_failed_take_is_the_backend_failing_and_a_batch_serves_only_within_its_lease() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let client = Client::builder()
        .clock(clock.clone())
        .command_timeout(Duration::from_millis(200))
        .connect(&server.url())
        .await
        .unwrap();
    let mut raw = server.raw().await;
    let name = "rate_limit:batch:failing";
    let rule = [Rule::new(name, 100, MINUTE)
        .batch(5)
        .batch_lease(Duration::from_secs(1))];
    assert!(client.check_rules(&rule).await.unwrap().allowed);
    server.pause();
    // The permits Redis counted already are served while the lease runs (1 s on the
    // client's clock; in real time, far longer than these calls on a loaded machine).
    clock.set(T0 + 50);
    for _ in 0..2 {
        assert!(client.check_rules(&rule).await.unwrap().allowed);
    }
    // The lease over, with 2 permits left in the batch: none is served; the next take
    // fails as any call does (on_error decides it).
    clock.set(T0 + 1_050);
    let failed = client.check_rules(&rule).await.unwrap_err();
    assert!(failed.is_backend_failure(), "{failed:?}");
    server.resume();
    // Whether or not the timed-out take ran, it is refunded: the log holds the batch.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while log_of(&mut raw, name).await != [(5, T0)] {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            log_of(&mut raw, name).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    clock.set(T0 + 1_200);
    assert!(client.check_rules(&rule).await.unwrap().allowed);
}

/// Limiter `rate_limit:batch:<prefix>:<i>` of 10 a minute, in batches of 5 leased for 30 s.
fn leased(prefix: &str, i: usize) -> Rule {
    Rule::new(format!("rate_limit:batch:{prefix}:{i}"), 10, MINUTE)
        .batch(5)
        .batch_lease(Duration::from_secs(30))
}

/// A batch taken by `client` of each of the 10 000 limiters [`leased`] `prefix`, from 8
/// tasks; a call that timed out tried again when `timeouts_retried`, and so is one
/// answered `Unreachable` (a connection made again after timeouts that answered
/// nothing within the short timeout either, as on a machine whose cores are busy),
/// after the pause the client keeps before it connects again.
async fn ten_thousand_batches(client: &Client, prefix: &'static str, timeouts_retried: bool) {
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let client = client.clone();
            tokio::spawn(async move {
                for i in (t..10_000).step_by(8) {
                    loop {
                        match client.check_rules(&[leased(prefix, i)]).await {
                            Ok(decision) => {
                                assert!(decision.allowed);
                                break;
                            }
                            Err(Error::Timeout { .. }) if timeouts_retried => {}
                            Err(Error::Unreachable { .. }) if timeouts_retried => {
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                            Err(err) => panic!("{err:?}"),
                        }
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// A caller choosing a new limiter name for every call (a value in the key) cannot grow
/// a client's batches past 10 000 limiters: with that many batches open, a call on
/// another limiter goes to Redis unbatched, and is still decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn attack_at_most_10_000_limiters_keep_batches_per_client() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let client = clocked(&server, &clock).await;
    let mut raw = server.raw().await;
    let rule = |i: usize| leased("many", i);
    ten_thousand_batches(&client, "many", false).await;
    assert_eq!(log_of(&mut raw, "rate_limit:batch:many:9999").await, [(5, T0)]);
    for i in 10_000..10_010 {
        assert!(client.check_rules(&[rule(i)]).await.unwrap().allowed);
        let name = format!("rate_limit:batch:many:{i}");
        assert_eq!(log_of(&mut raw, &name).await, [(1, T0)], "unbatched past 10 000");
    }
    // Once leases end, their slots make room again. The 10 000 batches given back
    // then go to Redis on the client's connection, and a call queued behind them may
    // wait past its command timeout (RELIABILITY.md says so): such a call is a
    // timeout, never a grant, and the next call once they are back is decided.
    clock.set(T0 + 30_000);
    let mut decided = None;
    for _ in 0..100 {
        match client.check_rules(&[rule(20_000)]).await {
            Err(redlimit::Error::Timeout { .. }) => tokio::time::sleep(Duration::from_millis(100)).await,
            other => {
                decided = Some(other.unwrap());
                break;
            }
        }
    }
    assert!(decided.expect("decided within 10 s").allowed);
    // A batch taken at the new time (a call that timed out may have taken one too:
    // counted, never granted).
    let log = log_of(&mut raw, "rate_limit:batch:many:20000").await;
    assert!(
        !log.is_empty() && log.iter().all(|&entry| entry == (5, T0 + 30_000)),
        "{log:?}"
    );
}

/// 10 000 batches given back at once (their leases over), on a client whose command
/// timeout is short: the calls queued behind them time out, but the give-backs'
/// replies are replies, so the client never takes the busy connection for one that
/// answers nothing (pausing the calls with `Unreachable` and making it again, which
/// drops the give-backs still on it). With the give-backs' replies not heard, the
/// calls were paused within the first second in each of three runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_given_back_at_once_are_not_taken_for_silence() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let client = Client::builder()
        .clock(clock.clone())
        .command_timeout(Duration::from_millis(20))
        .connect(&server.url())
        .await
        .unwrap();
    let rule = |i: usize| leased("flood", i);
    // (a call the short timeout cuts off may have taken its batch)
    ten_thousand_batches(&client, "flood", true).await;
    let mut raw = server.raw().await;
    let connections = |info: String| -> u64 {
        info.lines()
            .find_map(|line| line.strip_prefix("total_connections_received:"))
            .and_then(|count| count.trim().parse().ok())
            .unwrap()
    };
    let before = connections(
        redis::cmd("INFO")
            .arg("stats")
            .query_async(&mut raw)
            .await
            .unwrap(),
    );
    clock.set(T0 + 30_000);
    let started = std::time::Instant::now();
    let (mut timeouts, mut decided) = (0, 0);
    while started.elapsed() < Duration::from_secs(2) {
        match client.check_rules(&[rule(20_000)]).await {
            Ok(_) => decided += 1,
            Err(Error::Timeout { .. }) => timeouts += 1,
            Err(err) => panic!("after {timeouts} timeouts: {err:?}"),
        }
    }
    let after = connections(
        redis::cmd("INFO")
            .arg("stats")
            .query_async(&mut raw)
            .await
            .unwrap(),
    );
    println!(
        "{timeouts} calls timed out, {decided} decided in 2 s; {} connections made",
        after - before
    );
    assert!(decided > 0, "none decided in 2 s");
    assert_eq!(after, before, "the client connected again");
    // Each batch's unused permits given back meanwhile.
    for i in [0, 4_999, 9_999] {
        let log = log_of(&mut raw, &format!("rate_limit:batch:flood:{i}")).await;
        assert!(log.iter().all(|&(permits, _)| permits < 5), "{i}: {log:?}");
    }
}

/// Callers naming a new batched limiter at every call (a value an end caller sends,
/// in the key), its lease 50 ms: batches end faster than they can be given back on
/// the client's connection. The give-backs waiting for a turn stay at most 10 000 (the
/// others are let go, their permits counted until they leave the window): the
/// runtime's tasks peaked at 10 242 and 10 258 with 256 such callers for 4 s; with no
/// bound, 20 791 (and more the longer they went on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn give_backs_waiting_are_bounded() {
    let server = RedisServer::start();
    let client = Client::builder().connect(&server.url()).await.unwrap();
    let next = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let value = "x".repeat(1_000);
    let callers: Vec<_> = (0..256)
        .map(|_| {
            let (client, next, stop, value) = (
                client.clone(),
                Arc::clone(&next),
                Arc::clone(&stop),
                value.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let rule = Rule::new(format!("rate_limit:batch:churn:{i}:{value}"), 10, MINUTE)
                        .batch(5)
                        .batch_lease(Duration::from_millis(50));
                    let _ = client.check_rules(&[rule]).await;
                }
            })
        })
        .collect();
    let tasks = || tokio::runtime::Handle::current().metrics().num_alive_tasks();
    let started = std::time::Instant::now();
    let mut peak = 0;
    while started.elapsed() < Duration::from_secs(4) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        peak = peak.max(tasks());
    }
    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        caller.await.unwrap();
    }
    println!(
        "{} calls; the runtime's tasks peaked at {peak}",
        next.load(Ordering::Relaxed)
    );
    // (the 256 callers, the client's own tasks, 10 000 give-backs)
    assert!(peak <= 10_400, "{peak} tasks");
}

/// A caller on a current-thread runtime of its own, driven only while it calls (a
/// synchronous caller's `block_on`), whose call lets 10 000 ended batches go: their
/// give-backs go on the client's own runtime, so they do not wait for that runtime to
/// be driven again: every sampled batch was given back within 0.7 s. On the caller's,
/// the first 16 took every turn there and were never polled again: 100 of 100 sampled
/// batches were still whole 5 s later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn give_backs_go_while_a_caller_s_runtime_is_not_driven() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let client = clocked(&server, &clock).await;
    ten_thousand_batches(&client, "undriven", false).await;
    clock.set(T0 + 30_000);
    let (idle, idled) = std::sync::mpsc::channel::<()>();
    let caller = {
        let client = client.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let decided = runtime.block_on(client.check_rules(&[leased("undriven", 20_000)]));
            assert!(decided.unwrap().allowed);
            // (kept, not driven, until the test is done)
            idled.recv().unwrap();
        })
    };
    let mut raw = server.raw().await;
    let started = std::time::Instant::now();
    let mut left = usize::MAX;
    while left > 0 && started.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = 0;
        for i in (0..10_000).step_by(100) {
            let log = log_of(&mut raw, &format!("rate_limit:batch:undriven:{i}")).await;
            left += usize::from(log.iter().any(|&(permits, _)| permits == 5));
        }
    }
    idle.send(()).unwrap();
    caller.join().unwrap();
    println!(
        "given back in {:?}: {left} of 100 sampled batches left",
        started.elapsed()
    );
    assert_eq!(left, 0, "batches not given back in 5 s");
}

/// `LayerRule::batch` through an axum server on loopback: ten requests of one key cost
/// two takes, the key's limit holds, and header values posing as other keys are only
/// themselves.
#[cfg(feature = "axum")]
#[tokio::test]
async fn attack_a_layer_s_batch_through_http_with_header_values() {
    use redlimit::tower::{Key, LayerRule, RateLimitLayer};
    let server = RedisServer::start();
    warm_up_scripts(&server).await;
    let layer = RateLimitLayer::builder()
        .client(Client::connect(&server.url()).await.unwrap())
        .rule(
            LayerRule::new("hot", 10, MINUTE)
                .batch(5)
                // Longer than the test on a loaded machine: no lease ends in it.
                .batch_lease(Duration::from_secs(30))
                .key(Key::header("x-api-key")),
        )
        .build()
        .unwrap();
    let addr = support::http::serve_route("/", |app| app.layer(layer)).await;
    let status = |key: &'static str| async move {
        support::http::send(addr, "GET", "/", &[("x-api-key", key)])
            .await
            .status
    };
    let monitor = support::monitor::Monitor::start(server.port);
    for _ in 0..10 {
        assert_eq!(status("k1").await, 200);
    }
    let commands = monitor.client_commands();
    assert_eq!(evalshas(&commands), 2, "two takes of 5: {commands:?}");
    assert_eq!(status("k1").await, 429);
    for hostile in ["k1:x", "{k1}", "k1}", "k1:permits"] {
        for _ in 0..10 {
            assert_eq!(status(hostile).await, 200, "{hostile}: a limiter of its own");
        }
        assert_eq!(status(hostile).await, 429, "{hostile}");
    }
    assert_eq!(status("k1").await, 429, "k1 is still at its limit");
}

/// A lease that ends with most of its batch unused: the next call gives it back before
/// it takes again, so Redis never counts the unused permits against it. A batch of all
/// 10 of a limiter's permits, 1 used, its lease over: the next call is granted (the 9
/// came back) and the calls after it are granted until the 10 are spent, never refused
/// for the rest of the window. Then, in real time, a lease the sweeper ends: the call
/// that comes meanwhile waits for its give-back and is granted too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_batch_is_back_in_redis_before_the_next_take() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let client = clocked(&server, &clock).await;
    let mut raw = server.raw().await;
    warm_up_scripts(&server).await;
    let name = "rate_limit:batch:back-first";
    let rule = [Rule::new(name, 10, MINUTE)
        .batch(10)
        .batch_lease(Duration::from_millis(100))];
    assert!(client.check_rules(&rule).await.unwrap().allowed);
    clock.set(T0 + 200);
    for i in 1..10 {
        let decision = client.check_rules(&rule).await.unwrap();
        assert!(decision.allowed, "call {i} after the lease: {decision:?}");
    }
    assert!(!client.check_rules(&rule).await.unwrap().allowed, "the 11th");
    let spent: u32 = log_of(&mut raw, name)
        .await
        .iter()
        .map(|(permits, _)| permits)
        .sum();
    assert_eq!(spent, 10);

    // On the sweeper's watch: a 100 ms lease in real time, the clock standing still.
    let name = "rate_limit:batch:back-first-swept";
    let rule = [Rule::new(name, 10, MINUTE)
        .batch(10)
        .batch_lease(Duration::from_millis(100))];
    assert!(client.check_rules(&rule).await.unwrap().allowed);
    for pause in [90, 15, 5, 30, 200] {
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let decision = client.check_rules(&rule).await.unwrap();
        assert!(decision.allowed, "after {pause} ms more: {decision:?}");
    }
}

/// While Redis hangs, callers of one batched limiter queue for its take, but none waits
/// longer than about one command timeout behind the others: 8 at once under a command
/// timeout of 200 ms each answer a backend failure within 700 ms (queued one take after
/// another, the last waited about 1.6 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_queued_behind_a_hung_take_wait_about_one_command_timeout() {
    let server = RedisServer::start();
    let client = Client::builder()
        .command_timeout(Duration::from_millis(200))
        .connect(&server.url())
        .await
        .unwrap();
    warm_up_scripts(&server).await;
    let rule = [Rule::new("rate_limit:batch:hung", 100, MINUTE).batch(10)];
    server.pause();
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let (client, rule) = (client.clone(), rule.clone());
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                let decided = client.check_rules(&rule).await;
                (decided.map(|d| d.allowed), started.elapsed())
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    for caller in callers {
        let (decided, took) = caller.await.unwrap();
        let failed = decided.expect_err("no answer from a hung Redis");
        assert!(failed.is_backend_failure(), "{failed:?}");
        slowest = slowest.max(took);
    }
    server.resume();
    assert!(
        slowest < Duration::from_millis(700),
        "the slowest caller took {slowest:?}"
    );
}

/// A call whose caller gives up while its script is on its way (its own timeout, shorter
/// than the client's) has what Redis granted refunded: with Redis paused, a batch of 10
/// and a plain call of 1 on new limiters, each dropped after 100 ms; once Redis runs
/// them, each limiter is made and whole again (its value at the rate, its log empty).
#[tokio::test]
async fn a_take_whose_caller_gives_up_is_refunded() {
    let server = RedisServer::start();
    let client = Client::builder()
        .command_timeout(Duration::from_secs(3))
        .connect(&server.url())
        .await
        .unwrap();
    let mut raw = server.raw().await;
    warm_up_scripts(&server).await;
    let names = ["rate_limit:batch:given-up", "rate_limit:batch:given-up-plain"];
    let rules = [
        Rule::new(names[0], 100, MINUTE).batch(10),
        Rule::new(names[1], 100, MINUTE),
    ];
    server.pause();
    for rule in &rules {
        let call = client.check_rules(std::slice::from_ref(rule));
        assert!(tokio::time::timeout(Duration::from_millis(100), call)
            .await
            .is_err());
    }
    server.resume();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    for name in names {
        loop {
            let (value, log) = (value_of(&mut raw, name).await, log_of(&mut raw, name).await);
            if value == Some(100) && log.is_empty() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{name}: value {value:?}, log {log:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// One batch serves calls of one limiter whatever each call's permits (a layer's cost
/// per request): 1, 2 and 1 permits of a batch of 5 cost Redis one script call, and the
/// next call of 2, more than the batch holds, takes the next batch.
#[tokio::test]
async fn a_batch_serves_calls_of_any_permits_on_its_limiter() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let client = clocked(&server, &clock).await;
    warm_up_scripts(&server).await;
    let name = "rate_limit:batch:costs";
    let rule = |permits| {
        [Rule::new(name, 100, MINUTE)
            .batch(5)
            .batch_lease(Duration::from_secs(30))
            .permits(permits)]
    };
    let monitor = support::monitor::Monitor::start(server.port);
    for permits in [1, 2, 1] {
        assert!(client.check_rules(&rule(permits)).await.unwrap().allowed);
    }
    let commands = monitor.client_commands();
    assert_eq!(evalshas(&commands), 1, "one batch for all three: {commands:?}");
    let monitor = support::monitor::Monitor::start(server.port);
    assert!(client.check_rules(&rule(2)).await.unwrap().allowed);
    let commands = monitor.client_commands();
    assert_eq!(
        evalshas(&commands),
        2,
        "the batch given back, the next taken: {commands:?}"
    );
}
