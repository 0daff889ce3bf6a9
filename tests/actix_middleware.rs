//! `RateLimitLayer` as actix-web middleware on real servers on loopback (cargo feature
//! `actix`), on both backends: rules keyed by client address behind a trusted proxy, by
//! header, by path parameter and by nothing; on a scope and on a resource; costs,
//! exempt keys, shadow rules and missing keys; the RateLimit fields on grants and
//! refusals; backend failures under `on_error`; the handler's `ClientIp`.
#![cfg(feature = "actix")]

use redlimit_test_support as support;

use std::net::SocketAddr;
use std::time::Duration;

use actix_web::{web, App, HttpResponse};
use redlimit::actix::{
    ClientIp, Key, LayerRule, MissingKey, ProblemType, RateLimitLayer, Respond, TrustedProxies,
};
use redlimit::{Client, OnError};
use support::http::{proxy, send, send_from, Writes};
use support::{serve_actix, RedisServer};

const MINUTE: Duration = Duration::from_secs(60);

/// `/api/a` and `/api/b` behind `layer` on a scope, `/free` beside it.
fn serve<R: Respond + Send>(layer: RateLimitLayer<R>) -> SocketAddr {
    serve_actix!(move || {
        App::new()
            .service(
                web::scope("/api")
                    .wrap(layer.clone())
                    .route("/a", web::get().to(|| async { "a" }))
                    .route("/b", web::get().to(|| async { "b" })),
            )
            .route("/free", web::get().to(|| async { "free" }))
    })
}

async fn status(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> u16 {
    send(addr, "GET", path, headers).await.status
}

/// A key whose values are secrets, on actix-web and Redis: limited per value, and
/// stored as their digest only.
#[tokio::test]
async fn a_secret_key_is_stored_as_its_digest() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let layer = RateLimitLayer::builder()
        .client(client)
        .rule(LayerRule::new("token", 2, MINUTE).key(Key::header("authorization").secret()))
        .build()
        .unwrap();
    let addr = serve(layer);
    let token = [("authorization", "Bearer tok-secret-1")];
    let statuses = [
        status(addr, "/api/a", &token).await,
        status(addr, "/api/b", &token).await,
        status(addr, "/api/a", &token).await,
        status(addr, "/api/a", &[("authorization", "Bearer tok-secret-2")]).await,
    ];
    assert_eq!(statuses, [200, 200, 429, 200]);
    let mut raw = server.raw().await;
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut raw).await.unwrap();
    assert!(
        keys.iter().any(|k| k.starts_with("rate_limit:token:%#")),
        "{keys:?}"
    );
    assert!(!keys.iter().any(|k| k.contains("tok-secret")), "{keys:?}");
}

/// The tower layer's test of its client's prefix, on actix-web: the limiters are under
/// it on the path deciding where the middleware is called and on the general one.
#[tokio::test]
async fn a_layer_s_limiters_are_under_its_client_s_prefix_on_both_paths() {
    for timeout in [None, Some(Duration::from_secs(1))] {
        let client = Client::builder().prefix("edge:").memory();
        let mut layer = RateLimitLayer::builder()
            .client(client.clone())
            .rule(LayerRule::new("api", 2, MINUTE).key(Key::header("x-user")));
        if let Some(timeout) = timeout {
            layer = layer.timeout(timeout);
        }
        let addr = serve(layer.build().unwrap());
        assert_eq!(
            status(addr, "/api/a", &[("x-user", "a:{b}")]).await,
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
            status(addr, "/api/b", &[("x-user", "a:{b}")]).await,
            200,
            "{timeout:?}"
        );
        assert_eq!(
            status(addr, "/api/a", &[("x-user", "a:{b}")]).await,
            429,
            "{timeout:?}"
        );
        assert_eq!(limiter.available_permits().await.unwrap(), 0, "{timeout:?}");
    }
}

