use redlimit::rate_limit as limit;

#[limit(key = "user", rate = 5, interval = "1s")]
#[limit(key = "global", rate = 50, interval = "1s")]
async fn limited() -> Result<(), redlimit::RateLimited> {
    Ok(())
}

#[redlimit::rate_limit(key = "path", rate = 5, interval = "1s")]
async fn by_path() -> Result<(), redlimit::RateLimited> {
    Ok(())
}

pub(crate) fn main() {
    let _ = (limited(), by_path());
}
