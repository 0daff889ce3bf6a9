use redlimit::rate_limit;

#[rate_limit(rate = 5, interval = "99999999999999999999d")]
async fn f(user_id: u64) -> Result<(), redlimit::RateLimited> {
    Ok(())
}

fn main() {}