/// The tower layer's client-address test, word for word, on actix-web.
async fn client_ip_behind_a_proxy(client: Client) {
    let layer = RateLimitLayer::builder()
        .client(client.clone())
        .trusted_proxies(TrustedProxies::new(["127.0.0.1"]).unwrap())
        .rule(LayerRule::new("login", 2, MINUTE).key(Key::client_ip()))
        .build()
        .unwrap();
    let addr = serve(layer);
    let from = |ip| [("x-forwarded-for", ip)];

    let first = send(addr, "GET", "/api/a", &from("198.51.100.7")).await;
    assert_eq!((first.status, first.body.as_str()), (200, "a"));
    assert_eq!(first.header("ratelimit-policy"), Some("\"login\";q=2;w=60"));
    assert_eq!(first.header("ratelimit"), Some("\"login\";r=1"));
    assert_eq!(status(addr, "/api/b", &from("198.51.100.7")).await, 200);

    let refused = send(addr, "GET", "/api/a", &from("198.51.100.7")).await;
    assert_eq!(refused.status, 429);
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((59..=60).contains(&retry), "{retry}");
    assert_eq!(
        refused.header("ratelimit"),
        Some(&*format!("\"login\";r=0;t={retry}"))
    );
    assert_eq!(refused.header("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(refused.body, format!("Too many requests; retry in {retry} s\n"));

    for forged in ["1.1.1.1, 198.51.100.7", "10.0.0.9,198.51.100.7"] {
        assert_eq!(
            status(addr, "/api/a", &from(forged)).await,
            429,
            "forged {forged:?}"
        );
    }
    assert_eq!(status(addr, "/api/a", &from("198.51.100.8")).await, 200);
    // Outside the scope, no limit and no fields.
    let free = send(addr, "GET", "/free", &from("198.51.100.7")).await;
    assert_eq!((free.status, free.header("ratelimit")), (200, None));

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

/// One layer is one limit for every route of its scope and every worker's clone.
async fn shared_by_routes_and_clones(client: Client) {
    let layer = RateLimitLayer::builder()
        .client(client)
        .rule(LayerRule::new("everything", 3, MINUTE))
        .build()
        .unwrap();
    let first = serve(layer.clone());
    let second = serve(layer);
    assert_eq!(status(first, "/api/a", &[]).await, 200);
    assert_eq!(status(first, "/api/b", &[]).await, 200);
    assert_eq!(status(second, "/api/a", &[]).await, 200);
    assert_eq!(status(second, "/api/b", &[]).await, 429);
    assert_eq!(status(first, "/api/a", &[]).await, 429);
}

#[tokio::test]
async fn one_limit_across_routes_and_servers_in_process() {
    shared_by_routes_and_clones(Client::memory()).await;
}

#[tokio::test]
async fn one_limit_across_routes_and_servers_on_redis() {
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
    let addr = serve(layer);
    let key = |k| [("x-api-key", k)];
    assert_eq!(status(addr, "/api/a", &key("k1")).await, 200);
    assert_eq!(status(addr, "/api/a", &key("k1")).await, 429);
    assert_eq!(status(addr, "/api/a", &key("k2")).await, 200);
    assert_eq!(status(addr, "/api/a", &key("k2:x")).await, 200);
    assert_eq!(status(addr, "/api/a", &key("k2:x")).await, 429);
    assert_eq!(status(addr, "/api/a", &[]).await, 200);
    assert_eq!(status(addr, "/api/a", &[]).await, 429);
    assert_eq!(status(addr, "/api/a", &key("")).await, 429);
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
    let addr = serve(layer);
    let call = |key, cost| [("x-api-key", key), ("x-cost", cost)];
    let granted = send(addr, "GET", "/api/a", &call("k1", "3")).await;
    assert_eq!(granted.status, 200);
    assert_eq!(granted.header("ratelimit"), Some("\"quota\";r=2"));
    assert_eq!(
        status(addr, "/api/a", &call("k1", "3")).await,
        429,
        "3 of the 2 left"
    );
    assert_eq!(
        status(addr, "/api/a", &call("k1", "0")).await,
        200,
        "0 is not free"
    );
    assert_eq!(status(addr, "/api/a", &call("k1", "1")).await, 200);
    assert_eq!(status(addr, "/api/a", &call("k1", "1")).await, 429);
    let never = send(addr, "GET", "/api/a", &call("k2", "6")).await;
    assert_eq!((never.status, never.header("retry-after")), (429, None));
    for _ in 0..10 {
        assert_eq!(status(addr, "/api/a", &call("internal", "5")).await, 200);
    }
}

#[tokio::test]
async fn a_shadow_rule_spends_but_never_refuses() {
    let client = Client::memory();
    let layer = RateLimitLayer::builder()
        .client(client.clone())
        .rule(LayerRule::new("trial", 1, MINUTE).shadow(true))
        .build()
        .unwrap();
    let addr = serve(layer);
    for _ in 0..3 {
        assert_eq!(status(addr, "/api/a", &[]).await, 200);
    }
    let limiter = client.rate_limiter("rate_limit:trial");
    assert_eq!(limiter.available_permits().await.unwrap(), 0, "it spent");
}

#[tokio::test]
async fn a_missing_key_is_refused_when_the_rule_says_so() {
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .rule(
            LayerRule::new("keyed", 5, MINUTE)
                .key(Key::header("x-api-key"))
                .missing_key(MissingKey::Unauthorized),
        )
        .rule(
            LayerRule::new("tenant", 5, MINUTE)
                .key(Key::header("x-tenant"))
                .missing_key(MissingKey::BadRequest),
        )
        .build()
        .unwrap();
    let addr = serve(layer);
    let reply = send(addr, "GET", "/api/a", &[("x-tenant", "t")]).await;
    assert_eq!(reply.status, 401);
    assert_eq!(reply.body, "This request needs the x-api-key header\n");
    let reply = send(addr, "GET", "/api/a", &[("x-api-key", "k"), ("x-tenant", " ")]).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.body, "This request needs the x-tenant header\n");
    assert_eq!(
        status(addr, "/api/a", &[("x-api-key", "k"), ("x-tenant", "t")]).await,
        200
    );
}

/// Path parameters are those matched where the middleware is: on a resource, or a
/// scope whose path has them; on the app, before routing, every request is refused as
/// misconfigured, never let through unlimited.
#[tokio::test]
async fn a_path_parameter_key_on_a_resource_and_a_scope_and_a_clear_error_elsewhere() {
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .rule(LayerRule::new("user", 1, MINUTE).key(Key::path_param("id")))
        .build()
        .unwrap();
    let routed = layer.clone();
    let addr = serve_actix!(move || {
        App::new()
            .service(
                web::resource("/users/{id}")
                    .wrap(routed.clone())
                    .route(web::get().to(|| async { "user" })),
            )
            .service(
                web::scope("/teams/{id}")
                    .wrap(routed.clone())
                    .route("/members", web::get().to(|| async { "members" })),
            )
    });
    assert_eq!(status(addr, "/users/1", &[]).await, 200);
    assert_eq!(status(addr, "/users/1", &[]).await, 429);
    assert_eq!(status(addr, "/users/2", &[]).await, 200);
    // The scope's limiter is the same rule's: user 2's value is spent.
    assert_eq!(status(addr, "/teams/2/members", &[]).await, 429);
    assert_eq!(status(addr, "/teams/3/members", &[]).await, 200);

    let around = serve_actix!(move || {
        App::new()
            .wrap(layer.clone())
            .route("/users/{id}", web::get().to(|| async { "user" }))
    });
    let reply = send(around, "GET", "/users/4", &[]).await;
    assert_eq!(reply.status, 500);
    assert!(
        reply
            .body
            .contains("not in the path matched where the middleware is"),
        "{}",
        reply.body
    );
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
            .rule(LayerRule::new("outage", 1, MINUTE).on_error(on_error))
            .build()
            .unwrap()
    };
    let local = serve(layer(OnError::Local));
    let allow = serve(layer(OnError::Allow));
    let deny = serve(layer(OnError::Deny));
    let problem = serve(layer(OnError::Deny).problem_json());
    drop(server);

    assert_eq!(status(local, "/api/a", &[]).await, 200, "decided in process");
    assert_eq!(status(local, "/api/a", &[]).await, 429, "and limited there");
    for _ in 0..3 {
        assert_eq!(status(allow, "/api/a", &[]).await, 200);
    }
    let refused = send(deny, "GET", "/api/a", &[]).await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.header("retry-after"), None);
    assert_eq!(refused.body, "Service temporarily unavailable\n");
    let refused = send(problem, "GET", "/api/a", &[]).await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.header("content-type"), Some("application/problem+json"));
}

