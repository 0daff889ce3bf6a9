use redlimit::{rate_limit, RateLimited};

#[rate_limit(rate = 9007199254740992, interval = "60s", permits = 9007199254740992)]
async fn huge() -> Result<(), RateLimited> {
    Ok(())
}

fn main() {}
