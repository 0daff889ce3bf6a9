//! What a caller's value can reach, against a real redis-server and a real HTTP server:
//! not another rule's limiters, not the library's own keys. (Its own test binary: it
//! sets the default client.)
#![cfg(feature = "axum")]

use redlimit_test_support as support;

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

/// A rule whose name has a hash tag keeps its value, log and bucket at `NAME:value`,
/// `NAME:permits` and `NAME:bucket`: a second rule writing a value after that name
/// could be called with `value`.
#[rate_limit(key = "{{tenant:{t}}}", rate = 3, interval = "60s")]
async fn tenant_all(t: &str) -> Result<(), RateLimited> {
    let _ = t;
    Ok(())
}

#[rate_limit(
    key = "{{tenant:{t}}}:{route}",
    rate = 1,
    interval = "60s",
    on_error = "allow"
)]
async fn tenant_route(t: &str, route: &str) -> Result<(), RateLimited> {
    let _ = (t, route);
    Ok(())
}

/// A token bucket per client on a name with a hash tag keeps it at
/// `NAME:bucket:<client id>`, and a settle's mark at `NAME:settled:<grant id>`: rules
/// whose names could be either.
#[rate_limit(
    key = "{{seat:{t}}}",
    rate = 5,
    interval = "60s",
    algorithm = "token_bucket",
    mode = "per_client"
)]
async fn seat(t: &str) -> Result<(), RateLimited> {
    let _ = t;
    Ok(())
}

#[rate_limit(key = "{{seat:{t}}}:bucket:{id}", rate = 5, interval = "60s")]
async fn seat_bucket(t: &str, id: &str) -> Result<(), RateLimited> {
    let _ = (t, id);
    Ok(())
}

#[rate_limit(key = "{{seat:{t}}}:settled:{id}", rate = 5, interval = "60s")]
async fn seat_mark(t: &str, id: &str) -> Result<(), RateLimited> {
    let _ = (t, id);
    Ok(())
}

/// A rule whose value follows a name with a hash tag, used alone in this process: the
/// other rule of its shape (`{{plan:{p}}}`) stands for another service's.
#[rate_limit(key = "{{plan:{p}}}:{what}", rate = 5, interval = "60s")]
async fn plan_feature(p: &str, what: &str) -> Result<(), RateLimited> {
    let _ = (p, what);
    Ok(())
}

/// A rule of 1 a minute that lets calls through when Redis is down.
#[rate_limit(key = "state:{id}", rate = 1, interval = "60s", on_error = "allow")]
async fn allow_on_outage(id: u32) -> Result<(), RateLimited> {
    let _ = id;
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
    let addr = support::http::serve_route("/login", |app| app.layer(layer)).await;
    assert_eq!(support::http::send(addr, "GET", "/login", &[]).await.status, 200);

    // The attribute's rule, called with the victim's address: refused, naming both
    // rules, and nothing spent of the victim's limiter. Both rules refuse from then on
    // (which one a caller used first changes nothing): the layer answers 500.
    for _ in 0..20 {
        let refused = lookup("127.0.0.1").await.unwrap_err();
        let cause = refused.cause().expect("refused as misuse, not by a limit");
        assert!(matches!(cause, Error::OverlappingRules { .. }), "{cause}");
        let text = cause.to_string();
        assert!(
            text.contains("login:{user}") && text.contains("login:{client ip}"),
            "{text}"
        );
    }
    assert_eq!(zcard(&mut raw, "{rate_limit:login:127.0.0.1}:permits").await, 1);
    for _ in 0..3 {
        assert_eq!(support::http::send(addr, "GET", "/login", &[]).await.status, 500);
    }
    assert_eq!(zcard(&mut raw, "{rate_limit:login:127.0.0.1}:permits").await, 1);

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

    // A name that is another rule's stored key: both rules refuse, whichever came
    // first, and nothing is written to the other's keys.
    tenant_all("acme").await.unwrap();
    for route in ["value", "permits", "bucket", "x"] {
        let refused = tenant_route("acme", route).await.unwrap_err();
        assert!(
            matches!(refused.cause(), Some(Error::OverlappingRules { .. })),
            "{route}: {refused:?}"
        );
    }
    let refused = tenant_all("acme").await.unwrap_err();
    assert!(
        matches!(refused.cause(), Some(Error::OverlappingRules { .. })),
        "{refused:?}"
    );
    let kind: String = redis::cmd("TYPE")
        .arg("rate_limit:{tenant:acme}:value")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(kind, "string", "the value key is still the first rule's");
    seat("acme").await.unwrap();
    let bucket = format!("rate_limit:{{seat:acme}}:bucket:{}", client.client_id());
    let before: Vec<u8> = redis::cmd("DUMP")
        .arg(&bucket)
        .query_async(&mut raw)
        .await
        .unwrap();
    for refused in [
        seat_bucket("acme", client.client_id()).await.unwrap_err(),
        seat_mark("acme", "00112233445566778899aabbccddeeff")
            .await
            .unwrap_err(),
        seat("acme").await.unwrap_err(),
    ] {
        assert!(
            matches!(refused.cause(), Some(Error::OverlappingRules { .. })),
            "{refused:?}"
        );
    }
    let after: Vec<u8> = redis::cmd("DUMP")
        .arg(&bucket)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(before, after, "the bucket is the first rule's, as it was");

    // The same with the other rule in another process (here Redisson's API by hand,
    // which no registry of this one knows): a value that is a word of the key layout
    // is written encoded, so it names a limiter of its own, not the other's keys.
    for what in ["value", "permits", "bucket", "settled"] {
        plan_feature("gold", what).await.unwrap();
    }
    let other = client.rate_limiter("rate_limit:{plan:gold}");
    assert!(other
        .try_set_rate(redlimit::RateType::Overall, 3, Duration::from_secs(60))
        .await
        .unwrap());
    let mut granted = 0;
    for _ in 0..5 {
        granted += u32::from(other.try_acquire(1).await.unwrap());
    }
    assert_eq!(granted, 3, "the other limiter's 3 a minute, on keys of its own");
    let kind: String = redis::cmd("TYPE")
        .arg("rate_limit:{plan:gold}:value")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(kind, "string", "the other limiter's value key is its own");
    let kind: String = redis::cmd("TYPE")
        .arg("rate_limit:{plan:gold}:%76alue")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(kind, "hash", "the value `value` names a limiter of its own");

    // State another program wrote under a rule's keys: `allow` decides in process, it
    // does not switch the limit off.
    let _: () = redis::cmd("HSET")
        .arg("{rate_limit:state:1}:value")
        .arg("field")
        .arg("x")
        .query_async(&mut raw)
        .await
        .unwrap();
    let mut granted = 0;
    for _ in 0..20 {
        match allow_on_outage(1).await {
            Ok(()) => granted += 1,
            Err(refused) => assert!(
                refused.cause().is_none(),
                "refused by the in-process limit: {refused:?}"
            ),
        }
    }
    assert_eq!(
        granted, 1,
        "1 a minute, decided in process over a foreign value key"
    );
}

