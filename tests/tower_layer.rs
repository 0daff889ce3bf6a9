//! `RateLimitLayer` on real axum servers on loopback (cargo feature `axum`), on both
//! backends: rules keyed by client address behind a trusted proxy, by header, by path
//! parameter and by nothing; a cost per request; exempt keys; shadow rules; the limit
//! shared by every route and clone of the layer; refusals and grants carrying the
//! RateLimit fields; backend failures under each `on_error` policy.
#![cfg(feature = "axum")]

use redlimit_test_support as support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use axum::{Extension, Router};
use redlimit::axum::{ClientIp, ForwardedHeader, TrustedProxies};
use redlimit::tower::{Key, LayerRule, MissingKey, RateLimitLayer};
use redlimit::{Client, OnError, RateType};
use support::http::{proxy, send, send_from, serve, serve_on, Writes};
use support::RedisServer;

const MINUTE: Duration = Duration::from_secs(60);

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/a", get(|| async { "a" }))
        .route("/b", get(|| async { "b" }))
        .layer(layer)
}

async fn status(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> u16 {
    send(addr, "GET", path, headers).await.status
}

/// A layer told to wait `Duration::MAX` for permits serves (its deadline overflowed
/// the clock and panicked each request), and the limit holds: the third request of a
/// rate of 2 is the first refused by a second layer on the same limiter that does not
/// wait.
#[tokio::test]
async fn a_layer_waiting_without_end_serves_and_keeps_the_limit() {
    let client = Client::memory();
    let layer = |timeout: Option<Duration>| {
        let builder = RateLimitLayer::builder()
            .client(client.clone())
            .rule(LayerRule::new("waits", 2, MINUTE));
        match timeout {
            Some(timeout) => builder.timeout(timeout),
            None => builder,
        }
        .build()
        .unwrap()
    };
    let waiting = serve(app(layer(Some(Duration::MAX)))).await;
    let at_once = serve(app(layer(None))).await;
    assert_eq!(status(waiting, "/a", &[]).await, 200);
    assert_eq!(status(waiting, "/b", &[]).await, 200);
    assert_eq!(status(at_once, "/a", &[]).await, 429);
}

/// A path parameter without a name a route can give is refused when the layer is
/// built, as a header key without a header name is; it was answered 500 on every
/// request.
#[tokio::test]
async fn a_path_parameter_without_a_name_is_refused_at_build() {
    for name in ["", "{id}", "a/b", ":id", "*rest", " id"] {
        let err = RateLimitLayer::builder()
            .client(Client::memory())
            .rule(LayerRule::new("users", 2, MINUTE).key(Key::path_param(name)))
            .build()
            .unwrap_err();
        let shown = err.to_string();
        assert!(shown.contains("names no path parameter"), "{name:?}: {shown}");
        assert!(shown.contains("/users/{id}"), "{shown}");
    }
    let built = RateLimitLayer::builder()
        .client(Client::memory())
        .rule(LayerRule::new("users", 2, MINUTE).key(Key::path_param("id")))
        .build();
    assert!(built.is_ok());
}

/// Every decision of the layer, in order, on `client`.
async fn client_ip_behind_a_proxy(client: Client) {
    let layer = RateLimitLayer::builder()
        .client(client.clone())
        .trusted_proxies(TrustedProxies::new(["127.0.0.1"]).unwrap())
        .rule(LayerRule::new("login", 2, MINUTE).key(Key::client_ip()))
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let from = |ip| [("x-forwarded-for", ip)];

    let first = send(addr, "GET", "/a", &from("198.51.100.7")).await;
    assert_eq!((first.status, first.body.as_str()), (200, "a"));
    assert_eq!(first.header("ratelimit-policy"), Some("\"login\";q=2;w=60"));
    assert_eq!(first.header("ratelimit"), Some("\"login\";r=1"));
    assert_eq!(status(addr, "/b", &from("198.51.100.7")).await, 200);

    let refused = send(addr, "GET", "/a", &from("198.51.100.7")).await;
    assert_eq!(refused.status, 429);
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((59..=60).contains(&retry), "{retry}");
    assert_eq!(
        refused.header("ratelimit"),
        Some(&*format!("\"login\";r=0;t={retry}"))
    );
    assert_eq!(refused.body, format!("Too many requests; retry in {retry} s\n"));

    // A client that writes its own leftmost entries is still the one the proxy saw.
    for forged in ["1.1.1.1, 198.51.100.7", "10.0.0.9,198.51.100.7"] {
        assert_eq!(status(addr, "/a", &from(forged)).await, 429, "forged {forged:?}");
    }
    assert_eq!(
        status(addr, "/a", &from("198.51.100.8")).await,
        200,
        "another client"
    );

    // The limiter is the rule's name and the address, under the client's prefix.
    let limiter = client.rate_limiter("rate_limit:login:198.51.100.7");
    assert_eq!(limiter.available_permits().await.unwrap(), 0);
}

#[tokio::test]
async fn client_ip_behind_a_proxy_in_process() {
    client_ip_behind_a_proxy(Client::memory()).await;
}

#[tokio::test]
async fn client_ip_behind_a_proxy_on_redis() {
    let server = RedisServer::start();
    client_ip_behind_a_proxy(Client::connect(&server.url()).await.unwrap()).await;
}

/// One layer on a router is one limit for all its routes, and for every clone of the
/// layer, wherever the clone is mounted.
async fn shared_by_routes_and_clones(client: Client) {
    let layer = RateLimitLayer::builder()
        .client(client)
        .rule(LayerRule::new("everything", 3, MINUTE))
        .build()
        .unwrap();
    let first = serve(app(layer.clone())).await;
    let second = serve(app(layer)).await;
    assert_eq!(status(first, "/a", &[]).await, 200);
    assert_eq!(status(first, "/b", &[]).await, 200);
    assert_eq!(status(second, "/a", &[]).await, 200);
    assert_eq!(status(second, "/b", &[]).await, 429);
    assert_eq!(status(first, "/a", &[]).await, 429);
}

#[tokio::test]
async fn one_limit_across_routes_and_clones_in_process() {
    shared_by_routes_and_clones(Client::memory()).await;
}

#[tokio::test]
async fn one_limit_across_routes_and_clones_on_redis() {
    let server = RedisServer::start();
    shared_by_routes_and_clones(Client::connect(&server.url()).await.unwrap()).await;
}

#[tokio::test]
async fn a_header_key_limits_each_value_and_leaving_it_out_escapes_nothing() {
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .rule(LayerRule::new("api", 1, MINUTE).key(Key::header("x-api-key")))
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let key = |k| [("x-api-key", k)];
    assert_eq!(status(addr, "/a", &key("k1")).await, 200);
    assert_eq!(status(addr, "/a", &key("k1")).await, 429);
    assert_eq!(status(addr, "/a", &key("k2")).await, 200);
    // A value that poses as another key's separator is only itself.
    assert_eq!(status(addr, "/a", &key("k2:x")).await, 200);
    assert_eq!(status(addr, "/a", &key("k2:x")).await, 429);
    // Without the header: one limiter for all such requests, and an empty value is the
    // same as none.
    assert_eq!(status(addr, "/a", &[]).await, 200);
    assert_eq!(status(addr, "/a", &[]).await, 429);
    assert_eq!(status(addr, "/a", &key("")).await, 429);
}

#[tokio::test]
async fn a_cost_per_request_and_exempt_keys() {
    let client = Client::memory();
    let layer = RateLimitLayer::builder()
        .client(client.clone())
        .rule(
            LayerRule::new("quota", 5, MINUTE)
                .key(Key::header("x-api-key"))
                .cost(support::http::cost_header)
                .exempt(["internal"]),
        )
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let call = |key, cost| [("x-api-key", key), ("x-cost", cost)];
    let granted = send(addr, "GET", "/a", &call("k1", "3")).await;
    assert_eq!(granted.status, 200);
    assert_eq!(granted.header("ratelimit"), Some("\"quota\";r=2"));
    assert_eq!(status(addr, "/a", &call("k1", "3")).await, 429, "3 of the 2 left");
    // A cost of 0 is not free.
    assert_eq!(status(addr, "/a", &call("k1", "0")).await, 200);
    assert_eq!(status(addr, "/a", &call("k1", "1")).await, 200);
    assert_eq!(status(addr, "/a", &call("k1", "1")).await, 429);
    // More than the rate: refused, without a wait that would not help.
    let never = send(addr, "GET", "/a", &call("k2", "6")).await;
    assert_eq!(never.status, 429);
    assert_eq!(never.header("retry-after"), None);
    assert!(
        matches!(
            client
                .rate_limiter("rate_limit:quota:k2")
                .available_permits()
                .await,
            Err(redlimit::Error::NotInitialized { .. })
        ),
        "nothing decided, nothing created"
    );
    // An exempt key takes nothing and is never refused.
    for _ in 0..10 {
        assert_eq!(status(addr, "/a", &call("internal", "5")).await, 200);
    }
}

#[tokio::test]
async fn a_shadow_rule_spends_but_never_refuses() {
    let client = Client::memory();
    let layer = RateLimitLayer::builder()
        .client(client.clone())
        .rule(LayerRule::new("trial", 1, MINUTE).shadow(true))
        .rule(LayerRule::new("real", 3, MINUTE))
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    for _ in 0..3 {
        let reply = send(addr, "GET", "/a", &[]).await;
        assert_eq!(reply.status, 200);
        assert!(reply.header("ratelimit").unwrap().starts_with("\"real\""));
    }
    assert_eq!(
        status(addr, "/a", &[]).await,
        429,
        "the enforced rule still refuses"
    );
    let trial = client.rate_limiter("rate_limit:trial");
    assert_eq!(
        trial.available_permits().await.unwrap(),
        0,
        "decided all the same"
    );
}

#[tokio::test]
async fn a_path_parameter_key_on_route_layer_and_a_clear_error_without_it() {
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .rule(LayerRule::new("user", 1, MINUTE).key(Key::path_param("id")))
        .build()
        .unwrap();
    let routed = Router::new()
        .route("/users/{id}", get(|| async { "user" }))
        .route_layer(layer.clone());
    let addr = serve(routed).await;
    assert_eq!(status(addr, "/users/1", &[]).await, 200);
    assert_eq!(status(addr, "/users/1", &[]).await, 429);
    assert_eq!(status(addr, "/users/2", &[]).await, 200);

    // Around a whole router, before its routing, there are no path parameters: every
    // request is refused as a misconfiguration (500), never let through unlimited.
    let inner = Router::new().route("/users/{id}", get(|| async { "user" }));
    let around = Router::new().fallback_service(tower_layer::Layer::layer(&layer, inner));
    let addr = serve(around).await;
    let reply = send(addr, "GET", "/users/3", &[]).await;
    assert_eq!(reply.status, 500);
    assert!(
        reply.body.contains("no route has matched where the layer is"),
        "{}",
        reply.body
    );
}

#[tokio::test]
async fn ipv6_clients_are_grouped_by_prefix() {
    let client = Client::memory();
    let layer = RateLimitLayer::builder()
        .client(client.clone())
        .rule(LayerRule::new("v6", 1, MINUTE).key(Key::client_ip()))
        .build()
        .unwrap();
    let addr = serve_on("::1", app(layer)).await;
    assert_eq!(status(addr, "/a", &[]).await, 200);
    // A forwarding header from an untrusted peer changes nothing.
    assert_eq!(
        status(addr, "/a", &[("x-forwarded-for", "2001:db8::1")]).await,
        429
    );
    // ::1 in its /64, its colons escaped.
    let limiter = client.rate_limiter("rate_limit:v6:%3A%3A/64");
    assert_eq!(limiter.available_permits().await.unwrap(), 0);
}

#[tokio::test]
async fn backend_failures_follow_each_rules_on_error() {
    let server = RedisServer::start();
    let client = Client::builder()
        .command_timeout(Duration::from_millis(300))
        .connect(&server.url())
        .await
        .unwrap();
    let layer = |on_error| {
        RateLimitLayer::builder()
            .client(client.clone())
            .rule(
                LayerRule::new("outage", 1, MINUTE)
                    .mode(RateType::Overall)
                    .on_error(on_error),
            )
            .build()
            .unwrap()
    };
    let local = serve(app(layer(OnError::Local))).await;
    let allow = serve(app(layer(OnError::Allow))).await;
    let deny = serve(app(layer(OnError::Deny))).await;
    drop(server);

    assert_eq!(status(local, "/a", &[]).await, 200, "decided in process");
    assert_eq!(status(local, "/a", &[]).await, 429, "and limited there");
    for _ in 0..3 {
        assert_eq!(status(allow, "/a", &[]).await, 200);
    }
    let refused = send(deny, "GET", "/a", &[]).await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.header("retry-after"), None);
    assert_eq!(refused.body, "Service temporarily unavailable\n");
}

