use redlimit::{rate_limit, RateLimited};

#[rate_limit(key = "llm:ip:{request.ip}", rate = 5, interval = "1s")]
async fn ask(prompt: &str) -> Result<usize, RateLimited> {
    Ok(prompt.len())
}

#[rate_limit(key = "llm:{request}", rate = 5, interval = "1s")]
async fn ask_again(prompt: &str) -> Result<usize, RateLimited> {
    Ok(prompt.len())
}

#[rate_limit(key = "{request.identity}:llm", rate = 5, interval = "1s")]
async fn ask_first(prompt: &str) -> Result<usize, RateLimited> {
    Ok(prompt.len())
}

fn main() {}
