//! What `RateLimitLayer` answers, on real axum servers on loopback (cargo feature
//! `axum`): success fields that describe the rule as decided (a run-time override
//! from another process included), the `X-RateLimit-*` headers when asked for, a 500
//! that says what the server's set-up lacks, unmatched paths passing through a path
//! parameter's rule, and rules that refuse requests without a key.
#![cfg(feature = "axum")]

use redlimit_test_support as support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use redlimit::tower::{Key, LayerRule, MissingKey, RateLimitLayer};
use redlimit::{Client, OverrideOf, RateOverride};
use support::http::{send, send_from, serve, Reply};
use support::RedisServer;

const MINUTE: Duration = Duration::from_secs(60);

fn app(layer: RateLimitLayer) -> Router {
    Router::new().route("/a", get(|| async { "a" })).layer(layer)
}

async fn get_a(addr: SocketAddr, headers: &[(&str, &str)]) -> Reply {
    send(addr, "GET", "/a", headers).await
}

/// An operator's override, set from another process (another client of the same
/// Redis, as `redlimit override set` is), reaches the 200s as it reaches the 429s; its
/// removal too.
#[tokio::test]
async fn success_fields_describe_the_rule_as_decided_after_a_run_time_override() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let operator = Client::connect(&server.url()).await.unwrap();
    let layer = RateLimitLayer::builder()
        .client(client.clone())
        .x_ratelimit_headers(true)
        .rule(LayerRule::new("api", 20, MINUTE).key(Key::header("x-api-key")))
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let key = |k| [("x-api-key", k)];
    // The layer's client reads overrides every second: two periods and then some.
    let refreshed = || tokio::time::sleep(Duration::from_millis(2_500));

    let own = get_a(addr, &key("k0")).await;
    assert_eq!(own.status, 200);
    assert_eq!(own.header("ratelimit-policy"), Some("\"api\";q=20;w=60"));
    assert_eq!(own.header("x-ratelimit-limit"), Some("20"));

    let api = OverrideOf::Rule("api".into());
    operator
        .set_override(&RateOverride {
            of: api.clone(),
            rate: 2,
            interval: Duration::from_secs(30),
        })
        .await
        .unwrap();
    refreshed().await;
    let first = get_a(addr, &key("k1")).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.header("ratelimit-policy"), Some("\"api\";q=2;w=30"));
    assert_eq!(first.header("ratelimit"), Some("\"api\";r=1"));
    assert_eq!(first.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(first.header("x-ratelimit-remaining"), Some("1"));
    let second = get_a(addr, &key("k1")).await;
    assert_eq!(second.header("ratelimit-policy"), Some("\"api\";q=2;w=30"));
    let refused = get_a(addr, &key("k1")).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("ratelimit-policy"), Some("\"api\";q=2;w=30"));
    assert_eq!(refused.header("x-ratelimit-limit"), Some("2"));

    // Removed: the rule's own rate again, on the 200s.
    assert!(operator.remove_override(&api).await.unwrap());
    refreshed().await;
    let restored = get_a(addr, &key("k2")).await;
    assert_eq!(restored.status, 200);
    assert_eq!(restored.header("ratelimit-policy"), Some("\"api\";q=20;w=60"));
    assert_eq!(restored.header("ratelimit"), Some("\"api\";r=19"));
    assert_eq!(restored.header("x-ratelimit-limit"), Some("20"));
}

