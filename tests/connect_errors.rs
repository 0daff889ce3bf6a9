//! What a client says when it cannot use Redis: the real cause (refused, wrong or
//! missing password, unknown database, DNS, connect timeout), the address with the
//! password hidden, and never the password, in any error, log line or Debug output.

use redlimit_test_support as support;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use redlimit::{rate_limit, Client, Error, RateLimited, Rule};
use support::capture::Capture;
use support::{free_port, RedisServer};

const SECRET: &str = "topsecret-4f1c";

/// A redis-server that requires SECRET.
fn guarded() -> RedisServer {
    RedisServer::start_with(&["--requirepass", SECRET])
}

fn rule() -> [Rule; 1] {
    [Rule::new("rate_limit:connect", 5, Duration::from_secs(1))]
}

/// The error of connecting now and of the first call of a lazily connecting client.
async fn both_ways(url: &str) -> (Error, Error) {
    let eager = Client::connect(url).await.expect_err(url);
    let lazy = match Client::builder().connect_lazy(url) {
        Ok(client) => client.check_rules(&rule()).await.expect_err(url),
        Err(err) => err,
    };
    (eager, lazy)
}

fn assert_clean(err: &Error) {
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains(SECRET), "the password leaked: {shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_cause_is_named_and_the_password_never_shown() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    let server = guarded();
    let port = server.port;

    // The right password works, eagerly and lazily.
    let good = format!("redis://:{SECRET}@127.0.0.1:{port}/");
    assert!(
        Client::connect(&good)
            .await
            .unwrap()
            .check_rules(&rule())
            .await
            .unwrap()
            .allowed
    );
    let lazy = Client::builder().connect_lazy(&good).unwrap();
    assert!(lazy.check_rules(&rule()).await.unwrap().allowed);
    assert!(!format!("{lazy:?}").contains(SECRET));

    for (url, what) in [
        (
            format!("redis://:wrong-{SECRET}@127.0.0.1:{port}/"),
            "wrong password",
        ),
        (
            format!("redis://default:wrong-{SECRET}@127.0.0.1:{port}/"),
            "wrong user password",
        ),
        (format!("redis://127.0.0.1:{port}/"), "no password"),
    ] {
        let (eager, lazy) = both_ways(&url).await;
        for err in [&eager, &lazy] {
            assert!(matches!(err, Error::AuthFailed { .. }), "{what}: {err:?}");
            assert!(err.to_string().contains("password"), "{what}: {err}");
            assert!(err.is_backend_failure());
            assert_clean(err);
        }
    }

    let (eager, lazy) = both_ways(&format!("redis://:{SECRET}@127.0.0.1:{port}/99")).await;
    for err in [&eager, &lazy] {
        assert!(matches!(err, Error::UnknownDatabase { .. }), "{err:?}");
        assert_clean(err);
    }

    let closed = free_port();
    let (eager, lazy) = both_ways(&format!("redis://:{SECRET}@127.0.0.1:{closed}/")).await;
    for err in [&eager, &lazy] {
        assert!(matches!(err, Error::Unreachable { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains(&format!("redis://***@127.0.0.1:{closed}/")),
            "{text}"
        );
        assert!(text.to_lowercase().contains("refused"), "{text}");
        assert_clean(err);
    }

    let (eager, lazy) = both_ways(&format!("redis://:{SECRET}@no-such-host.invalid:6379/")).await;
    for err in [&eager, &lazy] {
        assert!(matches!(err, Error::Unreachable { .. }), "{err:?}");
        assert!(err.to_string().contains("no-such-host.invalid"), "{err}");
        assert_clean(err);
    }

    // A port that accepts connections but never answers: the connect timeout, named
    // as such, within it; a lazy client's first call says it was still connecting.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://:{SECRET}@{}/", silent.local_addr().unwrap());
    let started = Instant::now();
    let err = Client::builder()
        .connect_timeout(Duration::from_millis(300))
        .connect(&url)
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_millis(300 + 200),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(err, Error::ConnectTimeout { .. }), "{err:?}");
    assert!(err.to_string().contains("connect_timeout"), "{err}");
    assert_clean(&err);
    let lazy = Client::builder().connect_lazy(&url).unwrap();
    let err = lazy.check_rules(&rule()).await.unwrap_err();
    assert!(matches!(err, Error::Timeout { connecting: true, .. }), "{err:?}");
    assert!(err.to_string().contains("connect_timeout"), "{err}");

    // URLs that do not parse, every form.
    for url in [
        format!("redis://:{SECRET}@127.0.0.1:99999/"),
        format!("redis://user:{SECRET}@127.0.0.1:99999/"),
        format!("redis+cluster://:{SECRET}@/"),
    ] {
        let (eager, lazy) = both_ways(&url).await;
        for err in [&eager, &lazy] {
            assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
            assert_clean(err);
        }
    }
    let err = Client::connect(&format!(
        "redis+cluster://:{SECRET}@127.0.0.1:{closed},127.0.0.1:{port}/"
    ))
    .await
    .unwrap_err();
    assert_clean(&err);

    let logged = capture.text();
    assert!(
        !logged.contains(SECRET),
        "the password reached a log line: {logged}"
    );
}

/// A URL naming the wrong kind of server says which, connecting now or on first use:
/// a cluster URL on a single server, a sentinel URL on a server that is no sentinel,
/// and a cluster URL's wrong password (which the cluster client reports inside an
/// I/O error, and, on first use, not at all: the client looks into it with a
/// connection of its own). Each lasts until the URL changes: not transient.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_naming_the_wrong_kind_of_server_says_so() {
    let server = guarded();
    let port = server.port;
    let cases = [
        (
            format!("redis+cluster://:{SECRET}@127.0.0.1:{port}/"),
            "not a cluster node",
        ),
        (
            format!("redis+sentinel://:{SECRET}@127.0.0.1:{port}/m"),
            "it is not a sentinel",
        ),
        (
            format!("redis+cluster://:x{SECRET}@127.0.0.1:{port}/"),
            "refused the connection's credentials",
        ),
    ];
    for (url, said) in &cases {
        let (eager, lazy) = both_ways(url).await;
        for (how, err) in [("connecting now", eager), ("on first use", lazy)] {
            assert!(err.to_string().contains(said), "{how}, {url}: {err}");
            assert!(err.is_backend_failure() && !err.is_transient(), "{how}: {err:?}");
            assert_clean(&err);
        }
    }
}

