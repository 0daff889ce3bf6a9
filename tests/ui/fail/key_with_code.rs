use redlimit::rate_limit;

#[rate_limit(key = "order:{user_id + 1}", rate = 5, interval = "1s")]
async fn f(user_id: u64) -> Result<(), redlimit::RateLimited> {
    Ok(())
}

fn main() {}
