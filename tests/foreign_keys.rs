//! A limiter's writes (try_set_rate, set_rate, update_rate, keep_alive, expire,
//! delete) on a key that is not a limiter's: another program's string or hash, or
//! one of the library's own keys (the override table, refusal reports). Each is
//! refused with an error naming what the key holds, and writes nothing; a key that
//! does not exist yet may still become a limiter.

use redlimit_test_support as support;

use std::time::Duration;

use redis::AsyncCommands;
use redlimit::{Client, Error, RateLimiterArgs, RateType};
use support::RedisServer;

const MINUTE: Duration = Duration::from_secs(60);

/// A key's type, TTL and contents, as DUMP has them.
async fn state(raw: &mut redis::aio::MultiplexedConnection, key: &str) -> (String, i64, Option<Vec<u8>>) {
    let kind: String = redis::cmd("TYPE").arg(key).query_async(raw).await.unwrap();
    let ttl: i64 = raw.pttl(key).await.unwrap();
    let dump: Option<Vec<u8>> = redis::cmd("DUMP").arg(key).query_async(raw).await.unwrap();
    (kind, ttl, dump)
}

fn assert_refused(err: &Error, key: &str, found: &str) {
    assert!(
        matches!(err, Error::NotALimiter { key: k, .. } if k == key),
        "{key}: {err:?}"
    );
    let text = err.to_string();
    assert!(text.contains(found), "{key}: {text}");
    assert!(text.contains("nothing was written"), "{text}");
    assert!(!err.is_backend_failure(), "a foreign key is misuse: {err:?}");
}

/// Every write of a RateLimiter on `name`, each refused, the key left as it was.
async fn every_write_refused(
    client: &Client,
    raw: &mut redis::aio::MultiplexedConnection,
    name: &str,
    found: &str,
) {
    let before = state(raw, name).await;
    let limiter = client.rate_limiter(name);
    let args = RateLimiterArgs::new(RateType::Overall, 5, MINUTE).keep_alive(Duration::from_secs(61));
    let errors = [
        limiter
            .try_set_rate(RateType::Overall, 5, MINUTE)
            .await
            .map(|_| ()),
        limiter.set_rate(RateType::Overall, 5, MINUTE).await,
        limiter
            .update_rate(RateType::PerClient, 5, MINUTE)
            .await
            .map(|_| ()),
        limiter.set_rate_with(&args).await,
        limiter.update_rate_with(&args.keep_state(true)).await.map(|_| ()),
        limiter.keep_alive(Duration::from_secs(61)).await,
        limiter.expire(Duration::from_secs(1)).await.map(|_| ()),
        limiter.delete().await.map(|_| ()),
    ];
    for (i, result) in errors.into_iter().enumerate() {
        let err = result.expect_err(&format!("write {i} on {name}"));
        assert_refused(&err, name, found);
    }
    assert_eq!(state(raw, name).await, before, "{name} untouched");
}

