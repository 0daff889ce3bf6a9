use redlimit::rate_limit;

#[rate_limit(rate = 5, interval = "1s", fallback = busy)]
async fn greeting((first, last): (String, String)) -> String {
    format!("hello {first} {last}")
}

async fn busy(pair: (String, String)) -> String {
    format!("busy {}", pair.0)
}

fn main() {}