/// Rules whose limiters may coincide for some key value must count them alike: a
/// limiter keeps the config of the request that last wrote it, so a client sending that
/// value would have the looser rule decide the stricter's requests (a rule `t:a` of 10
/// a minute beside `t` keyed by `x-user`, counted per client in shadow: another mode,
/// another rate, another interval, a token bucket). Such a layer does not build; rules
/// counting alike, or whose limiters never coincide, do.
#[tokio::test]
async fn rules_whose_limiters_may_coincide_must_count_alike() {
    let error = |builder: redlimit::tower::RateLimitLayerBuilder| builder.build().unwrap_err().to_string();
    let global = || LayerRule::new("t:a", 10, MINUTE);
    let keyed = || LayerRule::new("t", 10, MINUTE).key(Key::header("x-user"));
    for other in [
        keyed().mode(RateType::PerClient).shadow(true),
        LayerRule::new("t", 1_000, MINUTE).key(Key::header("x-user")),
        LayerRule::new("t", 10, Duration::from_secs(1)).key(Key::header("x-user")),
        keyed().algorithm(redlimit::Algorithm::TokenBucket),
    ] {
        let message = error(
            RateLimitLayer::builder()
                .client(Client::memory())
                .rule(global())
                .rule(other),
        );
        assert!(
            message.contains("rules `t:a` and `t` name the same limiter for some key values"),
            "{message}"
        );
    }
    // alike: one limiter, one config
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .rule(global())
        .rule(keyed())
        .build();
    let addr = serve(
        Router::new()
            .route("/a", get(|| async { "a" }))
            .layer(layer.unwrap()),
    )
    .await;
    let mut granted = 0;
    for _ in 0..30 {
        let reply = send(addr, "GET", "/a", &[("x-user", "a")]).await;
        granted += usize::from(reply.status == 200);
    }
    assert_eq!(
        granted, 10,
        "both rules on one limiter of 10, each request taking 1 once"
    );
    // never coinciding: `t:a` beside `u` keyed by a header
    RateLimitLayer::builder()
        .rule(global())
        .rule(LayerRule::new("u", 1_000, MINUTE).key(Key::header("x-user")))
        .build()
        .unwrap();
    // keyed by the client address: beside a literal address refused, beside `t:a`
    // (no address) built
    let by_client = || LayerRule::new("t", 1_000, MINUTE).key(Key::client_ip());
    for address in ["t:10.0.0.1", "t:%3A%3A1", "t:2001%3Adb8%3A%3A/64"] {
        let message = error(
            RateLimitLayer::builder()
                .rule(LayerRule::new(address, 10, MINUTE))
                .rule(by_client()),
        );
        assert!(
            message.contains("name the same limiter for some key values"),
            "{address}: {message}"
        );
    }
    RateLimitLayer::builder()
        .rule(global())
        .rule(by_client())
        .build()
        .unwrap();
}

