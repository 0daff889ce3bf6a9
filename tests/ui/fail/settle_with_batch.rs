use redlimit::{rate_limit, RateLimited};

fn tokens_used(result: &Result<u64, RateLimited>) -> u64 {
    *result.as_ref().unwrap_or(&0)
}

#[rate_limit(key = "llm:{user}", rate = 1000, interval = "60s", cost = max_tokens, settle = tokens_used)]
#[rate_limit(key = "llm:requests", rate = 100, interval = "1s", batch = 10)]
async fn complete(user: u64, max_tokens: u64) -> Result<u64, RateLimited> {
    Ok(user + max_tokens)
}

fn main() {}
