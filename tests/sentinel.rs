//! redlimit behind Redis Sentinel (one master, one replica, three sentinels, passwords
//! on the master and on the sentinels): connecting by `redis+sentinel://`, following a
//! failover without a restart, what a failover loses, and the errors that name what is
//! wrong without showing a password.

use redlimit_test_support as support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redlimit::{rate_limit, Client, Error, RateType};
use support::sentinel::{RedisSentinel, MASTER_PASSWORD, SENTINEL_PASSWORD};

/// A rule the attribute decides through the default client, which `REDIS_URL` (the
/// sentinel URL) makes.
#[rate_limit(key = "sentinel:{user}", rate = 100000, interval = "60s", on_error = "deny")]
async fn guarded(user: &str) -> Result<(), redlimit::RateLimited> {
    Ok(())
}

fn assert_hidden(text: &str) {
    assert!(
        !text.contains(MASTER_PASSWORD) && !text.contains(SENTINEL_PASSWORD),
        "a password shown: {text}"
    );
}

/// A limiter on `set` no test here exhausts, on a client with a 200 ms command
/// timeout, granted once so that its script is loaded.
async fn hot_limiter(set: &RedisSentinel, name: &str) -> redlimit::RateLimiter {
    let client = Client::builder()
        .command_timeout(Duration::from_millis(200))
        .connect(&set.url())
        .await
        .unwrap();
    let limiter = hot(&client, name).await;
    assert!(limiter.try_acquire(1).await.unwrap());
    limiter
}

/// The limiter `name` of `client`, set to a rate no test here exhausts (a million per
/// ten minutes).
async fn hot(client: &Client, name: &str) -> redlimit::RateLimiter {
    let limiter = client.rate_limiter(name);
    limiter
        .try_set_rate(RateType::Overall, 1_000_000, Duration::from_secs(600))
        .await
        .unwrap();
    limiter
}

