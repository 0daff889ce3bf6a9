use redlimit::{rate_limit, RateLimited};

fn shown(_: &dyn std::fmt::Display) -> u64 {
    1
}

#[rate_limit(key = "show:{user}", rate = 1000, interval = "60s", cost = 10, settle = shown)]
async fn show(user: u64) -> impl std::fmt::Display {
    user
}

fn main() {
    let _ = RateLimited::from;
}
