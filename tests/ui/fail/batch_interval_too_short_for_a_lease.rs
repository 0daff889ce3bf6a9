use redlimit::rate_limit;

#[rate_limit(rate = 5, interval = "1ms", batch = 3)]
async fn f(user_id: u64) -> Result<(), redlimit::RateLimited> {
    Ok(())
}

fn main() {}
