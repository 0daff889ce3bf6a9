//! A rule keyed by a credential (`Key::header("authorization").secret()`): each value
//! is written as its digest, so no part of it reaches Redis (the limiters' keys, the
//! refusal reports `redlimit watch` reads), a log line or a refusal's message, while
//! the limit holds per credential as for any key. Through an axum server on loopback
//! and a real redis-server. (A file of its own: a test running beside it without a
//! subscriber could leave the log's call sites disabled.)
#![cfg(feature = "axum")]

use redlimit_test_support as support;

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use redis::AsyncCommands;
use redlimit::tower::{Key, LayerRule, MissingKey, RateLimitLayer};
use redlimit::Client;
use support::http::{send, serve};
use support::RedisServer;

const SECRET: &str = "sk-live-51HSECRETtoken0123456789";

#[tokio::test(flavor = "current_thread")]
async fn a_secret_key_reaches_no_key_report_or_log_and_still_limits() {
    let capture = support::capture::Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    let server = RedisServer::start();
    let mut raw = server.raw().await;
    let client = Client::connect(&server.url()).await.unwrap();
    let layer = RateLimitLayer::builder()
        .client(client)
        .rule(
            LayerRule::new("api", 2, Duration::from_secs(60))
                .key(Key::header("authorization").secret())
                .missing_key(MissingKey::Unauthorized)
                .exempt(["Bearer partner-token"]),
        )
        .build()
        .unwrap();
    let addr = serve(Router::new().route("/", get(|| async { "ok" })).layer(layer)).await;
    // The same reading on a plain key.
    let plain = RateLimitLayer::builder()
        .client(Client::connect(&server.url()).await.unwrap())
        .rule(LayerRule::new("plain-auth", 2, Duration::from_secs(60)).key(Key::header("authorization")))
        .build()
        .unwrap();
    let plain = serve(Router::new().route("/", get(|| async { "ok" })).layer(plain)).await;
    let mut spelled = Vec::new();
    for scheme in ["Bearer ", "bearer  ", "BEARER\t"] {
        let credential = format!("{scheme}plain-token");
        spelled.push(
            send(plain, "GET", "/", &[("authorization", &credential)])
                .await
                .status,
        );
    }
    assert_eq!(spelled, [200, 200, 429], "one plain token, three spellings");
    let bearer = format!("Bearer {SECRET}");
    let mut replies = Vec::new();
    for credential in [&bearer, &bearer, &bearer, "Bearer another", " Bearer another\t"] {
        replies.push(send(addr, "GET", "/", &[("authorization", credential)]).await);
    }
    let statuses: Vec<u16> = replies.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 429, 200, 200], "2 a minute per credential");
    // One token however its scheme is spelled: schemes are case-insensitive, and the
    // space before the token is one to the application.
    let mut spelled = Vec::new();
    for scheme in ["Bearer ", "bearer ", "BEARER  ", "BeArEr\t", "bEARER \t "] {
        let credential = format!("{scheme}{SECRET}-2");
        spelled.push(
            send(addr, "GET", "/", &[("authorization", &credential)])
                .await
                .status,
        );
    }
    assert_eq!(spelled, [200, 200, 429, 429, 429], "one token, five spellings");
    // An exempt credential, listed in one spelling, sent in another.
    for _ in 0..5 {
        let exempt = send(addr, "GET", "/", &[("authorization", "bearer\tpartner-token")]).await;
        assert_eq!(exempt.status, 200);
    }
    assert_eq!(
        send(addr, "GET", "/", &[]).await.status,
        401,
        "none: refused as before"
    );
    assert_eq!(
        send(addr, "GET", "/", &[("authorization", " ")]).await.status,
        401,
        "blank: refused as before"
    );
    // The refusal reported for `redlimit watch`, once the report is written.
    let mut keys: Vec<String> = Vec::new();
    for _ in 0..50 {
        keys = raw.keys("*").await.unwrap();
        if keys.iter().any(|k| k.contains("refused")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut stored = String::new();
    for key in &keys {
        stored.push_str(key);
        stored.push('\n');
        if key.contains("refused") {
            let fields: Vec<(String, String)> = raw.hgetall(key).await.unwrap();
            for (field, value) in fields {
                stored.push_str(&format!("{field}={value}\n"));
            }
        }
    }
    assert!(stored.contains("refused"), "the refusal is reported: {stored}");
    assert!(stored.contains("api:%#"), "limiters named by digest: {stored}");
    let seen = format!("{stored}{}{replies:?}", capture.text());
    // (the plain key's token is in its key names, as a plain key's values are)
    for piece in [SECRET, "sk-live", "another", "partner-token"] {
        assert!(!seen.contains(piece), "{piece} in: {seen}");
    }
}

/// A secret key's exempt values are credentials too: `Debug` counts them.
#[test]
fn a_secret_keys_exempt_values_are_not_shown() {
    let rule = LayerRule::new("partners", 2, Duration::from_secs(60))
        .key(Key::header("x-api-key").secret())
        .exempt(["partnerSECRET-999"]);
    let shown = format!("{rule:?}");
    assert!(
        !shown.contains("partnerSECRET") && shown.contains("1 secret values"),
        "{shown}"
    );
    let layer = RateLimitLayer::builder().rule(rule).build().unwrap();
    assert!(!format!("{layer:?}").contains("partnerSECRET"));
    let plain = LayerRule::new("partners", 2, Duration::from_secs(60)).exempt(["partner"]);
    assert!(format!("{plain:?}").contains("\"partner\""));
}

#[test]
fn a_global_key_has_no_value_to_keep_secret() {
    let error = RateLimitLayer::builder()
        .rule(LayerRule::new("all", 2, Duration::from_secs(60)).key(Key::global().secret()))
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("no value to keep secret"), "{error}");
}
