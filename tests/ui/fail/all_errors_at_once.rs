use redlimit::rate_limit;

#[rate_limit(rate = 0, interval = "1x", mode = "both", colour = "red")]
async fn f(user_id: u64) -> Result<(), redlimit::RateLimited> {
    Ok(())
}

fn main() {}
