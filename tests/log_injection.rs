//! Control characters a caller sends into a key (a path parameter decodes `%0A` to a
//! newline, `%1B` to ESC) stay in the limiter's name, by design, and are escaped in
//! every message that quotes it: a refusal's `Display`, the errors it carries, and the
//! library's own log lines. Logged as applications log a refusal, they forge no line of
//! their own and set no terminal colour. (A file of its own: a test running beside it
//! without a subscriber could leave the log's call sites disabled.)
#![cfg(feature = "axum")]

use redlimit_test_support as support;

use std::time::Duration;

use axum::extract::Path;
use axum::routing::get;
use axum::Router;
use redlimit::{rate_limit, Client, RateLimited, RateType};
use support::http::{send, serve};

#[rate_limit(key = "profile:{user}", rate = 1, interval = "60s")]
async fn profile(user: &str) -> Result<(), RateLimited> {
    let _ = user;
    Ok(())
}

/// The handler logs a refusal as applications do, by its `Display`.
async fn handler(Path(user): Path<String>) -> &'static str {
    match profile(&user).await {
        Ok(()) => "ok",
        Err(refused) => {
            tracing::warn!("request refused: {refused}");
            "refused"
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn control_characters_in_a_key_forge_no_log_line() {
    let capture = support::capture::Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    let client = Client::builder().max_limiters(3).memory();
    redlimit::set_default(client.clone()).unwrap();
    let addr = serve(Router::new().route("/profile/{user}", get(handler))).await;
    let path = "/profile/x%0AFORGED%20admin%20logged%20in%1B%5B31m";
    // Refused by its rate: the refusal quotes the key.
    assert_eq!(send(addr, "GET", path, &[]).await.body, "ok");
    assert_eq!(send(addr, "GET", path, &[]).await.body, "refused");
    // Refused at the in-process bound, held by limiters set by hand: the library's log
    // line and the refusal's cause quote the new limiter's name.
    for i in 0..3 {
        let limiter = client.rate_limiter(format!("hand:{i}"));
        assert!(limiter
            .try_set_rate(RateType::Overall, 5, Duration::from_secs(60))
            .await
            .unwrap());
    }
    assert_eq!(
        send(addr, "GET", "/profile/y%0AFORGED%1B%5B31m", &[]).await.body,
        "refused"
    );
    let text = capture.text();
    assert!(
        !text.lines().any(|line| line.starts_with("FORGED")) && !text.contains('\u{1b}'),
        "{text}"
    );
    assert!(
        text.contains("rate limit exceeded for `rate_limit:profile:x\\nFORGED admin logged in\\e[31m`"),
        "{text}"
    );
    assert!(
        text.contains("limiter `rate_limit:profile:y\\nFORGED\\e[31m` is refused"),
        "{text}"
    );
    assert_eq!(
        text.matches("limiter `rate_limit:profile:y\\nFORGED\\e[31m` is refused")
            .count(),
        2,
        "the library's line and the handler's: {text}"
    );
}
