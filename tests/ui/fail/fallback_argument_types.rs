use redlimit::rate_limit;

#[rate_limit(rate = 5, interval = "1s", fallback = busy)]
async fn greeting(name: String, times: u32) -> String {
    format!("hello {name} {times}")
}

async fn busy(name: &str, times: u32) -> String {
    format!("busy {name} {times}")
}

fn main() {}