/// A command or connect timeout of none or of years is refused before anything is
/// connected, naming the setting and what is accepted: each counts against the others
/// (`command_timeout * 4` overflowed at `Duration::MAX` on the first call), and a
/// password in the URL is not shown.
#[tokio::test]
async fn timeouts_out_of_range_are_refused_when_connecting() {
    let server = guarded();
    let url = server.url().replace("redis://", &format!("redis://:{SECRET}@"));
    let too_long = Duration::from_secs(3601);
    for (setting, timeout) in [
        ("command_timeout", Duration::MAX),
        ("command_timeout", too_long),
        ("command_timeout", Duration::ZERO),
        ("connect_timeout", Duration::MAX),
        ("connect_timeout", Duration::from_micros(999)),
    ] {
        let builder = || match setting {
            "command_timeout" => Client::builder().command_timeout(timeout),
            _ => Client::builder().connect_timeout(timeout),
        };
        let eager = builder().connect(&url).await.expect_err(setting);
        let lazy = builder().connect_lazy(&url).expect_err(setting);
        for err in [eager, lazy] {
            assert!(
                matches!(&err, Error::InvalidSetting { setting: s, .. } if *s == setting),
                "{setting} {timeout:?}: {err:?}"
            );
            assert!(err.to_string().contains("from 1 ms to an hour"), "{err}");
            assert_clean(&err);
        }
    }
    // The longest is taken, and the client decides.
    let client = Client::builder()
        .command_timeout(Duration::from_secs(3600))
        .connect_timeout(Duration::from_secs(3600))
        .connect(&url)
        .await
        .unwrap();
    assert!(client.check_rules(&rule()).await.unwrap().allowed);
}

#[rate_limit(key = "connect:{user}", rate = 2, interval = "60s", on_error = "deny")]
async fn limited(user: u32) -> Result<(), RateLimited> {
    Ok(())
}