/// Two layers of one rule name counting differently, each with a client of its own on
/// one Redis server, share its limiters: a client calling each in turn would have the
/// looser decide the stricter's requests. Once both are used, each refuses every
/// request. In process, each client keeps its own limiters: no conflict.
#[tokio::test]
async fn two_layers_of_one_rule_counting_differently_on_one_server_refuse() {
    let server = RedisServer::start();
    let layer = |client: Client, rate| {
        RateLimitLayer::builder()
            .client(client)
            .rule(LayerRule::new("dup", rate, MINUTE).key(Key::header("x-user")))
            .build()
            .unwrap()
    };
    let app = |layer| Router::new().route("/a", get(|| async { "a" })).layer(layer);
    let strict = serve(app(layer(Client::connect(&server.url()).await.unwrap(), 2))).await;
    let loose = serve(app(layer(Client::connect(&server.url()).await.unwrap(), 50))).await;
    let user = [("x-user", "u")];
    send(strict, "GET", "/a", &user).await;
    send(loose, "GET", "/a", &user).await;
    for addr in [strict, loose] {
        let reply = send(addr, "GET", "/a", &user).await;
        assert_eq!(reply.status, 500, "{reply:?}");
    }
    let strict = serve(app(layer(Client::memory(), 2))).await;
    let loose = serve(app(layer(Client::memory(), 50))).await;
    for (addr, want) in [(strict, [200, 200, 429]), (loose, [200, 200, 200])] {
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(send(addr, "GET", "/a", &user).await.status);
        }
        assert_eq!(got, want);
    }
}

#[test]
fn a_layer_that_cannot_work_does_not_build() {
    let error = |builder: redlimit::tower::RateLimitLayerBuilder| builder.build().unwrap_err().to_string();
    assert!(error(RateLimitLayer::builder()).contains("at least one rule"));
    let many = |n: usize| (0..n).map(|i| LayerRule::new(format!("r{i}"), 5, MINUTE));
    assert!(error(RateLimitLayer::builder().rules(many(257))).contains("of 257 rules"));
    RateLimitLayer::builder().rules(many(256)).build().unwrap();
    let rule = || LayerRule::new("x", 5, MINUTE);
    assert!(error(RateLimitLayer::builder().rule(rule()).rule(rule())).contains("two rules are named `x`"));
    assert!(error(RateLimitLayer::builder().rule(rule().permits(6))).contains("permits = 6"));
    assert!(error(RateLimitLayer::builder().rule(LayerRule::new("x", 0, MINUTE))).contains("rate is 0"));
    assert!(
        error(RateLimitLayer::builder().rule(rule().key(Key::header("bad header"))))
            .contains("not a header name")
    );
    assert!(error(RateLimitLayer::builder().rule(rule().exempt([""]))).contains("empty exempt value"));
    assert!(
        error(RateLimitLayer::builder().rule(rule().exempt([" \t "]))).contains("empty exempt value"),
        "spaces and tabs are no value"
    );
    for padding in ["=", " == "] {
        let binary = rule().key(Key::header("x-user-bin")).exempt([padding]);
        let said = error(RateLimitLayer::builder().rule(binary));
        assert!(said.contains("only padding"), "{padding:?}: {said}");
    }
    assert!(error(RateLimitLayer::builder().rule(LayerRule::new("", 5, MINUTE))).contains("name is empty"));
    for reserved in ["redlimit", "redlimit:overrides", "redlimit{x}"] {
        let said = error(RateLimitLayer::builder().rule(LayerRule::new(reserved, 5, MINUTE)));
        assert!(
            said.contains("may not start with `redlimit`"),
            "{reserved}: {said}"
        );
    }
    // Further in: the library's keys of clients whose prefix is the text before it.
    for reserved in [
        "rate_limit:redlimit",
        "app:redlimit:x",
        "myredlimit",
        "a{b}:redlimit",
    ] {
        let said = error(RateLimitLayer::builder().rule(LayerRule::new(reserved, 5, MINUTE)));
        assert!(
            said.contains("may not hold `redlimit` before a `:` or at its end"),
            "{reserved}: {said}"
        );
    }
    for accepted in ["redlimitx", "app:redlimits", "app:redlimit-x:y"] {
        assert!(
            RateLimitLayer::builder()
                .rule(LayerRule::new(accepted, 5, MINUTE))
                .build()
                .is_ok(),
            "{accepted}"
        );
    }
}

/// Two enforced rules are one decision: when the second refuses, the first spends
/// nothing. A key from a closure, fixed permits per request, a message, per-process mode.
#[tokio::test]
async fn rules_are_decided_all_or_nothing_in_the_attributes_vocabulary() {
    let client = Client::memory();
    let tenant = |request: &axum::http::request::Parts| {
        request
            .uri
            .query()
            .and_then(|q| q.strip_prefix("tenant="))
            .map(str::to_owned)
    };
    let layer = RateLimitLayer::builder()
        .client(client.clone())
        .rule(
            LayerRule::new("tenant", 10, MINUTE)
                .key(Key::with(tenant))
                .permits(2),
        )
        .rule(
            LayerRule::new("burst", 3, MINUTE)
                .mode(RateType::PerClient)
                .message("Slow down"),
        )
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    for _ in 0..3 {
        assert_eq!(status(addr, "/a?tenant=t1", &[]).await, 200);
    }
    let refused = send(addr, "GET", "/a?tenant=t1", &[]).await;
    assert_eq!(refused.status, 429);
    assert!(refused.body.starts_with("Slow down"), "{}", refused.body);
    assert_eq!(refused.header("ratelimit-policy"), Some("\"burst\";q=3;w=60"));
    let tenant_limiter = client.rate_limiter("rate_limit:tenant:t1");
    assert_eq!(
        tenant_limiter.available_permits().await.unwrap(),
        4,
        "3 grants of 2 permits; the refused request took none"
    );
    // per_client: the limiter's keys carry this client's id.
    let burst = client.rate_limiter("rate_limit:burst");
    assert_eq!(
        burst.config().await.unwrap().unwrap().rate_type,
        RateType::PerClient
    );
    assert_eq!(burst.available_permits().await.unwrap(), 0);
}

#[tokio::test]
async fn a_token_bucket_rule_in_a_layer() {
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .rule(
            LayerRule::new("tb", 1, MINUTE)
                .algorithm(redlimit::Algorithm::TokenBucket)
                .burst(3),
        )
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    for _ in 0..3 {
        assert_eq!(status(addr, "/a", &[]).await, 200);
    }
    let refused = send(addr, "GET", "/a", &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("retry-after"), Some("60"), "a token a minute");
    let error = RateLimitLayer::builder()
        .rule(LayerRule::new("x", 5, MINUTE).burst(3))
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("token bucket"), "{error}");
    let error = RateLimitLayer::builder()
        .rule(LayerRule::new("x", 5, MINUTE).warmup(MINUTE))
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("token bucket"), "{error}");
    let error = RateLimitLayer::builder()
        .rule(
            LayerRule::new("x", 1 << 30, MINUTE)
                .algorithm(redlimit::Algorithm::TokenBucket)
                .warmup(Duration::from_secs(1 << 20)),
        )
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("shorter warm-up"), "{error}");
}

/// A token bucket's settings hold in whichever order they are given: the burst set
/// before the algorithm is the bucket's burst still.
#[tokio::test]
async fn a_token_bucket_burst_set_before_its_algorithm() {
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .rule(
            LayerRule::new("tb", 1, MINUTE)
                .burst(3)
                .algorithm(redlimit::Algorithm::TokenBucket),
        )
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    for _ in 0..3 {
        assert_eq!(status(addr, "/a", &[]).await, 200);
    }
    assert_eq!(status(addr, "/a", &[]).await, 429, "a burst of 3, not 4");
    let error = RateLimitLayer::builder()
        .rule(
            LayerRule::new("x", 5, MINUTE)
                .algorithm(redlimit::Algorithm::TokenBucket)
                .burst(3)
                .algorithm(redlimit::Algorithm::SlidingWindow),
        )
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("token bucket"), "{error}");
}

