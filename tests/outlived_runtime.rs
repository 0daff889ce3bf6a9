//! A client used after the runtime it was made on has ended, from callers on runtimes
//! of their own that each end after their call (a synchronous wrapper that builds a
//! runtime per call): the connection's task ended with the client's runtime, and the
//! first call to find it so has the connection made again on the library's runtime
//! before it sends. Every call is decided by Redis.

use redlimit_test_support as support;

use std::future::Future;
use std::time::Duration;

use redlimit::{Client, RateType, Reserved, Rule};
use support::RedisServer;

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// `call` made by `n` threads at once, each on a current-thread runtime of its own:
/// their answers.
fn at_once<T: Send>(n: usize, call: impl Fn(&tokio::runtime::Runtime) -> T + Sync) -> Vec<T> {
    let ready = std::sync::Barrier::new(n);
    std::thread::scope(|threads| {
        let callers: Vec<_> = (0..n)
            .map(|_| {
                threads.spawn(|| {
                    let runtime = current_thread();
                    ready.wait();
                    call(&runtime)
                })
            })
            .collect();
        callers.into_iter().map(|caller| caller.join().unwrap()).collect()
    })
}

/// A client of `server` made on a current-thread runtime that has since ended.
fn outlived_client(server: &RedisServer) -> Client {
    let made_on = current_thread();
    made_on.block_on(Client::connect(&server.url())).unwrap()
}

/// `made_on`: the runtime the client is made on, ended after one call.
fn calls_from_runtimes_of_their_own(made_on: tokio::runtime::Runtime) {
    let server = RedisServer::start();
    calls_at(&server.url(), made_on);
}

/// Fifty calls from runtimes of their own, each ended after its call, on a client of
/// `url` made on `made_on`, ended after the client's first call: all decided by
/// Redis, and each grant counted once.
fn calls_at(url: &str, made_on: tokio::runtime::Runtime) -> Client {
    let client = made_on.block_on(async {
        let client = Client::connect(url).await.unwrap();
        let limiter = client.rate_limiter("outlived");
        assert!(limiter
            .try_set_rate(RateType::Overall, 1_000, Duration::from_secs(60))
            .await
            .unwrap());
        assert!(limiter.try_acquire(1).await.unwrap());
        client
    });
    drop(made_on);
    let mut failed = Vec::new();
    for call in 0..50 {
        let runtime = current_thread();
        match runtime.block_on(client.rate_limiter("outlived").try_acquire(1)) {
            Ok(granted) => assert!(granted, "call {call}"),
            Err(error) => failed.push(format!("call {call}: {error}")),
        }
    }
    assert!(failed.is_empty(), "{} of 50 failed: {failed:?}", failed.len());
    let left = current_thread().block_on(client.rate_limiter("outlived").available_permits());
    assert_eq!(left.unwrap(), 949);
    client
}

