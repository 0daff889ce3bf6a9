//! Stacked templates that name one limiter for some argument values: `x:p:{a}` and
//! `x:{b}:q` coincide when `a = "q"` and `b = "p"`. A caller choosing the values must
//! not switch either rule off, nor make every call refused, under any `on_error`.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use redlimit::{rate_limit, RateLimited};

#[rate_limit(key = "co_local:p:{a}", rate = 2, interval = "60s", on_error = "local")]
#[rate_limit(key = "co_local:{b}:q", rate = 5, interval = "60s", on_error = "local")]
async fn local(a: &str, b: &str) -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "co_allow:p:{a}", rate = 2, interval = "60s", on_error = "allow")]
#[rate_limit(key = "co_allow:{b}:q", rate = 5, interval = "60s", on_error = "allow")]
async fn allow(a: &str, b: &str) -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "co_deny:p:{a}", rate = 2, interval = "60s", on_error = "deny")]
#[rate_limit(key = "co_deny:{b}:q", rate = 5, interval = "60s", on_error = "deny")]
async fn deny(a: &str, b: &str) -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(
    key = "cop_local:p:{a}",
    rate = 100,
    interval = "60s",
    permits = 90,
    on_error = "local"
)]
#[rate_limit(key = "cop_local:{b}:q", rate = 10, interval = "60s", on_error = "local")]
async fn bulk_local(a: &str, b: &str) -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(
    key = "cop_allow:p:{a}",
    rate = 100,
    interval = "60s",
    permits = 90,
    on_error = "allow"
)]
#[rate_limit(key = "cop_allow:{b}:q", rate = 10, interval = "60s", on_error = "allow")]
async fn bulk_allow(a: &str, b: &str) -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(
    key = "cop_deny:p:{a}",
    rate = 100,
    interval = "60s",
    permits = 90,
    on_error = "deny"
)]
#[rate_limit(key = "cop_deny:{b}:q", rate = 10, interval = "60s", on_error = "deny")]
async fn bulk_deny(a: &str, b: &str) -> Result<(), RateLimited> {
    Ok(())
}

/// Templates that coincide for some values, the looser rule taking 90 permits a call
/// (`x:p:{a}`, 100 a minute) and the stricter 1 (`x:{b}:q`, 10 a minute): the call
/// naming one limiter asks 90 of a config of 10, and is refused with
/// `PermitsExceedRate`, under every `on_error`; it took 90 counted as 10, and the
/// 100-a-minute limiter then granted 90 more (180 in a minute). Answers, per policy,
/// the permits the 100-a-minute limiter `<policy>:p:q` has left after the coinciding
/// calls and two calls naming it beside another limiter.
pub async fn coinciding_permits_beyond_the_stricter_rate_are_refused() -> Vec<(&'static str, usize)> {
    let mut granted = Vec::new();
    for policy in ["cop_local", "cop_allow", "cop_deny"] {
        let bulk = |a: &'static str, b: &'static str| async move {
            match policy {
                "cop_local" => bulk_local(a, b).await,
                "cop_allow" => bulk_allow(a, b).await,
                _ => bulk_deny(a, b).await,
            }
        };
        for n in 0..3 {
            let refused = bulk("q", "p").await.expect_err("90 permits of a rule of 10");
            let cause = refused.cause().map(ToString::to_string).unwrap_or_default();
            assert!(
                cause.contains("90 permits requested but the rate is 10"),
                "{policy} call {n}: {refused}, caused by {cause:?}"
            );
        }
        // The 100-a-minute limiter, beside another: 90 of 100, then no more.
        let mut passed = 0;
        for b in ["r", "s", "t"] {
            passed += usize::from(bulk("q", b).await.is_ok());
        }
        granted.push((policy, passed));
    }
    granted
}

#[rate_limit(key = "cow_short:p:{a}", rate = 10, interval = "1s", on_error = "allow")]
#[rate_limit(key = "cow_short:{b}:q", rate = 100, interval = "60s", on_error = "allow")]
async fn short_window(a: &str, b: &str) -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(
    key = "cow_bucket:p:{a}",
    rate = 10,
    interval = "1s",
    algorithm = "token_bucket"
)]
#[rate_limit(
    key = "cow_bucket:{b}:q",
    rate = 100,
    interval = "60s",
    algorithm = "token_bucket"
)]
async fn quick_bucket(a: &str, b: &str) -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(
    key = "cow_client:p:{a}",
    rate = 10,
    interval = "60s",
    mode = "per_client",
    on_error = "allow"
)]
#[rate_limit(key = "cow_client:{b}:q", rate = 1000, interval = "60s", on_error = "allow")]
async fn per_client(a: &str, b: &str) -> Result<(), RateLimited> {
    Ok(())
}

/// Templates that coincide for some values, neither rule's limit holding the other's:
/// 10 a second beside 100 a minute (windows, and token buckets), 10 a minute per client
/// beside 1 000 a minute overall. One limiter keeps one config: decided on the one that
/// is the lower in the long run, or shared by every client, the other's limit went (100
/// granted at once of 10 a second; 1 000 to one client of 10 a minute). The call naming
/// one limiter is refused, with the error as its cause, `on_error = "allow"` too; values
/// that do not coincide are decided on both rules. Answers, per function, the calls of
/// 200 granted with coinciding values, then with others.
pub async fn coinciding_limits_neither_holding_the_other_are_refused() -> Vec<(&'static str, usize, usize)> {
    let mut granted = Vec::new();
    for name in ["short_window", "quick_bucket", "per_client"] {
        let call = |a: &'static str, b: &'static str| async move {
            match name {
                "short_window" => short_window(a, b).await,
                "quick_bucket" => quick_bucket(a, b).await,
                _ => per_client(a, b).await,
            }
        };
        let mut one = 0;
        for n in 0..200 {
            match call("q", "p").await {
                Ok(()) => one += 1,
                Err(refused) => {
                    let cause = refused.cause().map(ToString::to_string).unwrap_or_default();
                    assert!(
                        cause.contains("neither of which holds the other"),
                        "{name} call {n}: {refused}, caused by {cause:?}"
                    );
                }
            }
        }
        let mut two = 0;
        for _ in 0..200 {
            two += usize::from(call("z", "y").await.is_ok());
        }
        granted.push((name, one, two));
    }
    granted
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
/// is granted exactly the strict rule's rate. Then `calls` calls per policy with random
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
        assert_eq!(granted, 2, "{policy}: the strict rule's rate, no more, no less");
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
                vec![(k1, 2), (k2, 5)]
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
