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

/// Overrides set and removed at once from several threads on an in-process client
/// (where the client's table is every override there is) each take effect: none
/// undoes another's, whichever returns first. Each round, 8 tasks set an override of
/// a key of their own, and 4 of them remove theirs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overrides_set_and_removed_at_once_are_all_kept() {
    for round in 0..400 {
        let client = Client::memory();
        let key = move |k: usize| OverrideOf::Key(format!("rate_limit:api:{round}-{k}"));
        let tasks: Vec<_> = (0..8)
            .map(|k| {
                let client = client.clone();
                tokio::spawn(async move {
                    client.set_override(&over(key(k), 1)).await.unwrap();
                    if k % 2 == 0 {
                        assert!(
                            client.remove_override(&key(k)).await.unwrap(),
                            "{round}: its own, set"
                        );
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let kept: Vec<OverrideOf> = client
            .list_overrides()
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.of)
            .collect();
        let expected: Vec<OverrideOf> = (0..8).filter(|k| k % 2 == 1).map(key).collect();
        assert_eq!(kept, expected, "round {round}");
    }
}