/// One result of a load task: when it came back, and whether Redis granted it
/// (`Some(true)`), refused it (`Some(false)`) or failed (`None`).
type Outcome = (Instant, Option<bool>);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_fails_over_and_calls_follow_by_themselves() {
    let mut set = RedisSentinel::start();
    let timeout = Duration::from_millis(200);
    let client = Client::builder()
        .command_timeout(timeout)
        .connect(&set.url())
        .await
        .unwrap();
    std::env::set_var("REDIS_URL", set.url());
    guarded("alice").await.expect("decided by the master");

    // Nothing expires or refuses within the test: every grant is one log entry.
    let rate = 1_000_000;
    let limiter = client.rate_limiter("rate_limit:sentinel:hot");
    limiter
        .try_set_rate(RateType::Overall, rate, Duration::from_secs(600))
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let outcomes: Arc<Mutex<Vec<Outcome>>> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (limiter, stop, outcomes) = (limiter.clone(), stop.clone(), outcomes.clone());
        tasks.push(tokio::spawn(async move {
            let mut slowest = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let result = limiter.try_acquire(1).await;
                slowest = slowest.max(started.elapsed());
                let failed = result.is_err();
                outcomes.lock().unwrap().push((Instant::now(), result.ok()));
                if failed {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            slowest
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (old_master, replica) = set.data_ports();
    assert_eq!(set.master_port(), old_master);
    set.kill(old_master);
    let killed = Instant::now();
    let killed_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();

    // Without a master the attribute's calls follow on_error ("deny") and come back
    // promptly; once the replica is promoted Redis decides them again.
    let mut refused_meanwhile = 0;
    let recovered = loop {
        let started = Instant::now();
        let decided = guarded("alice").await;
        assert!(
            started.elapsed() < timeout * 3,
            "a call took {:?}",
            started.elapsed()
        );
        match decided {
            Ok(()) if set.master_port() == replica => break killed.elapsed(),
            Ok(()) => {}
            Err(refusal) => {
                assert_hidden(&format!("{refusal} {refusal:?}"));
                refused_meanwhile += 1;
            }
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "no failover within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut slowest = Duration::ZERO;
    for task in tasks {
        slowest = slowest.max(task.await.unwrap());
    }
    let outcomes = std::mem::take(&mut *outcomes.lock().unwrap());
    let before = |o: &&Outcome| o.0 < killed;
    let acknowledged = outcomes
        .iter()
        .filter(before)
        .filter(|o| o.1 == Some(true))
        .count() as u64;
    let failed = outcomes.iter().filter(|o| o.1.is_none()).count();
    let after = outcomes
        .iter()
        .filter(|o| !before(o) && o.1 == Some(true))
        .count() as u64;
    let last_second = outcomes
        .iter()
        .filter(|o| o.0 < killed && killed - o.0 < Duration::from_secs(1) && o.1 == Some(true))
        .count() as u64;
    assert!(after > 0, "the promoted replica granted nothing");
    assert!(refused_meanwhile > 0, "no call met the gap without a master");

    // What the promoted replica holds: every grant is one log entry scored by its
    // time, so those before the kill are what it kept of the old master's.
    let held = rate - limiter.available_permits().await.unwrap();
    let kept: u64 = set
        .node_cli(
            replica,
            &[
                "zcount",
                "{rate_limit:sentinel:hot}:permits",
                "-inf",
                &format!("({killed_ms}"),
            ],
        )
        .trim()
        .parse()
        .unwrap();
    // A call whose answer the kill cut off (at most one per task) may have been kept
    // too: it counts against the loss, so the loss is at least this.
    let lost = acknowledged.saturating_sub(kept);
    println!(
        "failover: decided again {recovered:?} after the kill; {acknowledged} grants acknowledged \
         by the old master, {kept} of its grants kept by the new one ({lost} lost), {after} granted \
         by the new one, {failed} calls failed meanwhile; slowest call {slowest:?}"
    );
    assert!(
        held <= acknowledged + after + failed as u64,
        "the new master holds {held}, more than the calls that may have run"
    );
    // Asynchronous replication: what is lost was acknowledged within the replica's lag,
    // on loopback well inside the last second before the kill.
    assert!(
        lost <= last_second,
        "{lost} lost, more than the last second's {last_second}"
    );
    assert!(slowest < timeout * 3, "a call took {slowest:?}");
}

#[tokio::test]
async fn connections_to_the_master_are_named_and_passwords_stay_hidden() {
    let set = RedisSentinel::start();
    let client = Client::connect(&set.url()).await.unwrap();
    let limiter = client.rate_limiter("rate_limit:sentinel:named");
    limiter
        .try_set_rate(RateType::Overall, 2, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(limiter.try_acquire(1).await.unwrap());
    assert!(limiter.try_acquire(1).await.unwrap());
    assert!(!limiter.try_acquire(1).await.unwrap(), "the third of a rate of 2");
    assert_hidden(&format!("{client:?}"));
    let (master, _) = set.data_ports();
    let clients = set.node_cli(master, &["client", "list"]);
    assert!(clients.contains("name=redlimit"), "{clients}");
    // The grants are on the master the sentinels name.
    let logged = set.node_cli(master, &["zcard", "{rate_limit:sentinel:named}:permits"]);
    assert_eq!(logged.trim(), "2");
}

#[tokio::test]
async fn wrong_passwords_and_an_unknown_master_are_named() {
    let set = RedisSentinel::start();
    let hosts: Vec<String> = set
        .sentinel_ports()
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let hosts = hosts.join(",");
    let connect = |url: String| async move {
        Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .connect(&url)
            .await
            .unwrap_err()
    };

    let err = connect(format!(
        "redis+sentinel://:{MASTER_PASSWORD}@{hosts}/mymaster?sentinel_password=not-{SENTINEL_PASSWORD}"
    ))
    .await;
    assert_hidden(&format!("{err} {err:?}"));
    assert!(
        matches!(err, Error::AuthFailed { .. }),
        "a wrong sentinel password: {err:?}"
    );

    let err = connect(format!(
        "redis+sentinel://:not-{MASTER_PASSWORD}@{hosts}/mymaster?sentinel_password={SENTINEL_PASSWORD}"
    ))
    .await;
    assert_hidden(&format!("{err} {err:?}"));
    assert!(
        matches!(err, Error::AuthFailed { .. }),
        "a wrong master password: {err:?}"
    );

    let err = connect(format!(
        "redis+sentinel://:{MASTER_PASSWORD}@{hosts}/othermaster?sentinel_password={SENTINEL_PASSWORD}"
    ))
    .await;
    assert_hidden(&format!("{err} {err:?}"));
    assert!(matches!(err, Error::Unreachable { .. }), "{err:?}");
    assert!(
        err.to_string().contains("othermaster") && err.to_string().contains("no sentinel named"),
        "{err}"
    );

    let err = connect(format!(
        "redis+sentinel://:{MASTER_PASSWORD}@{hosts}/mymaster?sentinel_pass=x"
    ))
    .await;
    assert_hidden(&format!("{err} {err:?}"));
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
}

/// Polls until the sentinels name `port` as the master.
async fn wait_for_master(set: &RedisSentinel, port: u16) -> Duration {
    let started = Instant::now();
    while set.master_port() != port {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no failover within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

#[tokio::test]
async fn waiting_for_a_replica_refuses_the_grants_a_failover_would_lose() {
    let mut set = RedisSentinel::start();
    let connect = |replicas: bool| {
        let builder = Client::builder().command_timeout(Duration::from_millis(500));
        let builder = if replicas {
            builder.wait_for_replicas(1, Duration::from_millis(100))
        } else {
            builder
        };
        let url = set.url();
        async move { builder.connect(&url).await.unwrap() }
    };
    let (plain, waiting) = (connect(false).await, connect(true).await);
    let rate = 1_000_000;
    let interval = Duration::from_secs(600);
    let plain = plain.rate_limiter("rate_limit:sentinel:plain");
    let waited = waiting.rate_limiter("rate_limit:sentinel:waited");
    for limiter in [&plain, &waited] {
        limiter
            .try_set_rate(RateType::Overall, rate, interval)
            .await
            .unwrap();
        for _ in 0..10 {
            assert!(limiter.try_acquire(1).await.unwrap(), "replicated grants");
        }
    }

    // The replica is cut off (a partition: frozen, and its link closed, so nothing
    // more reaches it); the master still grants.
    let (old_master, replica) = set.data_ports();
    set.signal(replica, "-STOP");
    set.node_cli(old_master, &["client", "kill", "type", "replica"]);
    for _ in 0..20 {
        assert!(
            plain.try_acquire(1).await.unwrap(),
            "acknowledged, not replicated"
        );
    }
    for _ in 0..3 {
        let started = Instant::now();
        let err = waited.try_acquire(1).await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::NotReplicated {
                    wanted: 1,
                    acknowledged: 0,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            err.is_transient() && err.is_backend_failure(),
            "on_error decides: {err:?}"
        );
        assert!(
            started.elapsed() >= Duration::from_millis(100),
            "{:?}",
            started.elapsed()
        );
        assert_hidden(&format!("{err} {err:?}"));
    }

    // The master dies before the replica caught up; the replica is promoted.
    set.kill(old_master);
    set.signal(replica, "-CONT");
    let waited_for = wait_for_master(&set, replica).await;
    let held = |limiter: redlimit::RateLimiter| async move {
        loop {
            match limiter.available_permits().await {
                Ok(available) => return rate - available,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    };
    let (plain_held, waited_held) = (held(plain.clone()).await, held(waited.clone()).await);
    println!(
        "failover after {waited_for:?}: without waiting 30 grants acknowledged, {plain_held} kept; \
         waiting for a replica 10 grants answered (and 3 NotReplicated), {waited_held} kept"
    );
    assert_eq!(
        plain_held, 10,
        "the 20 grants the replica never received are lost"
    );
    // Every grant answered as one survived; the three NotReplicated calls (refused
    // under on_error = "deny") were never received either.
    assert_eq!(waited_held, 10, "a grant answered as such was lost");
}

#[tokio::test]
async fn waiting_for_replicas_refuses_settings_that_cannot_work() {
    for (builder, says) in [
        (
            Client::builder().wait_for_replicas(0, Duration::from_millis(10)),
            "at least 1",
        ),
        (
            Client::builder()
                .command_timeout(Duration::from_millis(100))
                .wait_for_replicas(1, Duration::from_millis(100)),
            "below the command timeout",
        ),
        (
            Client::builder().wait_for_replicas(1, Duration::ZERO),
            "at least 1 ms",
        ),
        (
            Client::builder().wait_for_replicas(u32::MAX, Duration::from_millis(10)),
            "at most 2147483647",
        ),
    ] {
        let err = builder.connect_lazy("redis://127.0.0.1:1/").unwrap_err();
        assert!(matches!(err, Error::InvalidSetting { .. }), "{err:?}");
        assert!(err.to_string().contains(says), "{err}");
    }
    let err = Client::builder()
        .wait_for_replicas(1, Duration::from_millis(10))
        .connect_lazy("redis+cluster://127.0.0.1:1,127.0.0.1:2/")
        .unwrap_err();
    assert!(matches!(err, Error::InvalidSetting { .. }), "{err:?}");
    assert!(err.to_string().contains("single master"), "{err}");
}

#[tokio::test]
async fn a_manual_failover_is_followed_too() {
    // `SENTINEL FAILOVER`: the master is not killed; the sentinels promote the replica,
    // announce it, and make the old master a replica only seconds later.
    let set = RedisSentinel::start();
    let limiter = hot_limiter(&set, "rate_limit:sentinel:manual").await;
    let (old_master, replica) = set.data_ports();
    let port = set.sentinel_ports()[0];
    set.failover(port);
    let waited = wait_for_master(&set, replica).await;
    let started = Instant::now();
    let (mut failed, mut last_error) = (0, None);
    // Decided by the new master: its log grows.
    let count = |port: u16| -> u64 {
        set.node_cli(port, &["zcard", "{rate_limit:sentinel:manual}:permits"])
            .trim()
            .parse()
            .unwrap_or(0)
    };
    loop {
        let before = count(replica);
        match limiter.try_acquire(1).await {
            Ok(granted) => {
                assert!(granted);
                if count(replica) > before {
                    break;
                }
            }
            Err(err) => {
                assert_hidden(&format!("{err} {err:?}"));
                failed += 1;
                last_error = Some(err.to_string());
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "still not on the new master after 30 s: {failed} calls failed (the last: \
             {last_error:?}), {} grants on the old master, roles {:?} / {:?}",
            count(old_master),
            set.node_cli(old_master, &["role"]).lines().next(),
            set.node_cli(replica, &["role"]).lines().next(),
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "manual failover: the sentinels named the new master after {waited:?}; decided there {:?} \
         later, {failed} calls failed in between",
        started.elapsed()
    );
    // Followed on the announcement (`+switch-master`), not seconds later when the old
    // master is made a replica and refuses writes.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "followed after {:?}",
        started.elapsed()
    );
    let (on_old, on_new) = (count(old_master), count(replica));
    for _ in 0..20 {
        assert!(limiter.try_acquire(1).await.unwrap());
    }
    assert_eq!(
        count(old_master),
        on_old,
        "written to the old master after the switch"
    );
    assert_eq!(count(replica), on_new + 20);
}

/// The clients on the sentinel on `port` subscribed to a channel (`sub=1`).
fn subscribers(set: &RedisSentinel, port: u16) -> usize {
    set.sentinel_cli(port, &["client", "list"])
        .lines()
        .filter(|line| line.contains(" sub=1 "))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_client_closes_its_connections() {
    let set = RedisSentinel::start();
    let ports = set.sentinel_ports();
    let listening = || ports.iter().map(|p| subscribers(&set, *p)).sum::<usize>();
    let (master, _) = set.data_ports();
    let named = || {
        set.node_cli(master, &["client", "list"])
            .lines()
            .filter(|line| line.contains("name=redlimit"))
            .count()
    };
    // The sentinels' own links to each other subscribe too (to `__sentinel__:hello`
    // on the data nodes, not on the sentinels): what is here is clients'.
    let before = listening();
    let client = Client::connect(&set.url()).await.unwrap();
    let limiter = client.rate_limiter("rate_limit:sentinel:dropped");
    limiter
        .try_set_rate(RateType::Overall, 10, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(limiter.try_acquire(1).await.unwrap());
    let started = Instant::now();
    while listening() != before + 1 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the client's listener did not subscribe on a sentinel"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(named(), 1, "one connection to the master");
    // On the sentinels, only the listener stays: the search's connections close once
    // it found the master.
    let clients = || -> usize {
        ports
            .iter()
            .map(|p| {
                set.sentinel_cli(*p, &["client", "list"])
                    .lines()
                    .filter(|line| !line.contains("name=sentinel-") && !line.contains("cmd=client"))
                    .count()
            })
            .sum()
    };
    let started = Instant::now();
    while clients() != 1 {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{} connections of the client's on the sentinels",
            clients()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(limiter);
    drop(client);
    let dropped = Instant::now();
    while listening() != before || named() != 0 {
        assert!(
            dropped.elapsed() < Duration::from_secs(5),
            "5 s after the client was dropped: {} subscribers on the sentinels (before: {before}), \
             {} named connections on the master",
            listening(),
            named()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "the dropped client's connections closed within {:?}",
        dropped.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_sentinel_does_not_hide_the_master() {
    let mut set = RedisSentinel::start();
    // The default timeouts: 500 ms to connect, 250 ms a command.
    let client = Client::connect(&set.url()).await.unwrap();
    let limiter = hot(&client, "rate_limit:sentinel:hung").await;
    assert!(limiter.try_acquire(1).await.unwrap());

    // The sentinel listed first accepts connections and never answers.
    set.signal_first_sentinel("-STOP");
    let started = Instant::now();
    let fresh = Client::connect(&set.url())
        .await
        .expect("a new client finds the master through the two sentinels that answer");
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    assert!(fresh
        .rate_limiter("rate_limit:sentinel:hung")
        .try_acquire(1)
        .await
        .unwrap());

    // The two others fail the master over; both clients follow. (The replica has the
    // limiter's config first: a kill loses what it has not received.)
    let (master, replica) = set.data_ports();
    assert!(
        set.caught_up(master, replica),
        "the replica did not receive the limiter in 5 s"
    );
    set.kill(master);
    let killed = Instant::now();
    let count = || -> u64 {
        set.node_cli(replica, &["zcard", "{rate_limit:sentinel:hung}:permits"])
            .trim()
            .parse()
            .unwrap_or(0)
    };
    for client in [&client, &fresh] {
        let limiter = client.rate_limiter("rate_limit:sentinel:hung");
        loop {
            let before = count();
            if let Ok(true) = limiter.try_acquire(1).await {
                if count() > before {
                    break;
                }
            }
            // Usually 2.5 s; an election the two live sentinels lose (a slow answer on
            // a loaded machine) is tried again after twice the failover timeout, 20 s.
            assert!(
                killed.elapsed() < Duration::from_secs(45),
                "not decided by the promoted replica 45 s after the kill"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    println!(
        "both clients decided by the new master {:?} after the kill",
        killed.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_text_that_reads_readonly_does_not_drop_the_master() {
    // A token bucket's key holding the word a replica's refusal starts with: the
    // script names what it found in its error, which must not read as "no longer the
    // master" (each call would search the sentinels and connect again).
    let set = RedisSentinel::start();
    let client = Client::connect(&set.url()).await.unwrap();
    let rule = [
        redlimit::Rule::new("rate_limit:sentinel:ro", 5, Duration::from_secs(60))
            .algorithm(redlimit::Algorithm::TokenBucket),
    ];
    let (master, _) = set.data_ports();
    set.node_cli(
        master,
        &[
            "set",
            "{rate_limit:sentinel:ro}:bucket",
            "READONLY You can't write",
        ],
    );
    let connections = || -> u64 {
        let info = set.node_cli(master, &["info", "stats"]);
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("INFO stats names the connections received")
    };
    let before = connections();
    for _ in 0..20 {
        let err = client.check_rules(&rule).await.unwrap_err();
        assert!(err.to_string().contains("READONLY"), "{err}");
        assert!(matches!(err, Error::CorruptBucket { .. }), "{err:?}");
    }
    // The counting redis-cli connects once.
    assert_eq!(
        connections() - before,
        1,
        "the client connected to the master again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_master_is_left_on_its_readonly_reply() {
    // The master made a replica behind the sentinels' back (an operator's REPLICAOF):
    // no announcement, no connection closed, only READONLY replies. The client must
    // drop that connection (and ask the sentinels again) rather than keep writing
    // to a replica.
    let set = RedisSentinel::start();
    let limiter = hot_limiter(&set, "rate_limit:sentinel:demoted").await;
    let (master, replica) = set.data_ports();
    let named = || {
        set.node_cli(master, &["client", "list"])
            .lines()
            .filter(|line| line.contains("name=redlimit"))
            .count()
    };
    assert_eq!(named(), 1);
    set.node_cli(replica, &["replicaof", "no", "one"]);
    set.node_cli(master, &["replicaof", "127.0.0.1", &replica.to_string()]);
    let err = limiter.try_acquire(1).await.unwrap_err();
    assert!(matches!(err, Error::ReadOnlyReplica { .. }), "{err:?}");
    let started = Instant::now();
    while named() != 0 {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the client still holds its connection to the demoted master"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_sentinel_does_not_deafen_the_listener() {
    // The sentinel the client listens on freezes (its connection stays open, nothing
    // comes); the client must move to another to hear the next `+switch-master`.
    let set = RedisSentinel::start();
    let limiter = hot_limiter(&set, "rate_limit:sentinel:deaf").await;
    let ports = set.sentinel_ports();
    let started = Instant::now();
    while subscribers(&set, ports[0]) != 1 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the listener is not on the first sentinel"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    set.signal_first_sentinel("-STOP");
    // Time for a listener that checks its sentinel to notice and move.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (old_master, replica) = set.data_ports();
    set.failover(ports[1]);
    wait_for_master(&set, replica).await;
    let announced = Instant::now();
    let count = |port: u16| -> u64 {
        set.node_cli(port, &["zcard", "{rate_limit:sentinel:deaf}:permits"])
            .trim()
            .parse()
            .unwrap_or(0)
    };
    loop {
        let before = count(replica);
        if let Ok(true) = limiter.try_acquire(1).await {
            if count(replica) > before {
                break;
            }
        }
        assert!(
            announced.elapsed() < Duration::from_secs(2),
            "still deciding on the old master {:?} after the switch ({} grants there)",
            announced.elapsed(),
            count(old_master)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The layer on an axum server on loopback, deciding on the master the sentinels
/// name: the limit holds, and after a failover the promoted replica decides.
#[cfg(feature = "axum")]
#[tokio::test]
async fn the_layer_decides_behind_sentinel_across_a_failover() {
    use redlimit::tower::{Key, LayerRule, RateLimitLayer};
    use support::http::{send, serve_route};

    let mut set = RedisSentinel::start();
    let client = Client::builder()
        .command_timeout(Duration::from_millis(200))
        .connect(&set.url())
        .await
        .unwrap();
    let layer = RateLimitLayer::builder()
        .client(client)
        .rule(
            LayerRule::new("sentinel_api", 3, Duration::from_secs(60))
                .key(Key::header("x-user"))
                .on_error(redlimit::OnError::Deny),
        )
        .build()
        .unwrap();
    let addr = serve_route("/", |app| app.layer(layer)).await;
    let user = |name| [("x-user", name)];
    for _ in 0..3 {
        assert_eq!(send(addr, "GET", "/", &user("alice")).await.status, 200);
    }
    assert_eq!(
        send(addr, "GET", "/", &user("alice")).await.status,
        429,
        "the fourth of 3"
    );

    let (old_master, replica) = set.data_ports();
    // The replica has alice's grants before the master goes: a failover loses what
    // the replica has not yet received (grants that wait for replicas guard against
    // that; here, the layer following the new master is what is held). On a loaded
    // machine, a kill right after the grants once left the replica without them.
    assert!(
        set.caught_up(old_master, replica),
        "the replica did not receive the grants in 5 s"
    );
    set.kill(old_master);
    // No master: `deny` answers 503; then the promoted replica, which has alice's
    // three grants, refuses her and grants bob.
    let started = Instant::now();
    let mut unavailable = 0;
    loop {
        match send(addr, "GET", "/", &user("bob")).await.status {
            200 if set.master_port() == replica => break,
            503 => unavailable += 1,
            200 => {}
            other => panic!("bob got {other}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no failover within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(unavailable > 0, "no request met the gap");
    assert_eq!(
        send(addr, "GET", "/", &user("alice")).await.status,
        429,
        "kept across the failover"
    );
}

/// Behind Sentinel too, waited grants do not queue behind each other's `WAIT` (which
/// goes on connections of the client's own to the master, not the shared one): with
/// the replica cut off, each of 8 concurrent calls hears `NotReplicated` by its own
/// 100 ms, none reaches the command timeout, and none is answered as a grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_waited_grants_each_answer_by_their_own_timeout() {
    let set = RedisSentinel::start();
    let timeout = Duration::from_millis(500);
    let wait = Duration::from_millis(100);
    let client = Client::builder()
        .command_timeout(timeout)
        .wait_for_replicas(1, wait)
        .connect(&set.url())
        .await
        .unwrap();
    let limiter = hot(&client, "rate_limit:sentinel:queued").await;
    // The script loaded, a connection to wait on made: once the replica has what the
    // master wrote, and again while the replica, synced a moment ago on a loaded
    // machine, does not answer its first `WAIT` within 100 ms.
    let (master, replica) = set.data_ports();
    assert!(
        set.caught_up(master, replica),
        "the replica did not catch up in 5 s"
    );
    let warmed = Instant::now();
    loop {
        match limiter.try_acquire(1).await {
            Ok(granted) => break assert!(granted),
            Err(redlimit::Error::NotReplicated { .. }) if warmed.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("{error}"),
        }
    }
    set.signal(replica, "-STOP");
    set.node_cli(master, &["client", "kill", "type", "replica"]);
    let calls = (0..8).map(|_| {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            (limiter.try_acquire(1).await, started.elapsed())
        })
    });
    let mut times = Vec::new();
    for call in calls.collect::<Vec<_>>() {
        let (result, took) = call.await.unwrap();
        match result {
            Ok(granted) => panic!("answered {granted} without a replica"),
            Err(Error::NotReplicated { .. }) => {}
            Err(other) => panic!("{other:?} after {took:?}"),
        }
        assert!(
            took >= wait && took < wait + Duration::from_millis(50),
            "a call took {took:?}"
        );
        times.push(took);
    }
    set.signal(replica, "-CONT");
    println!("8 concurrent waited calls, replica cut off: NotReplicated after {times:?}");
}

/// A sentinel the test speaks for, on a free loopback port: it names the port in
/// `master` as [`support::sentinel::MASTER_NAME`]'s master, up, at the configuration
/// epoch in `epoch` (holding the answer while `held` is true), sends its subscribers
/// what the test announces, answers their PINGs, and `+OK` to anything else (`AUTH`).
struct FakeSentinel {
    port: u16,
    master: Arc<std::sync::atomic::AtomicU16>,
    epoch: Arc<std::sync::atomic::AtomicU64>,
    held: tokio::sync::watch::Sender<bool>,
    /// `Some(payload)`: a `+switch-master` message; `None`: close the subscribers.
    announce: tokio::sync::broadcast::Sender<Option<String>>,
    /// How many `SENTINEL MASTER` it was asked, how many `SUBSCRIBE` (refused ones
    /// too), and how many PINGs its subscribers sent.
    asked: Arc<std::sync::atomic::AtomicUsize>,
    subscribed: Arc<std::sync::atomic::AtomicUsize>,
    pinged: Arc<std::sync::atomic::AtomicUsize>,
    /// While true, `SUBSCRIBE` is answered with an error.
    refuse_subscriptions: Arc<AtomicBool>,
}

/// `items` as a RESP array of bulk strings.
fn resp_array(items: &[&str]) -> String {
    let body: String = items.iter().map(|i| format!("${}\r\n{i}\r\n", i.len())).collect();
    format!("*{}\r\n{body}", items.len())
}

/// `SENTINEL MASTER`'s reply naming the master on `port` as up at `epoch`, as
/// redis-sentinel 7.0 words it, less the fields a client does not read.
fn master_reply(port: u16, epoch: u64) -> String {
    let (port, epoch) = (port.to_string(), epoch.to_string());
    resp_array(&[
        "name",
        support::sentinel::MASTER_NAME,
        "ip",
        "127.0.0.1",
        "port",
        &port,
        "flags",
        "master",
        "config-epoch",
        &epoch,
    ])
}

impl FakeSentinel {
    async fn start(master: u16) -> FakeSentinel {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let fake = FakeSentinel {
            port: listener.local_addr().unwrap().port(),
            master: Arc::new(master.into()),
            epoch: Default::default(),
            held: tokio::sync::watch::channel(false).0,
            announce: tokio::sync::broadcast::channel(16).0,
            asked: Default::default(),
            subscribed: Default::default(),
            pinged: Default::default(),
            refuse_subscriptions: Default::default(),
        };
        let (master, held, announce) = (fake.master.clone(), fake.held.clone(), fake.announce.clone());
        let (asked, subscribed, pinged) = (fake.asked.clone(), fake.subscribed.clone(), fake.pinged.clone());
        let (refuse, epoch) = (fake.refuse_subscriptions.clone(), fake.epoch.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (master, mut held) = (master.clone(), held.subscribe());
                let epoch = epoch.clone();
                let (asked, subscribed, pinged) = (asked.clone(), subscribed.clone(), pinged.clone());
                let refuse = refuse.clone();
                let mut announced = announce.subscribe();
                tokio::spawn(async move {
                    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
                    let (read, mut write) = stream.into_split();
                    let mut lines = BufReader::new(read).lines();
                    let mut subscriber = false;
                    loop {
                        let head = tokio::select! {
                            line = lines.next_line() => match line {
                                Ok(Some(line)) => line,
                                _ => return,
                            },
                            message = announced.recv(), if subscriber => {
                                let Ok(Some(payload)) = message else { return };
                                let message = resp_array(&["message", "+switch-master", &payload]);
                                if write.write_all(message.as_bytes()).await.is_err() {
                                    return;
                                }
                                continue;
                            }
                        };
                        // A command: `*N`, then N times `$len` and the argument.
                        let n: usize = head.trim_start_matches('*').parse().unwrap_or(0);
                        let mut args = Vec::new();
                        for _ in 0..n {
                            let _len = lines.next_line().await;
                            args.push(lines.next_line().await.ok().flatten().unwrap_or_default());
                        }
                        let command = args.first().map(|a| a.to_ascii_uppercase()).unwrap_or_default();
                        let reply = match command.as_str() {
                            "SENTINEL" => {
                                asked.fetch_add(1, Ordering::SeqCst);
                                let _ = held.wait_for(|held| !*held).await;
                                master_reply(master.load(Ordering::SeqCst), epoch.load(Ordering::SeqCst))
                            }
                            "SUBSCRIBE" => {
                                subscribed.fetch_add(1, Ordering::SeqCst);
                                if refuse.load(Ordering::SeqCst) {
                                    "-ERR refused\r\n".to_owned()
                                } else {
                                    subscriber = true;
                                    "*3\r\n$9\r\nsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n".to_owned()
                                }
                            }
                            "PING" if subscriber => {
                                pinged.fetch_add(1, Ordering::SeqCst);
                                resp_array(&["pong", ""])
                            }
                            _ => "+OK\r\n".to_owned(),
                        };
                        if write.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        fake
    }

    /// Announces `old` replaced by `new` to its subscribers, and returns once the
    /// client's listener has read it.
    async fn switch(&self, old: u16, new: u16) {
        let payload = format!(
            "{} 127.0.0.1 {old} 127.0.0.1 {new}",
            support::sentinel::MASTER_NAME
        );
        self.send(payload).await;
    }

    /// Sends `payload` on `+switch-master`, and returns once the listener has read it.
    async fn send(&self, payload: String) {
        let pings = self.pinged.load(Ordering::SeqCst);
        self.announce.send(Some(payload)).unwrap();
        // The listener PINGs after a second without messages: the second PING from
        // now was sent after it read the announcement (the first may have been on its
        // way already).
        self.pings(pings + 2).await;
    }

    /// Closes its subscribers' connections, and returns once the client's listener has
    /// subscribed again and gone on listening.
    async fn drop_subscribers(&self) {
        let subscriptions = self.subscribed.load(Ordering::SeqCst);
        self.announce.send(None).unwrap();
        self.subscriptions(subscriptions + 1).await;
        let pings = self.pinged.load(Ordering::SeqCst);
        self.pings(pings + 1).await;
    }

    async fn pings(&self, n: usize) {
        let started = Instant::now();
        while self.pinged.load(Ordering::SeqCst) < n {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the listener sent no PING"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A client's URL naming this sentinel alone, without passwords.
    fn url(&self) -> String {
        format!(
            "redis+sentinel://127.0.0.1:{}/{}",
            self.port,
            support::sentinel::MASTER_NAME
        )
    }

    /// Waits until `n` subscriptions have been made in all.
    async fn subscriptions(&self, n: usize) {
        let started = Instant::now();
        while self.subscribed.load(Ordering::SeqCst) < n {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "no listener subscribed"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test]
async fn an_announced_master_is_taken_over_a_sentinel_that_has_not_heard() {
    // After `+switch-master`, the old master says it is one for seconds more, and a
    // sentinel asked then may not have heard of the switch: the client goes where the
    // announcement said, not where that sentinel points.
    let set = RedisSentinel::start();
    let (old_master, new_master) = set.data_ports();
    let first = set.sentinel_ports()[0];
    let stale = FakeSentinel::start(old_master).await;
    // The client listens on the sentinel listed first; the stale one is listed second.
    let url = format!(
        "redis+sentinel://:{MASTER_PASSWORD}@127.0.0.1:{first},127.0.0.1:{}/{}?sentinel_password={SENTINEL_PASSWORD}",
        stale.port,
        support::sentinel::MASTER_NAME
    );
    let client = Client::builder()
        .command_timeout(Duration::from_secs(1))
        .connect(&url)
        .await
        .unwrap();
    let limiter = hot(&client, "rate_limit:sentinel:announced").await;
    assert!(limiter.try_acquire(1).await.unwrap());
    let count = |port: u16| -> u64 {
        set.node_cli(port, &["zcard", "{rate_limit:sentinel:announced}:permits"])
            .trim()
            .parse()
            .unwrap_or(0)
    };
    assert_eq!(count(old_master), 1);

    // Heard as the client's listener hears it.
    let mut announcements = redis::Client::open(format!("redis://:{SENTINEL_PASSWORD}@127.0.0.1:{first}/"))
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    announcements.subscribe("+switch-master").await.unwrap();
    // The client's listener is on the first sentinel too.
    let started = Instant::now();
    while subscribers(&set, first) < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the client's listener did not subscribe"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    set.failover(first);
    let announced = tokio::time::timeout(
        Duration::from_secs(30),
        tokio_stream::StreamExt::next(&mut announcements.on_message()),
    )
    .await
    .expect("no +switch-master within 30 s")
    .unwrap();
    let payload: String = announced.get_payload().unwrap();
    assert!(payload.ends_with(&format!(" {new_master}")), "{payload}");
    // The client's own listener has its copy; the sentinel that announced it now hangs,
    // so the next search hears only the stale sentinel, if it asks one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    set.signal_first_sentinel("-STOP");
    let asked_before = stale.asked.load(Ordering::SeqCst);
    let granted = limiter.try_acquire(1).await;
    set.signal_first_sentinel("-CONT");
    assert!(granted.unwrap());
    assert_eq!(
        (count(old_master), count(new_master)),
        (1, 2),
        "decided by the old master after the switch was announced (the stale sentinel was \
         asked {} times)",
        stale.asked.load(Ordering::SeqCst) - asked_before
    );
}

/// Two masters of their own (no replication), the fake sentinel naming the first, and
/// a client on it whose limiter was granted once there.
async fn on_a_fake_sentinel(
    name: &str,
    connect: Duration,
) -> (
    support::RedisServer,
    support::RedisServer,
    FakeSentinel,
    redlimit::RateLimiter,
) {
    let (old, new) = (support::RedisServer::start(), support::RedisServer::start());
    let fake = FakeSentinel::start(old.port).await;
    let client = Client::builder()
        .connect_timeout(connect)
        .command_timeout(Duration::from_secs(3))
        .connect(&fake.url())
        .await
        .unwrap();
    let limiter = hot(&client, name).await;
    // The same limit on the other (a promoted replica would have it).
    hot(&Client::connect(&new.url()).await.unwrap(), name).await;
    assert!(limiter.try_acquire(1).await.unwrap());
    fake.subscriptions(1).await;
    (old, new, fake, limiter)
}

/// How many grants the limiter `name`'s log holds on `server`.
fn grants_on(server: &support::RedisServer, name: &str) -> u64 {
    let port = server.port.to_string();
    let reply = support::cluster::cli(&["-p", &port, "zcard", &format!("{{{name}}}:permits")]);
    reply
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("ZCARD on port {port} answered {reply:?}"))
}

#[tokio::test]
async fn a_switch_announced_during_a_search_is_followed() {
    // A search that began before an announcement may find the old master, which says
    // it is one: what it found is dropped and the announced master taken.
    let name = "rate_limit:sentinel:during";
    let (old, new, fake, limiter) = on_a_fake_sentinel(name, Duration::from_secs(3)).await;
    // A first switch, to a master that is not there: the next search asks the sentinel.
    let (nowhere, gone) = (support::free_port(), support::free_port());
    fake.switch(nowhere, gone).await;
    fake.held.send_replace(true);
    let asked = fake.asked.load(Ordering::SeqCst);
    let call = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.try_acquire(1).await }
    });
    let started = Instant::now();
    while fake.asked.load(Ordering::SeqCst) == asked {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the search did not ask"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // While the sentinel holds its answer (the old master), the real switch.
    fake.switch(old.port, new.port).await;
    fake.held.send_replace(false);
    assert!(call.await.unwrap().unwrap());
    assert_eq!(
        (grants_on(&old, name), grants_on(&new, name)),
        (1, 1),
        "decided by the master the sentinel named during the announcement"
    );
    // The listener stayed on its subscription throughout (its PINGs answered).
    assert_eq!(fake.subscribed.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_sentinel_naming_the_replaced_master_is_not_followed() {
    // The announced master does not answer in time (frozen), and the sentinel names
    // the master the switch replaced, which is not followed: the call fails, and a
    // later one, once the announced master answers, is decided there.
    let name = "rate_limit:sentinel:replaced";
    let (old, new, fake, limiter) = on_a_fake_sentinel(name, Duration::from_millis(600)).await;
    new.pause();
    fake.switch(old.port, new.port).await;
    let failed = limiter.try_acquire(1).await;
    new.resume();
    let err = failed.expect_err("decided while the announced master was frozen");
    assert_hidden(&format!("{err} {err:?}"));
    assert_eq!(grants_on(&old, name), 1, "decided by the replaced master");
    let started = Instant::now();
    while limiter.try_acquire(1).await.is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "not decided by the announced master"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!((grants_on(&old, name), grants_on(&new, name)), (1, 1));
}

#[tokio::test]
async fn a_listener_that_may_have_missed_a_switch_follows_the_sentinels() {
    // Announced, then the listener's sentinel connection closes: a later switch may
    // have gone unheard, so the announced master is no longer preferred, and the
    // sentinel's answer is followed; the master the switch replaced still is not.
    let name = "rate_limit:sentinel:missed";
    let (old, new, fake, limiter) = on_a_fake_sentinel(name, Duration::from_secs(3)).await;
    fake.switch(old.port, new.port).await;
    fake.drop_subscribers().await;
    assert!(
        limiter.try_acquire(1).await.is_err(),
        "decided by the replaced master"
    );
    let third = named_after_a_while(&fake, name).await;
    until_granted(&limiter).await;
    assert_eq!(
        (
            grants_on(&old, name),
            grants_on(&new, name),
            grants_on(&third, name)
        ),
        (1, 0, 1),
        "decided by the announced master after the listener may have missed a switch"
    );
    assert_eq!(fake.subscribed.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_switch_back_is_followed_back() {
    // Two switches heard, the second back to the first master: the master the second
    // replaced is the one not followed.
    let name = "rate_limit:sentinel:back";
    let (old, new, fake, limiter) = on_a_fake_sentinel(name, Duration::from_secs(3)).await;
    fake.switch(old.port, new.port).await;
    fake.switch(new.port, old.port).await;
    // The sentinel has heard the first switch only.
    fake.master.store(new.port, Ordering::SeqCst);
    assert!(limiter.try_acquire(1).await.unwrap());
    assert_eq!((grants_on(&old, name), grants_on(&new, name)), (2, 0));
}

/// A third master of its own with the limit `name`, which the fake sentinel names from
/// now on, holding its first answer 300 ms (long enough for an announced master to
/// answer first, were it tried).
async fn named_after_a_while(fake: &FakeSentinel, name: &str) -> support::RedisServer {
    let third = support::RedisServer::start();
    hot(&Client::connect(&third.url()).await.unwrap(), name).await;
    fake.master.store(third.port, Ordering::SeqCst);
    fake.held.send_replace(true);
    let held = fake.held.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        held.send_replace(false);
    });
    third
}

/// Calls until one is granted (5 s at most).
async fn until_granted(limiter: &redlimit::RateLimiter) {
    let started = Instant::now();
    while !matches!(limiter.try_acquire(1).await, Ok(true)) {
        assert!(started.elapsed() < Duration::from_secs(5), "never granted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn an_unreadable_switch_stops_preferring_the_announced_master() {
    // A message of this master's that does not read says a switch happened that the
    // client cannot follow: the master announced before may be an old one now.
    let name = "rate_limit:sentinel:unreadable";
    let (old, new, fake, limiter) = on_a_fake_sentinel(name, Duration::from_secs(3)).await;
    fake.switch(old.port, new.port).await;
    fake.send(format!(
        "{} 127.0.0.1 x 127.0.0.1 y",
        support::sentinel::MASTER_NAME
    ))
    .await;
    let third = named_after_a_while(&fake, name).await;
    until_granted(&limiter).await;
    assert_eq!(
        (
            grants_on(&old, name),
            grants_on(&new, name),
            grants_on(&third, name)
        ),
        (1, 0, 1),
        "decided by the master announced before an unreadable switch"
    );
}

#[tokio::test]
async fn a_listener_off_its_sentinel_stops_preferring_the_announced_master() {
    // The listener's connection closes and it cannot subscribe again: deaf, it may
    // miss a switch, so the master announced before is no longer preferred.
    let name = "rate_limit:sentinel:deaf";
    let (old, new, fake, limiter) = on_a_fake_sentinel(name, Duration::from_secs(3)).await;
    fake.switch(old.port, new.port).await;
    fake.refuse_subscriptions.store(true, Ordering::SeqCst);
    let subscriptions = fake.subscribed.load(Ordering::SeqCst);
    fake.announce.send(None).unwrap();
    // A refused attempt: the listener left its closed connection before it.
    fake.subscriptions(subscriptions + 1).await;
    let third = named_after_a_while(&fake, name).await;
    until_granted(&limiter).await;
    assert_eq!(
        (
            grants_on(&old, name),
            grants_on(&new, name),
            grants_on(&third, name)
        ),
        (1, 0, 1),
        "decided by the announced master while the listener was deaf"
    );
}

#[test]
fn a_search_its_runtime_never_ran_does_not_stop_the_next() {
    // A client that outlives the runtime its first call ran on: that call's search was
    // spawned there and never polled. Its end is kept all the same, so a call on
    // another runtime searches again instead of waiting for it.
    let background = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = support::RedisServer::start();
    let fake = background.block_on(FakeSentinel::start(server.port));
    let name = "rate_limit:sentinel:unpolled";
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    let client = first.block_on(async {
        Client::builder()
            .command_timeout(Duration::from_secs(2))
            .connect_lazy(&fake.url())
            .unwrap()
    });
    let limiter = client.rate_limiter(name);
    first.block_on(async {
        // Polled once: the search is spawned, and the call given up.
        tokio::select! {
            biased;
            _ = limiter.try_acquire(1) => panic!("answered without a search"),
            () = std::future::ready(()) => {}
        }
    });
    drop(first);
    assert_eq!(fake.asked.load(Ordering::SeqCst), 0, "the search ran");
    runtime().block_on(async {
        // Its end was kept as a failure: calls in the next 100 ms answer it at once.
        tokio::time::sleep(Duration::from_millis(200)).await;
        hot(&client, name).await;
        assert!(limiter.try_acquire(1).await.unwrap());
    });
    assert_eq!(grants_on(&server, name), 1);
}

/// A master of its own (no replication) behind the master's password, with the limit
/// `name` set (`extra`: more arguments, `--replicaof` say).
async fn master_with(name: &str, extra: &[&str]) -> support::RedisServer {
    let mut args = vec!["--requirepass", MASTER_PASSWORD, "--masterauth", MASTER_PASSWORD];
    args.extend_from_slice(extra);
    let server = support::RedisServer::start_with(&args);
    if extra.is_empty() {
        let url = format!("redis://:{MASTER_PASSWORD}@127.0.0.1:{}/", server.port);
        hot(&Client::connect(&url).await.unwrap(), name).await;
    }
    server
}

/// A fake sentinel naming `master` at configuration epoch `epoch`.
async fn naming(master: &support::RedisServer, epoch: u64) -> FakeSentinel {
    let fake = FakeSentinel::start(master.port).await;
    fake.epoch.store(epoch, Ordering::SeqCst);
    fake
}

/// A URL listing `sentinels` in this order, with both passwords.
fn listing(sentinels: &[&FakeSentinel]) -> String {
    let hosts: Vec<String> = sentinels
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    format!(
        "redis+sentinel://:{MASTER_PASSWORD}@{}/{}?sentinel_password={SENTINEL_PASSWORD}",
        hosts.join(","),
        support::sentinel::MASTER_NAME
    )
}

/// How many grants the limiter `name`'s log holds on `server`, behind the master's
/// password.
fn grants_behind_password(server: &support::RedisServer, name: &str) -> u64 {
    let port = server.port.to_string();
    let key = format!("{{{name}}}:permits");
    let reply = support::cluster::cli(&[
        "-p",
        &port,
        "-a",
        MASTER_PASSWORD,
        "--no-auth-warning",
        "zcard",
        &key,
    ]);
    reply
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("ZCARD on port {port} answered {reply:?}"))
}

/// Twenty clients of `url`, as twenty processes would start, each granted once.
async fn twenty_clients_grant(url: &str, name: &str) {
    let clients = (0..20).map(|_| {
        let url = url.to_owned();
        let name = name.to_owned();
        tokio::spawn(async move {
            let client = Client::builder()
                .connect_timeout(Duration::from_secs(2))
                .command_timeout(Duration::from_secs(2))
                .connect(&url)
                .await
                .unwrap();
            assert!(client.rate_limiter(&name).try_acquire(1).await.unwrap());
        })
    });
    for client in clients.collect::<Vec<_>>() {
        client.await.unwrap();
    }
}

/// The two servers, the one of the lower address (here the lower port) first.
fn by_address(
    a: support::RedisServer,
    b: support::RedisServer,
) -> (support::RedisServer, support::RedisServer) {
    if a.port < b.port {
        (a, b)
    } else {
        (b, a)
    }
}

#[tokio::test]
async fn sentinels_that_disagree_are_followed_to_the_highest_epoch_and_logged_once() {
    // Two sentinels each naming a master of their own: every client follows the one
    // named at the higher configuration epoch, whichever sentinel answers first, and
    // the disagreement is logged once, without a password.
    let capture = support::capture::Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    let name = "rate_limit:sentinel:epochs";
    let (older, newer) = (master_with(name, &[]).await, master_with(name, &[]).await);
    let (first, second) = (naming(&older, 1).await, naming(&newer, 2).await);
    twenty_clients_grant(&listing(&[&first, &second]), name).await;
    assert_eq!(
        (
            grants_behind_password(&older, name),
            grants_behind_password(&newer, name)
        ),
        (0, 20),
        "decided by the master of the lower epoch"
    );
    let logged = capture.text();
    assert_hidden(&logged);
    let warnings: Vec<&str> = logged
        .lines()
        .filter(|l| l.starts_with("WARN") && l.contains("different masters"))
        .collect();
    assert_eq!(warnings.len(), 1, "{logged}");
    for said in [
        format!(
            "sentinel 127.0.0.1:{} named 127.0.0.1:{} (config epoch 1)",
            first.port, older.port
        ),
        format!(
            "sentinel 127.0.0.1:{} named 127.0.0.1:{} (config epoch 2)",
            second.port, newer.port
        ),
        format!("following 127.0.0.1:{}", newer.port),
    ] {
        assert!(warnings[0].contains(&said), "{said} not in {}", warnings[0]);
    }
}

#[tokio::test]
async fn at_equal_epochs_the_master_most_sentinels_name_is_followed() {
    // Three sentinels at one epoch, two naming one master: that master, though the
    // other is listed first and has the lower address.
    let name = "rate_limit:sentinel:majority";
    let (lower, higher) = by_address(master_with(name, &[]).await, master_with(name, &[]).await);
    let alone = naming(&lower, 4).await;
    let (one, two) = (naming(&higher, 4).await, naming(&higher, 4).await);
    twenty_clients_grant(&listing(&[&alone, &one, &two]), name).await;
    assert_eq!(
        (
            grants_behind_password(&lower, name),
            grants_behind_password(&higher, name)
        ),
        (0, 20),
        "decided by the master one sentinel of three named"
    );
}

#[tokio::test]
async fn at_equal_epochs_without_a_majority_every_client_follows_the_lowest_address() {
    // Two sentinels at one epoch naming two masters: nothing else decides, so the
    // lowest address does, the same for every client.
    let name = "rate_limit:sentinel:tie";
    let (lower, higher) = by_address(master_with(name, &[]).await, master_with(name, &[]).await);
    let (first, second) = (naming(&higher, 5).await, naming(&lower, 5).await);
    twenty_clients_grant(&listing(&[&first, &second]), name).await;
    assert_eq!(
        (
            grants_behind_password(&lower, name),
            grants_behind_password(&higher, name)
        ),
        (20, 0),
        "the clients split, or followed the higher address"
    );
}

#[tokio::test]
async fn a_sentinel_naming_a_replica_is_passed_over_for_the_next_epoch() {
    // The highest epoch names a node whose ROLE says replica: it is not followed, and
    // the master of the next epoch is, not any master another sentinel names.
    let name = "rate_limit:sentinel:replica";
    let (next, lowest) = (master_with(name, &[]).await, master_with(name, &[]).await);
    let lowest_port = lowest.port.to_string();
    let replica = master_with(name, &["--replicaof", "127.0.0.1", &lowest_port]).await;
    let role = support::cluster::cli(&[
        "-p",
        &replica.port.to_string(),
        "-a",
        MASTER_PASSWORD,
        "--no-auth-warning",
        "role",
    ]);
    assert!(role.starts_with("slave"), "{role}");
    let sentinels = [
        naming(&replica, 9).await,
        naming(&next, 3).await,
        naming(&lowest, 1).await,
    ];
    twenty_clients_grant(&listing(&sentinels.iter().collect::<Vec<_>>()), name).await;
    assert_eq!(
        (
            grants_behind_password(&next, name),
            grants_behind_password(&lowest, name)
        ),
        (20, 0),
        "not decided by the master of the epoch after the replica's"
    );
}

#[tokio::test]
async fn a_client_that_missed_a_sentinel_follows_it_within_seconds() {
    // One client's search did not hear the sentinel of the higher epoch (it hung):
    // that client follows the other, then, once that sentinel answers again, moves to
    // the master of the higher epoch by itself, where a new client goes at once.
    let name = "rate_limit:sentinel:missed_sentinel";
    let (older, newer) = (master_with(name, &[]).await, master_with(name, &[]).await);
    let (first, second) = (naming(&older, 1).await, naming(&newer, 2).await);
    let url = listing(&[&first, &second]);
    second.held.send_replace(true);
    let client = Client::builder()
        .connect_timeout(Duration::from_millis(400))
        .command_timeout(Duration::from_secs(1))
        .connect(&url)
        .await
        .unwrap();
    let limiter = client.rate_limiter(name);
    assert!(limiter.try_acquire(1).await.unwrap());
    assert_eq!(grants_behind_password(&older, name), 1);
    second.held.send_replace(false);
    let answered = Instant::now();
    while grants_behind_password(&newer, name) == 0 {
        assert!(limiter.try_acquire(1).await.unwrap());
        assert!(
            answered.elapsed() < Duration::from_secs(3),
            "still on the master of the lower epoch {:?} after the other sentinel answered",
            answered.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "a client that missed a sentinel followed it {:?} after it answered",
        answered.elapsed()
    );
    let (on_older, on_newer) = (
        grants_behind_password(&older, name),
        grants_behind_password(&newer, name),
    );
    twenty_clients_grant(&url, name).await;
    assert!(limiter.try_acquire(1).await.unwrap());
    assert_eq!(
        (
            grants_behind_password(&older, name),
            grants_behind_password(&newer, name)
        ),
        (on_older, on_newer + 21),
        "decided by the master of the lower epoch once both sentinels answered"
    );
}

#[tokio::test]
async fn a_master_the_sentinels_name_anew_unannounced_is_followed() {
    // The sentinel names another master, at a higher epoch, without a `+switch-master`
    // (a second set of sentinels under the same name, an operator's hand) while the
    // master in use still says it is one: the client follows within about ten seconds.
    let name = "rate_limit:sentinel:unannounced";
    let (old, new) = (master_with(name, &[]).await, master_with(name, &[]).await);
    let fake = naming(&old, 1).await;
    let client = Client::builder()
        .command_timeout(Duration::from_secs(1))
        .connect(&listing(&[&fake]))
        .await
        .unwrap();
    let limiter = client.rate_limiter(name);
    assert!(limiter.try_acquire(1).await.unwrap());
    let renamed = Instant::now();
    fake.master.store(new.port, Ordering::SeqCst);
    fake.epoch.store(2, Ordering::SeqCst);
    while grants_behind_password(&new, name) == 0 {
        assert!(limiter.try_acquire(1).await.unwrap());
        assert!(
            renamed.elapsed() < Duration::from_secs(15),
            "still on the master the sentinel no longer names"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "a master named anew unannounced followed after {:?}",
        renamed.elapsed()
    );
    assert!(
        renamed.elapsed() > Duration::from_secs(5),
        "checked sooner than agreed"
    );
}

/// Behind Sentinel, the master's connection out of step (the first to carry a script
/// call, each of its calls handed the reply to the call before, through a proxy the
/// sentinel names as the master) is forgotten at the first reply that does not fit:
/// the sentinel is asked for the master again, and the new connection is in step.
#[tokio::test]
async fn a_master_connection_out_of_step_is_made_again() {
    let server = support::RedisServer::start();
    let proxy = support::lying::LyingProxy::start_out_of_step_once(server.port, b":1\r\n").await;
    let fake = FakeSentinel::start(proxy.port).await;
    let client = Client::builder()
        .command_timeout(Duration::from_secs(3))
        .connect(&fake.url())
        .await
        .unwrap();
    let rule = [redlimit::Rule::new(
        "sentinel:out-of-step",
        3,
        Duration::from_secs(60),
    )];
    let asked = fake.asked.load(Ordering::SeqCst);
    let first = client.check_rules(&rule).await.unwrap_err();
    assert!(matches!(first, Error::UnexpectedReply { .. }), "{first:?}");
    let mut allowed = Vec::new();
    for _ in 0..5 {
        // (each call at its own millisecond: a reply carries its call's time)
        tokio::time::sleep(Duration::from_millis(3)).await;
        allowed.push(client.check_rules(&rule).await.unwrap().allowed);
    }
    assert_eq!(allowed, [true, true, true, false, false]);
    assert_eq!(proxy.lies(), 1);
    assert!(
        fake.asked.load(Ordering::SeqCst) > asked,
        "the sentinel was asked again"
    );
}
