use redlimit::rate_limit;

#[rate_limit(rate = 5, interval = "1s", fallback = busy)]
async fn greeting(name: String) -> String {
    format!("hello {name}")
}

async fn busy(name: &str, extra: u32) -> String {
    format!("busy {name} {extra}")
}

fn main() {}
