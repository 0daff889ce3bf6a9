//! A default client that cannot be made (a `REDIS_URL` that names no server) is
//! misuse: every call is refused, whatever the rule's `on_error`, and the log says so.
//! (Its own test binary: it sets an environment variable of the process.)

use redlimit_test_support as support;

use redlimit::{rate_limit, RateLimited};

#[rate_limit(key = "misuse:url", rate = 1, interval = "60s", on_error = "allow")]
async fn allow_on_error() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "misuse:url_local", rate = 1, interval = "60s", on_error = "local")]
async fn local_on_error() -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn a_redis_url_that_names_no_server_refuses_every_call() {
    let capture = support::capture::Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    let mut urls = vec![
        "redis://127.0.0.1:notaport/",
        "redis//typo:6379",
        "http://127.0.0.1:6379/",
    ];
    if cfg!(not(feature = "tls")) {
        urls.push("rediss://127.0.0.1:6379/");
    }
    for url in urls {
        std::env::set_var("REDIS_URL", url);
        let mut granted = 0;
        for _ in 0..20 {
            for result in [allow_on_error().await, local_on_error().await] {
                match result {
                    Ok(()) => granted += 1,
                    Err(refused) => {
                        let cause = refused.cause().expect("refused for the URL, not by the limit");
                        assert!(
                            matches!(cause, redlimit::Error::InvalidUrl { .. }),
                            "{url}: {cause:?}"
                        );
                    }
                }
            }
        }
        assert_eq!(
            granted, 0,
            "REDIS_URL={url}: calls passed a rule whose client cannot be made"
        );
    }
    assert!(
        capture.text().contains("misconfigured, refusing the call"),
        "the log says the calls are refused: {}",
        capture.text()
    );
    std::env::remove_var("REDIS_URL");
}
