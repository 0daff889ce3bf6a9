//! Parity with Redisson 4.4-4.7 (`RedissonRateLimiter`, unchanged from 4.4.0 to 4.7):
//! each behaviour checked on a real redis-server by reading the keys with plain
//! commands, and Redisson's own writes and reads done here with plain commands as its
//! scripts do them. Where older Redisson versions differ, the comment says how.

use redlimit_test_support as support;

use std::collections::HashMap;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use redlimit::{Client, Clock, Error, ManualClock, RateLimiterArgs, RateLimiterConfig, RateType, Rule};
use support::RedisServer;

const T0: u64 = 1_700_000_000_000;
const MIN: Duration = Duration::from_secs(60);

async fn setup() -> (RedisServer, Client, ManualClock, MultiplexedConnection) {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let (client, raw) = server.clocked_client(&clock).await;
    (server, client, clock, raw)
}

async fn pttl(raw: &mut MultiplexedConnection, key: &str) -> i64 {
    raw.pttl(key).await.unwrap()
}

/// A member as Redisson's `struct.pack('Bc0I', 16, id, permits)` makes it.
fn member(id: u8, permits: u32) -> Vec<u8> {
    let mut member = vec![16u8];
    member.extend_from_slice(&[id; 16]);
    member.extend_from_slice(&permits.to_le_bytes());
    member
}

/// Redisson's `availablePermits()` as its script reads the keys (overall mode):
/// the value plus the permits of entries that left the window; the rate when the
/// value is missing.
async fn java_available_permits(raw: &mut MultiplexedConnection, name: &str, now: u64) -> i64 {
    let config: HashMap<String, String> = raw.hgetall(name).await.unwrap();
    let interval: u64 = config["interval"].parse().unwrap();
    let value: Option<String> = raw.get(format!("{{{name}}}:value")).await.unwrap();
    let Some(value) = value else {
        return config["rate"].parse().unwrap();
    };
    let expired: Vec<Vec<u8>> = raw
        .zrangebyscore(format!("{{{name}}}:permits"), 0, (now - interval) as f64)
        .await
        .unwrap();
    let released: i64 = expired
        .iter()
        .map(|m| i64::from(u32::from_le_bytes(m[m.len() - 4..].try_into().unwrap())))
        .sum();
    value.parse::<i64>().unwrap() + released
}

#[tokio::test]
async fn configuring_with_a_keep_alive_sets_the_ttl_at_once() {
    // Redisson 4.4+: trySetRate (when it takes effect) and setRate pexpire NAME by
    // keepAliveTime; 3.38-4.3 left NAME without a TTL until the first acquire.
    let (_server, client, _clock, mut raw) = setup().await;
    let config = RateLimiterConfig::new(RateType::Overall, 5, MIN).with_keep_alive(2 * MIN);
    let limiter = client.rate_limiter("ttl:try");
    assert!(limiter.try_set_config(&config).await.unwrap());
    let ttl = pttl(&mut raw, "ttl:try").await;
    assert!(ttl > 119_000 && ttl <= 120_000, "{ttl}");
    // A try that does not take effect leaves the TTL alone.
    let _: () = raw.pexpire("ttl:try", 90_000).await.unwrap();
    assert!(!limiter.try_set_config(&config).await.unwrap());
    assert!(pttl(&mut raw, "ttl:try").await <= 90_000);
    // Without a keep-alive, no TTL (as Redisson).
    let plain = client.rate_limiter("ttl:plain");
    plain.try_set_rate(RateType::Overall, 5, MIN).await.unwrap();
    assert_eq!(pttl(&mut raw, "ttl:plain").await, -1);

    let set = client.rate_limiter("ttl:set");
    set.set_config(&config).await.unwrap();
    let ttl = pttl(&mut raw, "ttl:set").await;
    assert!(ttl > 119_000 && ttl <= 120_000, "{ttl}");
}

