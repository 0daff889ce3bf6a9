//! The CLI behind Redis Sentinel: `redlimit` given a `redis+sentinel://` URL reads the
//! limiters on the master the sentinels name, and shows neither password.

mod binary;
use redlimit_test_support as support;

use binary::{code, json, redlimit, text};

use std::time::Duration;

use redlimit::{Client, Rule};
use support::sentinel::{RedisSentinel, MASTER_PASSWORD, SENTINEL_PASSWORD};

#[tokio::test]
async fn the_cli_reads_the_master_the_sentinels_name() {
    let set = RedisSentinel::start();
    let url = set.url();
    let client = Client::connect(&url).await.unwrap();
    let rule = [Rule::new("rate_limit:sentinel:cli", 5, Duration::from_secs(60)).permits(2)];
    assert!(client.check_rules(&rule).await.unwrap().allowed);

    let out = redlimit(&url, &["inspect", "rate_limit:sentinel:cli", "--json"]);
    assert_eq!(code(&out), 0, "{}", text(&out));
    assert_eq!(json(&out)["buckets"][0]["value"], 3);
    let listed = redlimit(&url, &["ls", "--json"]);
    assert_eq!(code(&listed), 0, "{}", text(&listed));
    assert!(
        text(&listed).contains("rate_limit:sentinel:cli"),
        "{}",
        text(&listed)
    );

    // A wrong sentinel password: named as refused credentials, no password shown.
    let wrong = url.replace(SENTINEL_PASSWORD, "wrong-password");
    let out = redlimit(&wrong, &["ls"]);
    let shown = text(&out);
    assert_ne!(code(&out), 0, "{shown}");
    assert!(shown.contains("password"), "{shown}");
    for secret in [MASTER_PASSWORD, SENTINEL_PASSWORD, "wrong-password"] {
        assert!(!shown.contains(secret), "{secret} shown: {shown}");
    }
}
