//! Stacked templates that name one limiter for some argument values: `x:p:{a}` and
//! `x:{b}:q` coincide when `a = "q"` and `b = "p"`. Such templates must count alike
//! (the attribute refuses others at compile time); a caller choosing the values must
//! not switch either rule off, nor make every call refused, under any `on_error`.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use redlimit::{rate_limit, RateLimited};

#[rate_limit(key = "co_local:p:{a}", rate = 2, interval = "60s", on_error = "local")]
#[rate_limit(key = "co_local:{b}:q", rate = 2, interval = "60s", on_error = "local")]
async fn local(a: &str, b: &str) -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "co_allow:p:{a}", rate = 2, interval = "60s", on_error = "allow")]
#[rate_limit(key = "co_allow:{b}:q", rate = 2, interval = "60s", on_error = "allow")]
async fn allow(a: &str, b: &str) -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "co_deny:p:{a}", rate = 2, interval = "60s", on_error = "deny")]
#[rate_limit(key = "co_deny:{b}:q", rate = 2, interval = "60s", on_error = "deny")]
async fn deny(a: &str, b: &str) -> Result<(), RateLimited> {
    Ok(())
}

/// A value as the attribute writes it into a key.
fn escaped(value: &str) -> String {
    if value.is_empty() {
        return "%00".to_owned();
    }
    value
        .replace('%', "%25")
        .replace(':', "%3A")
        .replace('{', "%7B")
        .replace('}', "%7D")
}

/// First `f("q", "p")` (both rules name one limiter) a hundred times per policy: it
/// is granted exactly the rules' rate, once per call. Then `calls` calls per policy with random
/// values (including ones that need escaping), each decision checked against a model
/// of the limit: each distinct limiter of a call grants while it holds fewer grants
/// than the strictest rate naming it in that call (no time passes, so every grant
/// stays in the window). Answers how many coinciding calls were granted.
pub async fn coinciding_values_never_switch_a_limit_off(calls: usize) -> usize {
    let mut used: HashMap<String, u64> = HashMap::new();
    for policy in ["co_local", "co_allow", "co_deny"] {
        let mut granted = 0;
        for _ in 0..100 {
            let result = call(policy, "q", "p").await;
            granted += u64::from(result.is_ok());
        }
        assert_eq!(granted, 2, "{policy}: the rules' rate, no more, no less");
        used.insert(format!("{policy}:p:q"), granted);
    }
    let values = ["p", "q", "r", "", ":", "{p}"];
    let mut rng = StdRng::seed_from_u64(8);
    let mut coinciding_granted = 0;
    for policy in ["co_local", "co_allow", "co_deny"] {
        let mut coincided = 0;
        for n in 0..calls {
            let a = values[rng.random_range(0..values.len())];
            let b = values[rng.random_range(0..values.len())];
            let (k1, k2) = (
                format!("{policy}:p:{}", escaped(a)),
                format!("{policy}:{}:q", escaped(b)),
            );
            let limits: Vec<(String, u64)> = if k1 == k2 {
                coincided += 1;
                vec![(k1, 2)]
            } else {
                vec![(k1, 2), (k2, 2)]
            };
            let expected = limits
                .iter()
                .all(|(k, rate)| used.get(k).copied().unwrap_or(0) < *rate);
            let result = call(policy, a, b).await;
            if let Err(refused) = &result {
                assert!(
                    refused.cause().is_none(),
                    "{policy} call {n}: refused by an error: {refused}"
                );
            }
            assert_eq!(result.is_ok(), expected, "{policy} call {n}: ({a:?}, {b:?})");
            if expected {
                for (k, _) in &limits {
                    *used.entry(k.clone()).or_default() += 1;
                }
                if limits.len() == 1 {
                    coinciding_granted += 1;
                }
            }
        }
        assert!(
            coincided > 0,
            "{policy}: no call coincided; the test tests nothing"
        );
    }
    coinciding_granted
}

async fn call(policy: &str, a: &str, b: &str) -> Result<(), RateLimited> {
    match policy {
        "co_local" => local(a, b).await,
        "co_allow" => allow(a, b).await,
        _ => deny(a, b).await,
    }
}
