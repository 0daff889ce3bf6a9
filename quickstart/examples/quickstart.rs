//! `cargo run --example quickstart`: three calls granted, the fourth refused with the
//! exact time to wait, and a grant after that wait.
//!
//! Runs in process with no set-up; with `REDIS_URL=redis://127.0.0.1:6379/` the same
//! limiter lives in Redis, in the layout Redisson's `RRateLimiter` reads.

use redlimit::{rate_limit, RateLimited};

/// At most 3 orders per 2 seconds for each user.
#[rate_limit(key = "quickstart:order:{user_id}", rate = 3, interval = "2s")]
async fn place_order(user_id: u64) -> Result<String, RateLimited> {
    Ok(format!("order placed for user {user_id}"))
}

#[tokio::main]
async fn main() -> Result<(), redlimit::Error> {
    let client = redlimit::default_client()?;
    let backend = if client.is_memory() {
        "in process (set REDIS_URL to use Redis)"
    } else {
        "Redis"
    };
    println!("limiter state: {backend}");

    let mut wait = None;
    for call in 1..=4 {
        match place_order(42).await {
            Ok(receipt) => println!("call {call}: granted: {receipt}"),
            Err(limited) => {
                println!("call {call}: refused: {limited}");
                wait = limited.retry_after();
                break;
            }
        }
    }

    if let Some(wait) = wait {
        tokio::time::sleep(wait).await;
        match place_order(42).await {
            Ok(receipt) => println!("after waiting {} ms: granted: {receipt}", wait.as_millis()),
            Err(limited) => println!("after waiting {} ms: still refused: {limited}", wait.as_millis()),
        }
    }
    Ok(())
}
