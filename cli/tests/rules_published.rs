//! Each process publishes the rules it runs to `<prefix>redlimit:rules`, which
//! `redlimit override set` checks an override against: within seconds of a rule's
//! first call, then again once a minute has passed on the client's clock, the table
//! kept an hour after the last publication.

use redlimit_test_support as support;

use std::time::{Duration, Instant};

use redlimit::{rate_limit, Client, ManualClock, RateLimited};
use support::RedisServer;

const T0: u64 = 1_700_000_000_000;

#[rate_limit(key = "published:{query}", rate = 5, interval = "60s")]
async fn published(query: &str) -> Result<(), RateLimited> {
    let _ = query;
    Ok(())
}

/// The fields of the published rules table.
async fn fields(raw: &mut redis::aio::MultiplexedConnection, key: &str) -> Vec<String> {
    redis::cmd("HKEYS").arg(key).query_async(raw).await.unwrap()
}

/// Waits up to `within` for the table to name the rule; how long that took.
async fn until_published(
    raw: &mut redis::aio::MultiplexedConnection,
    key: &str,
    within: Duration,
) -> Duration {
    let started = Instant::now();
    loop {
        if fields(raw, key)
            .await
            .iter()
            .any(|f| f.starts_with("published:{query}|"))
        {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "not published within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rules_are_published_again_each_minute_and_kept_an_hour() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let client = Client::builder()
        .clock(clock.clone())
        .connect(&server.url())
        .await
        .unwrap();
    redlimit::set_default(client.clone()).unwrap();
    let key = client.rules_key();
    let mut raw = server.raw().await;

    published("q").await.unwrap();
    let took = until_published(&mut raw, &key, Duration::from_secs(5)).await;
    println!("published {took:?} after the first call");
    let ttl: i64 = redis::cmd("PTTL").arg(&key).query_async(&mut raw).await.unwrap();
    assert!(
        (3_590_000..=3_600_000).contains(&ttl),
        "the table kept an hour: {ttl} ms"
    );

    // Gone (an operator's `DEL`, or an hour with no process publishing): not written
    // again until a minute passed since the last publication, then within seconds.
    let _: () = redis::cmd("DEL").arg(&key).query_async(&mut raw).await.unwrap();
    clock.advance(Duration::from_secs(59));
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(
        fields(&mut raw, &key).await.is_empty(),
        "published again within the minute"
    );
    clock.advance(Duration::from_secs(2));
    let took = until_published(&mut raw, &key, Duration::from_secs(5)).await;
    println!("published again {took:?} after the minute passed");
}
