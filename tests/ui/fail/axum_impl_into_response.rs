use axum::response::IntoResponse;
use redlimit::rate_limit;

#[rate_limit(rate = 5, interval = "1s")]
async fn handler() -> impl IntoResponse {
    "ok"
}

fn main() {}
