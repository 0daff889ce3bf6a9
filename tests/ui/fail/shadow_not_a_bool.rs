use redlimit::{rate_limit, RateLimited};

#[rate_limit(rate = 5, interval = "1s", shadow = "yes")]
async fn rollout() -> Result<(), RateLimited> {
    Ok(())
}

fn main() {}
