//! A server that answers the scripts with what they never send (cargo feature `axum`):
//! a proxy in front of a real redis-server replies to every script call with a
//! malformed reply, and an axum server on loopback behind the layer is asked ten
//! times for a rule of 3 a minute under each `on_error` policy. No reply lets more
//! than the rule's rate through: `local` and `allow` decide in process (a reply that
//! does not parse lasts until someone acts; it is no outage to let calls through
//! on), `deny` refuses every call.
#![cfg(feature = "axum")]

use redlimit_test_support as support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use redlimit::tower::{LayerRule, RateLimitLayer, Settle};
use redlimit::{Algorithm, Client, Error, OnError};
use support::http::{send, serve};
use support::link::SilencingLink;
use support::lying::LyingProxy;
use support::RedisServer;

const MINUTE: Duration = Duration::from_secs(60);

/// A client on `proxy`, with time to spare for its slowest replies.
async fn on(proxy: &LyingProxy) -> Client {
    Client::builder()
        .command_timeout(Duration::from_secs(2))
        .connect(&proxy.url())
        .await
        .unwrap()
}

/// A client of the Redis Cluster whose one node `port` reaches, with the same time
/// to spare as [`on`]'s.
async fn on_cluster(port: u16) -> Client {
    Client::builder()
        .command_timeout(Duration::from_secs(2))
        .connect(&format!("redis+cluster://127.0.0.1:{port}/"))
        .await
        .unwrap()
}

/// The statuses of 8 requests to `addr`, each after `pause`.
async fn statuses(addr: SocketAddr, pause: Duration) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..8 {
        tokio::time::sleep(pause).await;
        statuses.push(send(addr, "GET", "/", &[]).await.status);
    }
    statuses
}

/// An axum server on loopback behind a layer of `rule` on `client`.
async fn behind(client: Client, rule: LayerRule) -> SocketAddr {
    let layer = RateLimitLayer::builder()
        .client(client)
        .rule(rule)
        .build()
        .unwrap();
    serve(Router::new().route("/", get(|| async { "ok" })).layer(layer)).await
}

/// Replies acquire.lua never sends, each with what it is.
const HOSTILE: [(&str, &[u8]); 12] = [
    (
        "a server without scripts",
        b"-ERR unknown command 'EVALSHA', with args beginning with: \r\n",
    ),
    (
        "an error code of the scripts' they never raise",
        b"-ERR redlimit:zzz:1 x\r\n",
    ),
    (
        "a script error naming a rule the call does not have",
        b"-ERR redlimit:bad_value:9 value x\r\n",
    ),
    (
        "a refusal by a rule the call does not have",
        b"*6\r\n:0\r\n:99\r\n:10\r\n:0\r\n:0\r\n:0\r\n",
    ),
    (
        "a grant that names a refusing rule",
        b"*6\r\n:1\r\n:1\r\n:0\r\n:0\r\n:5\r\n:0\r\n",
    ),
    ("a string", b"$7\r\ngranted\r\n"),
    ("a nil", b"$-1\r\n"),
    ("an empty table", b"*0\r\n"),
    ("a short table", b"*2\r\n:1\r\n:0\r\n"),
    (
        "a table of strings",
        b"*6\r\n$1\r\n1\r\n$1\r\n0\r\n$1\r\n0\r\n$1\r\n0\r\n$1\r\n5\r\n$1\r\n0\r\n",
    ),
    ("a table of tables", b"*1\r\n*1\r\n:1\r\n"),
    (
        "an unknown config change",
        b"*6\r\n:1\r\n:0\r\n:0\r\n:0\r\n:5\r\n:7\r\n",
    ),
];

#[tokio::test]
async fn no_malformed_script_reply_lets_calls_past_the_rate() {
    let server = RedisServer::start();
    for (what, reply) in HOSTILE {
        let proxy = LyingProxy::start(server.port, reply).await;
        let client = on(&proxy).await;
        // The reply's parse fails as it is meant to, naming the script.
        let rule = [redlimit::Rule::new("hostile:direct", 3, MINUTE)];
        match client.check_rules(&rule).await {
            Err(error @ Error::UnexpectedReply { .. }) => {
                assert!(!error.is_transient(), "{what}: {error}");
                assert!(
                    error.to_string().contains("answered an unexpected reply"),
                    "{what}: {error}"
                );
            }
            other => panic!("{what}: {other:?}"),
        }
        for (policy, most) in [(OnError::Local, 3), (OnError::Allow, 3), (OnError::Deny, 0)] {
            let addr = behind(
                client.clone(),
                LayerRule::new(format!("hostile:{policy:?}"), 3, MINUTE).on_error(policy),
            )
            .await;
            let mut granted = 0;
            for _ in 0..10 {
                let response = send(addr, "GET", "/", &[]).await;
                match response.status {
                    200 => granted += 1,
                    429 if most > 0 => {}
                    503 if most == 0 => {}
                    other => panic!("{what}, {policy:?}: status {other}"),
                }
            }
            assert_eq!(granted, most, "{what}, {policy:?}");
        }
        assert!(proxy.lies() > 3 * 10, "{what}: every decision reached the proxy");
    }
}

