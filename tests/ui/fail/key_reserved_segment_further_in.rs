use redlimit::rate_limit;

// Under no key prefix, `orders:redlimit:overrides` is the override table of the
// clients on the prefix `orders:`.
#[rate_limit(key = "orders:redlimit:{user}", rate = 5, interval = "60s")]
async fn f(user: u64) -> Result<(), redlimit::RateLimited> {
    let _ = user;
    Ok(())
}

fn main() {}