#[tokio::test]
async fn update_keeping_the_window_refreshes_all_three_ttls() {
    let (_server, client, _clock, mut raw) = setup().await;
    let limiter = client.rate_limiter("ttl:update");
    limiter.try_set_rate(RateType::Overall, 5, MIN).await.unwrap();
    assert!(limiter.try_acquire(2).await.unwrap());
    for key in ["ttl:update", "{ttl:update}:value", "{ttl:update}:permits"] {
        assert_eq!(pttl(&mut raw, key).await, -1, "{key}");
    }
    let config = RateLimiterConfig::new(RateType::Overall, 8, MIN).with_keep_alive(3 * MIN);
    assert!(limiter.update_config(&config).await.unwrap());
    for key in ["ttl:update", "{ttl:update}:value", "{ttl:update}:permits"] {
        let ttl = pttl(&mut raw, key).await;
        assert!(ttl > 179_000 && ttl <= 180_000, "{key}: {ttl}");
    }
    let value: String = raw.get("{ttl:update}:value").await.unwrap();
    assert_eq!(value, "6", "the window is kept: 8 - 2");
}

#[tokio::test]
async fn a_keep_alive_shorter_than_the_interval_is_refused() {
    let (_server, client, _clock, mut raw) = setup().await;
    let short = RateLimiterConfig::new(RateType::Overall, 5, MIN).with_keep_alive(Duration::from_secs(30));
    let limiter = client.rate_limiter("short");
    let expect_refusal = |err: Error| {
        assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");
        assert!(
            err.to_string()
                .contains("The parameter keepAliveTime should be greater than or equal to rateInterval"),
            "{err}"
        );
    };
    expect_refusal(limiter.try_set_config(&short).await.unwrap_err());
    expect_refusal(limiter.set_config(&short).await.unwrap_err());
    expect_refusal(limiter.update_config(&short).await.unwrap_err());
    expect_refusal(
        limiter
            .set_rate_with(
                &RateLimiterArgs::new(RateType::Overall, 5, MIN).keep_alive(Duration::from_secs(1)),
            )
            .await
            .unwrap_err(),
    );
    expect_refusal(
        client
            .check_rules(&[Rule::new("short:rule", 5, MIN).keep_alive(Some(Duration::from_secs(59)))])
            .await
            .unwrap_err(),
    );
    let exists: bool = raw.exists("short").await.unwrap();
    assert!(!exists, "nothing was written");
    // keep_alive on a stored config checks the stored interval, in the script.
    limiter.try_set_rate(RateType::Overall, 5, MIN).await.unwrap();
    expect_refusal(limiter.keep_alive(Duration::from_secs(59)).await.unwrap_err());
    limiter.keep_alive(MIN).await.unwrap();
    limiter.keep_alive(Duration::ZERO).await.unwrap();
}

#[tokio::test]
async fn a_change_of_mode_deletes_both_modes_state() {
    // Redisson 4.4+ deletes all four state keys on a mode change; before, the old
    // mode's value and log stayed behind (without a TTL unless keep-alive was set).
    let (_server, client, _clock, mut raw) = setup().await;
    let name = "modes";
    let id = client.client_id().to_owned();
    let limiter = client.rate_limiter(name);
    limiter.try_set_rate(RateType::Overall, 5, MIN).await.unwrap();
    assert!(limiter.try_acquire(1).await.unwrap());
    // This client's per_client keys, as a Redisson instance with the same id writes them.
    let _: () = raw.set(format!("{{{name}}}:value:{id}"), "3").await.unwrap();
    let _: () = raw
        .zadd(format!("{{{name}}}:permits:{id}"), member(1, 2), T0)
        .await
        .unwrap();
    let state = [
        format!("{{{name}}}:value"),
        format!("{{{name}}}:permits"),
        format!("{{{name}}}:value:{id}"),
        format!("{{{name}}}:permits:{id}"),
    ];
    let count = |raw: &mut MultiplexedConnection| {
        let state = state.clone();
        let mut raw = raw.clone();
        async move {
            let n: usize = redis::cmd("EXISTS")
                .arg(&state[..])
                .query_async(&mut raw)
                .await
                .unwrap();
            n
        }
    };
    assert_eq!(count(&mut raw).await, 4);
    assert!(limiter.update_rate(RateType::PerClient, 5, MIN).await.unwrap());
    assert_eq!(count(&mut raw).await, 0, "update_rate");

    // The same through a rule that changes the mode.
    assert!(limiter.try_acquire(1).await.unwrap());
    let _: () = raw.set(&state[0], "4").await.unwrap();
    let _: () = raw.zadd(&state[1], member(2, 1), T0).await.unwrap();
    assert_eq!(count(&mut raw).await, 4);
    let rule = Rule::new(name, 5, MIN).keep_alive(None);
    assert!(client.check_rules(&[rule]).await.unwrap().allowed);
    let left: Vec<String> = {
        let mut left = Vec::new();
        for key in &state {
            let exists: bool = raw.exists(key).await.unwrap();
            if exists {
                left.push(key.clone());
            }
        }
        left
    };
    assert_eq!(
        left,
        [state[0].clone(), state[1].clone()],
        "only the new mode's, from this grant"
    );
}

