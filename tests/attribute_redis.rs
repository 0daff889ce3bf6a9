//! `#[rate_limit]` on a real redis-server, read back with plain commands, and each
//! `on_error` policy with the server stopped and restarted.
//!
//! The default client is process-wide, so this binary runs one test that owns its
//! server and walks through the scenarios in order.

use redlimit_test_support as support;

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redlimit::{rate_limit, Client, RateLimited};
use support::RedisServer;

#[derive(Debug)]
struct Limited(RateLimited);

impl From<RateLimited> for Limited {
    fn from(limited: RateLimited) -> Self {
        Limited(limited)
    }
}

#[rate_limit(key = "users:{user_id}", rate = 2, interval = "60s")]
async fn per_user(user_id: u64) -> Result<u64, Limited> {
    Ok(user_id)
}

#[rate_limit(key = "pair:{a}:{b}", rate = 1, interval = "60s")]
async fn pair(a: &str, b: &str) -> Result<(), Limited> {
    Ok(())
}

#[rate_limit(key = "orders:user:{user_id}", rate = 5, interval = "60s")]
#[rate_limit(key = "orders:all", rate = 1, interval = "60s")]
async fn order(user_id: u64) -> Result<(), Limited> {
    Ok(())
}

#[rate_limit(key = "search:{query}", rate = 1, interval = "60s", fallback = cached)]
async fn search(query: String, page: u32) -> String {
    format!("fresh {query} {page}")
}

async fn cached(query: String, page: u32) -> String {
    format!("cached {query} {page}")
}

struct Account {
    id: u32,
}

impl Account {
    #[rate_limit(key = "account:{self.id}", rate = 1, interval = "60s")]
    async fn withdraw(&self, amount: u32) -> Result<u32, Limited> {
        Ok(amount)
    }
}

#[rate_limit(key = "waiting", rate = 1, interval = "400ms", timeout = "2s")]
async fn waiting() -> Result<(), Limited> {
    Ok(())
}

#[rate_limit(key = "policy:local", rate = 2, interval = "60s", on_error = "local")]
async fn local_policy() -> Result<(), Limited> {
    Ok(())
}

#[rate_limit(key = "policy:allow", rate = 1, interval = "60s", on_error = "allow")]
async fn allow_policy() -> Result<(), Limited> {
    Ok(())
}

#[rate_limit(key = "policy:deny", rate = 100, interval = "60s", on_error = "deny")]
async fn deny_policy() -> Result<(), Limited> {
    Ok(())
}

#[rate_limit(key = "corrupt:{id}", rate = 1, interval = "60s", on_error = "deny")]
async fn corrupt_deny(id: u32) -> Result<(), Limited> {
    Ok(())
}

#[rate_limit(key = "corrupt:{id}", rate = 1, interval = "60s")]
async fn corrupt_local(id: u32) -> Result<(), Limited> {
    Ok(())
}