/// Through Sentinel: the master's connection, the sentinels' and the listener for
/// announced failovers all ended with the client's runtime. The commands are sent
/// from the library's runtime, where the master is looked for again, and its
/// listener, started again there, hears a failover: the calls follow the new master
/// on its announcement.
#[test]
fn a_sentinel_client_whose_runtime_ended() {
    let set = support::sentinel::RedisSentinel::start();
    let client = calls_at(&set.url(), multi_thread());
    let (_, replica) = set.data_ports();
    set.failover(set.sentinel_ports()[0]);
    let started = std::time::Instant::now();
    while set.master_port() != replica {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no failover within 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let named = std::time::Instant::now();
    let count = || -> u64 {
        let log = set.node_cli(replica, &["zcard", "{outlived}:permits"]);
        log.trim().parse().unwrap_or(0)
    };
    let limiter = client.rate_limiter("outlived");
    let mut failed = 0;
    loop {
        let before = count();
        match current_thread().block_on(limiter.try_acquire(1)) {
            Ok(granted) => {
                assert!(granted);
                if count() > before {
                    break;
                }
            }
            Err(_) => failed += 1,
        }
        assert!(
            named.elapsed() < Duration::from_secs(2),
            "not on the new master {:?} after it was named ({failed} calls failed)",
            named.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A Redis Cluster's connection runs its own task, which ended with the client's
/// runtime: made again once on the library's runtime, every call is decided.
#[test]
fn a_cluster_client_whose_runtime_ended() {
    let cluster = support::cluster::RedisCluster::start(3, 0);
    calls_at(&cluster.url(), current_thread());
}

#[test]
fn a_client_made_on_a_multi_thread_runtime_that_ended() {
    calls_from_runtimes_of_their_own(multi_thread());
}

#[test]
fn a_client_made_on_a_current_thread_runtime_that_ended() {
    calls_from_runtimes_of_their_own(current_thread());
}

/// Eight callers at once, each on a runtime of its own, the first calls on a client
/// whose runtime has ended: one has the connection made again, the others wait for
/// it, and all eight are granted, the last of a rate of eight.
#[test]
fn callers_at_once_on_a_client_whose_runtime_ended_all_go_through() {
    let server = RedisServer::start();
    let client = outlived_client(&server);
    let limiter = client.rate_limiter("at-once");
    let answers = at_once(8, |runtime| {
        runtime.block_on(async {
            limiter
                .try_set_rate(RateType::Overall, 8, Duration::from_secs(60))
                .await?;
            limiter.try_acquire(1).await
        })
    });
    let failed: Vec<_> = answers
        .iter()
        .filter_map(|answer| answer.as_ref().err())
        .collect();
    assert!(failed.is_empty(), "{} of 8 failed: {failed:?}", failed.len());
    assert!(
        answers.iter().all(|answer| *answer.as_ref().unwrap()),
        "{answers:?}"
    );
    let runtime = current_thread();
    assert!(
        !runtime.block_on(limiter.try_acquire(1)).unwrap(),
        "a ninth of 8 granted"
    );
}

/// A settle started by a caller whose runtime ends right after (the settle's future
/// polled once, then dropped with its runtime), on a client whose own runtime has
/// ended: the settle runs on the library's runtime and lands, each 900 used of 10
/// reserved charged.
#[test]
fn a_settle_from_a_caller_whose_runtime_ends_lands() {
    let server = RedisServer::start();
    let client = outlived_client(&server);
    let name = |user: u64| format!("outlived:tokens:{user}");
    for user in 0..5 {
        let runtime = current_thread();
        runtime.block_on(async {
            let rules = [Rule::new(name(user), 10_000, Duration::from_secs(60))
                .settled()
                .permits(10)];
            let Reserved::Granted(reservation) = client.reserve(&rules).await.unwrap() else {
                panic!("refused");
            };
            let mut settle = Box::pin(reservation.settle(900));
            let waker = std::task::Waker::noop();
            let _ = settle.as_mut().poll(&mut std::task::Context::from_waker(waker));
        });
        drop(runtime);
    }
    // Reserved on a runtime, settled by a future polled once outside any: it goes to
    // the library's runtime (it panicked, its timer wanting a runtime).
    let reservation = current_thread().block_on(async {
        let rules = [Rule::new(name(5), 10_000, Duration::from_secs(60))
            .settled()
            .permits(10)];
        match client.reserve(&rules).await.unwrap() {
            Reserved::Granted(reservation) => reservation,
            _ => panic!("refused"),
        }
    });
    let mut settle = Box::pin(reservation.settle(900));
    let waker = std::task::Waker::noop();
    let _ = settle.as_mut().poll(&mut std::task::Context::from_waker(waker));
    drop(settle);
    let reader = current_thread();
    for user in 0..6 {
        let limiter = client.rate_limiter(name(user));
        let landed = reader.block_on(async {
            let started = std::time::Instant::now();
            loop {
                let left = limiter.available_permits().await.unwrap();
                if left == 9_100 || started.elapsed() > Duration::from_secs(2) {
                    return left;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        assert_eq!(landed, 9_100, "user {user}: 900 used of 10 reserved");
    }
}

/// The server restarted under a client whose own runtime has ended, used from callers
/// on runtimes of their own: the connection, carried on the library's runtime,
/// connects again there, and the calls after the restart are decided by Redis but for
/// the one that finds the connection lost.
#[test]
fn a_server_restarted_under_a_client_whose_runtime_ended() {
    let server = RedisServer::start();
    let client = outlived_client(&server);
    restarted_under(&client, server);
}

/// The same under a client whose own runtime runs on (a multi-thread one), used from
/// callers on runtimes of their own: the caller that finds the connection lost has it
/// carried on the client's runtime, where it connects again, rather than on its own,
/// which ends after its call (before, about every other call failed, with no end).
#[test]
fn a_server_restarted_under_a_client_on_a_live_runtime_used_from_others() {
    let server = RedisServer::start();
    let made_on = multi_thread();
    let client = made_on.block_on(Client::connect(&server.url())).unwrap();
    restarted_under(&client, server);
    drop(made_on);
}

/// The limiter set and called 5 times, `server` restarted, then set again once it
/// answers and called 50 times, each from a runtime of its own: at most one call
/// fails after the restart.
fn restarted_under(client: &Client, server: RedisServer) {
    let limiter = client.rate_limiter("restarted");
    let set = || {
        let set = limiter.try_set_rate(RateType::Overall, 1_000, Duration::from_secs(60));
        current_thread().block_on(set)
    };
    let call = || current_thread().block_on(limiter.try_acquire(1));
    assert!(set().unwrap());
    for _ in 0..5 {
        assert!(call().unwrap());
    }
    let port = server.stop();
    let _server = RedisServer::start_on(port);
    let mut failed = Vec::new();
    for attempt in 0..50 {
        // (a restarted server has lost the limiter: set again once it answers)
        match set() {
            Ok(_) => break,
            Err(error) => failed.push(format!("set {attempt}: {error}")),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for attempt in 0..50 {
        if let Err(error) = call() {
            failed.push(format!("call {attempt}: {error}"));
        }
    }
    assert!(failed.len() <= 1, "{} failed: {failed:?}", failed.len());
}

/// The server down when the client's runtime ends, back a moment later: the first
/// call after the end carries the connection on the library's runtime whatever the
/// server's state, so once it is back every call is decided (before, a connection
/// made on a caller's runtime failed about every other call for a second).
#[test]
fn a_server_down_when_the_runtime_ends_is_reached_once_back() {
    let server = RedisServer::start();
    let made_on = current_thread();
    let client = made_on.block_on(Client::connect(&server.url())).unwrap();
    let limiter = client.rate_limiter("back");
    let set = |on: &tokio::runtime::Runtime| {
        on.block_on(limiter.try_set_rate(RateType::Overall, 1_000, Duration::from_secs(60)))
    };
    assert!(set(&made_on).unwrap());
    let port = server.stop();
    drop(made_on);
    for _ in 0..2 {
        assert!(current_thread().block_on(limiter.try_acquire(1)).is_err());
    }
    let _server = RedisServer::start_on(port);
    let back = std::time::Instant::now();
    while set(&current_thread()).is_err() {
        assert!(back.elapsed() < Duration::from_secs(5), "not reached in 5 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut failed = Vec::new();
    for attempt in 0..40 {
        if let Err(error) = current_thread().block_on(limiter.try_acquire(1)) {
            failed.push(format!("call {attempt}: {error}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(failed.is_empty(), "{} of 40 failed: {failed:?}", failed.len());
}

/// A frozen server under a client whose runtime has ended: 16 callers at once, each
/// on a runtime of its own, the first of them carrying the connection. Each answers
/// within its command timeout, the carrying inside it (before, 500 ms for a timeout
/// of 250 ms: the carrying waited a timeout of its own).
#[test]
fn calls_on_a_frozen_server_after_the_runtime_ended_answer_within_their_timeout() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(250);
    let made_on = current_thread();
    let client = made_on
        .block_on(Client::builder().command_timeout(timeout).connect(&server.url()))
        .unwrap();
    let limiter = client.rate_limiter("frozen");
    let set = limiter.try_set_rate(RateType::Overall, 1_000, Duration::from_secs(60));
    assert!(made_on.block_on(set).unwrap());
    drop(made_on);
    server.pause();
    let took = at_once(16, |runtime| {
        let started = std::time::Instant::now();
        let answer = runtime.block_on(limiter.try_acquire(1));
        (started.elapsed(), answer.is_err())
    });
    server.resume();
    assert!(took.iter().all(|&(_, failed)| failed), "{took:?}");
    let slowest = took.iter().map(|&(took, _)| took).max().unwrap();
    assert!(
        slowest < timeout + Duration::from_millis(100),
        "slowest {slowest:?}: {took:?}"
    );
}

/// A client that waits for replicas (`wait_for_replicas`), its runtime ended: the
/// connections kept for `WAIT` ended with it, and are let go before the first call
/// after; the rounds run, and make their connections, on the library's runtime, not
/// on the callers', which end after each call (before, 25 of 50 failed).
#[test]
fn a_client_waiting_for_replicas_whose_runtime_ended() {
    let master = RedisServer::start();
    let _replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
    let linked = std::time::Instant::now();
    let info = || {
        let mut raw = redis::Client::open(master.url())
            .unwrap()
            .get_connection()
            .unwrap();
        redis::cmd("INFO")
            .arg("replication")
            .query::<String>(&mut raw)
            .unwrap()
    };
    while !info().contains("state=online") {
        assert!(
            linked.elapsed() < Duration::from_secs(10),
            "the replica did not link in 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let made_on = current_thread();
    let client = made_on.block_on(async {
        let builder = Client::builder()
            .command_timeout(Duration::from_secs(2))
            .wait_for_replicas(1, Duration::from_secs(1));
        builder.connect(&master.url()).await.unwrap()
    });
    let limiter = client.rate_limiter("replicated");
    let set = limiter.try_set_rate(RateType::Overall, 1_000, Duration::from_secs(60));
    assert!(made_on.block_on(set).unwrap());
    assert!(made_on.block_on(limiter.try_acquire(1)).unwrap());
    drop(made_on);
    fifty_granted(&limiter, 949);
    // One connecting lazily, made outside any runtime, called from runtimes of their own.
    let builder = Client::builder()
        .command_timeout(Duration::from_secs(2))
        .wait_for_replicas(1, Duration::from_secs(1));
    let lazy = builder.connect_lazy(&master.url()).unwrap();
    lazy_calls_from_runtimes_of_their_own(&lazy, "replicated-lazy");
}

/// Every connection of `server`'s clients but the one killing them closed.
fn kill_connections(server: &RedisServer) {
    let mut raw = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let kill = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
        .query::<u64>(&mut raw);
    assert!(kill.unwrap() >= 1, "no connection killed");
}

/// A client made on a current-thread runtime that is kept and runs only while its own
/// callers block on it, used too from a runtime of another thread: a connection
/// carried on the library's runtime stays there when a caller on the client's runtime
/// finds it lost. Carried onto the client's runtime, the other runtime's commands
/// waited until it next ran, and timed out (before, 12 of 12 calls from the other
/// runtime timed out while the client's was idle).
#[test]
fn a_connection_carried_on_the_library_s_runtime_stays_there() {
    let server = RedisServer::start();
    let (made_on, other) = (current_thread(), current_thread());
    let client = made_on
        .block_on(
            Client::builder()
                .command_timeout(Duration::from_millis(250))
                .connect(&server.url()),
        )
        .unwrap();
    let limiter = client.rate_limiter("stays");
    let set = limiter.try_set_rate(RateType::Overall, 1_000_000, Duration::from_secs(3_600));
    assert!(made_on.block_on(set).unwrap());
    // Lost, found by a caller on the other runtime: carried on the library's.
    kill_connections(&server);
    made_on.block_on(async { tokio::time::sleep(Duration::from_millis(50)).await });
    for _ in 0..3 {
        let _ = other.block_on(limiter.try_acquire(1));
    }
    // (past the least time between two makings again)
    std::thread::sleep(Duration::from_millis(1_100));
    // Lost again, found by callers on the client's runtime.
    kill_connections(&server);
    std::thread::sleep(Duration::from_millis(50));
    for _ in 0..3 {
        let _ = made_on.block_on(limiter.try_acquire(1));
    }
    // The client's runtime idle: the other runtime's calls are decided.
    let failed: Vec<_> = (0..12)
        .filter_map(|_| other.block_on(limiter.try_acquire(1)).err())
        .collect();
    assert!(failed.is_empty(), "{} of 12 failed: {failed:?}", failed.len());
}

/// A client made on a current-thread runtime that is kept and not run again, used
/// from runtimes of their own: the connection's tasks there would wait for it to
/// run. The first call has the connection made again on the library's runtime, and
/// every call is decided (before, 6 of 10 failed: timeouts until a connection was made
/// again on a caller's runtime, which then ended).
#[test]
fn a_client_on_a_current_thread_runtime_not_run_again_serves_other_runtimes() {
    let server = RedisServer::start();
    let made_on = current_thread();
    let client = made_on.block_on(Client::connect(&server.url())).unwrap();
    let limiter = client.rate_limiter("not-run");
    let set = limiter.try_set_rate(RateType::Overall, 1_000, Duration::from_secs(60));
    assert!(made_on.block_on(set).unwrap());
    let failed: Vec<_> = (0..10)
        .filter_map(|_| current_thread().block_on(limiter.try_acquire(1)).err())
        .collect();
    assert!(failed.is_empty(), "{} of 10 failed: {failed:?}", failed.len());
    assert_eq!(made_on.block_on(limiter.available_permits()).unwrap(), 990);
}

/// Through Sentinel, a client on a multi-thread runtime that runs, used from runtimes
/// of their own: the caller that finds the master's connection lost has it carried on
/// the client's runtime, where the listener for announced failovers still runs. One
/// listener stays (before, a second was started beside it: two subscriptions).
#[test]
fn a_sentinel_connection_carried_on_a_live_runtime_keeps_one_listener() {
    let set = support::sentinel::RedisSentinel::start();
    let made_on = multi_thread();
    let client = made_on.block_on(Client::connect(&set.url())).unwrap();
    let limiter = client.rate_limiter("one-listener");
    let rate = limiter.try_set_rate(RateType::Overall, 1_000, Duration::from_secs(60));
    assert!(made_on.block_on(rate).unwrap());
    let subscribed = || -> usize {
        let lists = set
            .sentinel_ports()
            .into_iter()
            .map(|port| set.sentinel_cli(port, &["client", "list"]));
        lists
            .map(|list| list.lines().filter(|line| line.contains(" sub=1 ")).count())
            .sum()
    };
    let listening = std::time::Instant::now();
    while subscribed() == 0 {
        assert!(listening.elapsed() < Duration::from_secs(5), "no listener in 5 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let master = set.master_port();
    set.node_cli(master, &["client", "kill", "type", "normal"]);
    let mut failed = Vec::new();
    for call in 0..20 {
        if let Err(error) = current_thread().block_on(limiter.try_acquire(1)) {
            failed.push(format!("call {call}: {error}"));
        }
    }
    for f in &failed {
        eprintln!("DBG {}", &f[..f.len().min(260)]);
    }
    assert!(failed.len() <= 1, "{} of 20 failed", failed.len());
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(subscribed(), 1, "listeners subscribed");
    drop(made_on);
}

/// A client connected lazily, called only from runtimes made for each call: fifty
/// calls, each granted, none failing, and 950 left.
fn lazy_calls_from_runtimes_of_their_own(client: &Client, name: &str) {
    let limiter = client.rate_limiter(name);
    let set = limiter.try_set_rate(RateType::Overall, 1_000, Duration::from_secs(60));
    assert!(current_thread().block_on(set).unwrap());
    fifty_granted(&limiter, 950);
}

/// Fifty acquires of `limiter`, each from a runtime of its own: each granted, none
/// failing, and `left` permits left after.
fn fifty_granted(limiter: &redlimit::RateLimiter, left: u64) {
    let mut failed = Vec::new();
    for call in 0..50 {
        match current_thread().block_on(limiter.try_acquire(1)) {
            Ok(granted) => assert!(granted, "call {call}"),
            Err(error) => failed.push(format!("call {call}: {error}")),
        }
    }
    assert!(failed.is_empty(), "{} of 50 failed: {failed:?}", failed.len());
    let after = current_thread().block_on(limiter.available_permits());
    assert_eq!(after.unwrap(), left);
}

/// Connected lazily on a multi-thread runtime that runs on: the first connection is
/// made on the client's runtime, not on the first caller's, which ends with its call.
#[test]
fn a_lazy_client_on_a_live_runtime_called_only_from_others() {
    let server = RedisServer::start();
    let made_on = multi_thread();
    let client = made_on.block_on(async { Client::builder().connect_lazy(&server.url()) });
    lazy_calls_from_runtimes_of_their_own(&client.unwrap(), "lazy");
    drop(made_on);
}

/// Connected lazily outside any runtime: the first connection is made on the
/// library's runtime.
#[test]
fn a_lazy_client_made_outside_a_runtime_called_only_from_others() {
    let server = RedisServer::start();
    let client = Client::builder().connect_lazy(&server.url()).unwrap();
    lazy_calls_from_runtimes_of_their_own(&client, "lazy");
}

/// Lazy clients of `url`, one made on a live multi-thread runtime and one outside
/// any, each called only from runtimes of their own.
fn lazy_on_a_live_runtime_and_outside(url: &str) {
    let made_on = multi_thread();
    let client = made_on.block_on(async { Client::builder().connect_lazy(url) });
    lazy_calls_from_runtimes_of_their_own(&client.unwrap(), "lazy");
    drop(made_on);
    let outside = Client::builder().connect_lazy(url).unwrap();
    lazy_calls_from_runtimes_of_their_own(&outside, "lazy-outside");
}

/// The same through Sentinel, on a live runtime and outside any.
#[test]
fn a_lazy_sentinel_client_called_only_from_others() {
    let set = support::sentinel::RedisSentinel::start();
    lazy_on_a_live_runtime_and_outside(&set.url());
}

/// A Redis Cluster's, on a live runtime and outside any.
#[test]
fn a_lazy_cluster_client_called_only_from_others() {
    let cluster = support::cluster::RedisCluster::start(3, 0);
    lazy_on_a_live_runtime_and_outside(&cluster.url());
}

/// The client's background task (the overrides read every second, the refusals
/// reported, the rules published) started by a call from a runtime made for that
/// call: an override set later reaches the layer's requests within a few seconds.
#[test]
fn an_override_reaches_a_client_called_only_from_runtimes_of_their_own() {
    // the client's runtime one that runs, first called from another; or a
    // current-thread one, first called on it, then kept and not run again
    override_reaches(multi_thread(), false, (1_000, 2));
    override_reaches(current_thread(), true, (1_000, 2));
    // refused on it, and the refusal kept: later calls are answered in process
    override_reaches(current_thread(), true, (2, 1_000));
}

/// A layer of one rule of `rates.0` a minute on a client made on `made_on`, called
/// first on it or not: an override to `rates.1` set by another client changes the
/// answer of calls from runtimes of their own within 4 s.
fn override_reaches(made_on: tokio::runtime::Runtime, first_on_its_own: bool, rates: (u64, u64)) {
    use redlimit::tower::{LayerRule, RateLimitLayer};
    let server = RedisServer::start();
    let client = made_on.block_on(Client::connect(&server.url())).unwrap();
    let operator_on = multi_thread();
    let operator = operator_on.block_on(Client::connect(&server.url())).unwrap();
    let layer = RateLimitLayer::builder()
        .client(client)
        .rule(LayerRule::new("overridden", rates.0, Duration::from_secs(60)))
        .build()
        .unwrap();
    let router = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .layer(layer);
    let status_on = |on: &tokio::runtime::Runtime| {
        let request = axum::http::Request::new(axum::body::Body::empty());
        let called = tower_service::Service::call(&mut router.clone(), request);
        on.block_on(called).unwrap().status().as_u16()
    };
    let status = || status_on(&current_thread());
    let first = |n| {
        for _ in 0..n {
            match first_on_its_own {
                true => status_on(&made_on),
                false => status(),
            };
        }
    };
    // granted before the override lowers the rate; refused before it raises it
    let before = match rates.0 > rates.1 {
        true => {
            first(1);
            200
        }
        false => {
            first(rates.0 + 1);
            429
        }
    };
    assert_eq!(status(), before);
    let override_ = redlimit::RateOverride {
        of: redlimit::OverrideOf::Rule("overridden".into()),
        rate: rates.1,
        interval: Duration::from_secs(60),
    };
    operator_on.block_on(operator.set_override(&override_)).unwrap();
    let set = std::time::Instant::now();
    while status() == before {
        assert!(
            set.elapsed() < Duration::from_secs(4),
            "an override of {} a minute not applied 4 s after it was set",
            rates.1
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Lazy clients whose first call is an acquire (the limiter set by another client),
/// each call from a runtime of its own: the server's check, due at the first call, is
/// made on a runtime that lasts too, so it does not make the connection on the
/// caller's runtime (before, 9 or 10 of the 10 clients failed their second call with
/// a broken pipe).
#[test]
fn lazy_clients_whose_first_call_acquires() {
    let server = RedisServer::start();
    let setter_on = multi_thread();
    let setter = setter_on.block_on(Client::connect(&server.url())).unwrap();
    let setting = setter.rate_limiter("first-acquire");
    let set = setting.try_set_rate(RateType::Overall, 1_000, Duration::from_secs(60));
    assert!(setter_on.block_on(set).unwrap());
    let made_on = multi_thread();
    let mut failed = Vec::new();
    for round in 0..10 {
        let lazy = match round % 2 {
            0 => made_on.block_on(async { Client::builder().connect_lazy(&server.url()) }),
            _ => Client::builder().connect_lazy(&server.url()),
        };
        let limiter = lazy.unwrap().rate_limiter("first-acquire");
        for call in 0..5 {
            if let Err(error) = current_thread().block_on(limiter.try_acquire(1)) {
                failed.push(format!("round {round}, call {call}: {error}"));
            }
        }
    }
    assert!(failed.is_empty(), "{} failed: {failed:?}", failed.len());
    let left = setter_on.block_on(setting.available_permits());
    assert_eq!(left.unwrap(), 950);
}

/// The value of the limiter `name` on `server`, read without a client.
fn value_of(server: &RedisServer, name: &str) -> Option<u64> {
    let mut raw = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("GET")
        .arg(format!("{{{name}}}:value"))
        .query(&mut raw)
        .unwrap()
}

/// Waits up to 3 s for the limiter `name` to hold `value`.
fn value_reaches(server: &RedisServer, name: &str, value: u64, what: &str) {
    let since = std::time::Instant::now();
    while value_of(server, name) != Some(value) {
        assert!(
            since.elapsed() < Duration::from_secs(3),
            "{what}: {value} not reached in 3 s ({:?})",
            value_of(server, name)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A batch of 10 a minute at 100, leased 0.3 s, for the limiter `name`.
fn batched(name: &str) -> [Rule; 1] {
    [Rule::new(name, 100, Duration::from_secs(60))
        .batch(10)
        .batch_lease(Duration::from_millis(300))]
}

/// A batch taken by a call from a runtime made for that call, no call after: the
/// sweeper gives back what it did not use once its lease ends. It runs on a runtime
/// that lasts, and is started again when the one it ran on ended.
#[test]
fn a_batch_taken_from_a_runtime_of_its_own_is_given_back() {
    let server = RedisServer::start();
    let mut made_on = Some(multi_thread());
    let client = made_on.as_ref().unwrap().block_on(Client::connect(&server.url()));
    let client = client.unwrap();
    let rules = batched("swept");
    // the client's runtime runs; then the runtime the sweeper ran on ends
    for round in 1..=2u64 {
        let call = client.check_rules(&rules);
        assert!(current_thread().block_on(call).unwrap().allowed);
        value_reaches(&server, "swept", 100 - round, &format!("round {round}"));
        drop(made_on.take());
    }
}

/// A batch taken on the client's runtime, which then ends during the lease: a call
/// served from the batch after starts the sweeper again, and a client dropped after
/// gives back what a batch did not use, though no call carried the connection. So
/// does a client dropped outside any runtime while its own runs, one on a
/// current-thread runtime kept and no longer run, dropped outside any (also once the
/// runtime ran the client's tasks a few turns after the call, its batches' sweeper
/// among them, which reads the resets announced: read where the client was held, the
/// reading's reply never came and the client was held for good, 90 left), and one
/// dropped with a task of its current-thread runtime as that runtime shuts down.
#[test]
fn a_batch_outliving_the_client_s_runtime_is_given_back() {
    let server = RedisServer::start();
    for how in ["served", "dropped", "outside", "idle", "idle-turned", "shutdown"] {
        let made_on = match how {
            "idle" | "idle-turned" | "shutdown" => current_thread(),
            _ => multi_thread(),
        };
        let client = made_on.block_on(Client::connect(&server.url())).unwrap();
        let rules = batched(how);
        assert!(made_on.block_on(async {
            let granted = client.check_rules(&rules).await.unwrap().allowed;
            for _ in 0..usize::from(how == "idle-turned") * 2 {
                tokio::task::yield_now().await;
            }
            granted
        }));
        let value = match how {
            "served" => {
                drop(made_on);
                let served = current_thread().block_on(client.check_rules(&rules));
                assert!(served.unwrap().allowed);
                98
            }
            // dropped inside a runtime, which the give-backs start from
            "dropped" => {
                drop(made_on);
                current_thread().block_on(async { drop(client) });
                99
            }
            "outside" | "idle" | "idle-turned" => {
                drop(client);
                value_reaches(&server, how, 99, how);
                drop(made_on);
                99
            }
            _ => {
                made_on.spawn(async move {
                    let _held = client;
                    std::future::pending::<()>().await;
                });
                drop(made_on);
                99
            }
        };
        value_reaches(&server, how, value, how);
    }
}

/// A refusal kept in process ends when another client resets the limiter: the
/// background task that reads the announcements runs, though every call of the client
/// is on a runtime made for it, or its own runtime, where the task started, ended
/// after the refusal was kept.
#[test]
fn a_kept_refusal_ends_with_a_reset_announced_elsewhere() {
    let server = RedisServer::start();
    let operator_on = multi_thread();
    let operator = operator_on.block_on(Client::connect(&server.url())).unwrap();
    // a client connecting lazily; one whose runtime ended; one whose current-thread
    // runtime is kept and no longer run, the start of the task left there unrun, or
    // polled once, its first read left waiting there
    let mut idle = None;
    for how in ["lazy", "ended", "idle", "polled"] {
        let name = format!("kept-{how}");
        let rules = [Rule::new(name.clone(), 2, Duration::from_secs(60))];
        let client = match how {
            "lazy" => Client::builder().connect_lazy(&server.url()).unwrap(),
            "idle" | "polled" => {
                let made_on = idle.insert(current_thread());
                let client = made_on.block_on(Client::connect(&server.url())).unwrap();
                while made_on.block_on(client.check_rules(&rules)).unwrap().allowed {}
                if how == "polled" {
                    // the start polled once, its read sent, then that runtime stops
                    made_on.block_on(tokio::task::yield_now());
                }
                client
            }
            _ => {
                // refused on its runtime, the background task started there; then
                // that runtime ends
                let made_on = multi_thread();
                let client = made_on.block_on(Client::connect(&server.url())).unwrap();
                while made_on.block_on(client.check_rules(&rules)).unwrap().allowed {}
                std::thread::sleep(Duration::from_millis(300));
                client
            }
        };
        let call = || current_thread().block_on(client.check_rules(&rules)).unwrap();
        while call().allowed {}
        assert!(!call().allowed, "{how}: refused, and kept");
        let limiter = operator.rate_limiter(&name);
        assert!(operator_on.block_on(limiter.delete()).unwrap());
        let since = std::time::Instant::now();
        while !call().allowed {
            assert!(
                since.elapsed() < Duration::from_secs(4),
                "{how}: the reset not heard 4 s after it"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
