use redlimit::rate_limit;

struct UserId(u64);

#[rate_limit(key = "user:{id}", rate = 5, interval = "1s")]
async fn lookup(id: UserId) -> Result<u64, redlimit::RateLimited> {
    Ok(id.0)
}

fn main() {}