#[tokio::test]
async fn a_warming_token_bucket_in_a_layer_starts_slow() {
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .rule(
            LayerRule::new("warming", 10, MINUTE)
                .algorithm(redlimit::Algorithm::TokenBucket)
                .warmup(MINUTE),
        )
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    // Cold (coldness up to 10 tokens, half of it 5): the permits cost 3, 2.6, 2.2 and
    // 1.8 tokens of the 10, leaving 0.4; the next token is 0.6 of a token away, 3.6 s
    // at 10 a minute (without a warm-up, all 10 would pass).
    for _ in 0..4 {
        assert_eq!(status(addr, "/a", &[]).await, 200);
    }
    let refused = send(addr, "GET", "/a", &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("retry-after"), Some("4"));
}

// Attacks on the client address, each through a real reverse proxy on loopback (the
// only trusted proxy, 127.0.0.1) that writes one forwarding header as nginx does; the
// clients connect from addresses of their own (127.0.0.55, 127.0.0.66, ...).

fn ip(text: &str) -> std::net::IpAddr {
    text.parse().unwrap()
}

/// A router limiting 5 requests a minute per client address with `trusted` (and the
/// given exempt values), behind a proxy that writes `writes`; answers the proxy's
/// address.
async fn login_behind(writes: Writes, trusted: TrustedProxies, exempt: &[&str]) -> SocketAddr {
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .trusted_proxies(trusted)
        .rule(
            LayerRule::new("login", 5, MINUTE)
                .key(Key::client_ip())
                .exempt(exempt.iter().map(|v| v.to_string())),
        )
        .build()
        .unwrap();
    proxy(serve(app(layer)).await, writes).await
}

/// How many of `requests` (each a list of raw headers) sent from `from` are granted.
async fn granted(addr: SocketAddr, from: &str, requests: &[Vec<(&str, Vec<u8>)>]) -> usize {
    let mut granted = 0;
    for headers in requests {
        let headers: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_slice())).collect();
        let reply = send_from(Some(ip(from)), addr, "GET", "/a", &headers).await;
        assert!(matches!(reply.status, 200 | 429), "{reply:?}");
        granted += usize::from(reply.status == 200);
    }
    granted
}

#[tokio::test]
async fn attack_a_clients_own_forwarded_header_is_never_read_behind_a_proxy_writing_x_forwarded_for() {
    let trusted = TrustedProxies::new(["10.0.0.0/8", "127.0.0.1"]).unwrap();
    let addr = login_behind(Writes::XForwardedFor, trusted, &[]).await;
    // 5 requests forged as coming from the victim, 127.0.0.55...
    let forged: Vec<_> = (0..5)
        .map(|_| vec![("forwarded", b"for=127.0.0.55".to_vec())])
        .collect();
    let mut spent = granted(addr, "127.0.0.66", &forged).await;
    // ...leave the victim its own limit.
    let victim = send_from(Some(ip("127.0.0.55")), addr, "GET", "/a", &[]).await;
    assert_eq!(
        victim.status, 200,
        "the forged Forwarded spent the victim's permits"
    );
    // 50 more, each with a new Forwarded and a new leftmost X-Forwarded-For.
    let rotating: Vec<_> = (0..50)
        .map(|i| {
            vec![
                ("forwarded", format!("for=203.0.113.{i}").into_bytes()),
                ("x-forwarded-for", format!("198.51.100.{i}").into_bytes()),
            ]
        })
        .collect();
    spent += granted(addr, "127.0.0.66", &rotating).await;
    assert!(spent <= 5, "{spent} of 55 granted at 5 a minute");
}

#[tokio::test]
async fn attack_a_clients_own_x_forwarded_for_is_never_read_behind_a_proxy_writing_x_real_ip() {
    let trusted = TrustedProxies::new(["10.0.0.0/8", "127.0.0.1"])
        .unwrap()
        .header(ForwardedHeader::XRealIp);
    let addr = login_behind(Writes::XRealIp, trusted, &[]).await;
    let forged: Vec<_> = (0..5)
        .map(|_| {
            vec![
                ("x-forwarded-for", b"127.0.0.55".to_vec()),
                ("forwarded", b"for=127.0.0.55".to_vec()),
            ]
        })
        .collect();
    let mut spent = granted(addr, "127.0.0.66", &forged).await;
    let victim = send_from(Some(ip("127.0.0.55")), addr, "GET", "/a", &[]).await;
    assert_eq!(
        victim.status, 200,
        "the forged X-Forwarded-For spent the victim's permits"
    );
    let rotating: Vec<_> = (0..50)
        .map(|i| {
            vec![
                ("x-forwarded-for", format!("198.51.100.{i}").into_bytes()),
                ("x-real-ip", format!("203.0.113.{i}").into_bytes()),
            ]
        })
        .collect();
    spent += granted(addr, "127.0.0.66", &rotating).await;
    assert!(spent <= 5, "{spent} of 55 granted at 5 a minute");
}

#[tokio::test]
async fn attack_a_byte_that_is_not_ascii_left_of_the_client_does_not_make_the_exempt_proxy_the_client() {
    for (writes, header, trusted, junk) in [
        (
            Writes::XForwardedFor,
            "x-forwarded-for",
            ForwardedHeader::XForwardedFor,
            b"\xff".to_vec(),
        ),
        (
            Writes::Forwarded,
            "forwarded",
            ForwardedHeader::Forwarded,
            b"for=\xff".to_vec(),
        ),
    ] {
        let trusted = TrustedProxies::new(["10.0.0.0/8", "127.0.0.1"])
            .unwrap()
            .header(trusted);
        // The proxy, the load balancer every request comes through, is exempt.
        let addr = login_behind(writes, trusted, &["127.0.0.1"]).await;
        let requests: Vec<_> = (0..100).map(|_| vec![(header, junk.clone())]).collect();
        let spent = granted(addr, "127.0.0.77", &requests).await;
        assert_eq!(spent, 5, "{header}: {spent} of 100 granted at 5 a minute");
    }
}

