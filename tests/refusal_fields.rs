//! What a refusal says, on real axum servers on loopback (cargo feature `axum`): a 429
//! as problem+json is of the registered quota-exceeded type and names the refusing
//! rule in `violated-policies` (or is `about:blank` when asked), a token bucket's
//! policy says its burst, hostile rule names stay one string in the body and in the
//! header, and a layer over a handler whose `#[rate_limit]` function refused leaves
//! the refusal's fields as they are.
#![cfg(feature = "axum")]

use redlimit_test_support as support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::Path;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use redlimit::axum::{ProblemJson, ProblemType};
use redlimit::tower::{Key, LayerRule, RateLimitLayer, Respond};
use redlimit::{rate_limit, Client, RateLimited};
use support::http::{send, serve, Reply};

const MINUTE: Duration = Duration::from_secs(60);
const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The `#[rate_limit]` functions below decide on the default client: in process.
fn in_process_default() {
    static SET: std::sync::Once = std::sync::Once::new();
    SET.call_once(|| {
        let _ = redlimit::set_default(Client::memory());
    });
}

fn app<R: Respond<axum::body::Body>>(layer: RateLimitLayer<R>) -> Router {
    Router::new().route("/a", get(|| async { "a" })).layer(layer)
}

async fn get_a(addr: SocketAddr, headers: &[(&str, &str)]) -> Reply {
    send(addr, "GET", "/a", headers).await
}

/// A problem body parsed, or the test fails showing it.
fn json(reply: &Reply) -> serde_json::Value {
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("{e}: {}", reply.body))
}

/// Two rules, the second refusing: the problem names it, as `RateLimit-Policy` does.
#[tokio::test]
async fn a_layers_429_is_the_registered_problem_naming_the_refusing_rule() {
    let layer = |problem_type| {
        RateLimitLayer::builder()
            .client(Client::memory())
            .problem_type(problem_type)
            .rule(LayerRule::new("all", 1_000, Duration::from_secs(1)))
            .rule(LayerRule::new("daily", 1, MINUTE).key(Key::header("x-api-key")))
            .build()
            .unwrap()
            .problem_json()
    };
    let key = [("x-api-key", "k1")];
    let addr = serve(app(layer(ProblemType::default()))).await;
    assert_eq!(get_a(addr, &key).await.status, 200);
    let refused = get_a(addr, &key).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("content-type"), Some("application/problem+json"));
    assert_eq!(refused.header("ratelimit-policy"), Some("\"daily\";q=1;w=60"));
    let body = json(&refused);
    assert_eq!(body["type"], QUOTA_EXCEEDED, "{body}");
    assert_eq!(body["title"], "Quota exceeded");
    assert_eq!(body["status"], 429);
    assert_eq!(body["violated-policies"], serde_json::json!(["daily"]));
    assert_eq!(body["detail"], "Too many requests; retry in 60 s");
    assert_eq!(body["retry_after"], 60);

    // The option: about:blank, as before, without `violated-policies`.
    let addr = serve(app(layer(ProblemType::AboutBlank))).await;
    assert_eq!(get_a(addr, &key).await.status, 200);
    let refused = get_a(addr, &key).await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.body,
        "{\"type\":\"about:blank\",\"title\":\"Too Many Requests\",\"status\":429,\
         \"detail\":\"Too many requests; retry in 60 s\",\"retry_after\":60}"
    );
}

#[rate_limit(key = "problem_fn:{user}", rate = 1, interval = "60s")]
async fn problem_fn(user: u64) -> Result<(), RateLimited> {
    let _ = user;
    Ok(())
}

/// A handler's own refusal as `ProblemJson`: the registered type by default, the
/// option on `ProblemJson` giving about:blank.
#[tokio::test]
async fn a_handlers_problem_names_its_rule_or_is_about_blank_when_asked() {
    in_process_default();
    let handler = |problem_type: ProblemType| {
        move |Path(user): Path<u64>| async move {
            match problem_fn(user).await {
                Ok(()) => "ok".into_response(),
                Err(refused) => ProblemJson(refused).problem_type(problem_type).into_response(),
            }
        }
    };
    let app = Router::new()
        .route("/quota/{user}", get(handler(ProblemType::QuotaExceeded)))
        .route("/blank/{user}", get(handler(ProblemType::AboutBlank)));
    let addr = serve(app).await;
    assert_eq!(send(addr, "GET", "/quota/1", &[]).await.status, 200);
    let refused = send(addr, "GET", "/quota/1", &[]).await;
    assert_eq!(refused.status, 429);
    let body = json(&refused);
    assert_eq!(body["type"], QUOTA_EXCEEDED, "{body}");
    assert_eq!(
        body["violated-policies"],
        serde_json::json!(["problem_fn:{user}"])
    );
    assert_eq!(send(addr, "GET", "/blank/2", &[]).await.status, 200);
    let blank = json(&send(addr, "GET", "/blank/2", &[]).await);
    assert_eq!(blank["type"], "about:blank", "{blank}");
    assert_eq!(blank["title"], "Too Many Requests");
    assert!(blank.get("violated-policies").is_none(), "{blank}");
}