/// A lazy client whose URL cannot work until someone changes it (a cluster URL on a
/// single server, a sentinel URL on a server that is no sentinel, a wrong password on
/// a cluster or a server) is no outage: under `allow` its calls are decided in
/// process and the rule of 3 a minute holds through a real axum server. A lazy
/// cluster client's first connection says only that it found no node; the client
/// looks into why with a connection of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_that_cannot_work_switches_no_limit_off() {
    let server = RedisServer::start_with(&["--requirepass", "pw-4c8a"]);
    let port = server.port;
    for url in [
        format!("redis+cluster://:pw-4c8a@127.0.0.1:{port}/"),
        format!("redis+sentinel://:pw-4c8a@127.0.0.1:{port}/m"),
        format!("redis+cluster://:wrong-4c8a@127.0.0.1:{port}/"),
        format!("redis://:wrong-4c8a@127.0.0.1:{port}/"),
    ] {
        let client = Client::builder().connect_lazy(&url).unwrap();
        let error = client
            .check_rules(&[redlimit::Rule::new("lasting:direct", 3, MINUTE)])
            .await
            .unwrap_err();
        assert!(
            error.is_backend_failure() && !error.is_transient(),
            "{url}: {error:?}"
        );
        assert!(!format!("{error} {error:?}").contains("4c8a"), "{error:?}");
        let addr = behind(
            client,
            LayerRule::new("lasting", 3, MINUTE).on_error(OnError::Allow),
        )
        .await;
        let mut statuses = Vec::new();
        for _ in 0..6 {
            statuses.push(send(addr, "GET", "/", &[]).await.status);
        }
        assert_eq!(statuses, [200, 200, 200, 429, 429, 429], "{url}");
    }
}

/// Calls failing together on a lazy cluster client with a wrong password, behind a
/// link that takes 200 ms to carry each connection (the cluster client's tries then
/// take about 1.5 s, well within a command timeout of 5 s), all answer the refused
/// credentials: one looks into why, the others wait for what it finds (none answers
/// a transient failure that `allow` would let through), and the look is made once,
/// not once a call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_failing_together_share_one_look_into_why() {
    let server = RedisServer::start_with(&["--requirepass", "pw-4c8a"]);
    let link = support::link::FaultyLink::start(server.port).await;
    link.set(support::link::Fault::Slow(Duration::from_millis(200)));
    let url = format!("redis+cluster://:wrong-4c8a@127.0.0.1:{}/", link.port);
    let client = Client::builder()
        .command_timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(5))
        .connect_lazy(&url)
        .unwrap();
    let calls: Vec<_> = (0..100)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let rule = [redlimit::Rule::new(format!("together:{i}"), 3, MINUTE)];
                client.check_rules(&rule).await.unwrap_err()
            })
        })
        .collect();
    for call in calls {
        let error = call.await.unwrap();
        assert!(matches!(error, Error::AuthFailed { .. }), "{error:?}");
    }
    assert!(link.connections() < 20, "{} connections", link.connections());
}

/// A server's error reply is the server's, whatever words it holds: `CROSSSLOT` is not
/// a TLS failure for holding "ssl".
#[tokio::test]
async fn a_server_error_holding_ssl_is_not_a_tls_failure() {
    let server = RedisServer::start();
    let proxy = LyingProxy::start(
        server.port,
        b"-CROSSSLOT Keys in request don't hash to the same slot\r\n",
    )
    .await;
    let client = Client::builder().connect(&proxy.url()).await.unwrap();
    let rule = [redlimit::Rule::new("hostile:crossslot", 3, MINUTE)];
    let error = client.check_rules(&rule).await.unwrap_err();
    assert!(matches!(error, Error::Backend { .. }), "{error:?}");
    assert!(error.to_string().contains("CrossSlot"), "{error}");
}

