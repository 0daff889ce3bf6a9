//! A refusal caused by the backend failing under `on_error = "deny"` is a 503 that does
//! not show the cause (cargo feature `axum`): the response the refusal turns into.
#![cfg(feature = "axum")]

use axum::response::IntoResponse;
use redlimit::{rate_limit, Client, RateLimited};

#[rate_limit(key = "payments", rate = 5, interval = "60s", on_error = "deny")]
async fn charge() -> Result<&'static str, RateLimited> {
    Ok("charged")
}

#[tokio::test]
async fn a_backend_failure_under_deny_is_503_without_the_cause() {
    // Nothing listens on port 1: every decision fails.
    let client = Client::builder()
        .connect_lazy("redis://:hunter2@127.0.0.1:1/")
        .unwrap();
    redlimit::set_default(client).unwrap();
    let refused = charge().await.unwrap_err();
    assert!(refused.cause().is_some());
    let response = refused.into_response();
    assert_eq!(response.status(), 503);
    assert!(response.headers().get("retry-after").is_none());
    let body = axum::body::to_bytes(response.into_body(), 1024).await.unwrap();
    let body = String::from_utf8(body.to_vec()).unwrap();
    assert_eq!(body, "Service temporarily unavailable\n");
}
