//! `#[rate_limit]` on axum handlers (cargo feature `axum`), on a real server on
//! loopback: keyed by `ClientIp` behind a trusted proxy (each client limited on its
//! own, a forged leftmost `X-Forwarded-For` entry gives no fresh limit), and refusals
//! as HTTP: 429, `Retry-After`, the RateLimit fields, plain text or problem+json.
#![cfg(feature = "axum")]

use redlimit_test_support as support;

use std::net::SocketAddr;

use axum::http::StatusCode;
use axum::routing::post;
use axum::{Extension, Router};
use redlimit::axum::{ClientIp, TrustedProxies};
use redlimit::{rate_limit, Client, RateLimited};

struct Refused;

impl From<RateLimited> for Refused {
    fn from(_: RateLimited) -> Self {
        Refused
    }
}

impl axum::response::IntoResponse for Refused {
    fn into_response(self) -> axum::response::Response {
        StatusCode::TOO_MANY_REQUESTS.into_response()
    }
}

#[rate_limit(key = "login:{ip}", rate = 2, interval = "60s")]
async fn login(ip: ClientIp) -> Result<String, Refused> {
    Ok(format!("welcome {ip}"))
}

#[rate_limit(key = "search", rate = 1, interval = "1500ms", message = "search is busy")]
async fn search() -> Result<&'static str, RateLimited> {
    Ok("results")
}

#[rate_limit(key = "user:{id}", rate = 1, interval = "60s")]
async fn user(axum::extract::Path(id): axum::extract::Path<u64>) -> Result<String, RateLimited> {
    Ok(format!("user {id}"))
}

#[rate_limit(key = "report", rate = 1, interval = "60s")]
async fn report() -> axum::response::Response {
    axum::response::IntoResponse::into_response("report")
}

#[rate_limit(key = "export", rate = 1, interval = "60s")]
async fn export() -> Result<&'static str, redlimit::axum::ProblemJson> {
    Ok("exported")
}

/// The status, the headers (lower-case names) and the body of one request.
async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    forwarded_for: &str,
) -> (u16, Vec<(String, String)>, String) {
    let reply = support::http::send(addr, method, path, &[("X-Forwarded-For", forwarded_for)]).await;
    (reply.status, reply.headers, reply.body)
}

async fn post_with(addr: SocketAddr, forwarded_for: &str) -> u16 {
    request(addr, "POST", "/login", forwarded_for).await.0
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

async fn serve() -> SocketAddr {
    static SET: std::sync::Once = std::sync::Once::new();
    SET.call_once(|| redlimit::set_default(Client::memory()).unwrap());
    let app = Router::new()
        .route("/login", post(login))
        .route("/search", axum::routing::get(search))
        .route("/users/{id}", axum::routing::get(user))
        .route("/report", axum::routing::get(report))
        .route("/export", axum::routing::get(export))
        .layer(Extension(TrustedProxies::new(["127.0.0.1"]).unwrap()));
    support::http::serve(app).await
}

#[tokio::test]
async fn refusals_are_429_with_retry_after_and_the_ratelimit_fields() {
    let addr = serve().await;
    let (status, _, body) = request(addr, "GET", "/search", "198.51.100.7").await;
    assert_eq!((status, body.as_str()), (200, "results"));
    let (status, headers, body) = request(addr, "GET", "/search", "198.51.100.7").await;
    assert_eq!(status, 429);
    assert_eq!(
        header(&headers, "retry-after"),
        Some("2"),
        "1.5 s rounded up: {headers:?}"
    );
    assert_eq!(header(&headers, "ratelimit-policy"), Some("\"search\";q=1;w=2"));
    assert_eq!(header(&headers, "ratelimit"), Some("\"search\";r=0;t=2"));
    assert_eq!(body, "search is busy; retry in 2 s\n");

    // A handler returning axum's Response.
    assert_eq!(request(addr, "GET", "/report", "x").await.0, 200);
    let (status, headers, _) = request(addr, "GET", "/report", "x").await;
    assert_eq!(status, 429);
    assert!(header(&headers, "retry-after").is_some());

    // A path parameter in the key: each user limited on its own.
    assert_eq!(request(addr, "GET", "/users/1", "x").await.0, 200);
    assert_eq!(request(addr, "GET", "/users/1", "x").await.0, 429);
    let (status, headers, _) = request(addr, "GET", "/users/1", "x").await;
    assert_eq!(status, 429);
    assert_eq!(
        header(&headers, "ratelimit-policy"),
        Some("\"user:{id}\";q=1;w=60")
    );
    assert_eq!(request(addr, "GET", "/users/2", "x").await.0, 200);

    // Problem details.
    assert_eq!(request(addr, "GET", "/export", "x").await.0, 200);
    let (status, headers, body) = request(addr, "GET", "/export", "x").await;
    assert_eq!(status, 429);
    assert_eq!(header(&headers, "content-type"), Some("application/problem+json"));
    assert!(
        body.starts_with(
            "{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\",\
             \"title\":\"Quota exceeded\",\"status\":429"
        ),
        "{body}"
    );
    assert!(body.contains(",\"violated-policies\":[\"export\"],"), "{body}");
    assert!(header(&headers, "ratelimit-policy").is_some());
}

#[tokio::test]
async fn each_client_behind_the_proxy_has_its_own_limit() {
    let addr = serve().await;
    for _ in 0..2 {
        assert_eq!(post_with(addr, "198.51.100.7").await, 200);
    }
    assert_eq!(post_with(addr, "198.51.100.7").await, 429);
    for forged in ["1.1.1.1, 198.51.100.7", "10.0.0.9, 198.51.100.7"] {
        assert_eq!(post_with(addr, forged).await, 429, "forged {forged:?}");
    }
    assert_eq!(post_with(addr, "198.51.100.8").await, 200, "another client");
}
