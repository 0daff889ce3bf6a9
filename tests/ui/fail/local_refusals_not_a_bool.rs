use redlimit::rate_limit;

#[rate_limit(rate = 5, interval = "1s", local_refusals = "no")]
async fn f() -> Result<(), redlimit::RateLimited> {
    Ok(())
}

fn main() {}
