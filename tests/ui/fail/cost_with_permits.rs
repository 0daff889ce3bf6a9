use redlimit::{rate_limit, RateLimited};

#[rate_limit(key = "upload:{user}", rate = 1000, interval = "60s", permits = 5, cost = bytes)]
async fn upload(user: u64, bytes: u64) -> Result<u64, RateLimited> {
    Ok(user + bytes)
}

fn main() {}
