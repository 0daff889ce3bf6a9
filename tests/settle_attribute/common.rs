//! What the attribute's settle tests share, whichever backend decides: annotated
//! functions whose costs are known after the call, and the scenarios both backends are
//! held to, on the default client's manual clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redlimit::{rate_limit, Client, Error, ManualClock, RateLimited};

pub const MINUTE: Duration = Duration::from_secs(60);

/// A model's answer: the tokens it took.
#[derive(Debug)]
pub struct Completion {
    pub tokens: u64,
}

#[derive(Debug)]
pub enum ApiError {
    Limited(RateLimited),
}

impl From<RateLimited> for ApiError {
    fn from(limited: RateLimited) -> Self {
        ApiError::Limited(limited)
    }
}

impl ApiError {
    pub fn refusal(self) -> RateLimited {
        match self {
            ApiError::Limited(limited) => limited,
        }
    }
}

/// The tokens a completion took (0 for a failed one).
pub fn tokens_used(result: &Result<Completion, ApiError>) -> u64 {
    result.as_ref().map_or(0, |completion| completion.tokens)
}

/// Per-user tokens, global tokens (both settled from the answer), per-user requests
/// (1 a call). `used` stands for what the model reports.
#[rate_limit(key = "llm:tokens:user:{user}", rate = 10_000, interval = "60s", cost = max_tokens, settle = tokens_used)]
#[rate_limit(key = "llm:tokens", rate = 30_000, interval = "60s", cost = max_tokens, settle = tokens_used)]
#[rate_limit(key = "llm:requests:user:{user}", rate = 5, interval = "60s")]
pub async fn complete(user: u64, max_tokens: u64, used: u64) -> Result<Completion, ApiError> {
    Ok(Completion { tokens: used })
}

/// Calls of [`metered`]'s body: a refused call never runs it.
pub static METERED_RUNS: AtomicU64 = AtomicU64::new(0);

/// What a call reports having used.
pub fn reported(result: &Result<u64, ApiError>) -> u64 {
    *result.as_ref().unwrap_or(&0)
}

/// A caller chooses both the estimate and what is reported used.
#[rate_limit(key = "metered:{user}", rate = 10, interval = "60s", cost = estimate, settle = reported)]
pub async fn metered(user: u64, estimate: u64, used: u64) -> Result<u64, ApiError> {
    METERED_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(used)
}

/// The same, with what a settle charges past the estimate capped.
#[rate_limit(key = "capped:{user}", rate = 100, interval = "60s", cost = estimate, settle = reported, max_overdraft = 20)]
pub async fn capped(user: u64, estimate: u64, used: u64) -> Result<u64, ApiError> {
    Ok(used)
}

/// Two templates a caller can make name one limiter (`pair:y:x`), counting it alike
/// (templates that may coincide must).
#[rate_limit(key = "pair:{a}:x", rate = 100, interval = "60s", cost = estimate, settle = reported)]
#[rate_limit(key = "pair:y:{b}", rate = 100, interval = "60s")]
pub async fn pair(a: &str, b: &str, estimate: u64) -> Result<u64, ApiError> {
    Ok(estimate)
}

/// A cost known before the call, not settled.
#[rate_limit(key = "upload:{user}", rate = 1_000, interval = "60s", cost = bytes)]
pub async fn upload(user: u64, bytes: u64) -> Result<u64, ApiError> {
    Ok(bytes)
}

