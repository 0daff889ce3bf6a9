use redlimit::{rate_limit, RateLimited};

// 10 a second beside 100 a minute: a caller passing a = "q", b = "p" names one limiter.
#[rate_limit(key = "burst:p:{a}", rate = 10, interval = "1s")]
#[rate_limit(key = "burst:{b}:q", rate = 100, interval = "60s")]
async fn burst(a: &str, b: &str) -> Result<(), RateLimited> {
    let _ = (a, b);
    Ok(())
}

// One rule per client, the other shared; a shadow rule counts too.
#[rate_limit(key = "mode:p:{a}", rate = 10, interval = "60s", mode = "per_client")]
#[rate_limit(key = "mode:{b}:q", rate = 10, interval = "60s", shadow = true)]
async fn mode(a: &str, b: &str) -> Result<(), RateLimited> {
    let _ = (a, b);
    Ok(())
}

// A token bucket beside a sliding window of the same numbers.
#[rate_limit(key = "shape:p:{a}", rate = 10, interval = "60s", algorithm = "token_bucket")]
#[rate_limit(key = "shape:{b}:q", rate = 10, interval = "60s")]
async fn shape(a: &str, b: &str) -> Result<(), RateLimited> {
    let _ = (a, b);
    Ok(())
}

// Counting alike, or never naming one limiter: fine.
#[rate_limit(key = "same:p:{a}", rate = 10, interval = "60s", permits = 2)]
#[rate_limit(key = "same:{b}:q", rate = 10, interval = "60s")]
#[rate_limit(key = "same:daily:{b}:total", rate = 1000, interval = "86400s")]
async fn same(a: &str, b: &str) -> Result<(), RateLimited> {
    let _ = (a, b);
    Ok(())
}

// Per user beside a global limit: a user named "daily" names the global limiter...
#[rate_limit(key = "orders:{user}", rate = 10, interval = "60s")]
#[rate_limit(key = "orders:daily", rate = 1000, interval = "86400s")]
async fn orders(user: &str) -> Result<(), RateLimited> {
    let _ = user;
    Ok(())
}

// ...which an integer's digits never are: fine.
#[rate_limit(key = "items:{id}", rate = 10, interval = "60s")]
#[rate_limit(key = "items:daily", rate = 1000, interval = "86400s")]
async fn items(id: u64) -> Result<(), RateLimited> {
    let _ = id;
    Ok(())
}

// The client's address beside a literal address: the client 10.0.0.1 names it...
#[rate_limit(key = "login:{request.client_ip}", rate = 5, interval = "60s")]
#[rate_limit(key = "login:10.0.0.1", rate = 1000, interval = "60s")]
async fn login() -> Result<(), RateLimited> {
    Ok(())
}

// ...but no address is `all`, nor an integer's digits: fine.
#[rate_limit(key = "signon:{request.client_ip}", rate = 5, interval = "60s")]
#[rate_limit(key = "signon:all", rate = 1000, interval = "60s")]
#[rate_limit(key = "signon:{request.client_ip}:q", rate = 20, interval = "60s")]
#[rate_limit(key = "signon:{n}:{a}", rate = 50, interval = "60s")]
async fn signon(n: u32, a: &str) -> Result<(), RateLimited> {
    let _ = (n, a);
    Ok(())
}

// A keyed template that can spell the function's path, the limiter of a keyless rule.
#[rate_limit(key = "key_templates_may_coincide::{action}", rate = 5, interval = "60s")]
#[rate_limit(rate = 1000, interval = "1s")]
async fn signup(action: &str) -> Result<(), RateLimited> {
    let _ = action;
    Ok(())
}

// One that cannot (no `::`): fine.
#[rate_limit(key = "signin:{action}", rate = 5, interval = "60s")]
#[rate_limit(rate = 1000, interval = "1s")]
async fn signin(action: &str) -> Result<(), RateLimited> {
    let _ = action;
    Ok(())
}

fn main() {}