#[rate_limit(
    key = "bucket_fn",
    rate = 1,
    interval = "60s",
    algorithm = "token_bucket",
    burst = 3
)]
async fn bucket_fn() -> Result<&'static str, RateLimited> {
    Ok("ok")
}

/// A token bucket's `RateLimit-Policy` says its burst, on the layer's grants and
/// refusals and on the attribute's refusals; a sliding window's does not.
#[tokio::test]
async fn a_token_buckets_policy_says_its_burst() {
    in_process_default();
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
    let policy = Some("\"tb\";q=1;w=60;redlimit-burst=3");
    for _ in 0..3 {
        let granted = get_a(addr, &[]).await;
        assert_eq!(granted.status, 200);
        assert_eq!(granted.header("ratelimit-policy"), policy);
    }
    let refused = get_a(addr, &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("ratelimit-policy"), policy);

    let attribute = Router::new().route("/bucket", get(|| async { bucket_fn().await.into_response() }));
    let addr = serve(attribute).await;
    for _ in 0..3 {
        assert_eq!(send(addr, "GET", "/bucket", &[]).await.status, 200);
    }
    let refused = send(addr, "GET", "/bucket", &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.header("ratelimit-policy"),
        Some("\"bucket_fn\";q=1;w=60;redlimit-burst=3")
    );

    let window = RateLimitLayer::builder()
        .client(Client::memory())
        .rule(LayerRule::new("window", 1, MINUTE))
        .build()
        .unwrap();
    let addr = serve(app(window)).await;
    assert_eq!(
        get_a(addr, &[]).await.header("ratelimit-policy"),
        Some("\"window\";q=1;w=60")
    );
}

/// A structured-field string's content: the quotes taken off, `\"` and `\\` unescaped;
/// `None` when it is not one (a bare `"` or `\`, a character outside printable ASCII).
fn sf_string_content(item: &str) -> Option<String> {
    let inner = item.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next()? {
                escaped @ ('"' | '\\') => out.push(escaped),
                _ => return None,
            },
            '"' => return None,
            ' '..='~' => out.push(c),
            _ => return None,
        }
    }
    Some(out)
}

/// The leading string of a field (`"name";q=1;w=60`): up to its closing quote.
fn first_item(field: &str) -> &str {
    let mut escaped = false;
    for (i, c) in field.char_indices().skip(1) {
        match (escaped, c) {
            (false, '\\') => escaped = true,
            (false, '"') => return &field[..=i],
            _ => escaped = false,
        }
    }
    field
}

/// A rule name with quotes, backslashes, commas, control characters and non-ASCII:
/// one JSON string in `violated-policies`, one structured-field string in each field,
/// and the same name in both.
#[tokio::test]
async fn a_hostile_rule_name_stays_one_string_in_the_body_and_the_fields() {
    let name = "say \"hi\", \\back\\ é;q=9, \"x\"\u{1}\u{7f}\t🦀";
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .rule(LayerRule::new(name, 1, MINUTE))
        .build()
        .unwrap()
        .problem_json();
    let addr = serve(app(layer)).await;
    let granted = get_a(addr, &[]).await;
    assert_eq!(granted.status, 200);
    let refused = get_a(addr, &[]).await;
    assert_eq!(refused.status, 429);
    let body = json(&refused);
    let policies = body["violated-policies"].as_array().unwrap();
    assert_eq!(policies.len(), 1, "{body}");
    let said = policies[0].as_str().unwrap();
    assert_eq!(said, "say \"hi\", \\back\\ _;q=9, \"x\"____");
    for reply in [&granted, &refused] {
        for field in ["ratelimit-policy", "ratelimit"] {
            let value = reply.header(field).unwrap();
            let item = first_item(value);
            assert_eq!(sf_string_content(item).as_deref(), Some(said), "{field}: {value}");
            let rest = &value[item.len()..];
            assert!(
                rest.starts_with(';') && !rest.contains(['"', ',']),
                "{field}: {value}"
            );
        }
    }
}

