//! The command timeout as the defaults set it (250 ms), against a frozen server
//! (SIGSTOP: connections open, nothing answers), with margins that catch a call
//! waiting twice: a plain call, and a function with a `timeout` whose wait is cut
//! by the outage.

use redlimit_test_support as support;

use std::time::{Duration, Instant};

use redlimit::{rate_limit, Client, Error, RateLimited, Rule, DEFAULT_COMMAND_TIMEOUT};
use support::link::SilencingLink;
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
    for call in 0..3 {
        let started = Instant::now();
        let err = client.check_rules(&rules).await.unwrap_err();
        let took = started.elapsed();
        // Two timeouts in a row had the connection made again: the third call's
        // timeout went to connecting.
        let connecting = call == 2;
        assert!(
            matches!(err, Error::Timeout { after, connecting: c } if after == DEFAULT_COMMAND_TIMEOUT && c == connecting),
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

/// The command timeout of the clients behind a [`SilencingLink`].
const SHORT: Duration = Duration::from_millis(200);

/// A server, a link in front of it, and a client through the link with a command
/// timeout of [`SHORT`].
async fn behind_a_link() -> (RedisServer, SilencingLink, Client) {
    let server = RedisServer::start();
    let link = SilencingLink::start(server.port).await;
    let client = Client::builder()
        .command_timeout(SHORT)
        .connect(&link.url())
        .await
        .unwrap();
    (server, link, client)
}

/// A client with a command timeout of [`SHORT`] of the Redis Cluster whose one node
/// `port` reaches.
async fn on_cluster(port: u16) -> Client {
    Client::builder()
        .command_timeout(SHORT)
        .connect(&format!("redis+cluster://127.0.0.1:{port}/"))
        .await
        .unwrap()
}

/// A connection that goes silent for good (a flow a NAT forgot, a host gone without
/// closing it: nothing comes back, nothing says the connection is lost) is made
/// again once no reply came for two command timeouts, and Redis decides
/// again: without that, every call would time out until the system gave the
/// connection up, many minutes later. The limit holds across the new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_gone_silent_is_made_again_after_two_timeouts() {
    let (_server, link, client) = behind_a_link().await;
    let before = link.connections();
    assert_eq!(silenced(&link, &client, "rate_limit:silent").await, (2, 6, 3));
    assert_eq!(link.connections(), before + 1, "one connection made again");
}

/// The same on a Redis Cluster: its one node behind the link (the topology it
/// announces names the link), the cluster's connection goes silent, and is made
/// again as a whole, its topology read anew. Without that, its node connection
/// would stay silent, each call timing out, as nothing failed on it. A cluster
/// whose URL's nodes cannot be reached keeps its connection
/// (`a_cluster_connection_is_kept_when_its_nodes_cannot_be_reached`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_connection_gone_silent_is_made_again_after_two_timeouts() {
    let port = support::cluster::free_node_port();
    let link = SilencingLink::start(port).await;
    let _cluster = support::cluster::RedisCluster::one_node(port, link.port);
    let client = on_cluster(link.port).await;
    let before = link.connections();
    assert_eq!(
        silenced(&link, &client, "rate_limit:silent-cluster").await,
        (2, 6, 3)
    );
    assert!(link.connections() > before, "the cluster was connected to again");
}

/// A cluster connection gone silent whose new one cannot be connected (the URL's one
/// node reached through a link that is gone) is let go all the same, with the
/// commands waiting on it (each holds memory until a reply comes, which none does),
/// and one made on first use takes its place. Kept, it held about 1 KB more for each
/// call that timed out, for as long as the outage lasted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_cluster_connection_is_let_go_when_no_other_can_be_made() {
    let port = support::cluster::free_node_port();
    let link = SilencingLink::start(port).await;
    let seed = SilencingLink::start(port).await;
    let _cluster = support::cluster::RedisCluster::one_node(port, link.port);
    let client = on_cluster(seed.port).await;
    let rules = [Rule::new(
        "rate_limit:cluster-let-go",
        100,
        Duration::from_secs(60),
    )];
    assert!(client.check_rules(&rules).await.unwrap().allowed);
    drop(seed);
    link.silence_open();
    let silenced = Instant::now();
    while link.closed() == 0 {
        assert!(
            silenced.elapsed() < Duration::from_secs(10),
            "the silent connection was still open 10 s later"
        );
        let _ = client.check_rules(&rules).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "the silent connection was closed {:?} after it went silent",
        silenced.elapsed()
    );
}

/// A client made on a current-thread runtime kept but no longer driven (made in
/// `block_on`, used from another runtime): its cluster connection's task there never
/// runs. The first call, not on that runtime, has the connection made again on the
/// library's runtime before it sends, and Redis decides it (before, each call timed
/// out until the connection, silent, was made again after 0.5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_client_made_on_a_runtime_no_longer_driven_is_made_again() {
    let port = support::cluster::free_node_port();
    let _cluster = support::cluster::RedisCluster::one_node(port, port);
    let url = format!("redis+cluster://127.0.0.1:{port}/");
    let (client, kept) = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = runtime
            .block_on(Client::builder().command_timeout(SHORT).connect(&url))
            .unwrap();
        (client, runtime)
    })
    .join()
    .unwrap();
    let rules = [Rule::new(
        "rate_limit:cluster-undriven",
        100,
        Duration::from_secs(60),
    )];
    let started = Instant::now();
    let mut failed = 0;
    while !client
        .check_rules(&rules)
        .await
        .is_ok_and(|decision| decision.allowed)
    {
        failed += 1;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no call decided in 5 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("decided after {:?}, {failed} calls failed", started.elapsed());
    assert_eq!(failed, 0, "the first call was not decided");
    // (A runtime is dropped outside any other.)
    std::thread::spawn(move || drop(kept)).join().unwrap();
}