#[tokio::test]
async fn one_trusted_proxy_setting_the_handlers_client_ip_is_the_layers_key() {
    let client = Client::memory();
    let trusted = TrustedProxies::new(["127.0.0.1"]).unwrap();
    let layer = |trusted: Option<TrustedProxies>| {
        let builder = RateLimitLayer::builder().client(client.clone());
        match trusted {
            Some(trusted) => builder.trusted_proxies(trusted),
            None => builder,
        }
        .rule(LayerRule::new("login", 5, MINUTE).key(Key::client_ip()))
        .build()
        .unwrap()
    };
    let whoami = || get(|ip: ClientIp| async move { ip.to_string() });
    let from = |ip| [("x-forwarded-for", ip)];

    // Set on the layer alone: the handler's ClientIp is what the layer keyed by.
    let addr = serve(
        Router::new()
            .route("/", whoami())
            .layer(layer(Some(trusted.clone()))),
    )
    .await;
    let reply = send(addr, "GET", "/", &from("198.51.100.7")).await;
    assert_eq!((reply.status, reply.body.as_str()), (200, "198.51.100.7"));
    let limiter = client.rate_limiter("rate_limit:login:198.51.100.7");
    assert_eq!(limiter.available_permits().await.unwrap(), 4);

    // Set as an Extension outside the layer alone: both read it.
    let addr = serve(
        Router::new()
            .route("/", whoami().route_layer(layer(None)))
            .layer(Extension(trusted.clone())),
    )
    .await;
    let reply = send(addr, "GET", "/", &from("198.51.100.8")).await;
    assert_eq!((reply.status, reply.body.as_str()), (200, "198.51.100.8"));
    let limiter = client.rate_limiter("rate_limit:login:198.51.100.8");
    assert_eq!(limiter.available_permits().await.unwrap(), 4);

    // The same setting in both places: one setting.
    let addr = serve(
        Router::new()
            .route("/", whoami())
            .layer(Extension(trusted.clone()))
            .layer(layer(Some(trusted.clone()))),
    )
    .await;
    assert_eq!(
        send(addr, "GET", "/", &from("198.51.100.9")).await.body,
        "198.51.100.9"
    );

    // Two settings that differ, in either order, or an Extension the layer cannot see
    // (inside it): refused as misconfigured, never keyed by one and answered by the other.
    let other = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
    let apps = [
        Router::new()
            .route("/", whoami())
            .layer(Extension(other.clone()))
            .layer(layer(Some(trusted.clone()))),
        Router::new()
            .route("/", whoami().route_layer(layer(Some(trusted.clone()))))
            .layer(Extension(other)),
        Router::new()
            .route("/", whoami())
            .layer(Extension(trusted.clone()))
            .layer(layer(None)),
    ];
    for (i, app) in apps.into_iter().enumerate() {
        let addr = serve(app).await;
        let reply = send(addr, "GET", "/", &from("198.51.100.10")).await;
        assert_eq!(reply.status, 500, "app {i}: {reply:?}");
    }
    // The layer refuses it itself, before any handler: one that reads no ClientIp, and
    // two layers whose settings differ.
    let plain = || get(|| async { "ok" });
    let apps = [
        Router::new()
            .route("/", plain().route_layer(layer(Some(trusted.clone()))))
            .layer(Extension(TrustedProxies::new(["10.0.0.0/8"]).unwrap())),
        Router::new()
            .route("/", plain())
            .layer(layer(Some(TrustedProxies::new(["10.0.0.0/8"]).unwrap())))
            .layer(layer(Some(trusted.clone()))),
    ];
    for (i, app) in apps.into_iter().enumerate() {
        let addr = serve(app).await;
        let reply = send(addr, "GET", "/", &from("198.51.100.11")).await;
        assert_eq!(reply.status, 500, "app {i}");
        // The layer's words, not the extractor's.
        assert!(
            reply.body.starts_with(
                "Internal server error: rate limit rule `login` is misconfigured: two different"
            ),
            "app {i}: {}",
            reply.body
        );
    }
}

#[tokio::test]
async fn attack_ipv6_addresses_that_embed_ipv4_are_limited_as_that_ipv4_address() {
    let client = Client::memory();
    let layer = RateLimitLayer::builder()
        .client(client.clone())
        .trusted_proxies(TrustedProxies::new(["127.0.0.1"]).unwrap())
        .rule(LayerRule::new("v4", 1, MINUTE).key(Key::client_ip()))
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let from = |ip: &'static str| async move { send(addr, "GET", "/a", &[("x-forwarded-for", ip)]).await };
    // Two IPv4 clients behind NAT64 (RFC 6052's well-known prefix) are two clients.
    assert_eq!(from("64:ff9b::1.2.3.4").await.status, 200);
    assert_eq!(from("64:ff9b::5.6.7.8").await.status, 200);
    assert_eq!(
        client
            .rate_limiter("rate_limit:v4:1.2.3.4")
            .available_permits()
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        client
            .rate_limiter("rate_limit:v4:5.6.7.8")
            .available_permits()
            .await
            .unwrap(),
        0
    );
    // And each is the IPv4 address it embeds, in every form that embeds it.
    for same in [
        "1.2.3.4",
        "::ffff:1.2.3.4",
        "[64:ff9b::102:304]:4711",
        "::1.2.3.4",
        "2002:102:304::1",
        "2002:102:304:ffff::9",
        "2001:0:4136:e378:8000:63bf:fefd:fcfb",
    ] {
        assert_eq!(from(same).await.status, 429, "{same}");
    }
    assert_eq!(from("64:ff9b::9.9.9.9").await.status, 200);
    // Native IPv6 stays grouped by /64; loopback and the unspecified address are not IPv4.
    assert_eq!(from("2001:db8:1:2::1").await.status, 200);
    assert_eq!(from("2001:db8:1:2::2").await.status, 429);
    assert_eq!(from("::1").await.status, 200);
    assert_eq!(
        client
            .rate_limiter("rate_limit:v4:%3A%3A/64")
            .available_permits()
            .await
            .unwrap(),
        0
    );
}

/// Forged values naming the victim 127.0.0.55 in every form an address takes, and
/// values meant to confuse a parser: case, repeated lines, whitespace, quotes, zone
/// ids, RFC 7239's obfuscated identifiers, bytes that are not ASCII.
fn forgeries(header: &'static str) -> Vec<Vec<(&'static str, Vec<u8>)>> {
    let values: &[&[u8]] = &[
        b"127.0.0.55",
        b"::ffff:127.0.0.55",
        b"[::ffff:127.0.0.55]:80",
        b"64:ff9b::7f00:37",
        b"\"127.0.0.55\"",
        b"for=127.0.0.55",
        b"for=\"127.0.0.55\"",
        b"FOR=127.0.0.55;for=127.0.0.55",
        b"for=\"127.0.0.55",
        b"for=127.0.0.55;proto=\"a, for=127.0.0.55\"",
        b"  127.0.0.55\t,\t127.0.0.55  ",
        b"127.0.0.55,",
        b",",
        b"\"",
        b"fe80::1%eth0",
        b"for=_hidden, for=unknown",
        b"127.0.0.55\xff",
        b"\xff\xfe\xfd",
    ];
    let mut requests = Vec::new();
    for value in values {
        for name in [header, "X-FORWARDED-FOR", "Forwarded", "x-real-ip"] {
            requests.push(vec![(name, value.to_vec())]);
        }
        // The same header on two lines, and in two cases.
        requests.push(vec![(header, value.to_vec()), (header, value.to_vec())]);
        requests.push(vec![
            (header, b"127.0.0.55".to_vec()),
            ("X-Forwarded-For", value.to_vec()),
        ]);
    }
    requests
}

#[tokio::test]
async fn attack_forged_values_in_every_form_case_and_line_grant_at_most_the_rate() {
    for (writes, header, choice) in [
        (
            Writes::XForwardedFor,
            "x-forwarded-for",
            ForwardedHeader::XForwardedFor,
        ),
        (Writes::Forwarded, "forwarded", ForwardedHeader::Forwarded),
        (Writes::XRealIp, "x-real-ip", ForwardedHeader::XRealIp),
    ] {
        let trusted = TrustedProxies::new(["127.0.0.1"]).unwrap().header(choice);
        let addr = login_behind(writes, trusted, &["127.0.0.1"]).await;
        let forged = forgeries(header);
        let spent = granted(addr, "127.0.0.66", &forged).await;
        assert_eq!(
            spent,
            5,
            "{header}: {spent} of {} granted at 5 a minute",
            forged.len()
        );
        let victim = send_from(Some(ip("127.0.0.55")), addr, "GET", "/a", &[]).await;
        assert_eq!(
            victim.status, 200,
            "{header}: the forgeries spent the victim's permits"
        );
    }
}

/// The proxy's own element quotes the client's `Host`: its commas and semicolons
/// separate nothing, so the client chooses no address, even with the proxy's own
/// address exempt (a client keyed as the proxy would pass them all).
#[tokio::test]
async fn attack_a_host_quoted_in_the_proxys_forwarded_element_chooses_no_address() {
    for writes in [Writes::ForwardedHost, Writes::ForwardedHostLast] {
        let trusted = TrustedProxies::new(["127.0.0.1"])
            .unwrap()
            .header(ForwardedHeader::Forwarded);
        let addr = login_behind(writes, trusted, &["127.0.0.1"]).await;
        let hosts = support::http::quoted_hosts();
        let spent = granted(addr, "127.0.0.66", &hosts).await;
        assert_eq!(
            spent,
            5,
            "{writes:?}: {spent} of {} granted at 5 a minute",
            hosts.len()
        );
        let victim = send_from(Some(ip("127.0.0.55")), addr, "GET", "/a", &[]).await;
        assert_eq!(
            victim.status, 200,
            "{writes:?}: the hosts spent the victim's permits"
        );
    }
}

