//! What a caller's value can reach, against a real redis-server and a real HTTP server:
//! not another rule's limiters, not the library's own keys. (Its own test binary: it
//! sets the default client.)
#![cfg(feature = "axum")]

mod support;

use std::time::Duration;

use redlimit::tower::{Key, LayerRule, RateLimitLayer};
use redlimit::{rate_limit, Client, Error, OverrideOf, RateLimited, RateOverride};
use support::RedisServer;

/// An attribute rule whose shape is the layer's `login` rule's, with another value:
/// `lookup("127.0.0.1")` would spend what the layer gives 127.0.0.1.
#[rate_limit(key = "login:{user}", rate = 100, interval = "60s")]
async fn lookup(user: &str) -> Result<(), RateLimited> {
    let _ = user;
    Ok(())
}

/// A rule keyed by an API key, called with values that name the library's keys.
#[rate_limit(key = "api:{api_key}", rate = 5, interval = "60s")]
async fn by_api_key(api_key: &str) -> Result<(), RateLimited> {
    let _ = api_key;
    Ok(())
}

async fn zcard(raw: &mut redis::aio::MultiplexedConnection, key: &str) -> u64 {
    redis::cmd("ZCARD").arg(key).query_async(raw).await.unwrap()
}

#[tokio::test]
async fn a_value_reaches_neither_another_rules_limiters_nor_the_librarys_keys() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    redlimit::set_default(client.clone()).unwrap();
    let mut raw = server.raw().await;

    // The layer's rule, 5 per minute per client address, in use first.
    let layer = RateLimitLayer::builder()
        .client(client.clone())
        .rule(LayerRule::new("login", 5, Duration::from_secs(60)).key(Key::client_ip()))
        .build()
        .unwrap();
    let app = axum::Router::new()
        .route("/login", axum::routing::get(|| async { "ok" }))
        .layer(layer);
    let addr = support::http::serve(app).await;
    assert_eq!(support::http::send(addr, "GET", "/login", &[]).await.status, 200);

    // The attribute's rule, called with the victim's address: refused, naming both
    // rules, and nothing spent of the victim's limiter.
    for _ in 0..20 {
        let refused = lookup("127.0.0.1").await.unwrap_err();
        let cause = refused.cause().expect("refused as misuse, not by a limit");
        assert!(matches!(cause, Error::OverlappingRules { .. }), "{cause}");
        let text = cause.to_string();
        assert!(
            text.contains("login:{user}") && text.contains("login:{ip}"),
            "{text}"
        );
    }
    assert_eq!(zcard(&mut raw, "{rate_limit:login:127.0.0.1}:permits").await, 1);
    let statuses: Vec<u16> = {
        let mut s = Vec::new();
        for _ in 0..5 {
            s.push(support::http::send(addr, "GET", "/login", &[]).await.status);
        }
        s
    };
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 429],
        "the victim keeps its own 5 a minute"
    );

    // Values that name the library's keys: each is a limiter of the rule's own, and the
    // override table stays what it was, a hash without a TTL.
    client
        .set_override(&RateOverride {
            of: OverrideOf::Rule("api:{api_key}".into()),
            rate: 3,
            interval: Duration::from_secs(60),
        })
        .await
        .unwrap();
    let table = client.overrides_key();
    assert_eq!(table, "rate_limit:redlimit:overrides");
    for hostile in [
        "overrides",
        "redlimit",
        "redlimit:overrides",
        ":redlimit:overrides",
        "{redlimit}",
        "%3A",
    ] {
        for _ in 0..3 {
            by_api_key(hostile).await.unwrap();
        }
        assert!(
            by_api_key(hostile).await.is_err(),
            "{hostile}: the override's 3 a minute applies"
        );
    }
    let kind: String = redis::cmd("TYPE")
        .arg(&table)
        .query_async(&mut raw)
        .await
        .unwrap();
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&table)
        .query_async(&mut raw)
        .await
        .unwrap();
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(&table)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(
        (kind.as_str(), ttl, fields),
        ("hash", -1, vec!["rule:api:{api_key}".to_owned()])
    );
    let names: Vec<String> = redis::cmd("KEYS")
        .arg("rate_limit:api:*")
        .query_async(&mut raw)
        .await
        .unwrap();
    for name in &names {
        assert!(!name.starts_with("rate_limit:redlimit"), "{name}");
    }
    assert!(
        names.contains(&"rate_limit:api:redlimit%3Aoverrides".to_owned()),
        "{names:?}"
    );
}