/// What 8 calls of a rule of 3 a minute (granted once before), 100 ms apart, meet
/// after `link` is silenced: (timeouts, calls Redis decided, grants in all). Each
/// call answers within the command timeout. (A cluster's new connection is put in
/// place once connected, some milliseconds after the call that had it made.)
async fn silenced(link: &SilencingLink, client: &Client, name: &str) -> (usize, usize, usize) {
    let rules = [Rule::new(name, 3, Duration::from_secs(60))];
    assert!(client.check_rules(&rules).await.unwrap().allowed);
    link.silence_open();
    let (mut timeouts, mut decided, mut granted) = (0, 0, 1);
    for _ in 0..8 {
        let started = Instant::now();
        match client.check_rules(&rules).await {
            Ok(decision) => {
                decided += 1;
                granted += usize::from(decision.allowed);
            }
            Err(Error::Timeout { .. }) => timeouts += 1,
            Err(err) => panic!("{err:?}"),
        }
        assert!(started.elapsed() <= SHORT + MARGIN, "{:?}", started.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (timeouts, decided, granted)
}

/// A connection made again after it went silent has answered nothing: a timeout on
/// it is named as its connecting's (`connecting: true`), on one server as on a
/// cluster, while the two that had it made again were on a connection that had
/// answered. The network here drops everything, the new connections' too (so the
/// calls are paused at the third timeout with nothing back: a paused call sends
/// nothing and times out on no connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_on_a_connection_made_again_is_named_connecting() {
    let (_server, link, client) = behind_a_link().await;
    let named = silenced_for_good(&link, &client, "rate_limit:remade-connecting").await;
    assert_eq!(named, [false, false, true, true], "one server");

    let port = support::cluster::free_node_port();
    let link = SilencingLink::start(port).await;
    let _cluster = support::cluster::RedisCluster::one_node(port, link.port);
    let client = on_cluster(link.port).await;
    let named = silenced_for_good(&link, &client, "rate_limit:remade-connecting-cluster").await;
    assert_eq!(named, [false, false, true, true], "a cluster");
}

/// Whether each of the first 4 calls to time out, of calls 100 ms apart after every
/// connection through `link` is silenced, named its connecting. The calls refused
/// while the connecting is paused are passed over.
async fn silenced_for_good(link: &SilencingLink, client: &Client, name: &str) -> Vec<bool> {
    let rules = [Rule::new(name, 100, Duration::from_secs(60))];
    assert!(client.check_rules(&rules).await.unwrap().allowed);
    link.silence_all();
    let mut named = Vec::new();
    for _ in 0..30 {
        match client.check_rules(&rules).await {
            Err(Error::Timeout { connecting, .. }) => named.push(connecting),
            Err(Error::Unreachable { detail, .. }) if detail.contains("no connection is tried") => {}
            other => panic!("{other:?}"),
        }
        if named.len() == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    named
}

/// One slow answer is one timeout, however many calls it cut: 16 calls waiting on a
/// frozen server all time out together, and the connection is kept (the next call,
/// the server back, is answered on it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_cut_by_one_slow_answer_keep_the_connection() {
    let (server, link, client) = behind_a_link().await;
    let rules = [Rule::new("rate_limit:slow-once", 100, Duration::from_secs(60))];
    assert!(client.check_rules(&rules).await.unwrap().allowed);
    let connected = link.connections();
    server.pause();
    let calls: Vec<_> = (0..16)
        .map(|_| {
            let (client, rules) = (client.clone(), rules.clone());
            tokio::spawn(async move { client.check_rules(&rules).await })
        })
        .collect();
    for call in calls {
        let err = call.await.unwrap().unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    }
    server.resume();
    assert!(client.check_rules(&rules).await.unwrap().allowed);
    assert_eq!(link.connections(), connected, "the connection was kept");
}

/// Calls that time out on a connection that answered before are named so
/// (`connecting: false`), also when one of them had the connection made again while
/// the others still waited on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_on_the_old_connection_are_not_named_connecting() {
    let (_server, link, client) = behind_a_link().await;
    let rules = [Rule::new(
        "rate_limit:old-connection",
        100,
        Duration::from_secs(60),
    )];
    assert!(client.check_rules(&rules).await.unwrap().allowed);
    let connected = link.connections();
    link.silence_open();
    let err = client.check_rules(&rules).await.unwrap_err();
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
    // Sent together on the silent connection: the first to time out has it made
    // again; each was sent where a command had been answered.
    let calls: Vec<_> = (0..16)
        .map(|_| {
            let (client, rules) = (client.clone(), rules.clone());
            tokio::spawn(async move { client.check_rules(&rules).await })
        })
        .collect();
    for call in calls {
        let err = call.await.unwrap().unwrap_err();
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
    }
    assert!(client.check_rules(&rules).await.unwrap().allowed);
    assert_eq!(link.connections(), connected + 1, "made again once");
}