#[tokio::test]
async fn a_limiter_writes_nothing_to_a_key_that_is_not_a_limiter() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;

    // Another program's string and hashes: a session, a user record, a hash that
    // has a `rate` but is no limiter's config.
    let _: () = raw.set("session:abc", "token").await.unwrap();
    every_write_refused(&client, &mut raw, "session:abc", "holds a string").await;
    let _: () = raw
        .hset_multiple("user:42", &[("name", "ada"), ("email", "ada@example.com")])
        .await
        .unwrap();
    every_write_refused(&client, &mut raw, "user:42", "without rate, interval, type").await;
    let _: () = raw
        .hset_multiple("fx:quote", &[("rate", "1.0842"), ("currency", "EUR")])
        .await
        .unwrap();
    every_write_refused(&client, &mut raw, "fx:quote", "without interval, type").await;
    let _: () = raw.rpush("jobs", "one").await.unwrap();
    every_write_refused(&client, &mut raw, "jobs", "holds a list").await;

    // The library's own keys, refused by name whatever they hold: the override table
    // (here made to look like a config, as a caller's value written into it would)
    // and a refusal report.
    client
        .set_override(&redlimit::RateOverride {
            of: redlimit::OverrideOf::Rule("login".into()),
            rate: 3,
            interval: MINUTE,
        })
        .await
        .unwrap();
    let _: () = raw
        .hset_multiple(
            "rate_limit:redlimit:overrides",
            &[("rate", "5"), ("interval", "1000"), ("type", "0")],
        )
        .await
        .unwrap();
    every_write_refused(
        &client,
        &mut raw,
        "rate_limit:redlimit:overrides",
        "override table",
    )
    .await;
    let _: () = raw
        .hset("rate_limit:redlimit:refused:1700000000", "login", 3)
        .await
        .unwrap();
    every_write_refused(
        &client,
        &mut raw,
        "rate_limit:redlimit:refused:1700000000",
        "refusal report",
    )
    .await;
    // Not even a missing one becomes a limiter.
    let err = client
        .rate_limiter("rate_limit:redlimit:refused:1800000000")
        .try_set_rate(RateType::Overall, 5, MINUTE)
        .await
        .unwrap_err();
    assert_refused(&err, "rate_limit:redlimit:refused:1800000000", "refusal report");
    let exists: bool = raw
        .exists("rate_limit:redlimit:refused:1800000000")
        .await
        .unwrap();
    assert!(!exists);
    // With another prefix, that client's own keys are the ones refused.
    let other = Client::builder()
        .prefix("app:")
        .connect(&server.url())
        .await
        .unwrap();
    let err = other
        .rate_limiter("app:redlimit:overrides")
        .set_rate(RateType::Overall, 5, MINUTE)
        .await
        .unwrap_err();
    assert_refused(&err, "app:redlimit:overrides", "override table");

    // A missing key becomes a limiter; a limiter's config (Redisson's layout, with or
    // without keepAliveTime) is one, and is written.
    let fresh = client.rate_limiter("fresh:1");
    assert!(fresh.try_set_rate(RateType::Overall, 5, MINUTE).await.unwrap());
    assert!(!fresh.try_set_rate(RateType::Overall, 6, MINUTE).await.unwrap());
    fresh.set_rate(RateType::Overall, 7, MINUTE).await.unwrap();
    let _: () = raw
        .hset_multiple(
            "redisson:1",
            &[("rate", "5"), ("interval", "60000"), ("type", "0")],
        )
        .await
        .unwrap();
    let redisson = client.rate_limiter("redisson:1");
    assert!(!redisson.try_set_rate(RateType::Overall, 9, MINUTE).await.unwrap());
    assert!(redisson.update_rate(RateType::Overall, 9, MINUTE).await.unwrap());
    redisson.keep_alive(Duration::from_secs(120)).await.unwrap();
    assert!(redisson.expire(Duration::from_secs(100)).await.unwrap());
    assert!(redisson.delete().await.unwrap());
    let exists: bool = raw.exists("redisson:1").await.unwrap();
    assert!(!exists);
}

/// A token bucket's delete removes its state, and refuses a key under the bucket's
/// name that holds something else.
#[tokio::test]
async fn a_token_bucket_deletes_only_its_state() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    let bucket = client.token_bucket("tb:1", 5, MINUTE);
    assert!(bucket.try_acquire(1).await.unwrap());
    assert!(bucket.delete().await.unwrap());
    let exists: bool = raw.exists("{tb:1}:bucket").await.unwrap();
    assert!(!exists);

    let _: () = raw.set("{tb:2}:bucket", "not a bucket").await.unwrap();
    let err = client.token_bucket("tb:2", 5, MINUTE).delete().await.unwrap_err();
    assert_refused(&err, "{tb:2}:bucket", "not a token bucket");
    let kept: String = raw.get("{tb:2}:bucket").await.unwrap();
    assert_eq!(kept, "not a bucket");
}

/// A rule creates its limiter's config only where nothing is: a rule named after
/// another program's hash is refused, and the hash is left as it was.
#[tokio::test]
async fn a_rule_writes_no_config_into_another_programs_hash() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    for (name, fields, found) in [
        ("user:7", vec![("name", "ada")], "without rate, interval, type"),
        ("fx:rate", vec![("rate", "1.0842")], "without interval, type"),
    ] {
        let _: () = raw.hset_multiple(name, &fields).await.unwrap();
        let before = state(&mut raw, name).await;
        for rules in [
            vec![redlimit::Rule::new(name, 5, MINUTE)],
            vec![
                redlimit::Rule::new("fresh:1", 5, MINUTE),
                redlimit::Rule::new(name, 5, MINUTE),
            ],
        ] {
            let err = client.check_rules(&rules).await.unwrap_err();
            assert_refused(&err, name, found);
        }
        assert_eq!(state(&mut raw, name).await, before, "{name} unchanged");
    }
    let exists: bool = raw.exists("fresh:1").await.unwrap();
    assert!(!exists, "a refused call writes no rule's config");
}
