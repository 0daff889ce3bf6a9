//! The shapes of `fallback`, each run on the in-process backend: the function's
//! arguments; the arguments and then the `RateLimited` (its `retry_after`, its rule,
//! its limit); no parameter at all; on free functions and methods.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;
use std::time::Duration;

use redlimit::{rate_limit, Client, RateLimited};

fn client() {
    static SET: Once = Once::new();
    SET.call_once(|| redlimit::set_default(Client::memory()).unwrap());
}

#[rate_limit(key = "shapes:same:{user}", rate = 1, interval = "60s", fallback = same)]
async fn with_arguments(user: u64, note: String) -> String {
    format!("served {user} {note}")
}

async fn same(user: u64, note: String) -> String {
    format!("busy {user} {note}")
}

/// The second rule refuses: the fallback reads which, how long, and its limit.
#[rate_limit(key = "shapes:wide", rate = 100, interval = "60s")]
#[rate_limit(key = "shapes:then:{user}", rate = 1, interval = "30s", fallback = then_refusal)]
async fn with_refusal(user: u64, note: &'static str) -> String {
    format!("served {user} {note}")
}

async fn then_refusal(user: u64, note: &'static str, limited: RateLimited) -> String {
    let wait = limited.retry_after().expect("a limit's refusal says when");
    assert!(
        wait > Duration::from_secs(29) && wait <= Duration::from_secs(30),
        "{wait:?}"
    );
    let limit = limited.limit().expect("the refusing rule's limit");
    format!(
        "busy {user} {note}: rule {} `{}` {} per {:?}, key {}",
        limited.rule(),
        limit.name,
        limit.rate,
        limit.window,
        limited.key()
    )
}

static NOTHING_CALLS: AtomicU32 = AtomicU32::new(0);

#[rate_limit(key = "shapes:none:{user}", rate = 1, interval = "60s", fallback = nothing)]
async fn with_nothing(user: u64, note: String) -> String {
    format!("served {user} {note}")
}

async fn nothing() -> String {
    NOTHING_CALLS.fetch_add(1, Ordering::Relaxed);
    "busy".to_owned()
}

#[rate_limit(key = "shapes:bare", rate = 1, interval = "60s", fallback = only_refusal)]
async fn without_parameters() -> Result<u32, String> {
    Ok(1)
}

async fn only_refusal(limited: RateLimited) -> Result<u32, String> {
    Err(format!(
        "refused by rule {} for {}",
        limited.rule(),
        limited.key()
    ))
}

#[tokio::test]
async fn the_arguments_alone() {
    client();
    assert_eq!(with_arguments(5, "a".into()).await, "served 5 a");
    assert_eq!(with_arguments(5, "b".into()).await, "busy 5 b");
}

#[tokio::test]
async fn the_arguments_then_the_refusal() {
    client();
    assert_eq!(with_refusal(7, "a").await, "served 7 a");
    assert_eq!(
        with_refusal(7, "b").await,
        "busy 7 b: rule 1 `shapes:then:{user}` 1 per 30s, key rate_limit:shapes:then:7"
    );
}

#[tokio::test]
async fn nothing_at_all() {
    client();
    assert_eq!(with_nothing(9, "a".into()).await, "served 9 a");
    assert_eq!(NOTHING_CALLS.load(Ordering::Relaxed), 0);
    assert_eq!(with_nothing(9, "b".into()).await, "busy");
    assert_eq!(NOTHING_CALLS.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn a_function_without_parameters_gets_the_refusal() {
    client();
    assert_eq!(without_parameters().await, Ok(1));
    assert_eq!(
        without_parameters().await,
        Err("refused by rule 0 for rate_limit:shapes:bare".to_owned())
    );
}

struct Feed {
    name: &'static str,
}

impl Feed {
    #[rate_limit(key = "shapes:feed:{self.name}", rate = 1, interval = "60s", fallback = Self::stale)]
    async fn latest(&self, page: u32) -> String {
        format!("{} page {page}", self.name)
    }

    async fn stale(&self, page: u32, limited: RateLimited) -> String {
        format!("{} stale page {page} ({})", self.name, limited.key())
    }

    #[rate_limit(key = "shapes:any:{self.name}", rate = 1, interval = "60s", fallback = Self::empty)]
    async fn any(&self, page: u32) -> String {
        format!("{} page {page}", self.name)
    }

    async fn empty() -> String {
        "empty".to_owned()
    }
}

#[tokio::test]
async fn methods_take_each_shape() {
    client();
    let feed = Feed { name: "news" };
    assert_eq!(feed.latest(1).await, "news page 1");
    assert_eq!(
        feed.latest(2).await,
        "news stale page 2 (rate_limit:shapes:feed:news)"
    );
    assert_eq!(feed.any(1).await, "news page 1");
    assert_eq!(feed.any(2).await, "empty");
}
