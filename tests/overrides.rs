//! Run-time overrides on the in-process backend (the Redis path, across processes and
//! with the CLI, is `cli/tests/overrides.rs`): a rule's rate replaced for all its keys
//! or for one, the refusal naming the rate decided, removal restoring the rule, and
//! overrides a rule cannot take.

use std::time::Duration;

use redlimit::{rate_limit, Client, OverrideOf, RateLimited, RateOverride};

#[rate_limit(key = "mem:{user}", rate = 1, interval = "60s")]
async fn one_per_minute(user: u32) -> Result<(), RateLimited> {
    let _ = user;
    Ok(())
}

#[rate_limit(key = "heavy", rate = 10, interval = "60s", permits = 5)]
async fn heavy() -> Result<(), RateLimited> {
    Ok(())
}

fn over(of: OverrideOf, rate: u64) -> RateOverride {
    RateOverride {
        of,
        rate,
        interval: Duration::from_secs(60),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn overrides_replace_a_rules_rate_for_all_its_keys_or_one() {
    let client = Client::memory();
    redlimit::set_default(client.clone()).unwrap();
    let rule = OverrideOf::Rule("mem:{user}".into());
    client.set_override(&over(rule.clone(), 3)).await.unwrap();
    for _ in 0..3 {
        one_per_minute(1).await.unwrap();
    }
    let refused = one_per_minute(1).await.unwrap_err();
    assert_eq!(
        refused.limit().unwrap().rate,
        3,
        "the refusal names the rate decided"
    );

    // One limiter's own override wins over its rule's.
    let key = OverrideOf::Key("rate_limit:mem:2".into());
    client.set_override(&over(key.clone(), 5)).await.unwrap();
    for _ in 0..5 {
        one_per_minute(2).await.unwrap();
    }
    assert!(one_per_minute(2).await.is_err());
    assert_eq!(client.list_overrides().await.unwrap().len(), 2);

    // Removed: the rule's own rate, over a window that holds 3 grants.
    assert!(client.remove_override(&rule).await.unwrap());
    assert!(!client.remove_override(&rule).await.unwrap(), "already gone");
    let refused = one_per_minute(1).await.unwrap_err();
    assert_eq!(refused.limit().unwrap().rate, 1);
    one_per_minute(3).await.unwrap();
    assert!(one_per_minute(3).await.is_err());

    // An override below a rule's permits per call cannot apply: the rule's own does.
    client
        .set_override(&over(OverrideOf::Rule("heavy".into()), 2))
        .await
        .unwrap();
    heavy().await.unwrap();
    heavy().await.unwrap();
    assert!(heavy().await.is_err(), "10 per minute, 5 per call");

    // What no limiter accepts is refused when set.
    let error = client
        .set_override(&over(OverrideOf::Rule("x".into()), 0))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("rate is 0"), "{error}");
}
