use redlimit::rate_limit;

#[rate_limit(interval = "1s")]
async fn f(user_id: u64) -> Result<(), redlimit::RateLimited> {
    Ok(())
}

fn main() {}
