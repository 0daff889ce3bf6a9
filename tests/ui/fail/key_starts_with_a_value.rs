use redlimit::rate_limit;

// A value first would let the caller choose which rule's limiters it reaches:
// lookup("login", "192.0.2.55") would spend the `login` rule's permits for that address.
#[rate_limit(key = "{tenant}:{user}", rate = 100, interval = "60s")]
async fn lookup(tenant: &str, user: &str) -> Result<(), redlimit::RateLimited> {
    let _ = (tenant, user);
    Ok(())
}

fn main() {}
