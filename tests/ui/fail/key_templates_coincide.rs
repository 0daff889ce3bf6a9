use redlimit::{rate_limit, RateLimited};

#[rate_limit(key = "transfer:{from}", rate = 3, interval = "60s")]
#[rate_limit(key = "transfer:{to}", rate = 10, interval = "60s")]
async fn transfer(from: u64, to: u64) -> Result<(), RateLimited> {
    let _ = (from, to);
    Ok(())
}

#[rate_limit(rate = 3, interval = "1s")]
#[rate_limit(rate = 100, interval = "60s")]
async fn keyless() -> Result<(), RateLimited> {
    Ok(())
}

fn main() {}