/// A WRONGTYPE answered to the scripts sends the client looking for the key at fault,
/// one `TYPE` at a time: with every `TYPE` answered just inside the command timeout,
/// a call of three rules (fifteen keys) still answers within two timeouts.
#[tokio::test]
async fn the_search_for_a_wrong_type_takes_one_timeout_in_all() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(400);
    let proxy = LyingProxy::start_slow(
        server.port,
        b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
        Some(("TYPE", Duration::from_millis(350))),
    )
    .await;
    let client = Client::builder()
        .command_timeout(timeout)
        .connect(&proxy.url())
        .await
        .unwrap();
    let rules = ["a", "b", "c"].map(|n| redlimit::Rule::new(format!("hostile:{{t}}:{n}"), 3, MINUTE));
    let started = std::time::Instant::now();
    let error = client.check_rules(&rules).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(error, Error::WrongType { .. }), "{error:?}");
    assert!(took < 2 * timeout + Duration::from_millis(300), "took {took:?}");
}

/// A connection one reply out of step (a frame lost or one too many on the way): each
/// script call is handed the reply to the call before it, the first another command's
/// count. No call is granted on another call's answer, made in the same millisecond
/// too (the calls follow each other at once): under `deny` none is granted, under
/// `local` the rule's rate is, in process. For a sliding window (acquire.lua, its tag
/// in the member) and a token bucket (tokens.lua, its tag an argument).
#[tokio::test]
async fn a_connection_out_of_step_grants_nothing_on_another_calls_reply() {
    let server = RedisServer::start();
    let cases = [Algorithm::SlidingWindow, Algorithm::TokenBucket]
        .into_iter()
        .flat_map(|algorithm| [(algorithm, OnError::Deny, 0), (algorithm, OnError::Local, 3)]);
    for (algorithm, policy, most) in cases {
        let proxy = LyingProxy::start_out_of_step(server.port, b":1\r\n").await;
        let client = on(&proxy).await;
        let addr = behind(
            client,
            LayerRule::new(format!("out-of-step:{algorithm:?}:{policy:?}"), 3, MINUTE)
                .algorithm(algorithm)
                .on_error(policy),
        )
        .await;
        let mut granted = 0;
        for _ in 0..50 {
            granted += u32::from(send(addr, "GET", "/", &[]).await.status == 200);
        }
        assert_eq!(granted, most, "{algorithm:?} {policy:?}");
        assert!(
            proxy.lies() >= 10,
            "{algorithm:?} {policy:?}: decisions reached the proxy"
        );
    }
}

/// A refusal whose wait is past what the one-rule integer holds exactly (2^43 ms,
/// about 279 years: a "once ever" limit) is answered as a table and read as the
/// refusal it is, for a window and a bucket, on a real server.
#[tokio::test]
async fn a_refusal_that_waits_for_centuries_is_a_refusal() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let ever = Duration::from_millis(1 << 50);
    let window = redlimit::Rule::new("once:window", 1, ever).keep_alive(None);
    let bucket = redlimit::Rule::new("once:bucket", 1, ever)
        .algorithm(redlimit::Algorithm::TokenBucket)
        .burst(1);
    for rule in [window, bucket] {
        let rule = [rule];
        assert!(client.check_rules(&rule).await.unwrap().allowed);
        for _ in 0..3 {
            let refused = client.check_rules(&rule).await.unwrap();
            assert!(!refused.allowed, "{refused:?}");
            assert!(refused.retry_after.unwrap() > Duration::from_millis(1 << 43));
        }
    }
}

/// A connection that went out of step once (here: the first to carry a script call,
/// each of its calls handed the reply to the call before) is made again at the first
/// reply that does not fit, and the new connection is in step: Redis decides again.
/// Under `deny`, the call handed another's reply fails (503; Redis had not run it, its
/// script not loaded yet); the rule's 3 grants follow, then Redis's refusals (429).
#[tokio::test]
async fn a_connection_out_of_step_is_made_again_and_redis_decides_again() {
    let server = RedisServer::start();
    let proxy = LyingProxy::start_out_of_step_once(server.port, b":1\r\n").await;
    let client = on(&proxy).await;
    let addr = behind(
        client,
        LayerRule::new("out-of-step-once", 3, MINUTE).on_error(OnError::Deny),
    )
    .await;
    let statuses = statuses(addr, Duration::from_millis(3)).await;
    assert_eq!(statuses, [503, 200, 200, 200, 429, 429, 429, 429]);
    assert_eq!(proxy.lies(), 1, "one call was handed another's reply");
}

