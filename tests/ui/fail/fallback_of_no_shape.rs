use redlimit::{rate_limit, RateLimited};

// The refusal first: none of the shapes accepted.
#[rate_limit(rate = 5, interval = "1s", fallback = busy)]
async fn greeting(name: String) -> String {
    format!("hello {name}")
}

async fn busy(limited: RateLimited, name: String) -> String {
    format!("busy {name}: {limited}")
}

fn main() {}