#[tokio::test]
async fn x_ratelimit_headers_beside_the_ietf_fields_when_asked_for() {
    let layer = |x| {
        RateLimitLayer::builder()
            .client(Client::memory())
            .x_ratelimit_headers(x)
            .rule(LayerRule::new("pair", 2, MINUTE).key(Key::header("x-api-key")))
            .build()
            .unwrap()
    };
    let addr = serve(app(layer(true))).await;
    let key = [("x-api-key", "k1")];
    let first = get_a(addr, &key).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(first.header("x-ratelimit-remaining"), Some("1"));
    assert_eq!(
        first.header("x-ratelimit-reset"),
        None,
        "a grant's reset is not known"
    );
    assert_eq!(first.header("ratelimit"), Some("\"pair\";r=1"));
    assert_eq!(get_a(addr, &key).await.header("x-ratelimit-remaining"), Some("0"));
    let refused = get_a(addr, &key).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(refused.header("x-ratelimit-remaining"), Some("0"));
    let retry = refused.header("retry-after").unwrap();
    assert_eq!(refused.header("x-ratelimit-reset"), Some(retry));
    assert!(refused.header("ratelimit-policy").is_some());

    // As problem+json too.
    let problem = serve(app_with(layer(true).problem_json())).await;
    assert_eq!(get_a(problem, &key).await.status, 200);
    assert_eq!(get_a(problem, &key).await.status, 200);
    let refused = get_a(problem, &key).await;
    assert_eq!(refused.header("content-type"), Some("application/problem+json"));
    assert_eq!(refused.header("x-ratelimit-limit"), Some("2"));

    // Not asked for: none of them.
    let plain = serve(app(layer(false))).await;
    for reply in [
        get_a(plain, &key).await,
        get_a(plain, &key).await,
        get_a(plain, &key).await,
    ] {
        assert!(
            !reply
                .headers
                .iter()
                .any(|(name, _)| name.starts_with("x-ratelimit")),
            "{reply:?}"
        );
    }
}

fn app_with<R>(layer: RateLimitLayer<R>) -> Router
where
    R: redlimit::tower::Respond<axum::body::Body>,
{
    Router::new().route("/a", get(|| async { "a" })).layer(layer)
}

/// `RateLimited`'s own response (a handler's refusal) carries them when asked.
#[tokio::test]
async fn a_handlers_refusal_adds_the_x_ratelimit_headers_when_asked() {
    #[redlimit::rate_limit(key = "x_headers:{user}", rate = 1, interval = "60s")]
    async fn limited(user: u64) -> Result<(), redlimit::RateLimited> {
        let _ = user;
        Ok(())
    }
    static SET: std::sync::Once = std::sync::Once::new();
    SET.call_once(|| {
        let _ = redlimit::set_default(Client::memory());
    });
    let handler = |x: bool| {
        move |axum::extract::Path(user): axum::extract::Path<u64>| async move {
            match limited(user).await {
                Ok(()) => axum::response::IntoResponse::into_response("ok"),
                Err(refused) => axum::response::IntoResponse::into_response(refused.x_ratelimit(x)),
            }
        }
    };
    let app = Router::new()
        .route("/x/{user}", get(handler(true)))
        .route("/plain/{user}", get(handler(false)));
    let addr = serve(app).await;
    assert_eq!(send(addr, "GET", "/x/1", &[]).await.status, 200);
    let refused = send(addr, "GET", "/x/1", &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("x-ratelimit-limit"), Some("1"));
    assert_eq!(refused.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(refused.header("x-ratelimit-reset"), refused.header("retry-after"));
    assert_eq!(send(addr, "GET", "/plain/2", &[]).await.status, 200);
    let plain = send(addr, "GET", "/plain/2", &[]).await;
    assert_eq!(plain.status, 429);
    assert_eq!(plain.header("x-ratelimit-limit"), None);
}

/// Served without `into_make_service_with_connect_info`: the layer's 500 says so,
/// as the `ClientIp` extractor's does, without a log to read.
#[tokio::test]
async fn without_the_peer_address_the_500_says_what_is_missing() {
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .rule(LayerRule::new("login", 5, MINUTE).key(Key::client_ip()))
        .build()
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app(layer)).await.unwrap() });
    let reply = get_a(addr, &[]).await;
    assert_eq!(reply.status, 500);
    assert!(
        reply.body.contains("rule `login`")
            && reply
                .body
                .contains("into_make_service_with_connect_info::<SocketAddr>()"),
        "{}",
        reply.body
    );
}

