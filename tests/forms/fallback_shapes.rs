use redlimit::{rate_limit, RateLimited};

#[rate_limit(key = "same", rate = 1, interval = "1s", fallback = same_arguments)]
async fn with_arguments(name: String, count: u32) -> String {
    format!("{name} {count}")
}

async fn same_arguments(name: String, count: u32) -> String {
    format!("busy {name} {count}")
}

#[rate_limit(key = "then", rate = 1, interval = "1s", fallback = then_refusal)]
async fn with_refusal(name: String, count: u32) -> String {
    format!("{name} {count}")
}

async fn then_refusal(name: String, count: u32, limited: RateLimited) -> String {
    format!("busy {name} {count}: {:?}", limited.retry_after())
}

#[rate_limit(key = "none", rate = 1, interval = "1s", fallback = nothing)]
async fn with_nothing(name: String, count: u32) -> String {
    format!("{name} {count}")
}

async fn nothing() -> String {
    "busy".to_owned()
}

#[rate_limit(key = "bare", rate = 1, interval = "1s", fallback = only_refusal)]
async fn without_parameters() -> u64 {
    1
}

async fn only_refusal(limited: RateLimited) -> u64 {
    limited.retry_after().map_or(0, |wait| wait.as_millis() as u64)
}

struct Feed;

impl Feed {
    #[rate_limit(key = "feed", rate = 1, interval = "1s", fallback = Self::stale)]
    async fn latest(&self, page: u32) -> u32 {
        page
    }

    async fn stale(&self, page: u32, limited: RateLimited) -> u32 {
        page + limited.rule() as u32
    }

    #[rate_limit(key = "feed:any", rate = 1, interval = "1s", fallback = Self::empty)]
    async fn any(&self, page: u32) -> u32 {
        page
    }

    async fn empty() -> u32 {
        0
    }
}

pub(crate) fn main() {
    let _ = (
        with_arguments,
        with_refusal,
        with_nothing,
        without_parameters,
        Feed::latest,
        Feed::any,
    );
}
