//! The built `redlimit` binary against real redis-servers (one node, and a 3-node
//! cluster), on state written by the runtime and state written as Redisson's scripts
//! leave it: output, JSON and exit codes.

mod binary;
use redlimit_test_support as support;

use binary::{code, json, redlimit, text};

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use redis::AsyncCommands;
use redlimit::{Client, RateType, Rule};
use serde_json::Value;
use support::cluster::RedisCluster;
use support::{redisson_member, RedisServer};

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn inspect_a_limiter_a_rule_wrote() {
    let server = RedisServer::start();
    let url = server.url();
    let client = Client::connect(&url).await.unwrap();
    let rule = [Rule::new("rate_limit:order:user:42", 5, MINUTE).permits(2)];
    assert!(client.check_rules(&rule).await.unwrap().allowed);

    let out = redlimit(&url, &["inspect", "rate_limit:order:user:42", "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let report = json(&out);
    assert_eq!(report["config"]["rate"], 5);
    assert_eq!(report["config"]["interval_ms"], 60_000);
    assert_eq!(report["config"]["mode"], "overall");
    assert_eq!(report["config"]["keep_alive_ms"], 60_000);
    assert!(report["config"]["written_by"]
        .as_str()
        .unwrap()
        .starts_with("a redlimit rule"));
    let overall = &report["buckets"][0];
    assert_eq!(overall["value"], 3);
    assert_eq!(overall["available_now"], 3);
    assert_eq!(overall["log"]["entries"], 1);
    assert_eq!(overall["log"]["permits_in_window"], 2);
    let release = overall["log"]["next_release_in_ms"].as_i64().unwrap();
    assert!((55_000..=60_000).contains(&release), "{release}");
    let ttl = overall["value_key"]["ttl_ms"].as_i64().unwrap();
    assert!(
        (55_000..=60_000).contains(&ttl),
        "keys carry the keep-alive: {ttl}"
    );
    assert_eq!(report["healthy"], true);

    let human = redlimit(&url, &["inspect", "rate_limit:order:user:42"]);
    let shown = text(&human);
    assert!(shown.contains("5 per 1m, overall, keep-alive 1m"), "{shown}");
    assert!(shown.contains("{rate_limit:order:user:42}:permits"), "{shown}");
    assert!(shown.contains("health        ok"), "{shown}");

    let missing = redlimit(&url, &["inspect", "nothing"]);
    assert_eq!(code(&missing), 1);
    assert!(text(&missing).contains("no limiter named `nothing`"));
}

#[tokio::test]
async fn inspect_state_redisson_wrote_and_what_is_wrong_with_it() {
    let server = RedisServer::start();
    let url = server.url();
    let mut raw = server.raw().await;
    let now: (u64, u64) = redis::cmd("TIME").query_async(&mut raw).await.unwrap();
    let now = now.0 * 1000 + now.1 / 1000;
    // Redisson 3.24 after three grants: no keepAliveTime field, a 13-byte member
    // from 3.17-3.20 among 21-byte ones; value 1 + 4 permits = rate 5.
    let _: () = redis::cmd("HSET")
        .arg("orders")
        .arg(&["rate", "5", "interval", "1000", "type", "0"])
        .query_async(&mut raw)
        .await
        .unwrap();
    let _: () = raw.set("{orders}:value", "1").await.unwrap();
    let _: () = raw
        .zadd("{orders}:permits", redisson_member(&[7; 16], 2), now - 600)
        .await
        .unwrap();
    let _: () = raw
        .zadd("{orders}:permits", redisson_member(&[9; 8], 1), now - 300)
        .await
        .unwrap();
    let _: () = raw
        .zadd("{orders}:permits", redisson_member(&[8; 16], 1), now - 5_000)
        .await
        .unwrap();

    let out = redlimit(&url, &["inspect", "orders", "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let report = json(&out);
    assert!(report["config"]["written_by"]
        .as_str()
        .unwrap()
        .starts_with("Redisson before 4.4"));
    assert_eq!(report["config"]["keep_alive_ms"], Value::Null);
    let overall = &report["buckets"][0];
    assert_eq!(overall["log"]["entries"], 3);
    assert_eq!(overall["log"]["permits"], 4);
    assert_eq!(
        overall["log"]["permits_in_window"], 3,
        "the grant 5 s ago left the 1 s window"
    );
    assert_eq!(
        overall["available_now"], 2,
        "value 1 and the expired grant's permit"
    );
    assert!(report["notes"][0].as_str().unwrap().contains("never expire"));

    // A negative value (a debt, noted), and a member that is no grant (a problem).
    let _: () = raw.set("{orders}:value", "-2").await.unwrap();
    let _: () = raw
        .zadd("{orders}:permits", b"not a grant".to_vec(), now)
        .await
        .unwrap();
    let out = redlimit(&url, &["inspect", "orders", "--json"]);
    assert_eq!(code(&out), 1, "unhealthy");
    let problems = json(&out)["problems"].to_string();
    assert!(problems.contains("do not decode"), "{problems}");
    let notes = json(&out)["notes"].to_string();
    assert!(notes.contains("is -2: a debt of 2 permits"), "{notes}");

    // State without a config.
    let _: () = raw.del("orders").await.unwrap();
    let out = redlimit(&url, &["inspect", "orders"]);
    assert_eq!(code(&out), 1);
    assert!(text(&out).contains("state left behind"), "{}", text(&out));
}

/// A reservation settled beyond its estimate: a healthy limiter in debt.
#[tokio::test]
async fn inspect_shows_a_settled_debt_as_a_debt() {
    let server = RedisServer::start();
    let url = server.url();
    let client = Client::connect(&url).await.unwrap();
    let rule = Rule::new("llm:tokens", 1_000, Duration::from_secs(60))
        .settled()
        .permits(500);
    let redlimit::Reserved::Granted(reservation) = client.reserve(&[rule]).await.unwrap() else {
        panic!("granted");
    };
    reservation.settle(1_300).await.unwrap();
    let out = redlimit(&url, &["inspect", "llm:tokens"]);
    assert_eq!(code(&out), 0, "a debt is no fault: {}", text(&out));
    assert!(text(&out).contains("value -300 (a debt)"), "{}", text(&out));
    assert!(text(&out).contains("a debt of 300 permits"), "{}", text(&out));
}

#[tokio::test]
async fn ls_set_rate_check_acquire_and_reset() {
    let server = RedisServer::start();
    let url = server.url();
    let client = Client::connect(&url).await.unwrap();
    for (name, rate, taken) in [("api:a", 10, 9), ("api:b", 100, 10), ("other", 5, 0)] {
        let limiter = client.rate_limiter(name);
        limiter
            .try_set_rate(RateType::Overall, rate, MINUTE)
            .await
            .unwrap();
        if taken > 0 {
            assert!(limiter.try_acquire(taken).await.unwrap());
        }
    }
    let mut raw = server.raw().await;
    let _: () = raw.hset("api:not-a-limiter", "field", "x").await.unwrap();

    let out = redlimit(&url, &["ls", "api:*", "--sort", "usage", "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let list = json(&out);
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["api:a", "api:b"], "limiters only, fullest first");
    assert_eq!(list[0]["usage"], 0.9);
    assert!(list[0]["memory_bytes"].as_u64().unwrap() > 0);
    let table = text(&redlimit(&url, &["ls"]));
    assert!(table.lines().next().unwrap().starts_with("NAME"), "{table}");
    assert!(table.contains("other") && table.contains("90%"), "{table}");

    // A new rate keeps the window: 9 taken of a new rate 12 per 2 min.
    let out = redlimit(&url, &["set-rate", "api:a", "--rate", "12", "--interval", "2m"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert!(text(&out).contains("window kept"));
    assert_eq!(client.rate_limiter("api:a").available_permits().await.unwrap(), 3);
    let out = redlimit(
        &url,
        &["set-rate", "api:a", "--rate", "12", "--interval", "2m", "--reset"],
    );
    assert_eq!(code(&out), 0);
    assert_eq!(
        client.rate_limiter("api:a").available_permits().await.unwrap(),
        12
    );
    let out = redlimit(&url, &["set-rate", "missing", "--rate", "1", "--interval", "1s"]);
    assert_eq!(code(&out), 1);
    assert!(text(&out).contains("--reset"), "{}", text(&out));
    let out = redlimit(&url, &["set-rate", "api:a", "--rate", "1", "--interval", "60"]);
    assert_eq!(code(&out), 2, "usage: {}", text(&out));
    assert!(text(&out).contains("not a duration"), "{}", text(&out));
    // The attribute's grammar: each unit once, largest first; nothing is written.
    let out = redlimit(&url, &["set-rate", "api:a", "--rate", "1", "--interval", "30s1m"]);
    assert_eq!(code(&out), 2, "usage: {}", text(&out));
    assert!(text(&out).contains("largest first"), "{}", text(&out));

    // check takes nothing; acquire takes.
    let out = redlimit(&url, &["check", "other", "--permits", "5", "--json"]);
    assert_eq!(code(&out), 0);
    assert_eq!(json(&out)["allowed"], true);
    let out = redlimit(&url, &["acquire", "other", "--permits", "4"]);
    assert_eq!(code(&out), 0);
    assert!(
        text(&out).contains("4 permits granted; 1 available"),
        "{}",
        text(&out)
    );
    let out = redlimit(&url, &["check", "other", "--permits", "2", "--json"]);
    assert_eq!(code(&out), 1);
    let refused = json(&out);
    assert_eq!(refused["allowed"], false);
    assert_eq!(refused["available"], 1);
    assert!(refused["retry_after_ms"].as_u64().unwrap() > 55_000);
    let out = redlimit(&url, &["check", "other", "--permits", "1"]);
    assert_eq!(code(&out), 0, "still 1 available: check took nothing");
    assert_eq!(code(&redlimit(&url, &["acquire", "other", "--permits", "2"])), 1);

    // reset asks first; a per-client limiter's client keys go too.
    let per_client = client.rate_limiter("pc");
    per_client
        .try_set_rate(RateType::PerClient, 5, MINUTE)
        .await
        .unwrap();
    assert!(per_client.try_acquire(1).await.unwrap());
    // A new rate keeps the mode: each client's limit is not made one for all.
    let out = redlimit(
        &url,
        &["set-rate", "pc", "--rate", "4", "--interval", "1m", "--json"],
    );
    assert_eq!(code(&out), 0, "{}", text(&out));
    let config = per_client.config().await.unwrap().unwrap();
    assert_eq!((config.rate_type, config.rate), (RateType::PerClient, 4));
    let mut refused = Command::new(env!("CARGO_BIN_EXE_redlimit"))
        .args(["reset", "pc"])
        .env("REDIS_URL", &url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    refused.stdin.take().unwrap().write_all(b"n\n").unwrap();
    assert_eq!(refused.wait_with_output().unwrap().status.code(), Some(1));
    assert!(per_client.is_exists().await.unwrap(), "not deleted without a yes");
    let out = redlimit(&url, &["reset", "pc", "--yes", "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(
        json(&out)["deleted_keys"],
        3,
        "config, and the client's value and log"
    );
    let left: Vec<String> = raw.keys("*pc*").await.unwrap();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn watch_counts_the_grants_of_each_period() {
    let server = RedisServer::start();
    let url = server.url();
    let client = Client::connect(&url).await.unwrap();
    let limiter = client.rate_limiter("watched");
    limiter
        .try_set_rate(RateType::Overall, 100, MINUTE)
        .await
        .unwrap();
    let watch = Command::new(env!("CARGO_BIN_EXE_redlimit"))
        .args(["watch", "watched", "--every", "600ms", "--count", "2", "--json"])
        .env("REDIS_URL", &url)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(limiter.try_acquire(3).await.unwrap());
    assert!(limiter.try_acquire(4).await.unwrap());
    let out = watch.wait_with_output().unwrap();
    assert_eq!(code(&out), 0);
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    let granted: u64 = lines.iter().map(|l| l["granted"].as_u64().unwrap()).sum();
    assert_eq!(granted, 7);
    assert_eq!(lines[1]["available"], 93);
    assert_eq!(lines[1]["permits_in_window"], 7);
}

#[test]
fn failures_say_what_and_never_show_the_password() {
    let port = support::free_port();
    let url = format!("redis://:hunter2secret@127.0.0.1:{port}/");
    let out = redlimit(&url, &["inspect", "x"]);
    assert_eq!(code(&out), 3, "{}", text(&out));
    assert!(!text(&out).contains("hunter2secret"), "{}", text(&out));
    assert!(text(&out).contains("redis://***@127.0.0.1"), "{}", text(&out));
    let out = Command::new(env!("CARGO_BIN_EXE_redlimit"))
        .args(["inspect", "x"])
        .env_remove("REDIS_URL")
        .output()
        .unwrap();
    assert_eq!(code(&out), 2);
    assert!(text(&out).contains("REDIS_URL"));
}

#[tokio::test]
async fn on_a_cluster_ls_finds_limiters_on_every_primary() {
    let cluster = RedisCluster::start(3, 0);
    let url = cluster.url();
    let client = Client::connect(&url).await.unwrap();
    let names = ["a", "b", "c", "d", "e", "f"];
    for name in names {
        let limiter = client.rate_limiter(format!("cl:{name}"));
        limiter.try_set_rate(RateType::Overall, 10, MINUTE).await.unwrap();
        assert!(limiter.try_acquire(1).await.unwrap());
    }
    let primaries: std::collections::HashSet<u16> = names
        .iter()
        .map(|n| cluster.primary_of(cluster.keyslot(&format!("cl:{n}"))).0)
        .collect();
    assert!(primaries.len() > 1, "the limiters are spread over primaries");
    // Token buckets too, wherever their slot is.
    let buckets = ["g", "h", "i", "j"];
    for name in buckets {
        let bucket = client.token_bucket(format!("cl:{name}"), 10, MINUTE);
        assert!(bucket.try_acquire(1).await.unwrap());
    }
    let bucket_primaries: std::collections::HashSet<u16> = buckets
        .iter()
        .map(|n| cluster.primary_of(cluster.keyslot(&format!("cl:{n}"))).0)
        .collect();
    assert!(
        bucket_primaries.len() > 1,
        "the buckets are spread over primaries"
    );
    let out = redlimit(&url, &["ls", "cl:*", "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    let list = json(&out);
    assert_eq!(
        list.as_array().unwrap().len(),
        names.len() + buckets.len(),
        "{list}"
    );
    let kinds = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["algorithm"] == "bucket")
        .count();
    assert_eq!(kinds, buckets.len(), "{list}");
    let out = redlimit(&url, &["inspect", "cl:h", "--json"]);
    assert_eq!(json(&out)["token_buckets"][0]["tokens"], 9, "{}", text(&out));
    let out = redlimit(&url, &["inspect", "cl:d", "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(json(&out)["buckets"][0]["value"], 9);
}

#[redlimit::rate_limit(key = "watched:{user}", rate = 2, interval = "60s")]
async fn watched_call(user: &str) -> Result<(), redlimit::RateLimited> {
    let _ = user;
    Ok(())
}

/// Refusals by the attribute are reported to Redis once a second; `watch` shows them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_shows_the_refusals_processes_report() {
    let server = RedisServer::start();
    let url = server.url();
    redlimit::set_default(Client::connect(&url).await.unwrap()).unwrap();
    // The first call starts the client's background reporting.
    watched_call("w").await.unwrap();
    let watch = Command::new(env!("CARGO_BIN_EXE_redlimit"))
        .args(["watch", "rate_limit:watched:w", "--count", "5", "--json"])
        .env("REDIS_URL", &url)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    watched_call("w").await.unwrap();
    for _ in 0..6 {
        assert!(watched_call("w").await.is_err());
    }
    let out = watch.wait_with_output().unwrap();
    assert_eq!(code(&out), 0);
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let refused: u64 = lines.iter().map(|l| l["refused"].as_u64().unwrap()).sum();
    let granted: u64 = lines.iter().map(|l| l["granted"].as_u64().unwrap()).sum();
    assert_eq!((granted, refused), (1, 6), "{lines:?}");
    assert!(lines.iter().all(|l| l["refused_complete"] == true), "{lines:?}");
}

/// Seconds whose reports went past a process's budget of limiters (150 sprayed keys
/// refused at the start of each second, the rest counted by rule) cannot say all of a
/// watched limiter's refusals: `watch` says so (`10+`; `refused_complete: false`)
/// rather than show a count that looks whole.
#[tokio::test]
async fn watch_says_when_a_spray_left_its_count_incomplete() {
    let server = RedisServer::start();
    let url = server.url();
    let mut raw = server.raw().await;
    let now: (u64, u64) = redis::cmd("TIME").query_async(&mut raw).await.unwrap();
    for second in now.0 - 5..now.0 + 10 {
        let key = format!("rate_limit:redlimit:refused:{second}");
        let _: () = redis::pipe()
            .hset(&key, "rate_limit:victim", 10)
            .hset(&key, "rule:spray:{key}", 70)
            .hset(&key, "rate_limit:calm", 3)
            .query_async(&mut raw)
            .await
            .unwrap();
    }
    let name = "rate_limit:victim";
    let rule = [Rule::new(name, 5, MINUTE)];
    Client::connect(&url)
        .await
        .unwrap()
        .check_rules(&rule)
        .await
        .unwrap();
    // (the first period covers no second a report is due for yet)
    let out = redlimit(&url, &["watch", name, "--every", "1s", "--count", "3", "--json"]);
    let last: Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(last["refused_complete"], false, "{last}");
    assert!(last["refused"].as_u64().unwrap() >= 10, "{last}");
    let table = text(&redlimit(&url, &["watch", name, "--every", "1s", "--count", "3"]));
    let row = table.lines().last().unwrap();
    assert!(
        row.split_whitespace()
            .any(|cell| cell.ends_with('+') && cell.len() > 2),
        "{table}"
    );
}

/// A server whose policy can evict limiter keys is a health finding of `inspect`,
/// naming the policy and the fix; the same limiter on noeviction is healthy.
#[tokio::test]
async fn inspect_finds_a_policy_that_can_evict_limiter_keys() {
    let server = RedisServer::start_with(&["--maxmemory", "100mb", "--maxmemory-policy", "volatile-lfu"]);
    let url = server.url();
    let client = Client::connect(&url).await.unwrap();
    let rule = [Rule::new("rate_limit:evictable", 5, MINUTE)];
    assert!(client.check_rules(&rule).await.unwrap().allowed);
    let out = redlimit(&url, &["inspect", "rate_limit:evictable", "--json"]);
    assert_eq!(code(&out), 1, "unhealthy: {}", text(&out));
    let report = json(&out);
    assert_eq!(report["healthy"], false);
    let problems = report["problems"].to_string();
    assert!(
        problems.contains("volatile-lfu") && problems.contains("noeviction"),
        "{problems}"
    );
    let human = text(&redlimit(&url, &["inspect", "rate_limit:evictable"]));
    assert!(
        human.contains("PROBLEM") && human.contains("can evict rate limiter keys"),
        "{human}"
    );

    let mut raw = server.raw().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query_async(&mut raw)
        .await
        .unwrap();
    let out = redlimit(&url, &["inspect", "rate_limit:evictable", "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(json(&out)["healthy"], true);
}