#[tokio::test]
async fn update_rate_on_a_missing_limiter_writes_nothing() {
    let (_server, client, _clock, mut raw) = setup().await;
    let limiter = client.rate_limiter("missing");
    assert!(!limiter.update_rate(RateType::Overall, 5, MIN).await.unwrap());
    assert!(!limiter
        .update_rate_with(&RateLimiterArgs::new(RateType::Overall, 5, MIN))
        .await
        .unwrap());
    let keys: Vec<String> = raw.keys("*missing*").await.unwrap();
    assert!(keys.is_empty(), "{keys:?}");
    // set_rate_with creates it (Redisson's setRate(args): require exist = false).
    limiter
        .set_rate_with(&RateLimiterArgs::new(RateType::Overall, 5, MIN))
        .await
        .unwrap();
    assert!(limiter.is_exists().await.unwrap());
}

#[tokio::test]
async fn the_args_form_restarts_the_window_unless_told_to_keep_it() {
    let (_server, client, _clock, mut raw) = setup().await;
    let limiter = client.rate_limiter("args");
    limiter.try_set_rate(RateType::Overall, 5, MIN).await.unwrap();
    assert!(limiter.try_acquire(3).await.unwrap());
    // keepState = false (Redisson's default): the window restarts.
    assert!(limiter
        .update_rate_with(&RateLimiterArgs::new(RateType::Overall, 6, MIN))
        .await
        .unwrap());
    assert_eq!(limiter.available_permits().await.unwrap(), 6);
    assert!(limiter.try_acquire(2).await.unwrap());
    // keepState = true: available = rate - permits in the window.
    limiter
        .set_rate_with(&RateLimiterArgs::new(RateType::Overall, 10, MIN).keep_state(true))
        .await
        .unwrap();
    assert_eq!(limiter.available_permits().await.unwrap(), 8);
    let value: String = raw.get("{args}:value").await.unwrap();
    assert_eq!(value, "8");
}

#[tokio::test]
async fn a_lowered_rate_is_owed_and_java_reads_the_debt() {
    // Decision: update_rate keeps value + log = rate, so the value goes below zero
    // when the window holds more than the new rate. Redisson 4.4+ clamps it at 0,
    // and its clients then grant the new rate again as soon as the old grants leave,
    // on top of those still in the window. With the debt a Java client's
    // availablePermits() answers the negative number (its tryAcquire refuses: the value
    // is below the permits), and both sides grant again only once the window holds
    // less than the new rate.
    let (_server, client, clock, mut raw) = setup().await;
    let limiter = client.rate_limiter("debt");
    limiter.try_set_rate(RateType::Overall, 5, MIN).await.unwrap();
    assert!(limiter.try_acquire(3).await.unwrap());
    clock.advance(Duration::from_secs(10));
    assert!(limiter.try_acquire(2).await.unwrap());
    assert!(limiter.update_rate(RateType::Overall, 3, MIN).await.unwrap());
    let value: String = raw.get("{debt}:value").await.unwrap();
    assert_eq!(value, "-2");
    assert_eq!(java_available_permits(&mut raw, "debt", clock.now_ms()).await, -2);
    assert_eq!(
        limiter.available_permits().await.unwrap(),
        0,
        "redlimit answers 0"
    );
    // The first 3 permits leave the window: 2 held against a rate of 3, 1 available.
    clock.advance(Duration::from_secs(50));
    assert_eq!(java_available_permits(&mut raw, "debt", clock.now_ms()).await, 1);
    assert_eq!(limiter.available_permits().await.unwrap(), 1);
    assert!(limiter.try_acquire(1).await.unwrap());
    assert!(
        !limiter.try_acquire(1).await.unwrap(),
        "never more than 3 in the window"
    );
}

