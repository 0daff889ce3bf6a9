//! What an override applied or removed logs: its rewrite of the stored config is
//! the override's doing, not blamed on "something else". (A file of its own: a test
//! running beside it without a subscriber could leave the log's call sites disabled.)
#![cfg(feature = "axum")]

use std::time::Duration;

use redlimit::{Client, OverrideOf, RateOverride};

fn over(of: OverrideOf, rate: u64) -> RateOverride {
    RateOverride {
        of,
        rate,
        interval: Duration::from_secs(60),
    }
}

/// Applying an override rewrites the stored config once: logged as the override's
/// doing (not blamed on "something else"); removing it, as an override removed.
#[tokio::test(flavor = "current_thread")]
async fn an_override_applied_is_logged_as_the_overrides_doing() {
    use redlimit::tower::{LayerRule, RateLimitLayer};
    use redlimit::ManualClock;
    use redlimit_test_support as support;
    let capture = support::capture::Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    let clock = ManualClock::new(1_700_000_000_000);
    let client = Client::builder().clock(clock.clone()).memory();
    let layer = RateLimitLayer::builder()
        .client(client.clone())
        .rule(LayerRule::new("ovr", 2, Duration::from_secs(60)))
        .build()
        .unwrap();
    let addr = support::http::serve_route("/", |app| app.layer(layer)).await;
    assert_eq!(support::http::send(addr, "GET", "/", &[]).await.status, 200);
    client
        .set_override(&over(OverrideOf::Rule("ovr".into()), 5))
        .await
        .unwrap();
    assert_eq!(support::http::send(addr, "GET", "/", &[]).await.status, 200);
    let applied = capture.text();
    assert!(applied.contains("overridden at run time"), "{applied}");
    assert!(!applied.contains("something else wrote"), "{applied}");

    // Past the log's period for the limiter; the window holds 2 grants.
    clock.advance(Duration::from_secs(11));
    assert!(client
        .remove_override(&OverrideOf::Rule("ovr".into()))
        .await
        .unwrap());
    assert_eq!(support::http::send(addr, "GET", "/", &[]).await.status, 429);
    let removed = capture.text();
    assert!(removed.contains("an override removed since"), "{removed}");
}