#[tokio::test]
async fn attack_a_huge_forwarding_header_changes_nothing() {
    // 380 KB (hyper answers 431 to a head above about 400 KB) of entries naming the
    // victim behind a chain of the trusted proxy itself, hoping the walk believes
    // them: it stops at the address the proxy wrote.
    let trusted = TrustedProxies::new(["127.0.0.1"]).unwrap();
    let addr = login_behind(Writes::XForwardedFor, trusted, &["127.0.0.1"]).await;
    let mut huge = b"127.0.0.55".to_vec();
    while huge.len() < 380_000 {
        huge.extend_from_slice(b", 127.0.0.1");
    }
    let requests: Vec<_> = (0..8).map(|_| vec![("x-forwarded-for", huge.clone())]).collect();
    assert_eq!(granted(addr, "127.0.0.66", &requests).await, 5);
    let victim = send_from(Some(ip("127.0.0.55")), addr, "GET", "/a", &[]).await;
    assert_eq!(victim.status, 200);
}

/// An inner service that counts its clones.
struct Counting(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Clone for Counting {
    fn clone(&self) -> Self {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Counting(self.0.clone())
    }
}

impl tower_service::Service<axum::http::Request<axum::body::Body>> for Counting {
    type Response = axum::http::Response<axum::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: axum::http::Request<axum::body::Body>) -> Self::Future {
        std::future::ready(Ok(axum::http::Response::new(axum::body::Body::empty())))
    }
}

/// In process without a timeout, each request is decided where the service is called
/// and goes to the inner service that was polled ready for it, never a clone; with a
/// timeout (a decision may wait) it goes to a clone, as tower's contract asks. Either
/// way every request is decided once: 3 of a rate of 3 pass, the fourth is refused.
#[tokio::test]
async fn in_process_requests_are_decided_where_called_and_once() {
    use tower_layer::Layer;
    use tower_service::Service;
    for timeout in [None, Some(Duration::from_millis(1))] {
        let mut builder = RateLimitLayer::builder()
            .client(Client::memory())
            .rule(LayerRule::new("at-once", 3, MINUTE));
        if let Some(timeout) = timeout {
            builder = builder.timeout(timeout);
        }
        let clones = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut service = builder.build().unwrap().layer(Counting(clones.clone()));
        let mut statuses = Vec::new();
        for _ in 0..4 {
            std::future::poll_fn(|cx| service.poll_ready(cx)).await.unwrap();
            let request = axum::http::Request::new(axum::body::Body::empty());
            statuses.push(service.call(request).await.unwrap().status().as_u16());
        }
        assert_eq!(statuses, [200, 200, 200, 429], "timeout {timeout:?}");
        let cloned = clones.load(std::sync::atomic::Ordering::Relaxed);
        match timeout {
            None => assert_eq!(cloned, 0, "decided where called, the ready service called"),
            Some(_) => assert_eq!(cloned, 4, "one clone per request on the boxed path"),
        }
    }
}

/// A response's status and the fields the paths are held to agree on.
type Answer = (u16, Option<String>, Option<String>, Option<String>);

fn answer(response: &support::http::Reply) -> Answer {
    let field = |name| response.header(name).map(str::to_owned);
    (
        response.status,
        field("ratelimit"),
        field("retry-after"),
        field("x-ratelimit-remaining"),
    )
}

/// An in-process layer without a timeout decides a request where it is called, on the
/// engine's path for calls that nothing can make wait; with a timeout (1 ms, shorter
/// than any wait here: a refusal is answered at once) the request takes the boxed path
/// and the engine's general one (`in_process_requests_are_decided_where_called_and_once`
/// shows it goes to a clone). Both answer alike, request for request, on a clock of
/// their own, with header values that try to reach another key, a window that turns
/// and the X-RateLimit fields too. (No subscriber here: once one that wants debug spans
/// has existed, tracing reports them wanted for the rest of the process, and every
/// in-process layer of this binary would take the general path.)
#[tokio::test]
async fn the_in_process_path_answers_as_the_general_path() {
    type Seen = Vec<Answer>;
    async fn run(timeout: Option<Duration>) -> Seen {
        let clock = redlimit::ManualClock::new(1_000_000);
        let client = Client::builder().clock(clock.clone()).memory();
        let mut layer = RateLimitLayer::builder()
            .client(client)
            .x_ratelimit_headers(true)
            .rule(LayerRule::new("api", 3, MINUTE).key(Key::header("x-user")));
        if let Some(timeout) = timeout {
            layer = layer.timeout(timeout);
        }
        let addr = serve(app(layer.build().unwrap())).await;
        let users = ["a", "a", "{a}", "a:b", "a", "a", "%7Ba%7D", "", "b", "a%3Ab"];
        let mut seen = Vec::new();
        for (i, user) in users.iter().cycle().take(40).enumerate() {
            if i % 9 == 8 {
                clock.advance(Duration::from_secs(25));
            }
            let response = send(addr, "GET", "/a", &[("x-user", user)]).await;
            seen.push(answer(&response));
        }
        seen
    }
    let at_once = run(None).await;
    assert_eq!(
        at_once,
        run(Some(Duration::from_millis(1))).await,
        "the general path"
    );
    let refused = at_once.iter().filter(|seen| seen.0 == 429).count();
    assert!((5..35).contains(&refused), "{refused} of 40 refused: {at_once:?}");
}

/// A layer of a rule keyed by a path parameter, alone or beside a rule of every
/// request, reads the parameters where it is called and decides there too; it answers
/// as the general path (a timeout) does, request for request: under `route_layer`, and
/// under `Router::layer`, where a request no route matched passes on to the fallback
/// (404) and takes nothing of the path's rule (the other's counts it), with values that
/// try to reach another key (`{a}`, `a:b`, their escapes, bytes that are not UTF-8), a
/// window that turns, and the X-RateLimit fields.
#[tokio::test]
async fn a_path_parameter_rule_answers_where_it_is_called_as_the_general_path() {
    type Seen = Vec<Answer>;
    async fn run(route_layer: bool, every_request: bool, timeout: Option<Duration>) -> Seen {
        let clock = redlimit::ManualClock::new(1_000_000);
        let client = Client::builder().clock(clock.clone()).memory();
        let mut layer = RateLimitLayer::builder()
            .client(client)
            .x_ratelimit_headers(true)
            .rule(LayerRule::new("user", 3, MINUTE).key(Key::path_param("id")));
        if every_request {
            layer = layer.rule(LayerRule::new("user-every-request", 9, MINUTE));
        }
        if let Some(timeout) = timeout {
            layer = layer.timeout(timeout);
        }
        let layer = layer.build().unwrap();
        let router = Router::new().route("/users/{id}", get(|| async { "user" }));
        let router = match route_layer {
            true => router.route_layer(layer),
            false => router.layer(layer),
        };
        let addr = serve(router).await;
        let paths = [
            "/users/a",
            "/users/a",
            "/nowhere",
            "/users/%7Ba%7D",
            "/users/a:b",
            "/users/a%3Ab",
            "/nowhere",
            "/users/%FF",
            "/users/%FE",
            "/users/b",
            "/users/%20",
        ];
        let mut seen = Vec::new();
        for (i, path) in paths.iter().cycle().take(44).enumerate() {
            if i % 10 == 9 {
                clock.advance(Duration::from_secs(25));
            }
            let response = send(addr, "GET", path, &[]).await;
            seen.push(answer(&response));
        }
        seen
    }
    for (route_layer, every_request) in [(true, false), (false, false), (true, true), (false, true)] {
        let at_once = run(route_layer, every_request, None).await;
        let general = run(route_layer, every_request, Some(Duration::from_millis(1))).await;
        let case = format!("route_layer: {route_layer}, a rule of every request: {every_request}");
        assert_eq!(at_once, general, "{case}");
        let count = |status| at_once.iter().filter(|seen| seen.0 == status).count();
        // Under `Router::layer` the rule of every request refuses some of the 8
        // requests no route matched, and answers the others' 404.
        match every_request && !route_layer {
            true => assert!((1..8).contains(&count(404)), "{case}: {at_once:?}"),
            false => assert_eq!(count(404), 8, "{case}: {at_once:?}"),
        }
        assert!(
            (5..36).contains(&count(429)),
            "{case}: {} of 44 refused: {at_once:?}",
            count(429)
        );
    }
}

