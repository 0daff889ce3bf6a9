//! `cargo run --example multi_rule`: a per-user limit and a global limit on one
//! function, decided together: a call refused by either spends nothing of the other.
//!
//! Each user may submit 2 orders per second; everyone together, 3 per second.

use std::time::Duration;

use redlimit::{rate_limit, RateLimited};

#[derive(Debug)]
enum OrderError {
    TooFast {
        rule: String,
        retry_after: Option<Duration>,
    },
}

impl From<RateLimited> for OrderError {
    fn from(limited: RateLimited) -> Self {
        OrderError::TooFast {
            rule: limited.message().unwrap_or("?").to_owned(),
            retry_after: limited.retry_after(),
        }
    }
}

#[rate_limit(
    key = "multi_rule:order:user:{user_id}",
    rate = 2,
    interval = "1s",
    message = "per-user limit"
)]
#[rate_limit(key = "multi_rule:order", rate = 3, interval = "1s", message = "global limit")]
async fn submit_order(user_id: u64, item: &str) -> Result<String, OrderError> {
    Ok(format!("user {user_id} ordered {item}"))
}

#[tokio::main]
async fn main() -> Result<(), redlimit::Error> {
    let client = redlimit::default_client()?;
    let per_user = |user: u64| client.rate_limiter(format!("rate_limit:multi_rule:order:user:{user}"));

    for (user, item) in [(1, "tea"), (1, "cake"), (1, "jam"), (2, "bread"), (3, "milk")] {
        match submit_order(user, item).await {
            Ok(receipt) => println!("granted: {receipt}"),
            Err(OrderError::TooFast { rule, retry_after }) => {
                let wait = retry_after.unwrap_or_default().as_millis();
                println!("refused: user {user}, {item}: {rule}, retry after {wait} ms");
            }
        }
    }
    // User 3 was refused by the global limit, so the per-user limit spent nothing.
    println!(
        "user 3 still has {} of 2 per-user permits",
        per_user(3).available_permits().await?
    );
    Ok(())
}
