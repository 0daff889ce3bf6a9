//! `cargo run --example quickstart`: three calls granted, the fourth refused with the
//! exact time to wait, and a grant after that wait.
//!
//! Runs in process with no set-up; with `REDIS_URL=redis://127.0.0.1:6379/` the same
//! limiter lives in Redis, in the layout Redisson's `RRateLimiter` reads.

use std::time::Duration;

use redlimit::{Client, Rule};

#[tokio::main]
async fn main() -> Result<(), redlimit::Error> {
    let client = Client::from_env()?;
    let backend = if client.is_memory() {
        "in process (set REDIS_URL to use Redis)"
    } else {
        "Redis"
    };
    println!("limiter state: {backend}");

    // 3 calls per 2 seconds for user 42, as `#[rate_limit(rate = 3, interval = "2s")]`.
    let rule = Rule::new("rate_limit:quickstart:user:42", 3, Duration::from_secs(2));
    let rules = [rule];

    let mut retry_after = None;
    for call in 1..=4 {
        let decision = client.check_rules(&rules).await?;
        if decision.allowed {
            println!("call {call}: granted, {} left in the window", decision.remaining);
        } else {
            let wait = decision.retry_after.unwrap_or_default();
            println!("call {call}: refused, retry after {} ms", wait.as_millis());
            retry_after = Some(wait);
            break;
        }
    }

    if let Some(wait) = retry_after {
        tokio::time::sleep(wait).await;
        let decision = client.check_rules(&rules).await?;
        let verdict = if decision.allowed { "granted" } else { "refused" };
        println!("after waiting {} ms: {verdict}", wait.as_millis());
    }
    Ok(())
}
