//! `ClientBuilder::wait_for_replicas` on one master and one replica, each a
//! redis-server of the test's own on a free loopback port: concurrent waited grants
//! do not queue behind each other's `WAIT`, each caller answers by its own deadline,
//! and no grant is answered as replicated that the replica does not have.

use redlimit_test_support as support;

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redlimit::{Client, Error, RateLimiter, RateType};
use support::link::DelayedLink;
use support::RedisServer;

/// The command timeout of every client here: far above any replicas' timeout, so a
/// call that queued behind another's wait would show as `Timeout` or as a late answer.
const COMMAND_TIMEOUT: Duration = Duration::from_millis(1_000);

/// A master and its replica, linked (through a link that delays both ways, when
/// asked).
struct Pair {
    master: RedisServer,
    replica: RedisServer,
    _link: Option<DelayedLink>,
}

impl Pair {
    async fn start() -> Pair {
        Pair::start_linked(None).await
    }

    async fn start_linked(delay: Option<Duration>) -> Pair {
        let master = RedisServer::start();
        let link = match delay {
            Some(delay) => Some(DelayedLink::start(master.port, delay).await),
            None => None,
        };
        let port = link.as_ref().map_or(master.port, |link| link.port).to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
        let pair = Pair {
            master,
            replica,
            _link: link,
        };
        pair.wait_until_linked().await;
        pair
    }

