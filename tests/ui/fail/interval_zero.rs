use redlimit::rate_limit;

#[rate_limit(rate = 5, interval = "0ms")]
async fn f(user_id: u64) -> Result<(), redlimit::RateLimited> {
    Ok(())
}

fn main() {}