/// Under `Router::layer`, a path no route matches answers the router's 404, as
/// without the layer; the path parameter's rule still limits the routes, the other
/// rules still count every request, and a matched route without the parameter is
/// still a misconfiguration (a misspelt parameter never switches the limit off).
#[tokio::test]
async fn unmatched_paths_pass_a_path_parameter_rule_under_router_layer() {
    let client = Client::memory();
    let layer = RateLimitLayer::builder()
        .client(client.clone())
        .rule(LayerRule::new("user", 1, MINUTE).key(Key::path_param("id")))
        .rule(LayerRule::new("all", 8, MINUTE))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/users/{id}", get(|| async { "user" }))
        .route("/health", get(|| async { "ok" }))
        .layer(layer);
    let addr = serve(app).await;
    for path in ["/nope", "/users", "/users/1/extra", "/nope"] {
        let reply = send(addr, "GET", path, &[]).await;
        assert_eq!(reply.status, 404, "{path}: {reply:?}");
        assert_eq!(reply.body, "", "axum's own 404");
    }
    assert_eq!(send(addr, "GET", "/users/1", &[]).await.status, 200);
    assert_eq!(send(addr, "GET", "/users/1", &[]).await.status, 429);
    let health = send(addr, "GET", "/health", &[]).await;
    assert_eq!(health.status, 500);
    assert!(health.body.contains("Router::route_layer"), "{}", health.body);
    // 4 unmatched, 2 on /users/1 (the refused one takes nothing), 1 on /health
    // (refused before deciding): the global rule counted the 5 decided.
    let all = client.rate_limiter("rate_limit:all");
    assert_eq!(all.available_permits().await.unwrap(), 8 - 5);
    for _ in 0..3 {
        assert_eq!(send(addr, "GET", "/nope", &[]).await.status, 404);
    }
    assert_eq!(
        send(addr, "GET", "/nope", &[]).await.status,
        429,
        "the global rule holds"
    );
}

/// A rule that refuses requests without its header: 401 (or 400) naming the header,
/// for a missing, empty or blank value; nothing spent, no shared limiter made.
#[tokio::test]
async fn a_rule_can_refuse_requests_without_its_key() {
    let client = Client::memory();
    let layer = RateLimitLayer::builder()
        .client(client.clone())
        .rule(
            LayerRule::new("api", 1, MINUTE)
                .key(Key::header("x-api-key"))
                .missing_key(MissingKey::Unauthorized),
        )
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let without: [&[(&str, &[u8])]; 5] = [
        &[],
        &[("x-api-key", b"")],
        &[("x-api-key", b"   ")],
        &[("x-api-key", b"\t \t")],
        &[("X-API-KEY", b" ")],
    ];
    for _ in 0..3 {
        for headers in without {
            let reply = send_from(None, addr, "GET", "/a", headers).await;
            assert_eq!(reply.status, 401, "{headers:?}");
            assert_eq!(reply.body, "This request needs the x-api-key header\n");
            assert_eq!(reply.header("retry-after"), None);
            assert_eq!(reply.header("ratelimit"), None);
        }
    }
    assert!(
        matches!(
            client.rate_limiter("rate_limit:api").available_permits().await,
            Err(redlimit::Error::NotInitialized { .. })
        ),
        "no shared limiter for keyless requests"
    );
    assert_eq!(get_a(addr, &[("x-api-key", "k1")]).await.status, 200);
    assert_eq!(get_a(addr, &[("x-api-key", "k1")]).await.status, 429);
    // A value is a value, even one padded with spaces: limited as itself.
    assert_eq!(get_a(addr, &[("x-api-key", "k2")]).await.status, 200);
    let padded = send_from(None, addr, "GET", "/a", &[("x-api-key", b"  k2  ")]).await;
    assert_eq!(padded.status, 429, "HTTP trims the padding: the same key");

    // 400 for a value that is not a credential; a closure's None is missing too.
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .rule(
            LayerRule::new("tenant", 5, MINUTE)
                // A value of blanks (a closure may make one; HTTP trims a header's) is
                // no value.
                .key(Key::with(|parts| {
                    let tenant = parts.headers.get("x-tenant")?.to_str().ok()?;
                    Some(if tenant == "blank" {
                        " \t ".to_owned()
                    } else {
                        tenant.to_owned()
                    })
                }))
                .missing_key(MissingKey::BadRequest),
        )
        .build()
        .unwrap()
        .problem_json();
    let addr = serve(app_with(layer)).await;
    let reply = get_a(addr, &[]).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.header("content-type"), Some("application/problem+json"));
    assert!(
        reply.body.contains("This request needs a value for its key"),
        "{}",
        reply.body
    );
    assert_eq!(get_a(addr, &[("x-tenant", "blank")]).await.status, 400);
    assert_eq!(get_a(addr, &[("x-tenant", "t1")]).await.status, 200);
}