/// What a path parameter's rule under `Router::layer` limits, as its docs say: the
/// routes of the router it is added to. A request no route of it matched goes on
/// without the rule, whatever serves it (a router given to `fallback_service` or to
/// `nest_service`: 8 of 8 at a rate of 3, the router's other rule still counting
/// them), and a router nested with `nest`, whose routes are the outer router's, is
/// limited (3 of 8).
#[tokio::test]
async fn a_path_parameter_rule_under_router_layer_limits_that_router_s_routes() {
    fn users() -> Router {
        Router::new().route("/users/{id}", get(|| async { "user" }))
    }
    type Mount = fn(RateLimitLayer) -> Router;
    let cases: [(Mount, &str, usize); 3] = [
        (
            |layer| Router::new().fallback_service(users()).layer(layer),
            "/users/a",
            8,
        ),
        (
            |layer| Router::new().nest_service("/api", users()).layer(layer),
            "/api/users/a",
            8,
        ),
        (
            |layer| Router::new().nest("/api", users()).layer(layer),
            "/api/users/a",
            3,
        ),
    ];
    for (app, path, granted) in cases {
        let client = Client::memory();
        let layer = RateLimitLayer::builder()
            .client(client.clone())
            .rule(LayerRule::new("nested-user", 3, MINUTE).key(Key::path_param("id")))
            .rule(LayerRule::new("nested-all", 100, MINUTE))
            .build()
            .unwrap();
        let addr = serve(app(layer)).await;
        let mut passed = 0;
        for _ in 0..8 {
            passed += usize::from(send(addr, "GET", path, &[]).await.status == 200);
        }
        assert_eq!(passed, granted, "{path}");
        let all = client.rate_limiter("rate_limit:nested-all");
        // Each request granted counted by the router's other rule; a refusal takes
        // nothing of it.
        assert_eq!(
            all.available_permits().await.unwrap(),
            100 - granted as u64,
            "{path}"
        );
    }
}

/// A server whose layer on `client` has one rule `api` of 2 a minute keyed by the
/// `x-user` header, with `timeout` when given (the engine's general path).
async fn serve_keyed_by_user(client: Client, timeout: Option<Duration>) -> SocketAddr {
    let mut layer = RateLimitLayer::builder()
        .client(client)
        .rule(LayerRule::new("api", 2, MINUTE).key(Key::header("x-user")));
    if let Some(timeout) = timeout {
        layer = layer.timeout(timeout);
    }
    serve(app(layer.build().unwrap())).await
}

/// Run-time overrides reach an in-process layer's requests on the path that decides
/// where the service is called as on the engine's general one (a timeout): a rule's
/// rate raised for all its keys, one limiter's lowered, and the rule's own rate back
/// once they are removed. The RateLimit fields name the rate decided.
#[tokio::test]
async fn overrides_reach_an_in_process_layer_on_both_paths() {
    use redlimit::{OverrideOf, RateOverride};
    for timeout in [None, Some(Duration::from_secs(1))] {
        let client = Client::memory();
        let addr = serve_keyed_by_user(client.clone(), timeout).await;
        let statuses = |user: &'static str, n: usize| async move {
            let mut seen = Vec::new();
            for _ in 0..n {
                seen.push(status(addr, "/a", &[("x-user", user)]).await);
            }
            seen
        };
        assert_eq!(statuses("a", 3).await, [200, 200, 429], "{timeout:?}");

        let rule = OverrideOf::Rule("api".into());
        let set = |of: OverrideOf, rate| RateOverride {
            of,
            rate,
            interval: MINUTE,
        };
        client.set_override(&set(rule.clone(), 4)).await.unwrap();
        let granted = send(addr, "GET", "/a", &[("x-user", "a")]).await;
        assert_eq!(granted.status, 200, "{timeout:?}: 4 a minute");
        assert_eq!(granted.header("ratelimit-policy"), Some("\"api\";q=4;w=60"));
        assert_eq!(statuses("a", 2).await, [200, 429], "{timeout:?}");

        let one = OverrideOf::Key("rate_limit:api:b".into());
        client.set_override(&set(one.clone(), 1)).await.unwrap();
        assert_eq!(statuses("b", 2).await, [200, 429], "{timeout:?}: b's own");
        assert_eq!(statuses("c", 5).await, [200, 200, 200, 200, 429], "{timeout:?}");

        assert!(client.remove_override(&rule).await.unwrap());
        assert!(client.remove_override(&one).await.unwrap());
        let granted = send(addr, "GET", "/a", &[("x-user", "d")]).await;
        assert_eq!(granted.header("ratelimit-policy"), Some("\"api\";q=2;w=60"));
        assert_eq!(statuses("d", 2).await, [200, 429], "{timeout:?}: its own rate");
    }
}

/// A layer's limiters are under its client's own prefix, on the path that decides
/// where the service is called and on the engine's general one (a timeout), the value
/// escaped alike: two requests spend the same limiter of 2, and none is made under
/// the default prefix.
#[tokio::test]
async fn a_layer_s_limiters_are_under_its_client_s_prefix_on_both_paths() {
    for timeout in [None, Some(Duration::from_secs(1))] {
        let client = Client::builder().prefix("edge:").memory();
        let addr = serve_keyed_by_user(client.clone(), timeout).await;
        assert_eq!(
            status(addr, "/a", &[("x-user", "a:{b}")]).await,
            200,
            "{timeout:?}"
        );
        let limiter = client.rate_limiter("edge:api:a%3A%7Bb%7D");
        assert_eq!(limiter.available_permits().await.unwrap(), 1, "{timeout:?}");
        let default = client.rate_limiter("rate_limit:api:a%3A%7Bb%7D");
        let unspent = default.available_permits().await;
        assert!(
            matches!(unspent, Err(redlimit::Error::NotInitialized { .. })),
            "{timeout:?}: {unspent:?}"
        );
        assert_eq!(
            status(addr, "/b", &[("x-user", "a:{b}")]).await,
            200,
            "{timeout:?}"
        );
        assert_eq!(
            status(addr, "/a", &[("x-user", "a:{b}")]).await,
            429,
            "{timeout:?}"
        );
        assert_eq!(limiter.available_permits().await.unwrap(), 0, "{timeout:?}");
    }
}

/// A layer of one shadow rule, whose requests the engine's general path decides
/// (the path that decides where the service is called declines them): every request
/// passes, and each spends the limiter named under the client's own prefix, its value
/// escaped, as the rule's grants would.
#[tokio::test]
async fn a_layer_of_one_shadow_rule_spends_its_limiter_under_the_client_s_prefix() {
    let client = Client::builder().prefix("edge:").memory();
    let layer = RateLimitLayer::builder()
        .client(client.clone())
        .rule(
            LayerRule::new("trial", 2, MINUTE)
                .key(Key::header("x-user"))
                .shadow(true),
        )
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    for _ in 0..4 {
        assert_eq!(status(addr, "/a", &[("x-user", "a:{b}")]).await, 200);
    }
    let limiter = client.rate_limiter("edge:trial:a%3A%7Bb%7D");
    assert_eq!(
        limiter.available_permits().await.unwrap(),
        0,
        "spent by the grants"
    );
    for named in ["edge:edge:trial:a%3A%7Bb%7D", "rate_limit:trial:a%3A%7Bb%7D"] {
        let unspent = client.rate_limiter(named).available_permits().await;
        assert!(
            matches!(unspent, Err(redlimit::Error::NotInitialized { .. })),
            "{named}: {unspent:?}"
        );
    }
}

