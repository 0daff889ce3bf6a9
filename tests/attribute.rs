//! `#[rate_limit]` on the in-process backend (this binary's default client): keys,
//! escaping, stacked rules, fallbacks, methods, waiting, and every supported form.

use std::fmt;
use std::sync::Once;
use std::time::{Duration, Instant};

use redlimit::{rate_limit, Client, RateLimited};

use redlimit_test_support as support;

/// Every test of this binary shares one in-process default client.
fn client() -> &'static Client {
    static SET: Once = Once::new();
    SET.call_once(|| redlimit::set_default(Client::memory()).unwrap());
    redlimit::default_client().unwrap()
}

async fn available(key: &str) -> u64 {
    client()
        .rate_limiter(format!("rate_limit:{key}"))
        .available_permits()
        .await
        .unwrap()
}

#[derive(Debug, PartialEq)]
enum AppError {
    Limited {
        key: String,
        rule: usize,
        retry_after: Option<Duration>,
        message: Option<String>,
    },
}

impl From<RateLimited> for AppError {
    fn from(limited: RateLimited) -> Self {
        AppError::Limited {
            key: limited.key().to_owned(),
            rule: limited.rule(),
            retry_after: limited.retry_after(),
            message: limited.message().map(str::to_owned),
        }
    }
}

fn limited_rule(result: Result<impl fmt::Debug, AppError>) -> usize {
    match result {
        Err(AppError::Limited { rule, .. }) => rule,
        Ok(value) => panic!("expected a refusal, got {value:?}"),
    }
}

#[rate_limit(key = "per_user:{user_id}", rate = 2, interval = "60s", message = "slow down")]
async fn per_user(user_id: u64) -> Result<u64, AppError> {
    Ok(user_id)
}

#[tokio::test]
async fn user_1_is_limited_and_user_2_is_not() {
    client();
    assert_eq!(per_user(1).await, Ok(1));
    assert_eq!(per_user(1).await, Ok(1));
    let refused = per_user(1).await.unwrap_err();
    let AppError::Limited {
        key,
        rule,
        retry_after,
        message,
    } = refused;
    assert_eq!(key, "rate_limit:per_user:1");
    assert_eq!(rule, 0);
    assert!(retry_after.unwrap() > Duration::from_secs(59));
    assert_eq!(message.as_deref(), Some("slow down"));
    assert_eq!(per_user(2).await, Ok(2));
}

struct User {
    id: u32,
    org: Org,
}

struct Org {
    name: String,
}

#[rate_limit(key = "fields:{user.org.name}:{user.id}:{pair.1}", rate = 1, interval = "60s")]
async fn fields(user: &User, pair: (u8, &str)) -> Result<(), AppError> {
    let _ = (user.id, pair.0);
    Ok(())
}

#[tokio::test]
async fn fields_and_tuple_indices_are_interpolated() {
    client();
    let user = User {
        id: 7,
        org: Org { name: "acme".into() },
    };
    fields(&user, (1, "x")).await.unwrap();
    assert_eq!(available("fields:acme:7:x").await, 0);
    let untouched = client().rate_limiter("rate_limit:fields:acme:7:y");
    assert!(
        !untouched.is_exists().await.unwrap(),
        "another tuple, another limiter"
    );
    fields(&user, (1, "y")).await.unwrap();
}

#[rate_limit(key = "esc:{a}:{b}", rate = 1, interval = "60s")]
async fn escaped(a: &str, b: &str) -> Result<(), AppError> {
    Ok(())
}

#[tokio::test]
async fn hostile_values_never_collide_or_change_the_slot() {
    client();
    // "a:b" + "c" and "a" + "b:c" would both be "esc:a:b:c" unescaped.
    escaped("a:b", "c").await.unwrap();
    escaped("a", "b:c").await.unwrap();
    assert_eq!(available("esc:a%3Ab:c").await, 0);
    assert_eq!(available("esc:a:b%3Ac").await, 0);
    // Braces cannot open a hash tag; percent signs cannot forge an escape.
    escaped("{x}", "%3A").await.unwrap();
    assert_eq!(available("esc:%7Bx%7D:%253A").await, 0);
    let key = "rate_limit:esc:%7Bx%7D:%253A";
    let slot = redlimit::keys::hash_slot(key.as_bytes());
    let keys = redlimit::LimiterKeys::new(key, "id").unwrap();
    for k in keys.all() {
        assert_eq!(redlimit::keys::hash_slot(k.as_bytes()), slot);
    }
}

