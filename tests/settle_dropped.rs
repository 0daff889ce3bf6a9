//! `#[rate_limit]` with `cost` and `settle` on a real redis-server, its caller gone
//! once the body has returned: dropped in that poll (a client that hung up, a
//! `select!` branch taken), or on a runtime of its own that ends right after the call.
//! The settle, sent from a task of its own on the client's runtime, still lands. (Its
//! own binary: it sets the default client, with a command timeout long enough that
//! no call goes to its `on_error` policy on a busy machine.)

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use redlimit::{rate_limit, Client, RateLimited};
use redlimit_test_support::RedisServer;

/// Set by [`complete`]'s body as it returns.
static RETURNED: AtomicBool = AtomicBool::new(false);

/// What a model reports having used.
#[derive(Debug)]
struct Completion {
    tokens: u64,
}

fn tokens_used(result: &Result<Completion, RateLimited>) -> u64 {
    result.as_ref().map_or(0, |completion| completion.tokens)
}

/// Per-user and global tokens, both settled from the answer (two limiters, in two
/// cluster slots on a cluster, as the guide's pattern has them).
#[rate_limit(key = "gone:tokens:user:{user}", rate = 10_000, interval = "60s", cost = max_tokens, settle = tokens_used)]
#[rate_limit(key = "gone:tokens", rate = 1_000_000, interval = "60s", cost = max_tokens, settle = tokens_used)]
async fn complete(user: u64, max_tokens: u64, used: u64) -> Result<Completion, RateLimited> {
    RETURNED.store(true, Ordering::SeqCst);
    Ok(Completion { tokens: used })
}

/// The permits limiter `name` (without the prefix) has left.
async fn left(client: &Client, name: &str) -> u64 {
    let name = format!("rate_limit:{name}");
    client.rate_limiter(&name).available_permits().await.unwrap()
}

/// A call polled until its body has returned (`RETURNED`), then dropped
/// after that poll if it is still waiting: its caller gone.
struct GoneAsItReturns<F>(Option<F>);

impl<F: Future + Unpin> Future for GoneAsItReturns<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let call = self.0.as_mut().expect("polled after it answered");
        match Pin::new(call).poll(cx) {
            Poll::Ready(answer) => Poll::Ready(Some(answer)),
            Poll::Pending if RETURNED.load(Ordering::SeqCst) => {
                self.0 = None;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// `complete` for `user`, estimating 10 and using 900, its caller gone in
/// the poll in which the body returned: `None` when it was still waiting then.
async fn gone_as_it_returns(user: u64) -> Option<Result<Completion, RateLimited>> {
    RETURNED.store(false, Ordering::SeqCst);
    let call = std::pin::pin!(complete(user, 10, 900));
    GoneAsItReturns(Some(call)).await
}

/// [`gone_as_it_returns`] on a thread of its own, on a runtime `builder` makes for
/// the call and ends after it.
fn on_a_runtime_of_its_own(user: u64, mut builder: tokio::runtime::Builder) {
    std::thread::spawn(move || {
        let runtime = builder.enable_all().build().unwrap();
        let _ = runtime.block_on(gone_as_it_returns(user));
        drop(runtime);
    })
    .join()
    .unwrap();
}

/// Waits until each of `users`' token limiters counts the 900 its call used (9 100 of
/// 10 000 left), 2 s at most each.
async fn all_charged(client: &Client, users: std::ops::Range<u64>, how: &str) {
    for user in users {
        let name = format!("gone:tokens:user:{user}");
        let charged = async {
            while left(client, &name).await != 9_100 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let waited = tokio::time::timeout(Duration::from_secs(2), charged).await;
        let now = left(client, &name).await;
        assert!(
            waited.is_ok(),
            "user {user}, {how}: 900 used of 10 reserved, {now} left"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_lands_when_its_caller_is_gone() {
    let server = RedisServer::start();
    let client = Client::builder()
        .command_timeout(Duration::from_secs(2))
        .connect(&server.url())
        .await
        .unwrap();
    redlimit::set_default(client.clone()).unwrap();

    // The caller gone in the poll in which the body returned (a client that hung up,
    // a `select!` branch taken): the settle, sent from a task of its own, still lands.
    for user in 30..40 {
        // (answered in that poll when the settle's task was done first: landed too)
        let _ = gone_as_it_returns(user).await;
    }
    all_charged(&client, 30..40, "its caller gone").await;

    // The same from a caller on a current-thread runtime of its own, ended right
    // after (a synchronous wrapper around each call): the settle runs on the client's
    // runtime, not on the caller's, which ends with the tasks it holds.
    for user in 40..45 {
        on_a_runtime_of_its_own(user, tokio::runtime::Builder::new_current_thread());
    }
    all_charged(&client, 40..45, "on a runtime that ended").await;

    // And from callers each on a multi-thread runtime made for the call and ended
    // after it, the settle's script flushed so that it takes more than one round
    // trip: the settle runs on the client's runtime, which outlives them.
    for user in 45..48 {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut server.raw().await)
            .await
            .unwrap();
        on_a_runtime_of_its_own(user, tokio::runtime::Builder::new_multi_thread());
    }
    all_charged(&client, 45..48, "on a runtime made for the call").await;
}