#[tokio::test]
async fn problem_json_and_the_legacy_fields_as_the_tower_layer_writes_them() {
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .x_ratelimit_headers(true)
        .rule(LayerRule::new("api", 1, MINUTE).message("API quota exceeded"))
        .build()
        .unwrap()
        .problem_json();
    let addr = serve(layer);
    let granted = send(addr, "GET", "/api/a", &[]).await;
    assert_eq!(granted.status, 200);
    assert_eq!(granted.header("x-ratelimit-limit"), Some("1"));
    assert_eq!(granted.header("x-ratelimit-remaining"), Some("0"));
    let refused = send(addr, "GET", "/api/a", &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("content-type"), Some("application/problem+json"));
    assert_eq!(refused.header("x-ratelimit-limit"), Some("1"));
    assert_eq!(refused.header("x-ratelimit-remaining"), Some("0"));
    let retry = refused.header("retry-after").unwrap();
    assert_eq!(refused.header("x-ratelimit-reset"), Some(retry));
    let body: serde_json::Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!(body["status"], 429);
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["title"], "Quota exceeded");
    assert_eq!(body["violated-policies"], serde_json::json!(["api"]));
    assert_eq!(body["detail"], format!("API quota exceeded; retry in {retry} s"));
}

/// The builder's problem type holds on the middleware's 429s as on the tower layer's.
#[tokio::test]
async fn the_builders_problem_type_on_the_middlewares_refusals() {
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .problem_type(ProblemType::AboutBlank)
        .rule(LayerRule::new("api", 1, MINUTE))
        .build()
        .unwrap()
        .problem_json();
    let addr = serve(layer);
    assert_eq!(status(addr, "/api/a", &[]).await, 200);
    let refused = send(addr, "GET", "/api/a", &[]).await;
    assert_eq!(refused.status, 429);
    let body: serde_json::Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!(body["type"], "about:blank", "{body}");
    assert!(body.get("violated-policies").is_none(), "{body}");
}