#[rate_limit(key = "stack:user:{user_id}", rate = 3, interval = "60s")]
#[rate_limit(key = "stack:global", rate = 2, interval = "60s")]
async fn stacked(user_id: u64) -> Result<(), AppError> {
    Ok(())
}

#[tokio::test]
async fn a_refusal_by_the_second_rule_spends_nothing_of_the_first() {
    client();
    stacked(1).await.unwrap();
    stacked(1).await.unwrap();
    assert_eq!(limited_rule(stacked(1).await), 1, "the global rule refuses");
    assert_eq!(
        available("stack:user:1").await,
        1,
        "the user rule kept its last permit"
    );
    assert_eq!(available("stack:global").await, 0);
}

#[rate_limit(key = "fallback:{user_id}", rate = 1, interval = "60s", fallback = busy)]
async fn with_fallback(user_id: u64, note: String) -> String {
    format!("served {user_id} {note}")
}

async fn busy(user_id: u64, note: String) -> String {
    format!("busy {user_id} {note}")
}

#[tokio::test]
async fn the_fallback_gets_the_same_arguments() {
    client();
    assert_eq!(with_fallback(5, "a".into()).await, "served 5 a");
    assert_eq!(with_fallback(5, "b".into()).await, "busy 5 b");
}

struct Service {
    tenant: &'static str,
    calls: u32,
}

impl Service {
    #[rate_limit(key = "svc:{self.tenant}:{item}", rate = 1, interval = "60s", fallback = Self::refused)]
    async fn get(&self, item: u32) -> String {
        format!("{} got {item}", self.tenant)
    }

    async fn refused(&self, item: u32) -> String {
        format!("{} refused {item}", self.tenant)
    }

    #[rate_limit(key = "svc_mut:{self.tenant}", rate = 2, interval = "60s")]
    async fn bump(&mut self) -> Result<u32, AppError> {
        self.calls += 1;
        Ok(self.calls)
    }

    #[rate_limit(key = "svc_owned:{self.tenant}", rate = 1, interval = "60s")]
    async fn consume(self) -> Result<&'static str, AppError> {
        Ok(self.tenant)
    }
}

#[tokio::test]
async fn methods_with_every_receiver() {
    client();
    let mut service = Service {
        tenant: "t1",
        calls: 0,
    };
    assert_eq!(service.get(1).await, "t1 got 1");
    assert_eq!(service.get(1).await, "t1 refused 1");
    assert_eq!(service.bump().await, Ok(1));
    assert_eq!(service.bump().await, Ok(2));
    assert_eq!(limited_rule(service.bump().await), 0);
    assert_eq!(service.calls, 2, "a refused call never runs the body");
    assert_eq!(
        Service {
            tenant: "t2",
            calls: 0
        }
        .consume()
        .await,
        Ok("t2")
    );
    assert!(Service {
        tenant: "t2",
        calls: 0
    }
    .consume()
    .await
    .is_err());
}

#[rate_limit(key = "wait", rate = 1, interval = "300ms", timeout = "1s")]
async fn waits() -> Result<(), AppError> {
    Ok(())
}

#[rate_limit(key = "no_wait", rate = 1, interval = "5s", timeout = "100ms")]
async fn gives_up() -> Result<(), AppError> {
    Ok(())
}

#[tokio::test]
async fn timeout_waits_for_permits_then_grants_or_refuses() {
    client();
    waits().await.unwrap();
    let started = Instant::now();
    waits().await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(290),
        "{:?}",
        started.elapsed()
    );
    gives_up().await.unwrap();
    let started = Instant::now();
    assert!(gives_up().await.is_err());
    assert!(
        started.elapsed() < Duration::from_millis(150),
        "{:?}",
        started.elapsed()
    );
}

#[rate_limit(rate = 1, interval = "60s")]
async fn default_key() -> Result<(), AppError> {
    Ok(())
}

#[tokio::test]
async fn the_default_key_is_the_module_path_and_name() {
    client();
    default_key().await.unwrap();
    assert_eq!(available("attribute::default_key").await, 0);
}

#[rate_limit(key = "generic:{value}", rate = 1, interval = "60s")]
async fn generic<T: fmt::Display + Send + Sync>(value: T) -> Result<String, AppError> {
    Ok(value.to_string())
}

