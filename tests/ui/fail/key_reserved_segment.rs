use redlimit::rate_limit;

// The library keeps its run-time overrides and refusal reports under `redlimit:`.
#[rate_limit(key = "redlimit:overrides", rate = 5, interval = "60s")]
async fn f() -> Result<(), redlimit::RateLimited> {
    Ok(())
}

fn main() {}
