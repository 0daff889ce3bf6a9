use redlimit::rate_limit;

// `user-{id}` with id "admin" would be the limiter of a key written "user-admin".
#[rate_limit(key = "user-{id}", rate = 5, interval = "60s")]
async fn by_id(id: &str) -> Result<(), redlimit::RateLimited> {
    let _ = id;
    Ok(())
}

fn main() {}