#[tokio::test]
async fn release_gives_back_from_the_newest_grants_and_keeps_the_sum() {
    let (_server, client, clock, mut raw) = setup().await;
    let limiter = client.rate_limiter("release");
    limiter.try_set_rate(RateType::Overall, 10, MIN).await.unwrap();
    assert!(limiter.try_acquire(4).await.unwrap());
    clock.advance(Duration::from_secs(1));
    assert!(limiter.try_acquire(3).await.unwrap());
    limiter.release(5).await.unwrap();
    let value: String = raw.get("{release}:value").await.unwrap();
    assert_eq!(value, "8", "min(rate, 3 + 5), as Redisson's formula");
    let log: Vec<(Vec<u8>, f64)> = raw.zrange_withscores("{release}:permits", 0, -1).await.unwrap();
    let permits: Vec<(u32, u64)> = log
        .iter()
        .map(|(m, s)| {
            (
                u32::from_le_bytes(m[m.len() - 4..].try_into().unwrap()),
                *s as u64,
            )
        })
        .collect();
    assert_eq!(
        permits,
        [(2, T0)],
        "the newest grant went, the older one shrank by 2"
    );
    assert_eq!(
        java_available_permits(&mut raw, "release", clock.now_ms()).await,
        8
    );
    // When the shrunk grant leaves, the limiter is full: not 10 + 5.
    clock.advance(MIN);
    assert_eq!(limiter.available_permits().await.unwrap(), 10);
    assert_eq!(
        java_available_permits(&mut raw, "release", clock.now_ms()).await,
        10
    );
    // More than was taken: capped at the rate. 0 does nothing.
    limiter.release(50).await.unwrap();
    assert_eq!(limiter.available_permits().await.unwrap(), 10);
    limiter.release(0).await.unwrap();
    let err = client.rate_limiter("release:none").release(1).await.unwrap_err();
    assert!(matches!(err, Error::NotInitialized { .. }), "{err:?}");

    // A Java client's release (value = min(rate, value + n), log untouched) is state
    // redlimit continues from as Redisson would: the permits are available at once.
    let _: () = raw.del("{release}:value").await.unwrap();
    assert!(limiter.try_acquire(6).await.unwrap());
    let value: i64 = raw.get("{release}:value").await.unwrap();
    let _: () = raw.set("{release}:value", (value + 6).min(10)).await.unwrap();
    assert_eq!(limiter.available_permits().await.unwrap(), 10);
}

/// Members of 0 permits (Redisson's `tryAcquire(0)` logs one when the value is not
/// negative) hold none: a release passes them to the grants that hold its permits, and
/// removes them. Before, it read as many of the newest
/// members as the permits it gave back: 7 of 8 past one of 0 permits, 0 of 8 past
/// eight.
#[tokio::test]
async fn release_passes_members_of_no_permits() {
    let (_server, client, clock, mut raw) = setup().await;
    for zeros in [1u8, 8, 40] {
        let name = format!("zeros:{zeros}");
        let limiter = client.rate_limiter(&name);
        limiter.try_set_rate(RateType::Overall, 10, MIN).await.unwrap();
        for _ in 0..8 {
            assert!(limiter.try_acquire(1).await.unwrap());
        }
        clock.advance(Duration::from_secs(1));
        for id in 0..zeros {
            let _: () = raw
                .zadd(format!("{{{name}}}:permits"), member(id, 0), clock.now_ms())
                .await
                .unwrap();
        }
        limiter.release(8).await.unwrap();
        let value: String = raw.get(format!("{{{name}}}:value")).await.unwrap();
        assert_eq!(value, "10", "{zeros}: min(rate, 2 + 8), as Redisson's formula");
        let log: Vec<Vec<u8>> = raw.zrange(format!("{{{name}}}:permits"), 0, -1).await.unwrap();
        assert!(
            log.is_empty(),
            "{zeros}: the grants taken and the empty members gone: {log:?}"
        );
        assert_eq!(java_available_permits(&mut raw, &name, clock.now_ms()).await, 10);
        // Nothing comes back twice when the window passes.
        clock.advance(MIN);
        assert_eq!(limiter.available_permits().await.unwrap(), 10, "{zeros}");
    }
}