#[rate_limit(key = "opaque", rate = 1, interval = "60s")]
async fn opaque() -> Result<impl fmt::Display, AppError> {
    Ok(42)
}

/// Documented and instrumented; `#[must_use]` stays.
#[rate_limit(key = "instrumented:{n}", rate = 1, interval = "60s")]
#[tracing::instrument]
#[must_use]
async fn instrumented(n: u32) -> Result<u32, AppError> {
    Ok(n)
}

#[tracing::instrument]
#[rate_limit(key = "instrumented_outer:{n}", rate = 1, interval = "60s")]
async fn instrumented_outer(n: u32) -> Result<u32, AppError> {
    Ok(n)
}

#[tokio::test]
async fn generics_opaque_returns_and_other_attributes() {
    client();
    assert_eq!(generic(3u8).await, Ok("3".to_owned()));
    assert!(generic(3u8).await.is_err());
    assert_eq!(generic("x").await, Ok("x".to_owned()));
    assert_eq!(opaque().await.map(|v| v.to_string()).ok(), Some("42".to_owned()));
    assert!(opaque().await.is_err());
    assert_eq!(instrumented(1).await, Ok(1));
    assert!(instrumented(1).await.is_err());
    assert_eq!(instrumented_outer(1).await, Ok(1));
    assert!(instrumented_outer(1).await.is_err());
}

trait Orders {
    async fn place(&self, id: u32) -> Result<u32, AppError>;
}

struct Shop;

impl Orders for Shop {
    #[rate_limit(key = "trait:{id}", rate = 1, interval = "60s")]
    async fn place(&self, id: u32) -> Result<u32, AppError> {
        Ok(id)
    }
}

#[async_trait::async_trait]
trait Boxed {
    async fn fetch(&self, id: u32) -> Result<u32, AppError>;
}

#[async_trait::async_trait]
impl Boxed for Shop {
    #[rate_limit(key = "async_trait:{id}", rate = 1, interval = "60s")]
    async fn fetch(&self, id: u32) -> Result<u32, AppError> {
        Ok(id)
    }
}

#[tokio::test]
async fn native_async_trait_methods_and_async_trait() {
    client();
    assert_eq!(Shop.place(1).await, Ok(1));
    assert!(Shop.place(1).await.is_err());
    assert_eq!(Shop.fetch(1).await, Ok(1));
    assert!(Shop.fetch(1).await.is_err());
    assert_eq!(available("async_trait:1").await, 0);
}

mod renamed {
    use super::*;
    use redlimit::rate_limit as limit;

    #[limit(key = "renamed:user", rate = 3, interval = "60s")]
    #[limit(key = "renamed:global", rate = 1, interval = "60s")]
    pub async fn both_renamed() -> Result<(), AppError> {
        Ok(())
    }

    #[rate_limit(key = "mixed:user", rate = 3, interval = "60s")]
    #[limit(key = "mixed:global", rate = 1, interval = "60s")]
    pub async fn mixed() -> Result<(), AppError> {
        Ok(())
    }
}

#[tokio::test]
async fn renamed_imports_still_decide_all_rules_at_once() {
    client();
    renamed::both_renamed().await.unwrap();
    assert_eq!(limited_rule(renamed::both_renamed().await), 1);
    assert_eq!(
        available("renamed:user").await,
        2,
        "one decision: the refusal spent nothing"
    );
    renamed::mixed().await.unwrap();
    assert_eq!(limited_rule(renamed::mixed().await), 1);
    assert_eq!(available("mixed:user").await, 2);
}

fn assert_send<T: Send>(_: &T) {}

#[tokio::test]
async fn decorated_futures_are_send() {
    client();
    let future = per_user(99);
    assert_send(&future);
    let user = User {
        id: 1,
        org: Org { name: "o".into() },
    };
    let future = fields(&user, (0, "s"));
    assert_send(&future);
    future.await.unwrap();
}

#[tokio::test]
async fn coinciding_keys_never_switch_a_limit_off() {
    client();
    // Fresh values only: the random calls start after the first hundred.
    support::coinciding::coinciding_values_never_switch_a_limit_off(300).await;
}

/// A parameter taken apart by a pattern, as axum's `Path(user_id): Path<u64>`.
struct Wrapped<T>(T);

