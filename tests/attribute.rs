//! `#[rate_limit]` on the in-process backend (this binary's default client).

use std::sync::Once;
use std::time::Duration;

use redlimit::{rate_limit, Client, RateLimited};

fn memory_default() {
    static SET: Once = Once::new();
    SET.call_once(|| redlimit::set_default(Client::memory()).unwrap());
}

#[derive(Debug, PartialEq)]
enum AppError {
    Limited(Option<Duration>),
}

impl From<RateLimited> for AppError {
    fn from(limited: RateLimited) -> Self {
        AppError::Limited(limited.retry_after())
    }
}

#[rate_limit(key = "smoke:{user_id}", rate = 2, interval = "60s")]
async fn submit(user_id: u64) -> Result<u64, AppError> {
    Ok(user_id)
}

#[tokio::test]
async fn per_user_keys() {
    memory_default();
    assert_eq!(submit(1).await, Ok(1));
    assert_eq!(submit(1).await, Ok(1));
    assert!(matches!(submit(1).await, Err(AppError::Limited(Some(_)))));
    assert_eq!(submit(2).await, Ok(2));
}