/// The same on a Redis Cluster, its one node behind the proxy (the topology it
/// announces names the proxy): a new cluster connection is made, and put in place
/// once connected; Redis decides again.
#[tokio::test]
async fn a_cluster_connection_out_of_step_is_made_again_and_redis_decides_again() {
    let port = support::cluster::free_node_port();
    let proxy = LyingProxy::start_out_of_step_once(port, b":1\r\n").await;
    let _cluster = support::cluster::RedisCluster::one_node(port, proxy.port);
    let client = on_cluster(proxy.port).await;
    let addr = behind(
        client,
        LayerRule::new("cluster-out-of-step", 3, MINUTE).on_error(OnError::Deny),
    )
    .await;
    // The new connection is put in place once connected.
    let statuses = statuses(addr, Duration::from_millis(100)).await;
    assert_eq!(statuses, [503, 200, 200, 200, 429, 429, 429, 429]);
    assert_eq!(proxy.lies(), 1, "one call was handed another's reply");
}

/// A cluster connection that cannot be made again is kept: the URL's one node cannot
/// be reached any more (the link it was reached by is gone), while the node the
/// topology names still answers. A reply that does not fit (once; the connection
/// stays in step) has a new connection tried, which fails; the old one serves on,
/// and Redis decides. Put in place unconnected, a new connection would fail every
/// call that follows.
#[tokio::test]
async fn a_cluster_connection_is_kept_when_its_nodes_cannot_be_reached() {
    let port = support::cluster::free_node_port();
    let proxy = LyingProxy::start_lying_once(port, b":1\r\n").await;
    let seed = SilencingLink::start(port).await;
    let _cluster = support::cluster::RedisCluster::one_node(port, proxy.port);
    let client = on_cluster(seed.port).await;
    drop(seed);
    let addr = behind(
        client,
        LayerRule::new("cluster-kept", 3, MINUTE).on_error(OnError::Deny),
    )
    .await;
    let connections = proxy.connections();
    let statuses = statuses(addr, Duration::from_millis(100)).await;
    assert_eq!(statuses, [503, 200, 200, 200, 429, 429, 429, 429]);
    assert_eq!(proxy.lies(), 1);
    assert_eq!(proxy.connections(), connections, "the old connection served on");
}

/// A cluster connection runs a task of its own. Made again at a call on a runtime
/// that then ends (a client shared by two runtimes: a thread's own, a test's), it
/// runs on the runtime the client was made on, and serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_connection_made_again_outlives_the_runtime_that_had_it_made() {
    let port = support::cluster::free_node_port();
    let proxy = LyingProxy::start_lying_once(port, b":1\r\n").await;
    let _cluster = support::cluster::RedisCluster::one_node(port, proxy.port);
    let client = on_cluster(proxy.port).await;
    let rules = [redlimit::Rule::new("rate_limit:cluster-outlives", 100, MINUTE)];
    let on_thread = (client.clone(), rules.clone());
    // On a runtime of its own: the reply replaced has the connection made again;
    // the new one decides; the runtime ends.
    std::thread::spawn(move || {
        let (client, rules) = on_thread;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let err = client.check_rules(&rules).await.unwrap_err();
            assert!(matches!(err, Error::UnexpectedReply { .. }), "{err:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(client.check_rules(&rules).await.unwrap().allowed);
        });
    })
    .join()
    .unwrap();
    for _ in 0..10 {
        assert!(client.check_rules(&rules).await.unwrap().allowed);
    }
}

/// A cluster connection made on a runtime that then shuts down (the client made in
/// a thread's own runtime, used after in another) dies with it: its task is gone,
/// and every command handed to it fails with a broken pipe. The first call after
/// has it made again on a runtime that lasts before it sends, and Redis decides it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_connection_whose_runtime_ended_is_made_again() {
    let port = support::cluster::free_node_port();
    let _cluster = support::cluster::RedisCluster::one_node(port, port);
    let url = format!("redis+cluster://127.0.0.1:{port}/");
    let rules = [redlimit::Rule::new("rate_limit:cluster-runtime", 100, MINUTE)];
    let on_thread = rules.clone();
    let client = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let client = Client::builder()
                .command_timeout(Duration::from_secs(2))
                .connect(&url)
                .await
                .unwrap();
            assert!(client.check_rules(&on_thread).await.unwrap().allowed);
            client
        })
    })
    .join()
    .unwrap();
    let ended = Instant::now();
    let mut failed = 0;
    while !client
        .check_rules(&rules)
        .await
        .is_ok_and(|decision| decision.allowed)
    {
        failed += 1;
        assert!(
            ended.elapsed() < Duration::from_secs(3),
            "{failed} calls failed in 3 s after the runtime ended"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "decided again {:?} after the runtime ended, {failed} calls failed",
        ended.elapsed()
    );
    assert_eq!(failed, 0, "the first call after the runtime ended failed");
}