// A settle function takes `&Output`, here `&String`.
#[allow(clippy::ptr_arg)]
fn answered(answer: &String) -> u64 {
    answer
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Refused, it answers from a fallback; granted, the answer says what it used.
#[rate_limit(key = "summary:{user}", rate = 100, interval = "60s", cost = max_tokens, settle = answered, fallback = cached)]
pub async fn summary(user: u64, max_tokens: u64) -> String {
    format!("fresh {user} {}", max_tokens / 2)
}

async fn cached(user: u64, max_tokens: u64) -> String {
    format!("cached {user} {max_tokens}")
}

/// Requests enforced, tokens measured in shadow (reserved and settled, never refusing).
#[rate_limit(key = "trial:requests:{user}", rate = 3, interval = "60s")]
#[rate_limit(key = "trial:tokens:{user}", rate = 100, interval = "60s", cost = estimate, settle = reported, shadow = true)]
pub async fn trial(user: u64, estimate: u64, used: u64) -> Result<u64, ApiError> {
    Ok(used)
}

/// Waits for room up to its timeout, then settles the reservation that was granted.
#[rate_limit(key = "waiting:{user}", rate = 100, interval = "200ms", cost = estimate, settle = reported, timeout = "2s")]
pub async fn waiting(user: u64, estimate: u64, used: u64) -> Result<u64, ApiError> {
    Ok(used)
}

/// The permits `name` (with the attribute's prefix) has left.
pub async fn left(client: &Client, name: &str) -> u64 {
    let name = format!("rate_limit:{name}");
    client.rate_limiter(&name).available_permits().await.unwrap()
}

/// More used than estimated puts the user's tokens in debt: the next call is refused
/// until the grant leaves the window, however small its estimate.
pub async fn an_excess_is_a_debt(client: &Client, clock: &ManualClock) {
    let done = complete(1, 1_000, 12_000).await.unwrap();
    assert_eq!(done.tokens, 12_000);
    assert_eq!(left(client, "llm:tokens:user:1").await, 0, "2 000 owed");
    let refused = complete(1, 10, 10).await.unwrap_err().refusal();
    assert_eq!(refused.rule(), 0, "the user's tokens refuse");
    assert_eq!(refused.retry_after(), Some(MINUTE));
    clock.advance(Duration::from_secs(30));
    assert!(complete(1, 10, 10).await.is_err(), "still owed");
    clock.advance(Duration::from_secs(30));
    complete(1, 10, 10).await.unwrap();
    clock.advance(MINUTE * 2);
}

/// Less used than estimated gives the difference back: a call the estimate alone
/// would refuse is granted.
pub async fn what_is_not_used_goes_back(client: &Client, clock: &ManualClock) {
    complete(2, 8_000, 100).await.unwrap();
    assert_eq!(left(client, "llm:tokens:user:2").await, 9_900);
    assert_eq!(left(client, "llm:tokens").await, 29_900);
    // 8 000 reserved again: room only because 7 900 came back.
    complete(2, 8_000, 8_000).await.unwrap();
    assert_eq!(left(client, "llm:tokens:user:2").await, 1_900);
    clock.advance(MINUTE * 2);
}

/// Three rules on one function, all or nothing: requests per user, tokens per user,
/// tokens over every user.
pub async fn mixed_rules_hold_together(client: &Client, clock: &ManualClock) {
    for _ in 0..5 {
        complete(3, 100, 50).await.unwrap();
    }
    let refused = complete(3, 100, 50).await.unwrap_err().refusal();
    assert_eq!(refused.rule(), 2, "the sixth request of a minute");
    assert_eq!(left(client, "llm:tokens:user:3").await, 9_750, "nothing reserved");
    for user in 10..13 {
        complete(user, 9_000, 9_000).await.unwrap();
    }
    assert_eq!(left(client, "llm:tokens").await, 30_000 - 250 - 27_000);
    let refused = complete(13, 9_000, 9_000).await.unwrap_err().refusal();
    assert_eq!(refused.rule(), 1, "the global tokens refuse");
    assert_eq!(left(client, "llm:tokens:user:13").await, 10_000, "all or nothing");
    assert_eq!(left(client, "llm:requests:user:13").await, 5, "all or nothing");
    // What the global tokens have left is still anyone's.
    complete(13, 2_000, 2_000).await.unwrap();
    clock.advance(MINUTE * 2);
}

/// A refused call runs the fallback, and nothing is reserved or settled for it.
pub async fn a_fallback_answers_a_refusal(client: &Client, clock: &ManualClock) {
    assert_eq!(summary(7, 80).await, "fresh 7 40");
    assert_eq!(left(client, "summary:7").await, 60, "40 of 80 came back");
    assert_eq!(summary(7, 80).await, "cached 7 80");
    assert_eq!(left(client, "summary:7").await, 60);
    assert_eq!(summary(7, 60).await, "fresh 7 30");
    clock.advance(MINUTE * 2);
}

/// A shadow settled rule is reserved and settled, and never refuses.
pub async fn a_shadow_rule_is_settled_too(client: &Client, clock: &ManualClock) {
    trial(1, 50, 30).await.unwrap();
    assert_eq!(left(client, "trial:tokens:1").await, 70);
    trial(1, 60, 200).await.unwrap();
    assert_eq!(left(client, "trial:tokens:1").await, 0, "in debt: 130 owed");
    trial(1, 50, 30).await.unwrap();
    let refused = trial(1, 1, 1).await.unwrap_err().refusal();
    assert_eq!(refused.rule(), 0, "only the enforced rule refuses");
    clock.advance(MINUTE * 2);
}

/// A call that waits (its `timeout`) settles the reservation that was granted.
pub async fn a_waiting_call_settles_what_it_reserved(client: &Client, clock: &ManualClock) {
    waiting(1, 50, 100).await.unwrap();
    let ticker = clock.clone();
    let tick = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        ticker.advance(Duration::from_secs(1));
    });
    waiting(1, 10, 4).await.unwrap();
    tick.await.unwrap();
    assert_eq!(left(client, "waiting:1").await, 96);
    clock.advance(MINUTE * 2);
}