/// Two layers, each with a rule keyed by a closure of its own: one shape each, so a
/// value one closure computes never reaches the other's limiters; both refuse.
#[tokio::test]
async fn two_closures_are_two_shapes() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let layer = |key: Key| {
        RateLimitLayer::builder()
            .client(client.clone())
            .rule(LayerRule::new("closures", 5, Duration::from_secs(60)).key(key))
            .build()
            .unwrap()
    };
    let users = layer(Key::with(|parts: &axum::http::request::Parts| {
        parts.headers.get("x-user")?.to_str().ok().map(str::to_owned)
    }));
    let tenants = layer(Key::with(|parts: &axum::http::request::Parts| {
        parts.headers.get("x-tenant")?.to_str().ok().map(str::to_owned)
    }));
    let app = axum::Router::new()
        .route("/users", axum::routing::get(|| async { "u" }).layer(users))
        .route("/tenants", axum::routing::get(|| async { "t" }).layer(tenants));
    let addr = support::http::serve(app).await;
    assert_eq!(
        support::http::send(addr, "GET", "/tenants", &[("x-tenant", "acme")])
            .await
            .status,
        200
    );
    for path in ["/users", "/tenants", "/users"] {
        let reply = support::http::send(addr, "GET", path, &[("x-user", "acme"), ("x-tenant", "acme")]).await;
        assert_eq!(reply.status, 500, "{path}: {}", reply.body);
    }
}

/// A rule keyed by a header or a path parameter named `ip` (or `request.client_ip`)
/// beside a rule of the same name keyed by the client address: a value the caller
/// chooses is not the address the layer read, so the two are of different shapes and
/// refuse, and the caller spends nothing of the address's limiter.
#[tokio::test]
async fn a_header_or_path_parameter_named_ip_is_not_the_client_address() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    let minute = Duration::from_secs(60);
    for (name, key, path, headers) in [
        ("login1", Key::path_param("ip"), "/lookup/127.0.0.1", vec![]),
        (
            "login2",
            Key::header("ip"),
            "/lookup/x",
            vec![("ip", "127.0.0.1")],
        ),
        (
            "login3",
            Key::header("request.client_ip"),
            "/lookup/x",
            vec![("request.client_ip", "127.0.0.1")],
        ),
    ] {
        let login = RateLimitLayer::builder()
            .client(client.clone())
            .rule(LayerRule::new(name, 2, minute).key(Key::client_ip()))
            .build()
            .unwrap();
        let lookup = RateLimitLayer::builder()
            .client(client.clone())
            .rule(LayerRule::new(name, 100, minute).key(key))
            .build()
            .unwrap();
        let app = axum::Router::new()
            .route("/login", axum::routing::get(|| async { "in" }).layer(login))
            .route(
                "/lookup/{ip}",
                axum::routing::get(|| async { "found" }).layer(lookup),
            );
        let addr = support::http::serve(app).await;
        let victim = format!("{{rate_limit:{name}:127.0.0.1}}:permits");
        assert_eq!(support::http::send(addr, "GET", "/login", &[]).await.status, 200);
        for _ in 0..5 {
            let reply = support::http::send(addr, "GET", path, &headers).await;
            assert_eq!(reply.status, 500, "{name} {path}: {}", reply.body);
        }
        assert_eq!(
            zcard(&mut raw, &victim).await,
            1,
            "{name}: the victim's one login"
        );
    }
}
