use redlimit::rate_limit;

#[rate_limit(rate = 5, interval = "1s", batch = 3, batch_lease = "1s")]
async fn f(user_id: u64) -> Result<(), redlimit::RateLimited> {
    Ok(())
}

fn main() {}
