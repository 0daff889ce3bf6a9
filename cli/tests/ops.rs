//! The built `redlimit` binary as an operator meets it, against real redis-servers:
//! token buckets seen by every command, `set-rate` saying when a change will not last,
//! one message per failure whatever the command, the documented exit codes per
//! command, and text that reads.

mod binary;
use redlimit_test_support as support;

use binary::{code, json, redlimit, text};

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use redis::AsyncCommands;
use redlimit::{Algorithm, Client, RateType, Rule};
use support::capture::Capture;
use support::{free_port, RedisServer};

const MINUTE: Duration = Duration::from_secs(60);

async fn keys(raw: &mut redis::aio::MultiplexedConnection, pattern: &str) -> Vec<String> {
    let mut keys: Vec<String> = raw.keys(pattern).await.unwrap();
    keys.sort();
    keys
}

fn bucket_rule(name: &str) -> Rule {
    Rule::new(name, 10, MINUTE)
        .algorithm(Algorithm::TokenBucket)
        .burst(20)
}

#[tokio::test]
async fn token_buckets_are_seen_by_every_command() {
    let server = RedisServer::start();
    let url = server.url();
    let mut raw = server.raw().await;
    let client = Client::connect(&url).await.unwrap();
    let name = "rate_limit:tb:user:1";
    for _ in 0..5 {
        assert!(client.check_rules(&[bucket_rule(name)]).await.unwrap().allowed);
    }
    let stored: String = raw.get("{rate_limit:tb:user:1}:bucket").await.unwrap();

    // ls: one row, a bucket, 5 of 20 tokens used.
    let out = redlimit(&url, &["ls", "rate_limit:tb*", "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let list = json(&out);
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list[0]["name"], name);
    assert_eq!(list[0]["algorithm"], "bucket");
    assert_eq!(list[0]["rate"], 10);
    assert_eq!(list[0]["interval_ms"], 60_000);
    assert_eq!(list[0]["mode"], "overall");
    assert_eq!(list[0]["usage"], 0.25);
    assert!(list[0]["memory_bytes"].as_u64().unwrap() > 0);
    let table = text(&redlimit(&url, &["ls", "rate_limit:tb*"]));
    assert!(table.contains(name) && table.contains("bucket"), "{table}");
    let out = redlimit(&url, &["ls", "other*", "--json"]);
    assert_eq!(json(&out), serde_json::json!([]), "the pattern is the name's");
    // `*}` matches the key `{NAME}:bucket`'s first part, not NAME.
    let out = redlimit(&url, &["ls", "*}", "--json"]);
    assert_eq!(json(&out), serde_json::json!([]), "the pattern is the name's");

    // inspect: tokens, burst, refill, time until full, TTL.
    let out = redlimit(&url, &["inspect", name, "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let report = json(&out);
    let bucket = &report["token_buckets"][0];
    assert_eq!(bucket["key"]["key"], "{rate_limit:tb:user:1}:bucket");
    assert_eq!(bucket["tokens"], 15);
    assert_eq!(bucket["burst"], 20);
    assert_eq!(bucket["rate"], 10);
    let full_in = bucket["full_in_ms"].as_i64().unwrap();
    assert!(
        (25_000..=30_000).contains(&full_in),
        "5 tokens at 10 a minute: {full_in}"
    );
    let ttl = bucket["key"]["ttl_ms"].as_i64().unwrap();
    assert!((25_000..=30_000).contains(&ttl), "{ttl}");
    assert_eq!(report["healthy"], true);
    let human = text(&redlimit(&url, &["inspect", name]));
    assert!(human.contains("token bucket  10 per 1m, burst 20"), "{human}");
    assert!(human.contains("15 tokens of 20, full in"), "{human}");
    assert!(!human.contains("config        none"), "{human}");

    // check reads, takes nothing, and says when.
    let out = redlimit(&url, &["check", name, "--permits", "15", "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(json(&out)["available"], 15);
    let out = redlimit(&url, &["check", name, "--permits", "16", "--json"]);
    assert_eq!(code(&out), 1, "{}", text(&out));
    let retry = json(&out)["retry_after_ms"].as_i64().unwrap();
    assert!((1..=6_000).contains(&retry), "a token every 6 s: {retry}");
    let out = redlimit(&url, &["check", name, "--permits", "21"]);
    assert_eq!(code(&out), 1);
    assert!(text(&out).contains("retry never"), "{}", text(&out));

    // acquire takes from the bucket with its own config.
    let out = redlimit(&url, &["acquire", name, "--permits", "3"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(
        text(&out).contains("3 permits granted; 12 available"),
        "{}",
        text(&out)
    );
    let after: String = raw.get("{rate_limit:tb:user:1}:bucket").await.unwrap();
    assert_eq!(
        after.split(':').take(3).collect::<Vec<_>>(),
        stored.split(':').take(3).collect::<Vec<_>>(),
        "the config stays the bucket's: {stored} -> {after}"
    );
    assert_eq!(code(&redlimit(&url, &["acquire", name, "--permits", "13"])), 1);

    // watch follows its tokens.
    let out = redlimit(
        &url,
        &["watch", name, "--every", "200ms", "--count", "1", "--json"],
    );
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(json(&out)["tokens"], 12);

    // set-rate refuses, writing nothing: the rule writes its own config back.
    let out = redlimit(
        &url,
        &["set-rate", name, "--rate", "50", "--interval", "1m", "--reset"],
    );
    assert_eq!(code(&out), 1, "{}", text(&out));
    assert!(text(&out).contains("is a token bucket"), "{}", text(&out));
    assert!(text(&out).contains("override set"), "{}", text(&out));
    assert!(
        !raw.exists::<_, bool>(name).await.unwrap(),
        "no config hash written"
    );

    // reset deletes it.
    let out = redlimit(&url, &["reset", name, "--yes"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(text(&out).contains("1 key deleted"), "{}", text(&out));
    assert!(keys(&mut raw, "*tb:user*").await.is_empty());
    let out = redlimit(&url, &["inspect", name]);
    assert_eq!(code(&out), 1);
    assert!(
        text(&out).contains("a full token bucket has no key"),
        "{}",
        text(&out)
    );
}

#[tokio::test]
async fn a_warming_bucket_shows_its_coldness_and_per_client_buckets_their_clients() {
    let server = RedisServer::start();
    let url = server.url();
    let mut raw = server.raw().await;
    let client = Client::connect(&url).await.unwrap();
    let warm = bucket_rule("warm").warmup(Duration::from_secs(30));
    assert!(client.check_rules(&[warm]).await.unwrap().allowed);
    let report = json(&redlimit(&url, &["inspect", "warm", "--json"]));
    let bucket = &report["token_buckets"][0];
    assert_eq!(bucket["warmup_ms"], 30_000);
    let coldness = bucket["coldness"].as_f64().unwrap();
    // A new bucket is cold; its first permit took one token's worth (1/5 of 10 x 30 s).
    assert!((coldness - 0.8).abs() < 0.01, "{coldness}");
    assert!(
        (bucket["cost_per_permit"].as_f64().unwrap() - 2.2).abs() < 0.05,
        "{bucket}"
    );
    let human = text(&redlimit(&url, &["inspect", "warm"]));
    assert!(
        human.contains("warm-up 30s") && human.contains("coldness"),
        "{human}"
    );

    // State another program wrote under a bucket's key: refused, left as it was.
    for (key, stored) in [
        ("{junk}:bucket", "9:9:9"),
        ("{floor}:bucket", "1:1000:5:-4503599627370497:1"),
    ] {
        let _: () = raw.set(key, stored).await.unwrap();
        let name = &key[1..key.find('}').unwrap()];
        let commands = [vec!["check", name], vec!["acquire", name]];
        for args in commands {
            let out = redlimit(&url, &args);
            assert_eq!(code(&out), 1, "{args:?}: {}", text(&out));
            assert!(text(&out).contains(key), "{args:?}: {}", text(&out));
        }
        let after: String = raw.get(key).await.unwrap();
        assert_eq!(after, stored);
    }
    let out = redlimit(&url, &["inspect", "junk"]);
    assert_eq!(code(&out), 1, "unhealthy: {}", text(&out));
    assert!(
        text(&out).contains("not a token bucket's state"),
        "{}",
        text(&out)
    );

    let per_client = bucket_rule("pcb").mode(RateType::PerClient);
    assert!(client.check_rules(&[per_client]).await.unwrap().allowed);
    let list = json(&redlimit(&url, &["ls", "pcb", "--json"]));
    assert_eq!(list[0]["mode"], "per_client", "{list}");
    let human = text(&redlimit(&url, &["inspect", "pcb"]));
    let id = client.client_id();
    assert!(
        human
            .lines()
            .any(|l| l.trim_end() == format!("client        {id}")),
        "the client on a line of its own: {human}"
    );
    let before = keys(&mut raw, "*").await;
    for args in [["check", "pcb"], ["acquire", "pcb"]] {
        let out = redlimit(&url, &args);
        assert_eq!(code(&out), 1, "{}", text(&out));
        assert!(text(&out).contains("is per_client"), "{}", text(&out));
    }
    assert_eq!(keys(&mut raw, "*").await, before, "the CLI left no client keys");
}

#[redlimit::rate_limit(
    key = "tbo:{user}",
    rate = 10,
    interval = "60s",
    algorithm = "token_bucket",
    burst = 20
)]
async fn bucketed(user: &str) -> Result<(), redlimit::RateLimited> {
    let _ = user;
    Ok(())
}

/// `override set` on a bucket's limiter: its rule decides with the override and
/// writes it into the bucket, as `inspect` shows; `rm` gives the rule its own back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_reaches_a_bucket_through_its_rule() {
    let server = RedisServer::start();
    let url = server.url();
    let name = "rate_limit:tbo:u";
    let out = redlimit(
        &url,
        &["override", "set", name, "--rate", "30", "--interval", "1m"],
    );
    assert_eq!(code(&out), 0, "{}", text(&out));
    redlimit::set_default(Client::connect(&url).await.unwrap()).unwrap();
    bucketed("u").await.unwrap();
    let report = json(&redlimit(&url, &["inspect", name, "--json"]));
    assert_eq!(report["token_buckets"][0]["rate"], 30, "{report}");
    let list = json(&redlimit(&url, &["ls", "rate_limit:tbo*", "--json"]));
    assert_eq!(list[0]["rate"], 30, "{list}");
    let out = redlimit(&url, &["override", "rm", name]);
    assert_eq!(code(&out), 0, "{}", text(&out));
}

/// The CLI is a client of its own: a per-client limiter's keys of its id would belong
/// to no process, kept until the keep-alive ends, or for good without one.
#[tokio::test]
async fn acquire_on_a_per_client_limiter_leaves_no_keys() {
    let server = RedisServer::start();
    let url = server.url();
    let mut raw = server.raw().await;
    let client = Client::connect(&url).await.unwrap();
    let limiter = client.rate_limiter("pc");
    limiter
        .try_set_rate(RateType::PerClient, 5, MINUTE)
        .await
        .unwrap();
    let before = keys(&mut raw, "*").await;
    for _ in 0..2 {
        let out = redlimit(&url, &["acquire", "pc"]);
        assert_eq!(code(&out), 1, "{}", text(&out));
        assert!(text(&out).contains("is per_client"), "{}", text(&out));
    }
    assert_eq!(keys(&mut raw, "*").await, before);
}

#[tokio::test]
async fn set_rate_on_a_rules_limiter_says_it_will_not_last() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    let server = RedisServer::start();
    let url = server.url();
    let client = Client::connect(&url).await.unwrap();
    let name = "rate_limit:order:user:7";
    let rule = [Rule::new(name, 5, MINUTE)];
    assert!(client.check_rules(&rule).await.unwrap().allowed);

    let out = redlimit(&url, &["set-rate", name, "--rate", "50", "--interval", "1m"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let shown = text(&out);
    assert!(shown.contains("50 per 1m (window kept)"), "{shown}");
    assert!(shown.contains("will not last"), "{shown}");
    assert!(
        shown.contains(&format!("redlimit override set {name} --rate 50 --interval 1m")),
        "{shown}"
    );
    let out = redlimit(
        &url,
        &["set-rate", name, "--rate", "50", "--interval", "1m", "--json"],
    );
    assert_eq!(json(&out)["rule_wrote_config"], true);

    // The rule's next call writes its own back, and says what it knows.
    assert!(client.check_rules(&rule).await.unwrap().allowed);
    let config = client.rate_limiter(name).config().await.unwrap().unwrap();
    assert_eq!(config.rate, 5, "undone by the rule");
    let logged = capture.text();
    assert!(logged.contains("differs from the rule's"), "{logged}");
    assert!(logged.contains("redlimit override set"), "{logged}");
    assert!(!logged.contains("share this limiter"), "{logged}");

    // A limiter no rule wrote (Redisson's keep-alive): the note says if.
    let other = client.rate_limiter("orders");
    other.try_set_rate(RateType::Overall, 5, MINUTE).await.unwrap();
    let out = redlimit(&url, &["set-rate", "orders", "--rate", "6", "--interval", "1m"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(text(&out).contains("if a rule"), "{}", text(&out));
    assert!(!text(&out).contains("will not last"), "{}", text(&out));
}

/// Every command, in an order that reads.
fn every_command() -> Vec<Vec<&'static str>> {
    vec![
        vec!["inspect", "x"],
        vec!["ls"],
        vec!["set-rate", "x", "--rate", "1", "--interval", "1s"],
        vec!["reset", "x", "--yes"],
        vec!["check", "x"],
        vec!["acquire", "x"],
        vec!["watch", "x", "--every", "10ms", "--count", "1"],
        vec!["override", "set", "x", "--rate", "1", "--interval", "1s"],
        vec!["override", "ls"],
        vec!["override", "rm", "x"],
    ]
}

/// A server that answers every connection as an HTTP server does, on a port claimed
/// as the test's servers' are (on a port the system picked, it could take the one a
/// test keeps closed, which then answered HTTP where nothing should listen).
fn http_server() -> u16 {
    let port = free_port();
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
                let _ = stream.read(&mut buf);
                let _ = stream
                    .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            });
        }
    });
    port
}

#[test]
fn every_command_names_each_cause_once_and_alike() {
    let password = "s3cretpw";
    let server = RedisServer::start_with(&["--requirepass", password]);
    let port = server.port;
    let closed = free_port();
    let http = http_server();
    let cases = [
        (
            format!("redis://:{password}@127.0.0.1:{closed}/"),
            3,
            "cannot reach Redis at `redis://***@127.0.0.1",
        ),
        (
            format!("redis://:wrong{password}@127.0.0.1:{port}/"),
            3,
            "refused the connection's credentials",
        ),
        (
            format!("redis://127.0.0.1:{port}/"),
            3,
            "refused the connection's credentials",
        ),
        (format!("redis://127.0.0.1:{http}/"), 3, "is not a Redis server"),
        (
            format!("redis://:{password}@127.0.0.1:{port}/99"),
            3,
            "has no such database",
        ),
        (
            format!("redis://:{password}@127.0.0.1:notaport/"),
            2,
            "invalid Redis URL",
        ),
        ("http://127.0.0.1:6379/".to_owned(), 2, "invalid Redis URL"),
    ];
    for (url, expected, cause) in cases {
        let mut first: Option<String> = None;
        for args in every_command() {
            let out = redlimit(&url, &args);
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            assert_eq!(code(&out), expected, "{url} {args:?}: {}", text(&out));
            assert!(out.stdout.is_empty(), "{url} {args:?}: {}", text(&out));
            assert_eq!(stderr.lines().count(), 1, "{url} {args:?}: {stderr}");
            assert!(stderr.starts_with("redlimit: "), "{url} {args:?}: {stderr}");
            assert!(stderr.contains(cause), "{url} {args:?}: {stderr}");
            assert!(!stderr.contains(password), "{url} {args:?}: {stderr}");
            assert!(
                stderr.matches("Redis at").count() <= 1,
                "said once: {url} {args:?}: {stderr}"
            );
            for raw in [
                "AuthenticationFailed",
                "InvalidClientConfig",
                "Incompatible type",
                "NOAUTH\":",
            ] {
                assert!(!stderr.contains(raw), "{url} {args:?}: {stderr}");
            }
            match &first {
                None => first = Some(stderr),
                Some(first) => {
                    // The same cause, the same message (the port of a refused
                    // connection's OS text aside, there is none).
                    assert_eq!(&stderr, first, "{url} {args:?}");
                }
            }
        }
    }
}

#[tokio::test]
async fn exit_codes_are_as_documented_for_every_command() {
    let server = RedisServer::start();
    let url = server.url();
    let client = Client::connect(&url).await.unwrap();
    let limiter = client.rate_limiter("here");
    limiter.try_set_rate(RateType::Overall, 5, MINUTE).await.unwrap();

    // 1: not found, for every command that names a limiter.
    for args in [
        vec!["inspect", "nope"],
        vec!["set-rate", "nope", "--rate", "1", "--interval", "1s"],
        vec!["reset", "nope", "--yes"],
        vec!["check", "nope"],
        vec!["acquire", "nope"],
        vec!["watch", "nope", "--count", "1"],
        vec!["override", "rm", "nope"],
    ] {
        let out = redlimit(&url, &args);
        assert_eq!(code(&out), 1, "{args:?}: {}", text(&out));
        assert!(text(&out).contains("no "), "{args:?}: {}", text(&out));
    }
    // 1: refused.
    assert!(limiter.try_acquire(5).await.unwrap());
    for args in [vec!["check", "here"], vec!["acquire", "here"]] {
        let out = redlimit(&url, &args);
        assert_eq!(code(&out), 1, "{args:?}: {}", text(&out));
        assert!(text(&out).contains("1 permit would be refused") || text(&out).contains("1 permit refused"));
    }

    // 2: usage, whatever the state.
    let max = (redlimit::MAX_RATE + 1).to_string();
    for args in [
        vec!["set-rate", "here", "--rate", "0", "--interval", "1s"],
        vec!["set-rate", "here", "--rate", max.as_str(), "--interval", "1s"],
        vec!["set-rate", "here", "--rate", "1", "--interval", "60"],
        vec![
            "set-rate",
            "here",
            "--rate",
            "1",
            "--interval",
            "1m",
            "--keep-alive",
            "1s",
            "--reset",
        ],
        vec!["override", "set", "x", "--rate", "0", "--interval", "1s"],
        vec!["check", "here", "--permits", "0"],
        vec!["acquire", "here", "--permits", "0"],
        vec!["check", "here", "--permits", "-1"],
        vec!["watch", "here", "--every", "0s"],
        vec!["watch", "here", "--count", "0"],
        vec!["ls", "--limit", "0"],
        vec!["inspect"],
        vec!["no-such-command"],
    ] {
        let out = redlimit(&url, &args);
        assert_eq!(code(&out), 2, "{args:?}: {}", text(&out));
    }
    let out = redlimit(&url, &["check", "here", "--permits", "0"]);
    assert!(text(&out).contains("at least 1"), "{}", text(&out));
    let out = redlimit(&url, &["acquire", "here", "--permits", "0"]);
    assert!(text(&out).contains("at least 1"), "{}", text(&out));
    assert_eq!(
        limiter.config().await.unwrap().unwrap().rate,
        5,
        "nothing written"
    );

    // 0: ok.
    limiter.set_rate(RateType::Overall, 5, MINUTE).await.unwrap();
    for args in [
        vec!["inspect", "here"],
        vec!["ls"],
        vec!["check", "here"],
        vec!["acquire", "here"],
        vec!["watch", "here", "--every", "10ms", "--count", "1"],
        vec!["set-rate", "here", "--rate", "5", "--interval", "1m"],
        vec!["override", "set", "x", "--rate", "1", "--interval", "1s"],
        vec!["override", "ls"],
        vec!["override", "rm", "x"],
        vec!["reset", "here", "--yes"],
    ] {
        let out = redlimit(&url, &args);
        assert_eq!(code(&out), 0, "{args:?}: {}", text(&out));
    }
}

#[tokio::test]
async fn text_reads_at_three_in_the_morning() {
    let server = RedisServer::start();
    let url = server.url();
    let client = Client::connect(&url).await.unwrap();
    let rule = [Rule::new("rate_limit:t", 5, MINUTE)];
    assert!(client.check_rules(&rule).await.unwrap().allowed);

    let out = redlimit(&url, &["check", "rate_limit:t"]);
    assert!(
        text(&out).contains("1 permit would be granted; 4 available"),
        "{}",
        text(&out)
    );
    let out = redlimit(&url, &["acquire", "rate_limit:t"]);
    assert!(
        text(&out).contains("1 permit granted; 3 available"),
        "{}",
        text(&out)
    );
    let human = text(&redlimit(&url, &["inspect", "rate_limit:t"]));
    assert!(
        human.contains("log 2 entries, 2 permits in the window (2 entries)"),
        "{human}"
    );
    assert!(!human.contains("chose the same"), "{human}");
    let written_by = human.lines().find(|l| l.starts_with("written by")).unwrap();
    assert!(
        written_by.trim_end().ends_with(')'),
        "a sentence that ends: {written_by}"
    );

    // A per-client window: each client on a line of its own.
    let per_client = client.rate_limiter("pcw");
    per_client
        .try_set_rate(RateType::PerClient, 5, MINUTE)
        .await
        .unwrap();
    assert!(per_client.try_acquire(1).await.unwrap());
    let human = text(&redlimit(&url, &["inspect", "pcw"]));
    let id = client.client_id();
    let at = human
        .lines()
        .position(|l| l.trim_end() == format!("client        {id}"))
        .unwrap_or_else(|| panic!("{human}"));
    let next = human.lines().nth(at + 1).unwrap();
    assert!(next.starts_with("              value 4"), "{human}");
    assert!(
        next.contains("log 1 entry, 1 permit in the window (1 entry)"),
        "{human}"
    );

    // watch shows the server's time of day.
    let out = redlimit(
        &url,
        &["watch", "rate_limit:t", "--every", "10ms", "--count", "1"],
    );
    let line = String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .unwrap()
        .to_owned();
    let time = line.split_whitespace().next().unwrap();
    let shape: Vec<usize> = time.split([':', '.']).map(str::len).collect();
    assert_eq!(shape, [2, 2, 2, 3], "HH:MM:SS.mmm: {line}");
    let out = redlimit(
        &url,
        &[
            "watch",
            "rate_limit:t",
            "--every",
            "10ms",
            "--count",
            "1",
            "--json",
        ],
    );
    let time = json(&out)["time"].as_str().unwrap().to_owned();
    assert!(time.ends_with('Z') && time.contains('T'), "{time}");
}

/// The runtime names the cause the CLI shows: a client connecting to an HTTP server.
#[tokio::test]
async fn a_client_says_an_http_server_is_not_redis() {
    let port = http_server();
    let err = Client::connect(&format!("redis://127.0.0.1:{port}/"))
        .await
        .unwrap_err();
    assert!(matches!(err, redlimit::Error::NotRedis { .. }), "{err:?}");
    assert!(err.is_backend_failure());
    assert!(err.to_string().contains("is not a Redis server"), "{err}");
}

/// Names a caller chose (a path parameter `x%0d%0aALERT...`, an escape sequence, a
/// `&str` with a newline through the attribute) are limiter names; every command's
/// human output shows them escaped: nothing but the output's own line ends reaches
/// the terminal, and `ls` prints one row per limiter.
#[tokio::test]
async fn attack_names_cannot_write_into_the_operators_terminal() {
    let server = RedisServer::start();
    let url = server.url();
    let client = redlimit::Client::connect(&url).await.unwrap();
    let hostile = [
        "rate_limit:x\r\nALERT rate_limit:admin      token     1  1s",
        "rate_limit:\u{1b}]0;owned\u{7}\u{1b}[1;31mred",
        "rate_limit:user\nrate_limit:spoofed  window  5  1m",
        "rate_limit:back\\nslash\u{202e}desrever\u{85}",
    ];
    for name in hostile {
        let rule = [redlimit::Rule::new(name, 5, Duration::from_secs(60))];
        assert!(client.check_rules(&rule).await.unwrap().allowed);
    }
    let clean = |out: &std::process::Output, what: &str| {
        let shown = text(out);
        let bad: Vec<char> = shown
            .chars()
            .filter(|c| (c.is_control() && *c != '\n') || *c == '\u{202e}')
            .collect();
        assert!(
            bad.is_empty(),
            "{what}: {bad:?} reached the terminal in:\n{shown}"
        );
        shown
    };
    let table = clean(&redlimit(&url, &["ls"]), "ls");
    assert_eq!(
        table.lines().count(),
        1 + hostile.len(),
        "one row per limiter:\n{table}"
    );
    assert!(table.contains("rate_limit:x\\r\\nALERT"), "{table}");
    assert!(
        table.contains("rate_limit:\\e]0;owned\\u{7}\\e[1;31mred"),
        "{table}"
    );
    for name in hostile {
        let shown = clean(&redlimit(&url, &["inspect", name]), "inspect");
        assert!(shown.starts_with("limiter "), "{shown}");
        clean(&redlimit(&url, &["check", name]), "check");
        clean(&redlimit(&url, &["acquire", name]), "acquire");
        clean(
            &redlimit(&url, &["watch", name, "--every", "10ms", "--count", "1"]),
            "watch",
        );
        clean(
            &redlimit(
                &url,
                &["override", "set", name, "--rate", "3", "--interval", "1s"],
            ),
            "override set",
        );
        clean(&redlimit(&url, &["override", "ls"]), "override ls");
        clean(&redlimit(&url, &["override", "rm", name]), "override rm");
        clean(&redlimit(&url, &["override", "rm", name]), "override rm of none");
        clean(
            &redlimit(&url, &["set-rate", name, "--rate", "2", "--interval", "1m"]),
            "set-rate",
        );
        clean(&redlimit(&url, &["reset", name, "--yes"]), "reset");
        clean(&redlimit(&url, &["inspect", name]), "inspect of none");
    }
}

/// The incident of docs/operating.md ("user 42 is stuck at zero"): `reset` and
/// `set-rate --reset` let the user in within about a second in every process, though
/// each kept its refusal for the whole wait (20 s here); the output says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_and_set_rate_reach_the_refusals_processes_keep() {
    let server = RedisServer::start();
    let url = server.url();
    let deciding = redlimit::Client::connect(&url).await.unwrap();
    let commands: [&[&str]; 2] = [
        &["reset", "NAME", "--yes"],
        &["set-rate", "NAME", "--rate", "2", "--interval", "20s", "--reset"],
    ];
    for (i, command) in commands.into_iter().enumerate() {
        let name = format!("rate_limit:stuck:user:{i}");
        let rule = [redlimit::Rule::new(name.as_str(), 2, Duration::from_secs(20))];
        for _ in 0..2 {
            assert!(deciding.check_rules(&rule).await.unwrap().allowed);
        }
        assert!(!deciding.check_rules(&rule).await.unwrap().allowed);
        let args: Vec<&str> = command
            .iter()
            .map(|a| if *a == "NAME" { name.as_str() } else { a })
            .collect();
        let out = redlimit(&url, &args);
        assert_eq!(code(&out), 0, "{}", text(&out));
        assert!(
            text(&out).contains("key prefix `rate_limit:` stop refusing from what they kept"),
            "{}",
            text(&out)
        );
        let started = std::time::Instant::now();
        while !deciding.check_rules(&rule).await.unwrap().allowed {
            assert!(
                started.elapsed() < Duration::from_millis(2_500),
                "{command:?}: still refused {:?} after it",
                started.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A limiter's log of half a million entries is read in ranges: `inspect` and `check`
/// count every entry, `watch` reads it too, and no command they send holds Redis for
/// 20 ms (one `ZRANGE` of the whole log does).
#[tokio::test]
async fn a_long_log_is_read_in_ranges() {
    let server = RedisServer::start();
    let url = server.url();
    let mut raw = server.raw().await;
    let client = Client::connect(&url).await.unwrap();
    let limiter = client.rate_limiter("long");
    assert!(limiter
        .try_set_rate(RateType::Overall, 1_000_000, Duration::from_secs(3_600))
        .await
        .unwrap());
    let now: (u64, u64) = redis::cmd("TIME").query_async(&mut raw).await.unwrap();
    let now_ms = now.0 * 1_000 + now.1 / 1_000;
    // (in 50 scripts of 10 000: one would outlast the connection's timeout)
    let fill = "for i = ARGV[2], ARGV[2] + 9999 do redis.call('ZADD', KEYS[1], ARGV[1], \
                struct.pack('Bc0I', 8, string.format('%08d', i), 1)) end";
    for first in (0..500_000).step_by(10_000) {
        let _: () = redis::cmd("EVAL")
            .arg(fill)
            .arg(1)
            .arg("{long}:permits")
            .arg(now_ms)
            .arg(first)
            .query_async(&mut raw)
            .await
            .unwrap();
    }
    let _: () = raw.set("{long}:value", 500_000).await.unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "slowlog-log-slower-than", "20000"])
        .query_async(&mut raw)
        .await
        .unwrap();
    let _: () = redis::cmd("SLOWLOG")
        .arg("RESET")
        .query_async(&mut raw)
        .await
        .unwrap();

    let shown = json(&redlimit(&url, &["--json", "inspect", "long"]));
    let entries = shown.to_string();
    assert!(entries.contains("\"entries\":500000"), "{entries}");
    let checked = redlimit(&url, &["--json", "check", "long", "--permits", "1"]);
    assert_eq!(json(&checked)["available"], 500_000, "{}", text(&checked));
    let watched = redlimit(&url, &["watch", "long", "--count", "1"]);
    assert_eq!(code(&watched), 0, "{}", text(&watched));

    let slow: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(128)
        .query_async(&mut raw)
        .await
        .unwrap();
    let slow = format!("{slow:?}");
    assert!(!slow.to_ascii_uppercase().contains("ZRANGE"), "{slow}");
}