    async fn master_info(&self) -> String {
        let mut raw = self.master.raw().await;
        redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut raw)
            .await
            .unwrap()
    }

    async fn wait_until_linked(&self) {
        let started = Instant::now();
        while !self.master_info().await.contains("state=online") {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the replica never linked"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Freezes the replica (SIGSTOP): the master still counts it, and hears no ack.
    /// With `close_link`, the master also closes its link (a partition).
    async fn cut_off(&self, close_link: bool) {
        self.replica.pause();
        if !close_link {
            return;
        }
        let mut raw = self.master.raw().await;
        let _: redis::Value = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("replica")
            .query_async(&mut raw)
            .await
            .unwrap();
    }

    async fn reconnect(&self) {
        self.replica.resume();
        self.wait_until_linked().await;
    }

    /// The grants in `name`'s log on the master.
    async fn grants(&self, name: &str) -> u64 {
        let mut raw = self.master.raw().await;
        raw.zcard(format!("{{{name}}}:permits")).await.unwrap()
    }
}

/// A client waiting for 1 replica up to `timeout`.
async fn waiting(pair: &Pair, timeout: Duration) -> Client {
    Client::builder()
        .command_timeout(COMMAND_TIMEOUT)
        .wait_for_replicas(1, timeout)
        .connect(&pair.master.url())
        .await
        .unwrap()
}

/// `name` on `client`, at a rate no test here exhausts, granted and replicated once
/// (the script loaded, a connection of the pool made; a replica just linked may
/// still be loading what it was sent, and not acknowledge yet).
async fn hot(client: &Client, name: &str) -> RateLimiter {
    let limiter = client.rate_limiter(name);
    limiter
        .try_set_rate(RateType::Overall, 1_000_000, Duration::from_secs(600))
        .await
        .unwrap();
    let started = Instant::now();
    loop {
        match limiter.try_acquire(1).await {
            Ok(granted) => {
                assert!(granted);
                break;
            }
            Err(Error::NotReplicated { .. }) if started.elapsed() < Duration::from_secs(10) => {}
            Err(err) => panic!("{err:?}"),
        }
    }
    limiter
}

/// `n` calls at once on `limiter`, each started after its offset in `stagger`
/// (0 when absent); each call's result and time from its own start.
async fn at_once(limiter: &RateLimiter, n: usize, stagger: Duration) -> Vec<(Result<bool, Error>, Duration)> {
    let calls: Vec<_> = (0..n)
        .map(|i| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                tokio::time::sleep(stagger * i as u32).await;
                let started = Instant::now();
                (limiter.try_acquire(1).await, started.elapsed())
            })
        })
        .collect();
    let mut results = Vec::new();
    for call in calls {
        results.push(call.await.unwrap());
    }
    results
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_waited_grants_take_about_what_a_lone_one_takes() {
    // The replica 5 ms away each way: a WAIT takes about 10 ms, far above the
    // scheduling of 8 tasks on 2 cores (8 plain calls at once took 4.5 times a lone
    // one, 0.6 ms against 0.135 ms).
    let pair = Pair::start_linked(Some(Duration::from_millis(5))).await;
    let client = waiting(&pair, Duration::from_millis(200)).await;
    let limiter = hot(&client, "rate_limit:replicas:up").await;
    let before = pair.grants("rate_limit:replicas:up").await;
    let mut lone = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        assert!(limiter.try_acquire(1).await.unwrap());
        lone.push(started.elapsed());
    }
    let lone = median(lone);
    // Each of the 8 callers' own median over 20 bursts of 8 at once.
    let mut by_caller = vec![Vec::new(); 8];
    for _ in 0..20 {
        for (i, (result, took)) in at_once(&limiter, 8, Duration::ZERO).await.into_iter().enumerate() {
            assert!(result.unwrap(), "granted and replicated");
            by_caller[i].push(took);
        }
    }
    let medians: Vec<Duration> = by_caller.into_iter().map(median).collect();
    println!("replica up, 5 ms away: a lone waited grant {lone:?} (median of 20); 8 at once, each caller's median of 20: {medians:?}");
    for took in &medians {
        assert!(
            *took <= lone * 2,
            "a caller's median {took:?} against a lone call's {lone:?}"
        );
    }
    assert_eq!(pair.grants("rate_limit:replicas:up").await, before + 20 + 160);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_replica_cut_off_each_caller_hears_not_replicated_by_its_own_timeout() {
    // Frozen with its link open (the master still counts the replica: a WAIT on a
    // connection that never wrote would be answered 1 at once), then also its link
    // closed.
    for close_link in [false, true] {
        let pair = Pair::start().await;
        let timeout = Duration::from_millis(100);
        let client = waiting(&pair, timeout).await;
        let name = "rate_limit:replicas:cut";
        let limiter = hot(&client, name).await;
        let before = pair.grants(name).await;
        pair.cut_off(close_link).await;
        let results = at_once(&limiter, 8, Duration::ZERO).await;
        let times: Vec<Duration> = results.iter().map(|(_, took)| *took).collect();
        println!(
            "replica cut off (link closed: {close_link}), wait_for_replicas(1, 100 ms), 8 at once: {times:?}"
        );
        for (result, took) in results {
            match result {
                Err(Error::NotReplicated {
                    wanted: 1,
                    acknowledged: 0,
                    ..
                }) => {}
                other => panic!("{other:?} after {took:?}"),
            }
            assert!(
                took >= timeout && took < timeout + Duration::from_millis(50),
                "answered after {took:?}"
            );
        }
        // Each NotReplicated was granted on the master (its permits stay taken), and
        // none was answered as a grant.
        assert_eq!(pair.grants(name).await, before + 8);
        pair.reconnect().await;
        assert!(limiter.try_acquire(1).await.unwrap(), "replicated again");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_with_different_deadlines_each_answer_by_their_own() {
    let pair = Pair::start().await;
    let (short, long) = (Duration::from_millis(100), Duration::from_millis(300));
    let short_client = waiting(&pair, short).await;
    let long_client = waiting(&pair, long).await;
    let short_limiter = hot(&short_client, "rate_limit:replicas:short").await;
    let long_limiter = hot(&long_client, "rate_limit:replicas:long").await;
    pair.cut_off(true).await;
    // One client's callers starting 20 ms apart (16 of them: twice its connections,
    // so the last 8 wait for a connection and share rounds with others' deadlines),
    // the other's all at once, side by side.
    let stagger = Duration::from_millis(20);
    let (long_results, short_results) = tokio::join!(
        at_once(&long_limiter, 16, stagger),
        at_once(&short_limiter, 4, Duration::ZERO)
    );
    for (results, timeout) in [(&long_results, long), (&short_results, short)] {
        let times: Vec<Duration> = results.iter().map(|(_, took)| *took).collect();
        println!("replica cut off, timeout {timeout:?}: {times:?}");
        for (result, took) in results {
            assert!(
                matches!(result, Err(Error::NotReplicated { .. })),
                "{result:?} after {took:?}"
            );
            assert!(
                *took >= timeout && *took < timeout + Duration::from_millis(50),
                "{took:?} for a timeout of {timeout:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_past_the_connections_answer_by_their_deadline_and_spend_nothing_unsent() {
    let pair = Pair::start().await;
    let timeout = Duration::from_millis(100);
    let client = waiting(&pair, timeout).await;
    let name = "rate_limit:replicas:many";
    let limiter = hot(&client, name).await;
    pair.cut_off(true).await;
    // 64 callers, 2 ms apart: more than the rounds of 8 connections can take, unless
    // a slow machine spreads them out; then again, at most three times. Every caller of
    // every attempt answers by its deadline and spends nothing unsent.
    let mut busy_seen = 0;
    for _ in 0..3 {
        let before = pair.grants(name).await;
        let results = at_once(&limiter, 64, Duration::from_millis(2)).await;
        let (mut not_replicated, mut busy) = (0, 0);
        for (result, took) in &results {
            match result {
                Err(Error::NotReplicated { .. }) => not_replicated += 1,
                Err(err @ Error::ReplicaWaitsBusy { .. }) => {
                    assert!(err.is_backend_failure() && err.is_transient(), "{err:?}");
                    busy += 1;
                }
                other => panic!("{other:?} after {took:?}"),
            }
            assert!(
                *took < timeout + Duration::from_millis(50),
                "answered after {took:?}"
            );
        }
        let mut raw = pair.master.raw().await;
        let clients: String = redis::cmd("CLIENT")
            .arg("LIST")
            .arg("TYPE")
            .arg("normal")
            .query_async(&mut raw)
            .await
            .unwrap();
        println!(
            "replica cut off, 64 callers 2 ms apart: {not_replicated} NotReplicated, {busy} ReplicaWaitsBusy; \
             connections on the master: {}",
            clients.lines().count()
        );
        // Only the grants sent are in the log: one unsent spent nothing.
        assert_eq!(pair.grants(name).await, before + not_replicated);
        // The client's shared connection, at most 8 of its own, and this one.
        assert!(clients.lines().count() <= 1 + 8 + 1, "{clients}");
        busy_seen += busy;
        if busy > 0 {
            break;
        }
    }
    assert!(busy_seen > 0, "the connections were never all busy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_the_server_refuses_is_an_error_never_a_grant() {
    let pair = Pair::start().await;
    let mut raw = pair.master.raw().await;
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "nowait",
            "on",
            ">nowait-password",
            "~*",
            "&*",
            "+@all",
            "-wait",
        ])
        .query_async(&mut raw)
        .await
        .unwrap();
    let client = Client::builder()
        .command_timeout(COMMAND_TIMEOUT)
        .wait_for_replicas(1, Duration::from_millis(100))
        .connect(&format!(
            "redis://nowait:nowait-password@127.0.0.1:{}/",
            pair.master.port
        ))
        .await
        .unwrap();
    let name = "rate_limit:replicas:nowait";
    let limiter = client.rate_limiter(name);
    limiter
        .try_set_rate(RateType::Overall, 10, Duration::from_secs(600))
        .await
        .unwrap();
    for _ in 0..3 {
        let err = limiter.try_acquire(1).await.unwrap_err();
        assert!(matches!(err, Error::NoPermission { .. }), "{err:?}");
    }
    // Granted on the master, never answered as grants: the permits stay taken.
    assert_eq!(pair.grants(name).await, 3);
}

/// Behind Sentinel, the connections a client waits on follow a failover: after
/// `SENTINEL FAILOVER`, waited grants fail (`NotReplicated` while the new master has
/// no replica) until the old master is the new one's replica, then are granted, on
/// the new master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waited_grants_follow_a_failover_to_the_new_master() {
    let set = support::sentinel::RedisSentinel::start();
    let client = Client::builder()
        .command_timeout(COMMAND_TIMEOUT)
        .wait_for_replicas(1, Duration::from_millis(200))
        .connect(&set.url())
        .await
        .unwrap();
    let name = "rate_limit:replicas:failover";
    let limiter = hot(&client, name).await;
    let (old_master, new_master) = set.data_ports();
    let log = |port: u16| -> u64 {
        set.node_cli(port, &["zcard", &format!("{{{name}}}:permits")])
            .trim()
            .parse()
            .unwrap_or(0)
    };
    let port = set.sentinel_ports()[0];
    set.failover(port);
    let started = Instant::now();
    while set.master_port() != new_master {
        assert!(started.elapsed() < Duration::from_secs(30), "no failover");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let switched = log(old_master);
    let (mut failed, mut granted) = (0, 0);
    while granted < 5 {
        match limiter.try_acquire(1).await {
            Ok(true) => granted += 1,
            Ok(false) => panic!("refused"),
            Err(_) => {
                failed += 1;
                assert!(started.elapsed() < Duration::from_secs(60), "no grant replicated");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let (on_new, on_old) = (log(new_master), log(old_master));
    println!(
        "after the switch: {failed} waited calls failed, then 5 granted; the new master's log {on_new}, \
         the old one's {on_old} (it held {switched} at the switch)"
    );
    assert!(on_new >= switched + 5, "the grants are the new master's");
    assert!(on_old <= on_new, "{on_old} on the old master against {on_new}");
}

/// More replicas asked for than the master has (the most a client takes, 2^31 - 1:
/// Redis 7.0 answered `WAIT 2147483648` at once with 0): each grant waits its timeout
/// and fails. (`acknowledged` is what `WAIT` counted by the caller's deadline: Redis
/// answers a timed-out `WAIT` at its next timer tick, up to 100 ms late at the
/// default `hz`, so here usually 0.) A flushed script cache is loaded again on the
/// way, as on the shared connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_replicas_than_there_are_and_a_flushed_script_cache() {
    let pair = Pair::start().await;
    let timeout = Duration::from_millis(50);
    let client = Client::builder()
        .command_timeout(COMMAND_TIMEOUT)
        .wait_for_replicas(i32::MAX as u32, timeout)
        .connect(&pair.master.url())
        .await
        .unwrap();
    let name = "rate_limit:replicas:many_asked";
    let limiter = client.rate_limiter(name);
    limiter
        .try_set_rate(RateType::Overall, 100, Duration::from_secs(600))
        .await
        .unwrap();
    let mut raw = pair.master.raw().await;
    for flush in [false, true] {
        if flush {
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async(&mut raw)
                .await
                .unwrap();
        }
        let started = Instant::now();
        let err = limiter.try_acquire(1).await.unwrap_err();
        let took = started.elapsed();
        assert!(
            matches!(
                err,
                Error::NotReplicated {
                    wanted: 2_147_483_647,
                    acknowledged: 0 | 1,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            took >= timeout && took < timeout + Duration::from_millis(50),
            "{took:?}"
        );
    }
    assert_eq!(pair.grants(name).await, 2);
}