/// Through the attribute (a default client from REDIS_URL with a wrong password):
/// refused with the cause, and neither the refusal nor the throttled error log shows
/// the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_logs_the_cause_without_the_password() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_global_default(capture.clone());
    let server = guarded();
    // No other test of this binary reads the environment.
    std::env::set_var(
        "REDIS_URL",
        format!("redis://:wrong-{SECRET}@127.0.0.1:{}/", server.port),
    );
    for user in 0..3 {
        let refused = limited(user).await.unwrap_err();
        let cause = refused.cause().expect("refused by the failure");
        assert!(matches!(cause, Error::AuthFailed { .. }), "{cause:?}");
        assert!(!format!("{refused} {refused:?}").contains(SECRET));
    }
    let logged = capture.text();
    assert!(
        logged.contains("refused the connection's credentials"),
        "{logged}"
    );
    assert!(!logged.contains(SECRET), "{logged}");
}

/// A cluster's one node replaced, at its address, by a single server (no cluster, no
/// scripts) after the client read the slot map: every call is refused, saying the
/// server is no cluster node. (A script load routed by the map gone stale loaded into
/// the single server, and it served the client as a cluster node.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_replaced_by_a_single_server_is_named_the_wrong_kind() {
    let port = support::cluster::free_node_port();
    let mut cluster = support::cluster::RedisCluster::one_node(port, port);
    let client = Client::builder()
        .command_timeout(Duration::from_millis(500))
        .connect(&format!("redis+cluster://127.0.0.1:{port}/"))
        .await
        .unwrap();
    // (the scripts nowhere yet: this call's load has the client's slot map read)
    assert!(client.check_rules(&rule()).await.unwrap().allowed);
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.kill(port);
    let _single = RedisServer::start_on(port);
    for call in 0..6 {
        let err = client
            .check_rules(&rule())
            .await
            .expect_err("a call to a single server");
        assert!(
            err.to_string().contains("not a cluster node"),
            "call {call}: {err}"
        );
    }
}

/// A lazy client with a cluster URL on a single server whose script cache holds the
/// scripts already (another client's calls loaded them): no call of it fails on its
/// own, yet soon its calls are refused, saying the server is no cluster node, as a
/// client connecting now is; also behind a link that delays each way by 5 ms, and
/// with the server frozen (SIGSTOP) for 1.2 s at the first call. (Before, it was
/// served for good; asked only after the connection's name was set, never behind
/// the link; asked again only a minute later, frozen at the first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_cluster_client_on_a_single_server_holding_the_scripts_says_so() {
    let server = RedisServer::start();
    let other = Client::connect(&server.url()).await.unwrap();
    assert!(other.check_rules(&rule()).await.unwrap().allowed);

    let url = format!("redis+cluster://127.0.0.1:{}/", server.port);
    refused_within(&url, Duration::from_secs(1), "at rest").await;

    let link = support::link::DelayedLink::start(server.port, Duration::from_millis(5)).await;
    let behind = format!("redis+cluster://127.0.0.1:{}/", link.port);
    refused_within(&behind, Duration::from_secs(3), "behind a slow link").await;

    let lazy = Client::builder().connect_lazy(&url).unwrap();
    server.pause();
    let _ = lazy.check_rules(&rule()).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    server.resume();
    refused_within_on(&lazy, Duration::from_secs(3), "frozen at its first call").await;
}

/// A lazy client of `url` refused as no cluster node within `within`, then each
/// of five calls after.
async fn refused_within(url: &str, within: Duration, case: &str) {
    let lazy = Client::builder().connect_lazy(url).unwrap();
    refused_within_on(&lazy, within, case).await;
}

async fn refused_within_on(lazy: &Client, within: Duration, case: &str) {
    let started = Instant::now();
    let mut served = 0;
    loop {
        match lazy.check_rules(&rule()).await {
            Err(err) if err.to_string().contains("not a cluster node") => break,
            _ => served += 1,
        }
        assert!(
            started.elapsed() < within,
            "{case}: {served} calls in {within:?}, none refused as no cluster node"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "{case}: refused after {:?}, {served} calls before",
        started.elapsed()
    );
    for call in 0..5 {
        let err = lazy.check_rules(&rule()).await.expect_err("a call once refused");
        assert!(
            err.to_string().contains("not a cluster node"),
            "{case}, call {call}: {err}"
        );
        assert!(err.is_backend_failure() && !err.is_transient(), "{err:?}");
    }
}
