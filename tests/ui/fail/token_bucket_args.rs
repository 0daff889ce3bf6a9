use redlimit::{rate_limit, RateLimited};

#[rate_limit(key = "a", rate = 5, interval = "1s", burst = 10)]
async fn burst_without_token_bucket() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "b", rate = 5, interval = "1s", algorithm = "token_bucket", burst = 3, permits = 4)]
async fn permits_above_burst() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "c", rate = 5, interval = "1s", algorithm = "leaky_bucket")]
async fn unknown_algorithm() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "d", rate = 5, interval = "365d", algorithm = "token_bucket", burst = 1000000000)]
async fn burst_too_large() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "e", rate = 5, interval = "1s", warmup = "30s")]
async fn warmup_without_token_bucket() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "f", rate = 5, interval = "1s", algorithm = "token_bucket", warmup = "0s")]
async fn warmup_zero() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "g", rate = 1000000, interval = "1s", algorithm = "token_bucket", warmup = "365d")]
async fn warmup_too_long() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "h", rate = 5, interval = "365d", algorithm = "token_bucket", burst = 100000, warmup = "1s")]
async fn burst_too_large_to_warm_up() -> Result<(), RateLimited> {
    Ok(())
}

fn main() {}