/// Header values that are not UTF-8 key by their bytes: no two of them share a
/// limiter, nor one with the UTF-8 text a lossy reading would make of it (`\u{fffd}`)
/// or with text spelling its escape (`%E9`); long ones are digested apart. A rate of 1:
/// each value's first request passes, its second is refused.
#[tokio::test]
async fn attack_header_values_that_are_not_utf8_reach_no_other_value_s_limiter() {
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .rule(LayerRule::new("bytes", 1, MINUTE).key(Key::header("x-user")))
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let long = |last: u8| {
        let mut value = b"\xfe".repeat(300);
        value.push(last);
        value
    };
    let values: Vec<Vec<u8>> = vec![
        b"caf\xe9".to_vec(),
        b"caf\xff".to_vec(),
        "caf\u{fffd}".as_bytes().to_vec(),
        b"caf%E9".to_vec(),
        b"caf%25E9".to_vec(),
        b"\xe9caf".to_vec(),
        b"\xc3".to_vec(),
        b"\xc3\xa9".to_vec(),
        long(b'a'),
        long(b'b'),
    ];
    for round in ["first", "second"] {
        for value in &values {
            let status = send_from(None, addr, "GET", "/a", &[("x-user", value)])
                .await
                .status;
            let expected = if round == "first" { 200 } else { 429 };
            assert_eq!(status, expected, "{round} request of {value:?}");
        }
    }
}

/// An `Authorization` value that is not UTF-8 is one credential however its scheme is
/// spelled, as a UTF-8 one is (`Bearer`, `BEARER`, spaces and tabs between): three
/// spellings of one token at a rate of 2 get 200, 200, 429, a secret key's too, and
/// another token its own limiter.
#[tokio::test]
async fn attack_spellings_of_a_credential_that_is_not_utf8_share_its_limiter() {
    for (name, secret) in [("bytes-credential", false), ("bytes-credential-secret", true)] {
        let key = Key::header("authorization");
        let layer = RateLimitLayer::builder()
            .client(Client::memory())
            .rule(LayerRule::new(name, 2, MINUTE).key(if secret { key.secret() } else { key }))
            .build()
            .unwrap();
        let addr = serve(app(layer)).await;
        let mut statuses = Vec::new();
        for value in [
            &b"Bearer caf\xff"[..],
            b"BEARER caf\xff",
            b"bearer \t caf\xff",
            b"Bearer caf\xfe",
        ] {
            let sent = send_from(None, addr, "GET", "/a", &[("authorization", value)]).await;
            statuses.push(sent.status);
        }
        assert_eq!(statuses, [200, 200, 429, 200], "secret: {secret}");
    }
}

/// A key header without a value, however it is spelled (absent, empty, or whitespace
/// of any kind: a no-break space, an ideographic or an em space), is one value: under
/// `MissingKey::Share` every such request shares the rule's one limiter, on both
/// backends; under `BadRequest` each is refused.
#[tokio::test]
async fn attack_spellings_of_no_value_share_one_limiter() {
    let server = RedisServer::start();
    let redis = Client::connect(&server.url()).await.unwrap();
    let blanks: [&[u8]; 6] = [
        b"",
        "\u{a0}".as_bytes(),
        "\u{3000}".as_bytes(),
        "\u{2003}".as_bytes(),
        "\u{a0}\u{2003}\u{a0}".as_bytes(),
        "\u{85}".as_bytes(),
    ];
    for client in [Client::memory(), redis] {
        let rule = |missing| {
            LayerRule::new("anon", 2, MINUTE)
                .key(Key::header("x-api-key"))
                .missing_key(missing)
        };
        let shared = RateLimitLayer::builder()
            .client(client.clone())
            .rule(rule(MissingKey::Share));
        let addr = serve(app(shared.build().unwrap())).await;
        let mut granted = 0;
        for value in blanks {
            for headers in [vec![], vec![("x-api-key", value)]] {
                let status = send_from(None, addr, "GET", "/a", &headers).await.status;
                assert!(matches!(status, 200 | 429), "{value:?}: {status}");
                granted += u32::from(status == 200);
            }
        }
        assert_eq!(granted, 2, "12 requests without a value, a rate of 2");
        let refusing = RateLimitLayer::builder()
            .client(client)
            .rule(rule(MissingKey::BadRequest));
        let addr = serve(app(refusing.build().unwrap())).await;
        for value in blanks {
            let status = send_from(None, addr, "GET", "/a", &[("x-api-key", value)])
                .await
                .status;
            assert_eq!(status, 400, "{value:?}");
        }
    }
}

/// The in-process layer, deciding where it is called, under 32 clients at once on a
/// server with 4 worker threads: 320 requests on one key, a rate of 100 a minute,
/// exactly 100 granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_in_process_layer_holds_its_rate_under_concurrent_requests() {
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .rule(LayerRule::new("busy", 100, MINUTE).key(Key::header("x-user")))
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let clients: Vec<_> = (0..32)
        .map(|_| {
            tokio::spawn(async move {
                let mut granted = 0;
                for _ in 0..10 {
                    if status(addr, "/a", &[("x-user", "u")]).await == 200 {
                        granted += 1;
                    }
                }
                granted
            })
        })
        .collect();
    let mut granted = 0;
    for client in clients {
        granted += client.await.unwrap();
    }
    assert_eq!(granted, 100);
}

/// Two in-process layers whose rules would share a limiter (`api` keyed by a header,
/// whose value `admin` names `api:admin`, another layer's global rule): both refuse as
/// misconfigured (500) once each has decided, on the path that decides where it is
/// called as on every other, and neither spends the other's permits.
#[tokio::test]
async fn attack_in_process_layers_whose_rules_overlap_refuse() {
    let client = Client::memory();
    let keyed = RateLimitLayer::builder()
        .client(client.clone())
        .rule(LayerRule::new("overlap-api", 5, MINUTE).key(Key::header("x-user")))
        .build()
        .unwrap();
    let global = RateLimitLayer::builder()
        .client(client.clone())
        .rule(LayerRule::new("overlap-api:admin", 5, MINUTE))
        .build()
        .unwrap();
    let keyed = serve(app(keyed)).await;
    let global = serve(app(global)).await;
    let admin = [("x-user", "admin")];
    let first = status(keyed, "/a", &admin).await;
    for _ in 0..10 {
        assert_eq!(status(global, "/a", &[]).await, 500, "the global rule overlaps");
        assert_eq!(status(keyed, "/a", &admin).await, 500, "the keyed rule overlaps");
    }
    assert_eq!(first, 200, "alone, the keyed rule decided");
    // Only the first request spent a permit of the limiter both would share: 4 left.
    let take = |n| [redlimit::Rule::new("rate_limit:overlap-api:admin", 5, MINUTE).permits(n)];
    assert!(client.check_rules(&take(4)).await.unwrap().allowed);
    assert!(!client.check_rules(&take(1)).await.unwrap().allowed);
}

/// An exempt value of a key that is not a header is compared as listed: a closure's
/// value ` vip` (spaces are part of it there) is exempt when ` vip` is listed.
#[tokio::test]
async fn an_exempt_value_of_a_closure_s_key_is_compared_as_listed() {
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .rule(
            LayerRule::new("closure-exempt", 1, MINUTE)
                .key(Key::with(|_: &axum::http::request::Parts| {
                    Some(" vip".to_owned())
                }))
                .exempt([" vip"]),
        )
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    for _ in 0..3 {
        assert_eq!(send(addr, "GET", "/a", &[]).await.status, 200);
    }
}
