//! `redlimit override set` checks an override against the rules of every process using
//! the Redis, as `Client::set_override` does in a process running them: each process
//! publishes its rules, and an override one of them cannot take is refused with the
//! reason, writing nothing.

use redlimit_test_support as support;

use std::process::Command;
use std::time::{Duration, Instant};

use redlimit::{rate_limit, Client, RateLimited};
use support::RedisServer;

#[rate_limit(
    key = "search:{query}",
    rate = 5,
    interval = "60s",
    algorithm = "token_bucket",
    warmup = "60s"
)]
async fn search(query: &str) -> Result<(), RateLimited> {
    let _ = query;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_no_published_rule_can_take_is_refused_by_the_cli() {
    let server = RedisServer::start();
    let url = server.url();
    let client = Client::connect(&url).await.unwrap();
    redlimit::set_default(client.clone()).unwrap();
    search("q").await.unwrap();
    // The rule reaches the published table within about a second.
    let mut raw = server.raw().await;
    let started = Instant::now();
    loop {
        let fields: Vec<String> = redis::cmd("HKEYS")
            .arg(client.rules_key())
            .query_async(&mut raw)
            .await
            .unwrap();
        if fields.iter().any(|f| f.starts_with("search:{query}|b:")) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "not published: {fields:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let cli = |rate: &str| {
        Command::new(env!("CARGO_BIN_EXE_redlimit"))
            .args([
                "override",
                "set",
                "search:{query}",
                "--rate",
                rate,
                "--interval",
                "1s",
            ])
            .env("REDIS_URL", &url)
            .output()
            .unwrap()
    };
    let refused = cli("1000000000");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    assert!(
        said.contains("cannot apply to rule `search:{query}`") && said.contains("warm-up"),
        "{said}"
    );
    let overrides: Vec<String> = redis::cmd("HKEYS")
        .arg(client.overrides_key())
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(overrides.is_empty(), "nothing written: {overrides:?}");

    // One the rule can take is set.
    let set = cli("10");
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    let overrides: Vec<String> = redis::cmd("HKEYS")
        .arg(client.overrides_key())
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(overrides, ["rule:search:{query}"]);
}