/// A release of more than the rate gives back what the window holds, on both backends
/// (on Redis the count reached the script's range query as a float, `1e+19`, and the
/// release failed with Redis's "not an integer"); shrinking the log's only grant keeps
/// the log's expiry (it removed the grant first, which deleted the key, and the shrunk
/// grant made it again without one).
#[tokio::test]
async fn a_release_past_the_rate_and_of_the_only_grant() {
    let (_server, client, _clock, mut raw) = setup().await;
    let memory = Client::builder().memory();
    for client in [&client, &memory] {
        let limiter = client.rate_limiter("past");
        limiter.try_set_rate(RateType::Overall, 10, MIN).await.unwrap();
        assert!(limiter.try_acquire(4).await.unwrap());
        limiter.release(u64::MAX).await.unwrap();
        assert_eq!(limiter.available_permits().await.unwrap(), 10);
        assert!(limiter.try_acquire(10).await.unwrap(), "10, not more");
        assert!(!limiter.try_acquire(1).await.unwrap());
    }
    let log: Vec<Vec<u8>> = raw.zrange("{past}:permits", 0, -1).await.unwrap();
    assert_eq!(log.len(), 1, "the grant of 10 alone");
    // A config without an expiry and a keep-alive of 0: the log keeps its own.
    let limiter = client.rate_limiter("only");
    limiter.try_set_rate(RateType::Overall, 10, MIN).await.unwrap();
    assert!(limiter.try_acquire(5).await.unwrap());
    let _: () = raw.pexpire("{only}:permits", 400_000).await.unwrap();
    limiter.release(2).await.unwrap();
    let ttl = pttl(&mut raw, "{only}:permits").await;
    assert!(ttl > 390_000 && ttl <= 400_000, "{ttl}");
    let log: Vec<Vec<u8>> = raw.zrange("{only}:permits", 0, -1).await.unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(
        u32::from_le_bytes(log[0][log[0].len() - 4..].try_into().unwrap()),
        3
    );
}

/// release.lua joined from the files its `-- Recipe:` line names (the runtime's own
/// tests hold that line to the recipe it sends), to call with what no client sends.
fn release_by_hand() -> redis::Script {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("runtime/lua");
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap();
    let own = read("release.lua");
    let recipe = own
        .lines()
        .find_map(|line| line.strip_prefix("-- Recipe: "))
        .unwrap();
    redis::Script::new(&recipe.split(", ").map(read).collect::<String>())
}

#[tokio::test]
async fn a_release_of_a_count_that_is_not_one_is_refused_before_writing() {
    let (_server, client, clock, mut raw) = setup().await;
    let limiter = client.rate_limiter("hand");
    limiter.try_set_rate(RateType::Overall, 10, MIN).await.unwrap();
    assert!(limiter.try_acquire(4).await.unwrap());
    // A grant of 1 gone from the window: a release removes it, once its count is read.
    let _: () = raw
        .zadd("{hand}:permits", member(3, 1), T0 - 120_000)
        .await
        .unwrap();
    let now = clock.now_ms().to_string();
    let script = release_by_hand();
    let release = |count: &str| {
        let mut call = script.key("hand");
        call.key("{hand}:value")
            .key("{hand}:value:x")
            .key("{hand}:permits");
        call.key("{hand}:permits:x").arg(count).arg(&now);
        call
    };
    let before = dumps(&mut raw, "hand").await;
    // Counts Redis would read as ranges of floats, of none or of the whole log, or as
    // a negative release that takes permits; a count the client sends is a decimal
    // above 0, without sign or leading zero.
    for count in [
        "0", "-1", "-0", "00", "01", "+1", "1.5", "1e17", "0x10", "inf", "-inf", "nan", " 1", "1 ", "abc", "",
    ] {
        let failed = release(count).invoke_async::<i64>(&mut raw).await.unwrap_err();
        assert!(
            failed.to_string().contains("bad_argument:1 permits"),
            "{count:?}: {failed}"
        );
        assert_eq!(dumps(&mut raw, "hand").await, before, "{count:?} wrote");
    }
    assert_eq!(release("3").invoke_async::<i64>(&mut raw).await.unwrap(), 10);
}