struct Point {
    x: u32,
    y: u32,
}

#[rate_limit(key = "patterns:{user_id}:{a}:{x}", rate = 1, interval = "60s")]
async fn patterns(
    Wrapped(user_id): Wrapped<u64>,
    (a, _b): (u8, u8),
    Point { x, .. }: Point,
) -> Result<u64, AppError> {
    Ok(user_id + u64::from(a) + u64::from(x))
}

#[tokio::test]
async fn names_bound_by_patterns_can_be_used_in_keys() {
    client();
    let point = || Point { x: 3, y: 9 };
    assert_eq!(patterns(Wrapped(7), (1, 2), point()).await.unwrap(), 11);
    let AppError::Limited { key, .. } = patterns(Wrapped(7), (1, 5), Point { x: 3, y: 0 })
        .await
        .unwrap_err();
    assert_eq!(key, "rate_limit:patterns:7:1:3");
    assert!(
        patterns(Wrapped(8), (1, 2), point()).await.is_ok(),
        "another user"
    );
    let _ = point().y;
}

#[rate_limit(key = "shadow:enforced", rate = 3, interval = "60s")]
#[rate_limit(key = "shadow:new", rate = 1, interval = "60s", shadow = true)]
async fn rolling_out() -> Result<(), AppError> {
    Ok(())
}

#[rate_limit(key = "shadow:only", rate = 1, interval = "60s", shadow = true)]
async fn only_shadow() -> Result<(), AppError> {
    Ok(())
}

/// A shadow rule is decided (it takes its permit while it has one) and reported
/// (a warning), and never refuses; the enforced rule beside it still does.
#[tokio::test]
async fn shadow_rules_are_decided_and_reported_but_never_refuse() {
    client();
    let capture = support::capture::Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    for _ in 0..3 {
        rolling_out().await.unwrap();
    }
    assert_eq!(
        available("shadow:new").await,
        0,
        "the shadow rule took its one permit"
    );
    assert_eq!(available("shadow:enforced").await, 0);
    assert_eq!(limited_rule(rolling_out().await), 0, "the enforced rule refuses");
    let logged = capture.text();
    assert_eq!(
        logged.matches("shadow rate limit would have refused").count(),
        1,
        "two shadow refusals within 10 s, one line: {logged}"
    );
    assert!(logged.contains("rule=\"shadow:new\""), "{logged}");

    for _ in 0..5 {
        only_shadow().await.unwrap();
    }
    assert_eq!(available("shadow:only").await, 0);
}

fn tokens_used(result: &Result<u64, RateLimited>) -> u64 {
    *result.as_ref().unwrap_or(&0)
}

#[rate_limit(key = "misuse:tokens", rate = 1_000, interval = "60s", cost = max_tokens, settle = tokens_used)]
async fn metered_call(max_tokens: u64) -> Result<u64, RateLimited> {
    Ok(max_tokens)
}

/// A call refused for its own misuse (a settled rule's estimate of 0) says what was
/// wrong and what is accepted, not that a limit was reached or that the limiter is
/// unavailable; its cause is no backend failure.
#[tokio::test]
async fn a_misuse_refusal_says_what_was_wrong() {
    client();
    let refused = metered_call(0).await.unwrap_err();
    let text = refused.to_string();
    assert!(
        text.starts_with("call refused without a decision for `rate_limit:misuse:tokens`:")
            && text.contains("estimate (`cost`) is 0")
            && text.contains("at least 1")
            && !text.contains("exceeded")
            && !text.contains("unavailable"),
        "{text}"
    );
    assert!(refused.cause().is_some_and(|cause| !cause.is_backend_failure()));
    assert_eq!(
        metered_call(10).await.unwrap(),
        10,
        "an estimate of 1 or more passes"
    );
}

#[rate_limit(key = "left:costly", rate = 5, interval = "60s", cost = n)]
async fn costly(n: u64) -> Result<(), RateLimited> {
    Ok(())
}

/// A refusal says what its limiter had left: 2 of 5 after a call of 3, refusing
/// another call of 3 (and its wait).
#[tokio::test]
async fn a_refusal_says_what_was_left() {
    client();
    costly(3).await.unwrap();
    let refused = costly(3).await.unwrap_err();
    assert_eq!(refused.remaining(), 2, "{refused:?}");
    assert!(refused.retry_after().is_some());
}