#[rate_limit(key = "inner:{user}", rate = 1, interval = "60s")]
async fn inner(user: u64) -> Result<(), RateLimited> {
    let _ = user;
    Ok(())
}

/// A handler calling `inner`, answering its refusal as `RateLimited`'s response.
async fn calls_inner(Path(user): Path<u64>) -> Response {
    match inner(user).await {
        Ok(()) => "ok".into_response(),
        Err(refused) => refused.into_response(),
    }
}

/// A layer (1 000 a second, all requests) over a handler whose `#[rate_limit]`
/// function refuses: the 429 carries the function's fields, which decided it, not the
/// layer's grant (`"all";r=998`), nor the layer's `X-RateLimit-*`; the handler's grants
/// carry the layer's fields.
#[tokio::test]
async fn a_layer_leaves_the_fields_of_a_refusal_made_inside() {
    in_process_default();
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .x_ratelimit_headers(true)
        .rule(LayerRule::new("all", 1_000, Duration::from_secs(1)))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/inner/{user}", get(calls_inner))
        .layer(layer);
    let addr = serve(app).await;
    let granted = send(addr, "GET", "/inner/1", &[]).await;
    assert_eq!(granted.status, 200);
    assert_eq!(granted.header("ratelimit"), Some("\"all\";r=999"));
    assert_eq!(granted.header("x-ratelimit-limit"), Some("1000"));
    let refused = send(addr, "GET", "/inner/1", &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.header("ratelimit-policy"),
        Some("\"inner:{user}\";q=1;w=60")
    );
    assert_eq!(refused.header("ratelimit"), Some("\"inner:{user}\";r=0;t=60"));
    assert_eq!(refused.header("x-ratelimit-limit"), None, "{refused:?}");
    assert_eq!(refused.header("x-ratelimit-remaining"), None, "{refused:?}");
    assert_eq!(refused.header("retry-after"), Some("60"));
}

/// A handler that writes its own fields, under a problem+json layer: the layer writes
/// none of its own on a response that has either field, and its own on the others.
#[tokio::test]
async fn a_layer_leaves_a_handlers_own_fields() {
    let layer = RateLimitLayer::builder()
        .client(Client::memory())
        .rule(LayerRule::new("outer", 1_000, Duration::from_secs(1)))
        .build()
        .unwrap()
        .problem_json();
    let own = || async {
        (
            [
                ("ratelimit", "\"own\";r=4"),
                ("ratelimit-policy", "\"own\";q=5;w=1"),
            ],
            "mine",
        )
    };
    let only_state = || async { ([("ratelimit", "\"own\";r=4")], "mine") };
    let app = Router::new()
        .route("/own", get(own))
        .route("/state", get(only_state))
        .route("/plain", get(|| async { "plain" }))
        .layer(layer);
    let addr = serve(app).await;
    let reply = send(addr, "GET", "/own", &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("ratelimit"), Some("\"own\";r=4"));
    assert_eq!(reply.header("ratelimit-policy"), Some("\"own\";q=5;w=1"));
    let reply = send(addr, "GET", "/state", &[]).await;
    assert_eq!(reply.header("ratelimit"), Some("\"own\";r=4"));
    assert_eq!(reply.header("ratelimit-policy"), None, "{reply:?}");
    let reply = send(addr, "GET", "/plain", &[]).await;
    assert_eq!(reply.header("ratelimit-policy"), Some("\"outer\";q=1000;w=1"));
}

/// Two layers, both granting: the response says the inner layer's rule, which the
/// outer layer leaves.
#[tokio::test]
async fn nested_layers_leave_the_inner_layers_fields() {
    let layer = |name: &'static str, rate| {
        RateLimitLayer::builder()
            .client(Client::memory())
            .rule(LayerRule::new(name, rate, MINUTE))
            .build()
            .unwrap()
    };
    let app = Router::new()
        .route("/a", get(|| async { "a" }))
        .route_layer(layer("route", 5))
        .layer(layer("everything", 1_000));
    let addr = serve(app).await;
    let reply = get_a(addr, &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("ratelimit"), Some("\"route\";r=4"));
    assert_eq!(reply.header("ratelimit-policy"), Some("\"route\";q=5;w=60"));
}