#[tokio::test]
async fn release_on_the_in_process_backend_matches() {
    let clock = ManualClock::new(T0);
    let client = Client::builder().clock(clock.clone()).memory();
    let limiter = client.rate_limiter("release");
    limiter.try_set_rate(RateType::Overall, 10, MIN).await.unwrap();
    assert!(limiter.try_acquire(4).await.unwrap());
    clock.advance(Duration::from_secs(1));
    assert!(limiter.try_acquire(3).await.unwrap());
    limiter.release(5).await.unwrap();
    assert_eq!(limiter.available_permits().await.unwrap(), 8);
    // The remaining 2 permits leave with the first grant's time.
    clock.advance(Duration::from_secs(59));
    assert_eq!(limiter.available_permits().await.unwrap(), 10);
}

/// DUMP of every key of `name` (overall mode), to compare before and after.
async fn dumps(raw: &mut MultiplexedConnection, name: &str) -> Vec<Option<Vec<u8>>> {
    let mut out = Vec::new();
    for key in [
        name.to_owned(),
        format!("{{{name}}}:value"),
        format!("{{{name}}}:permits"),
    ] {
        out.push(redis::cmd("DUMP").arg(&key).query_async(raw).await.unwrap());
    }
    out
}

#[tokio::test]
async fn release_and_update_fail_before_writing_on_a_log_that_does_not_decode() {
    let (_server, client, clock, mut raw) = setup().await;
    let limiter = client.rate_limiter("broken");
    let config = RateLimiterConfig::new(RateType::Overall, 10, MIN).with_keep_alive(MIN);
    limiter.try_set_config(&config).await.unwrap();
    assert!(limiter.try_acquire(2).await.unwrap());
    // An entry that has left the window (the first thing an update or a release would
    // remove) and, the newest grant (the first a release takes permits from), one that
    // does not decode (Redisson 3.13-3.16's layout).
    let _: () = raw
        .zadd("{broken}:permits", member(3, 1), T0 - 120_000)
        .await
        .unwrap();
    let _: () = raw
        .zadd(
            "{broken}:permits",
            &b"\x00\x00\x80?\x01\x00\x00\x00"[..],
            T0 + 500,
        )
        .await
        .unwrap();
    clock.advance(Duration::from_secs(1));
    let before = dumps(&mut raw, "broken").await;
    let err = limiter.release(1).await.unwrap_err();
    assert!(matches!(err, Error::CorruptMember { .. }), "{err:?}");
    assert_eq!(dumps(&mut raw, "broken").await, before, "release wrote nothing");
    let err = limiter
        .update_config(&RateLimiterConfig::new(RateType::Overall, 5, MIN).with_keep_alive(MIN))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::CorruptMember { .. }), "{err:?}");
    assert_eq!(
        dumps(&mut raw, "broken").await,
        before,
        "update_rate wrote nothing"
    );
    // Restarting the window repairs it.
    limiter.set_config(&config).await.unwrap();
    assert!(limiter.try_acquire(1).await.unwrap());
}

/// Every decision by a rule refreshes the keep-alive of all three keys, the usual
/// call (config already stored) included, granted or refused; with no keep-alive the
/// value and log take the config's own TTL.
#[tokio::test]
async fn every_rule_decision_refreshes_the_three_ttls() {
    let (_server, client, _clock, mut raw) = setup().await;
    let keys = ["ttl:rule", "{ttl:rule}:value", "{ttl:rule}:permits"];
    // every refusal asked of Redis (a refusal answered in process leaves the TTLs
    // where Redis last set them)
    let rule = [Rule::new("ttl:rule", 1, MIN).local_refusals(false)];
    assert!(
        client.check_rules(&rule).await.unwrap().allowed,
        "creates the config"
    );
    for granted in [false, false] {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(client.check_rules(&rule).await.unwrap().allowed, granted);
        for key in keys {
            let ttl = pttl(&mut raw, key).await;
            assert!(ttl > 59_800, "{key}: refreshed by the last decision, {ttl}");
        }
    }
    // No keep-alive: the config's own TTL (set by hand, as an operator might) passes
    // to the value and the log.
    let plain = [Rule::new("ttl:plain_rule", 5, MIN).keep_alive(None)];
    assert!(client.check_rules(&plain).await.unwrap().allowed);
    let _: () = raw.pexpire("ttl:plain_rule", 90_000).await.unwrap();
    assert!(client.check_rules(&plain).await.unwrap().allowed);
    for key in ["{ttl:plain_rule}:value", "{ttl:plain_rule}:permits"] {
        let ttl = pttl(&mut raw, key).await;
        assert!(ttl > 89_000 && ttl <= 90_000, "{key}: {ttl}");
    }
}