/// What a hostile caller chooses (an estimate of u64::MAX or 0, a reported use of
/// u64::MAX) never lets more than the rate through.
pub async fn hostile_values_keep_the_limit(client: &Client, clock: &ManualClock) {
    let runs = || METERED_RUNS.load(Ordering::SeqCst);
    metered(1, 1, 1).await.unwrap();
    let before = runs();
    let refused = metered(1, u64::MAX, 1).await.unwrap_err().refusal();
    assert_eq!(refused.retry_after(), None, "no wait lets it pass");
    assert!(refused.cause().is_none(), "a refusal, not a failure: {refused:?}");
    let refused = metered(1, 0, 1_000).await.unwrap_err().refusal();
    assert!(
        matches!(refused.cause(), Some(Error::InvalidReservation { problem, .. }) if problem.contains("estimate (`cost`) is 0")),
        "{refused:?}"
    );
    assert_eq!(runs(), before, "neither ran");
    assert_eq!(left(client, "metered:1").await, 9, "nothing taken");

    metered(1, 1, u64::MAX).await.unwrap();
    assert_eq!(left(client, "metered:1").await, 0);
    assert!(metered(1, 1, 1).await.is_err(), "in debt");
    clock.advance(MINUTE);
    for _ in 0..10 {
        metered(1, 1, 1).await.unwrap();
    }
    assert!(metered(1, 1, 0).await.is_err(), "the rate holds again");
    clock.advance(MINUTE * 2);

    // Under-estimating calls, each reporting u64::MAX: with `max_overdraft`, each
    // counts at most its estimate and the cap.
    for _ in 0..3 {
        capped(1, 10, u64::MAX).await.unwrap();
    }
    assert_eq!(left(client, "capped:1").await, 10, "3 x (10 + 20) counted");
    capped(1, 10, 10).await.unwrap();
    assert!(capped(1, 1, 1).await.is_err(), "no room left");
    clock.advance(MINUTE * 2);

    // Values that make the settled rule's limiter another rule's: refused, as misuse,
    // with nothing taken from either.
    pair("z", "w", 10).await.unwrap();
    let refused = pair("y", "x", 10).await.unwrap_err().refusal();
    assert!(
        matches!(refused.cause(), Some(Error::InvalidReservation { problem, .. }) if problem.contains("same limiter")),
        "{refused:?}"
    );
    assert_eq!(left(client, "pair:z:x").await, 90, "the first call's 10 only");
    assert_eq!(left(client, "pair:y:w").await, 99);

    // A cost known before the call: 0 takes nothing, too much is refused at once.
    upload(1, 600).await.unwrap();
    upload(1, 0).await.unwrap();
    let refused = upload(1, 600).await.unwrap_err().refusal();
    assert!(refused.retry_after().is_some());
    let refused = upload(1, u64::MAX).await.unwrap_err().refusal();
    assert_eq!(refused.retry_after(), None);
    assert_eq!(left(client, "upload:1").await, 400);
    clock.advance(MINUTE * 2);
}