const TIMEOUT: Duration = Duration::from_millis(200);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_on_redis() {
    let server = RedisServer::start();
    let client = Client::builder()
        .command_timeout(TIMEOUT)
        .connect(&server.url())
        .await
        .unwrap();
    redlimit::set_default(client).unwrap();
    let mut raw = server.raw().await;

    // Per-user keys, in Redisson's layout under the prefix.
    per_user(1).await.unwrap();
    per_user(1).await.unwrap();
    let refused = per_user(1).await.unwrap_err().0;
    assert_eq!(refused.key(), "rate_limit:users:1");
    assert!(refused.retry_after().is_some());
    per_user(2).await.unwrap();
    let value: String = raw.get("{rate_limit:users:1}:value").await.unwrap();
    assert_eq!(value, "0");
    let value: String = raw.get("{rate_limit:users:2}:value").await.unwrap();
    assert_eq!(value, "1");
    // Each key kept for the rule's interval from its last call (keep-alive = interval).
    for key in [
        "rate_limit:users:1",
        "{rate_limit:users:1}:value",
        "{rate_limit:users:1}:permits",
    ] {
        let ttl: i64 = raw.pttl(key).await.unwrap();
        assert!(
            (59_000..=60_000).contains(&ttl),
            "keep-alive = interval, {key}: {ttl}"
        );
    }

    // Escaped values never collide and never change the slot.
    pair("a:b", "c").await.unwrap();
    pair("a", "b:c").await.unwrap();
    pair("{x}", "%").await.unwrap();
    let mut keys: Vec<String> = raw.keys("rate_limit:pair:*").await.unwrap();
    keys.sort();
    assert_eq!(
        keys,
        [
            "rate_limit:pair:%7Bx%7D:%25",
            "rate_limit:pair:a%3Ab:c",
            "rate_limit:pair:a:b%3Ac"
        ]
    );
    for key in keys {
        let slot = redlimit::keys::hash_slot(key.as_bytes());
        let value_key = format!("{{{key}}}:value");
        let exists: bool = raw.exists(&value_key).await.unwrap();
        assert!(exists, "{value_key}");
        assert_eq!(redlimit::keys::hash_slot(value_key.as_bytes()), slot);
    }

    // Two stacked rules: the second refuses and the first's permits are unspent.
    order(1).await.unwrap();
    for _ in 0..3 {
        assert_eq!(order(1).await.unwrap_err().0.rule(), 1);
    }
    let value: String = raw.get("{rate_limit:orders:user:1}:value").await.unwrap();
    assert_eq!(value, "4");
    let logged: usize = raw.zcard("{rate_limit:orders:user:1}:permits").await.unwrap();
    assert_eq!(logged, 1);
    // Both rules in one script call, granted or refused: everything the client sent.
    let monitor = support::monitor::Monitor::start(server.port);
    for user in 10..15 {
        let refused = order(user).await.unwrap_err().0;
        assert_eq!(refused.rule(), 1, "the global rule is spent");
    }
    assert_eq!(monitor.client_commands(), vec!["EVALSHA".to_owned(); 5]);

    // Fallback with the arguments; methods; waiting.
    assert_eq!(search("rust".into(), 1).await, "fresh rust 1");
    assert_eq!(search("rust".into(), 2).await, "cached rust 2");
    let account = Account { id: 9 };
    assert_eq!(account.withdraw(5).await.unwrap(), 5);
    assert_eq!(
        account.withdraw(5).await.unwrap_err().0.key(),
        "rate_limit:account:9"
    );
    waiting().await.unwrap();
    let started = Instant::now();
    waiting().await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(390),
        "{:?}",
        started.elapsed()
    );

    // Corrupted state is a backend failure: `deny` refuses with it as the cause,
    // `local` decides in process; the state is left as it was.
    let _: () = redis::cmd("HSET")
        .arg("rate_limit:corrupt:1")
        .arg(&["rate", "ten", "interval", "60000", "type", "0"])
        .query_async(&mut raw)
        .await
        .unwrap();
    let refused = corrupt_deny(1).await.unwrap_err().0;
    assert!(
        matches!(
            refused.cause(),
            Some(redlimit::Error::CorruptConfig { field: "rate", .. })
        ),
        "{refused:?}"
    );
    assert_eq!(refused.retry_after(), None);
    corrupt_local(1).await.unwrap();
    let refused = corrupt_local(1).await.unwrap_err().0;
    assert!(
        refused.cause().is_none(),
        "refused by the in-process limiter: {refused:?}"
    );
    assert!(refused.retry_after().is_some());
    let stored: std::collections::HashMap<String, String> =
        raw.hgetall("rate_limit:corrupt:1").await.unwrap();
    assert_eq!(stored["rate"], "ten", "left as it was");
    assert_eq!(stored.len(), 3);

    // Stacked templates that coincide for some values: each decision as the model
    // says, under every on_error policy.
    support::coinciding::coinciding_values_never_switch_a_limit_off(150).await;

    // Redis goes away: each policy answers within the command timeout.
    deny_policy().await.unwrap();
    let port = server.stop();
    let bound = TIMEOUT + Duration::from_millis(100);
    let timed = |started: Instant| {
        let took = started.elapsed();
        assert!(took < bound, "took {took:?}");
    };
    let started = Instant::now();
    local_policy().await.unwrap();
    timed(started);
    local_policy().await.unwrap();
    let refused = local_policy().await.unwrap_err().0;
    assert!(
        refused.cause().is_none(),
        "refused by the in-process limiter, not by the failure"
    );
    assert!(refused.retry_after().is_some());
    for _ in 0..3 {
        let started = Instant::now();
        allow_policy().await.unwrap();
        timed(started);
    }
    let started = Instant::now();
    let refused = deny_policy().await.unwrap_err().0;
    timed(started);
    assert!(
        refused.cause().is_some_and(|cause| cause.is_backend_failure()),
        "{refused:?}"
    );
    assert_eq!(refused.retry_after(), None);
    assert!(refused.to_string().contains("unavailable"), "{refused}");

    // Redis comes back on the same address: service resumes without a restart.
    let server = RedisServer::start_on(port);
    let deadline = Instant::now() + Duration::from_secs(10);
    while deny_policy().await.is_err() {
        assert!(Instant::now() < deadline, "no recovery within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut raw = server.raw().await;
    let value: String = raw.get("{rate_limit:policy:deny}:value").await.unwrap();
    assert_eq!(value, "99", "decided by Redis again (a fresh server)");
    allow_policy().await.unwrap();
    assert!(
        allow_policy().await.is_err(),
        "allow_policy is limited by Redis again"
    );
}