/// The handler's `ClientIp` is the client the middleware keyed by, with the one
/// trusted-proxy setting; two different settings are refused (500).
#[tokio::test]
async fn the_handlers_client_ip_is_the_middlewares_key() {
    let trusted = TrustedProxies::new(["127.0.0.1"]).unwrap();
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .trusted_proxies(trusted.clone())
        .rule(LayerRule::new("login", 5, MINUTE).key(Key::client_ip()))
        .build()
        .unwrap();
    let echo = |ip: ClientIp| async move { HttpResponse::Ok().body(ip.to_string()) };
    let (one, two) = (layer.clone(), layer);
    let addr = serve_actix!(move || {
        App::new()
            .service(
                web::scope("/layer")
                    .wrap(one.clone())
                    .route("/ip", web::get().to(echo)),
            )
            .route("/plain", web::get().to(echo))
    });
    let behind = proxy(addr, Writes::XForwardedFor).await;
    let reply = send_from(
        Some("127.0.0.55".parse().unwrap()),
        behind,
        "GET",
        "/layer/ip",
        &[],
    )
    .await;
    assert_eq!((reply.status, reply.body.as_str()), (200, "127.0.0.55"));
    // Without the middleware or application data, no proxy is trusted.
    let reply = send_from(Some("127.0.0.55".parse().unwrap()), behind, "GET", "/plain", &[]).await;
    assert_eq!(reply.body, "127.0.0.1");

    // Application data naming another setting than the middleware's: refused.
    let other = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
    let addr = serve_actix!(move || {
        App::new().app_data(other.clone()).service(
            web::scope("/layer")
                .wrap(two.clone())
                .route("/ip", web::get().to(echo)),
        )
    });
    let reply = send(addr, "GET", "/layer/ip", &[]).await;
    assert_eq!(reply.status, 500);
    assert!(
        reply.body.contains("two different TrustedProxies settings"),
        "{}",
        reply.body
    );
    // The same setting as application data alone: the extractor reads it.
    let addr = serve_actix!(move || {
        App::new()
            .app_data(trusted.clone())
            .route("/ip", web::get().to(echo))
    });
    let behind = proxy(addr, Writes::XForwardedFor).await;
    let reply = send_from(Some("127.0.0.66".parse().unwrap()), behind, "GET", "/ip", &[]).await;
    assert_eq!(reply.body, "127.0.0.66");
}

/// Rules read from configuration wrap an actix-web scope as they wrap a router.
#[cfg(feature = "serde")]
#[tokio::test]
async fn rules_from_configuration() {
    let config: redlimit::actix::LayerConfig = toml::from_str(
        r#"
        [rules.api]
        rate = 1
        interval = "1m"
        key = { header = "x-api-key" }
        missing_key = "unauthorized"
        "#,
    )
    .unwrap();
    let layer = config.builder().client(Client::memory()).build().unwrap();
    let addr = serve(layer);
    assert_eq!(status(addr, "/api/a", &[]).await, 401);
    assert_eq!(status(addr, "/api/a", &[("x-api-key", "k")]).await, 200);
    assert_eq!(status(addr, "/api/a", &[("x-api-key", "k")]).await, 429);
}
