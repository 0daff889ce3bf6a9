use redlimit::{rate_limit, RateLimited};

struct Completion {
    tokens: u64,
}

#[derive(Debug)]
struct ApiError;

impl From<RateLimited> for ApiError {
    fn from(_: RateLimited) -> Self {
        ApiError
    }
}

// Takes the completion, not the function's result.
fn tokens_used(completion: &Completion) -> u64 {
    completion.tokens
}

#[rate_limit(key = "llm:{user}", rate = 1000, interval = "60s", cost = max_tokens, settle = tokens_used)]
async fn complete(user: u64, max_tokens: u64) -> Result<Completion, ApiError> {
    Ok(Completion { tokens: user + max_tokens })
}

fn main() {}