/// A server whose every script reply does not fit is not connected to at every call:
/// the connection is made again at most once a second. Each call is decided by its
/// policy meanwhile (`local`: 3 of 50 granted).
#[tokio::test]
async fn a_server_that_never_fits_is_connected_to_at_most_once_a_second() {
    let server = RedisServer::start();
    let proxy = LyingProxy::start(server.port, b"$7\r\ngranted\r\n").await;
    let client = on(&proxy).await;
    let addr = behind(
        client,
        LayerRule::new("never-fits", 3, MINUTE).on_error(OnError::Local),
    )
    .await;
    let before = proxy.connections();
    let started = std::time::Instant::now();
    let mut granted = 0;
    for _ in 0..50 {
        granted += u32::from(send(addr, "GET", "/", &[]).await.status == 200);
    }
    let seconds = started.elapsed().as_secs() as usize;
    let during = proxy.connections() - before;
    assert_eq!(granted, 3);
    assert!(proxy.lies() >= 50, "every decision reached the proxy");
    assert!(
        (1..=1 + seconds).contains(&during),
        "{during} connections made again in {seconds} s of 50 calls"
    );
    // A second later, the next reply that does not fit has it made again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let after = proxy.connections();
    assert_eq!(send(addr, "GET", "/", &[]).await.status, 429);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(send(addr, "GET", "/", &[]).await.status, 429);
    assert!(proxy.connections() > after, "made again after a second");
}

/// A server that says it lacks the script and answers its load with another SHA1 (a
/// connection out of step hands a command another's reply): the load's reply does not
/// fit, so the script is not called again on the strength of it. Decided as any reply
/// that does not fit: none granted under `deny`, the rule's 3 in process under
/// `local` and `allow`. (The load's SHA1 was asserted in a debug build, which
/// panicked the request's task.)
#[tokio::test]
async fn a_script_load_answered_with_another_sha1_is_a_reply_that_does_not_fit() {
    const NOSCRIPT: &[u8] = b"-NOSCRIPT No matching script. Please use EVAL.\r\n";
    const ANOTHER: &[u8] = b"$40\r\n0123456789012345678901234567890123456789\r\n";
    let server = RedisServer::start();
    let proxy = LyingProxy::start_loading(server.port, NOSCRIPT, ANOTHER).await;
    let client = on(&proxy).await;
    let rule = [redlimit::Rule::new("another-sha1", 3, MINUTE)];
    let error = client.check_rules(&rule).await.unwrap_err();
    assert!(matches!(error, Error::UnexpectedReply { .. }), "{error:?}");
    assert!(error.to_string().contains("another SHA1"), "{error}");
    // A load answered with what no load answers: a nil, an integer.
    for load in [&b"$-1\r\n"[..], b":1\r\n"] {
        let proxy = LyingProxy::start_loading(server.port, NOSCRIPT, load).await;
        let client = Client::connect(&proxy.url()).await.unwrap();
        let error = client.check_rules(&rule).await.unwrap_err();
        assert!(matches!(error, Error::UnexpectedReply { .. }), "{error:?}");
    }
    for (policy, most) in [(OnError::Deny, 0), (OnError::Local, 3), (OnError::Allow, 3)] {
        let proxy = LyingProxy::start_loading(server.port, NOSCRIPT, ANOTHER).await;
        let client = on(&proxy).await;
        let addr = behind(
            client,
            LayerRule::new(format!("another-sha1:{policy:?}"), 3, MINUTE).on_error(policy),
        )
        .await;
        let mut granted = 0;
        for _ in 0..10 {
            granted += u32::from(send(addr, "GET", "/", &[]).await.status == 200);
        }
        assert_eq!(granted, most, "{policy:?}");
        assert!(
            proxy.lies() >= 20,
            "{policy:?}: every call and load reached the proxy"
        );
    }
}

