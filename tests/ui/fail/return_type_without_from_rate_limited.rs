use redlimit::rate_limit;

#[rate_limit(rate = 5, interval = "1s")]
async fn greeting(name: String) -> String {
    format!("hello {name}")
}

fn main() {}
