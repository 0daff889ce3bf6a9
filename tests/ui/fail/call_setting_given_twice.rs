use redlimit::rate_limit;

#[rate_limit(key = "a", rate = 5, interval = "1s", timeout = "1s")]
#[rate_limit(key = "b", rate = 9, interval = "1s", timeout = "2s")]
async fn twice() -> Result<(), redlimit::RateLimited> {
    Ok(())
}

fn main() {}