/// With `wait_for_replicas`, a script the server says it lacks is loaded within what
/// is left of the call's command timeout: a server that answers `NOSCRIPT` just before
/// the timeout and never answers the load has the call fail by its command timeout,
/// not by two.
#[tokio::test]
async fn a_late_noscript_and_a_silent_load_end_by_the_command_timeout() {
    const NOSCRIPT: &[u8] = b"-NOSCRIPT No matching script. Please use EVAL.\r\n";
    const TIMEOUT: Duration = Duration::from_millis(500);
    let server = RedisServer::start();
    let late = Some(("EVALSHA", Duration::from_millis(450)));
    let proxy = LyingProxy::start_loading_slow(server.port, NOSCRIPT, b"", late).await;
    let client = Client::builder()
        .command_timeout(TIMEOUT)
        .wait_for_replicas(1, Duration::from_millis(200))
        .connect(&proxy.url())
        .await
        .unwrap();
    let rule = [redlimit::Rule::new("late-noscript", 3, MINUTE)];
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let error = client.check_rules(&rule).await.unwrap_err();
        let took = started.elapsed();
        assert!(matches!(error, Error::Timeout { .. }), "{error:?}");
        assert!(took < TIMEOUT + Duration::from_millis(150), "took {took:?}");
    }
}

/// A network that silences every connection once it has carried a call (a flow
/// forgotten again and again): the connection is made again after two command
/// timeouts without a reply, at most once a second. Each timeout is decided by the rule's policy (`deny`:
/// 503), the call after each making again by Redis, and Redis's grants stay within
/// the rate.
#[tokio::test]
async fn a_network_that_silences_every_connection_costs_one_connection_a_second() {
    let server = RedisServer::start();
    let link = SilencingLink::start(server.port).await;
    let client = Client::builder()
        .command_timeout(Duration::from_millis(100))
        .connect(&link.url())
        .await
        .unwrap();
    let addr = behind(
        client,
        LayerRule::new("silenced", 3, MINUTE).on_error(OnError::Deny),
    )
    .await;
    // (Connecting took two: the client's check, then its connection.)
    let connected = link.connections();
    let started = Instant::now();
    let mut statuses = Vec::new();
    while started.elapsed() < Duration::from_millis(3_500) {
        statuses.push(send(addr, "GET", "/", &[]).await.status);
        link.silence_open();
    }
    let seconds = started.elapsed().as_secs_f64().ceil() as usize;
    let count = |status| statuses.iter().filter(|&&s| s == status).count();
    assert_eq!(
        count(200) + count(429) + count(503),
        statuses.len(),
        "{statuses:?}"
    );
    assert!(count(200) <= 3, "{statuses:?}");
    assert!(count(200) + count(429) >= 3, "Redis decided again: {statuses:?}");
    let made_again = link.connections() - connected;
    assert!(
        (1..=seconds).contains(&made_again),
        "made again {made_again} times in {seconds} s: {statuses:?}"
    );
}

/// A client's first decision reads the rate overrides, then runs the script: on a
/// server that stopped answering, the read's timeout is the decision's, and the
/// script is not sent after it (it took two timeouts). The request is answered by
/// the rule's policy within one command timeout: a rule decided, and a settled one
/// reserved.
#[tokio::test]
async fn a_first_decision_on_a_silent_server_takes_one_timeout() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(300);
    for settled in [false, true] {
        let client = Client::builder()
            .command_timeout(timeout)
            .connect(&server.url())
            .await
            .unwrap();
        let rule = LayerRule::new(format!("first:{settled}"), 3, MINUTE).on_error(OnError::Deny);
        let rule = match settled {
            true => rule.settle(Settle::header("x-used")),
            false => rule,
        };
        let addr = behind(client, rule).await;
        server.pause();
        let started = Instant::now();
        let status = send(addr, "GET", "/", &[]).await.status;
        let took = started.elapsed();
        server.resume();
        assert_eq!(status, 503, "settled: {settled}");
        assert!(took >= timeout, "settled: {settled}: {took:?}");
        assert!(
            took < timeout + Duration::from_millis(150),
            "settled: {settled}: {took:?}"
        );
        // The next request, the server back, is decided by Redis.
        assert_eq!(
            send(addr, "GET", "/", &[]).await.status,
            200,
            "settled: {settled}"
        );
    }
}
