use redlimit::{rate_limit, RateLimited};

fn tokens_used(result: &Result<u64, RateLimited>) -> u64 {
    *result.as_ref().unwrap_or(&0)
}

#[rate_limit(key = "llm:{user}", rate = 1000, interval = "60s", settle = tokens_used)]
async fn complete(user: u64) -> Result<u64, RateLimited> {
    Ok(user)
}

fn main() {}