#[test]
fn refusing_keyless_requests_needs_a_key_a_request_can_lack() {
    for key in [Key::global(), Key::client_ip()] {
        let error = RateLimitLayer::builder()
            .rule(
                LayerRule::new("r", 1, MINUTE)
                    .key(key)
                    .missing_key(MissingKey::BadRequest),
            )
            .build()
            .unwrap_err()
            .to_string();
        assert!(error.contains("rule `r`: missing_key"), "{error}");
    }
}

/// Names and messages owned: a service that builds its rules at run time needs no
/// `'static` strings.
#[tokio::test]
async fn owned_names_and_messages() {
    let client = Client::memory();
    let name = format!("tenant-{}", 7);
    let layer = RateLimitLayer::builder()
        .client(client.clone())
        .rule(LayerRule::new(name.clone(), 1, MINUTE).message(format!("{name} is over its quota")))
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    assert_eq!(
        get_a(addr, &[]).await.header("ratelimit"),
        Some("\"tenant-7\";r=0")
    );
    let refused = get_a(addr, &[]).await;
    assert_eq!(refused.status, 429);
    assert!(
        refused.body.starts_with("tenant-7 is over its quota; retry in "),
        "{}",
        refused.body
    );
    assert_eq!(
        client
            .rate_limiter("rate_limit:tenant-7")
            .available_permits()
            .await
            .unwrap(),
        0
    );
}

/// A problem+json body stays one JSON document whatever the rule's message holds
/// (quotes, backslashes, line breaks, control characters, markup): its `detail` reads
/// back as the message the plain-text body shows.
#[tokio::test]
async fn a_problem_body_is_json_whatever_the_message_holds() {
    let message = "over \"quota\" \\ here,\nnext line\t\u{1}\u{7f} é </script>{\"x\":1}";
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .rule(LayerRule::new("hostile", 1, MINUTE).message(message))
        .build()
        .unwrap()
        .problem_json();
    let addr = serve(app_with(layer)).await;
    assert_eq!(get_a(addr, &[]).await.status, 200);
    let refused = get_a(addr, &[]).await;
    assert_eq!(refused.status, 429);
    let body: serde_json::Value =
        serde_json::from_str(&refused.body).unwrap_or_else(|e| panic!("{e}: {}", refused.body));
    let object = body.as_object().unwrap();
    let keys: Vec<&str> = object.keys().map(String::as_str).collect();
    assert_eq!(keys.len(), 6, "{body}");
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["title"], "Quota exceeded");
    assert_eq!(body["status"], 429);
    assert_eq!(body["violated-policies"], serde_json::json!(["hostile"]));
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.starts_with(message), "{detail:?}");
    assert!(detail.ends_with('s'), "{detail:?}");
    assert_eq!(body["retry_after"], 60);
}

/// A 429's remaining count is the key's: a cost above the rate, refused before any
/// decision, and a cost above what is left, refused by the decision, both say what
/// the key has left (not 0), in `RateLimit` and `X-RateLimit-Remaining`, on both
/// backends.
#[tokio::test]
async fn a_refusals_remaining_count_is_the_keys() {
    use redlimit::tower::{Key, LayerRule, RateLimitLayer};
    let server = support::RedisServer::start();
    let redis = Client::connect(&server.url()).await.unwrap();
    for client in [Client::memory(), redis] {
        let layer = RateLimitLayer::builder()
            .client(client.clone())
            .x_ratelimit_headers(true)
            .rule(
                LayerRule::new("metered", 10, Duration::from_secs(60))
                    .key(Key::header("x-api-key"))
                    .cost(support::http::cost_header),
            )
            .build()
            .unwrap();
        let addr = support::http::serve_route("/", |app| app.layer(layer)).await;
        let call = |cost: &'static str| [("x-api-key", "k"), ("x-cost", cost)];
        for (cost, status, left) in [
            ("11", 429, "10"),
            ("4", 200, "6"),
            ("7", 429, "6"),
            ("11", 429, "6"),
        ] {
            let reply = support::http::send(addr, "GET", "/", &call(cost)).await;
            assert_eq!(reply.status, status, "cost {cost}: {reply:?}");
            assert_eq!(
                reply.header("x-ratelimit-remaining"),
                Some(left),
                "cost {cost}: {reply:?}"
            );
            let field = reply.header("ratelimit").unwrap();
            assert!(
                field.starts_with(&format!("\"metered\";r={left}")),
                "cost {cost}: {field}"
            );
        }
    }
}
