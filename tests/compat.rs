//! Redisson compatibility: the keys the runtime writes, read with plain Redis commands;
//! state written the way Redisson writes it, continued by the runtime; and foreign or
//! corrupted state, reported as clear errors that leave the keys untouched.

use redlimit_test_support as support;

use std::collections::HashMap;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use redlimit::{Client, Error, ManualClock, RateType, Rule};
use support::{redisson_member, RedisServer};

const T0: u64 = 1_700_000_000_000;
const SEC: Duration = Duration::from_secs(1);

async fn setup() -> (RedisServer, Client, ManualClock, MultiplexedConnection) {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let (client, raw) = server.clocked_client(&clock).await;
    (server, client, clock, raw)
}

async fn key_type(raw: &mut MultiplexedConnection, key: &str) -> String {
    redis::cmd("TYPE").arg(key).query_async(raw).await.unwrap()
}

#[tokio::test]
async fn keys_written_match_the_redisson_layout() {
    let (_server, client, clock, mut raw) = setup().await;
    let limiter = client.rate_limiter("rate_limit:user:42");
    limiter
        .try_set_rate(RateType::Overall, 10, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(limiter.try_acquire(1).await.unwrap());
    clock.advance(Duration::from_millis(7));
    assert!(limiter.try_acquire(3).await.unwrap());

    let config: HashMap<String, String> = raw.hgetall("rate_limit:user:42").await.unwrap();
    let expected: HashMap<String, String> = [
        ("rate", "10"),
        ("interval", "60000"),
        ("type", "0"),
        ("keepAliveTime", "0"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    assert_eq!(config, expected);
    assert_eq!(key_type(&mut raw, "rate_limit:user:42").await, "hash");
    assert_eq!(key_type(&mut raw, "{rate_limit:user:42}:value").await, "string");
    assert_eq!(key_type(&mut raw, "{rate_limit:user:42}:permits").await, "zset");
    let value: String = raw.get("{rate_limit:user:42}:value").await.unwrap();
    assert_eq!(value, "6");

    let log: Vec<(Vec<u8>, f64)> = raw
        .zrange_withscores("{rate_limit:user:42}:permits", 0, -1)
        .await
        .unwrap();
    assert_eq!(log.len(), 2);
    for ((member, score), (permits, at)) in log.iter().zip([(1u32, T0), (3, T0 + 7)]) {
        assert_eq!(member.len(), 21, "1 length byte, 16 random bytes, 4 permit bytes");
        assert_eq!(member[0], 16);
        assert_eq!(&member[17..], &permits.to_le_bytes());
        assert_eq!(*score, at as f64);
    }
    assert_ne!(log[0].0[1..17], log[1].0[1..17], "random ids differ");

    // No other keys: exactly Redisson's three for an overall limiter.
    let mut keys: Vec<String> = raw.keys("*").await.unwrap();
    keys.sort();
    assert_eq!(
        keys,
        [
            "rate_limit:user:42",
            "{rate_limit:user:42}:permits",
            "{rate_limit:user:42}:value"
        ]
    );
}

#[tokio::test]
async fn members_decode_like_the_lua_struct_library() {
    let (_server, _client, _clock, mut raw) = setup().await;
    // Redis's own struct.pack, as Redisson's scripts call it.
    let packed: Vec<u8> = redis::cmd("EVAL")
        .arg("return struct.pack('Bc0I', string.len(ARGV[1]), ARGV[1], ARGV[2])")
        .arg(0)
        .arg("0123456789abcdef")
        .arg(70_000)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(packed, redisson_member(b"0123456789abcdef", 70_000));
    assert_eq!(redlimit::member::decode_permits(&packed), Some(70_000));
}

#[tokio::test]
async fn per_client_keys_carry_the_client_id() {
    let (_server, client, _clock, mut raw) = setup().await;
    let rule = Rule::new("rate_limit:pc", 5, SEC).mode(RateType::PerClient);
    assert!(client.check_rules(&[rule]).await.unwrap().allowed);
    let id = client.client_id();
    assert_eq!(id.len(), 36);
    assert!(id.chars().all(|c| c.is_ascii_hexdigit() || c == '-'));
    assert_eq!(id.as_bytes()[14], b'4', "UUID version 4");
    let mut keys: Vec<String> = raw.keys("*").await.unwrap();
    keys.sort();
    assert_eq!(
        keys,
        [
            "rate_limit:pc".to_owned(),
            format!("{{rate_limit:pc}}:permits:{id}"),
            format!("{{rate_limit:pc}}:value:{id}"),
        ]
    );
    let config: HashMap<String, String> = raw.hgetall("rate_limit:pc").await.unwrap();
    assert_eq!(config["type"], "1");
    assert_eq!(config["keepAliveTime"], "1000");
    for key in keys {
        let ttl: i64 = raw.pttl(&key).await.unwrap();
        assert!((1..=1000).contains(&ttl), "{key}: keep-alive applied, {ttl}");
    }
}

#[tokio::test]
async fn continues_from_state_redisson_wrote() {
    let (_server, client, clock, mut raw) = setup().await;
    // What Redisson 3.24 leaves after three grants: no keepAliveTime field, a value,
    // and a log with 21-byte members (and one 13-byte member from 3.17-3.20).
    let _: () = redis::cmd("HSET")
        .arg("orders")
        .arg(&["rate", "5", "interval", "1000", "type", "0"])
        .query_async(&mut raw)
        .await
        .unwrap();
    let _: () = raw.set("{orders}:value", "1").await.unwrap();
    let _: () = raw
        .zadd("{orders}:permits", redisson_member(&[7; 16], 2), T0 - 600)
        .await
        .unwrap();
    let _: () = raw
        .zadd("{orders}:permits", redisson_member(&[9; 8], 1), T0 - 300)
        .await
        .unwrap();
    let _: () = raw
        .zadd("{orders}:permits", redisson_member(&[8; 16], 1), T0 - 100)
        .await
        .unwrap();

    let limiter = client.rate_limiter("orders");
    let config = limiter.config().await.unwrap().unwrap();
    assert_eq!(
        (config.rate, config.interval, config.rate_type, config.keep_alive),
        (5, SEC, RateType::Overall, None)
    );
    assert_eq!(limiter.available_permits().await.unwrap(), 1);
    let refused = limiter.check(2).await.unwrap();
    assert!(!refused.allowed);
    assert_eq!(
        refused.retry_after,
        Some(Duration::from_millis(400)),
        "the 2-permit grant at T0-600 leaves at T0+400"
    );
    assert!(limiter.try_acquire(1).await.unwrap());
    clock.advance(Duration::from_millis(400));
    assert_eq!(limiter.available_permits().await.unwrap(), 2);
    assert!(limiter.try_acquire(2).await.unwrap());
    let value: String = raw.get("{orders}:value").await.unwrap();
    assert_eq!(value, "0");
    let log: usize = raw.zcard("{orders}:permits").await.unwrap();
    assert_eq!(log, 4, "the released entry left the log; ours were added");
}

/// Redisson's `tryAcquire(0)` logs an entry of no permits. Among the oldest entries of
/// a full window, such entries do not stretch a refusal's wait to the newest entry's
/// leaving: the wait is the moment the oldest grant that holds a permit leaves, for a
/// call of one rule (`acquire_plain.lua`) and of a rule beside a token bucket
/// (`acquire.lua`). Read to the newest, a refusal kept in process locked this client
/// out for 5 s more than Redis did. The walk stays 64 entries: behind 70 such entries,
/// the wait is the newest's leaving, never shorter than exact.
#[tokio::test]
async fn entries_of_no_permits_do_not_stretch_a_refusal_s_wait() {
    let (_server, client, clock, mut raw) = setup().await;
    for (zeros, wait) in [(3, 4_980), (70, 9_980)] {
        for with_bucket in [false, true] {
            let name = format!("rate_limit:zero:{zeros}:{with_bucket}");
            let log = format!("{{{name}}}:permits");
            let window = Rule::new(name.as_str(), 5, Duration::from_secs(10));
            let mut rules = vec![window.clone()];
            if with_bucket {
                let bucket = Rule::new(format!("{name}:bucket"), 1_000, Duration::from_secs(10))
                    .algorithm(redlimit::Algorithm::TokenBucket);
                rules.insert(0, bucket);
            }
            clock.set(T0);
            let first = client.check_rules(std::slice::from_ref(&window)).await.unwrap();
            assert!(first.allowed);
            // Java's tryAcquire(0) before that grant, then the window filled at T0 + 100.
            for i in 0..zeros {
                let member = redisson_member(&[b'z', i as u8], 0);
                let _: () = raw.zadd(&log, member, T0 - zeros + i).await.unwrap();
            }
            clock.set(T0 + 100);
            for _ in 0..4 {
                assert!(client.check_rules(&rules).await.unwrap().allowed);
            }
            let last = redisson_member(b"zlast", 0);
            let _: () = raw.zadd(&log, last, T0 + 5_000).await.unwrap();
            clock.set(T0 + 5_020);
            let refused = client.check_rules(&rules).await.unwrap();
            let case = format!("{zeros} entries of no permits, a bucket beside: {with_bucket}");
            assert!(!refused.allowed, "{case}");
            assert_eq!(refused.retry_after, Some(Duration::from_millis(wait)), "{case}");
        }
    }
}

/// A Redisson 3.x service's `setRate` to a longer interval, on a limiter a rule of a
/// shorter one made, leaves the rule's `keepAliveTime` (1 s under an interval of 60 s),
/// which 3.x does not know. Each call after keeps every key at least the interval:
/// before, the keys went a second after the last call, and the window with them (Java
/// and a Rust handle took 10 at 5 per 60 s). Redisson 4.x writes `keepAliveTime` 0 and
/// keeps the config's TTL, which is then a deadline, as an `expire`'s: copied onto the
/// other keys, not put off.
#[tokio::test]
async fn a_keep_alive_left_shorter_than_the_interval_keeps_the_window() {
    let (_server, client, _clock, mut raw) = setup().await;
    for (version, keep) in [("3.24", "1000"), ("4.7", "0")] {
        let name = format!("rate_limit:left:{version}");
        let keys = [
            name.clone(),
            format!("{{{name}}}:value"),
            format!("{{{name}}}:permits"),
        ];
        let fields = [
            "rate",
            "5",
            "interval",
            "60000",
            "type",
            "0",
            "keepAliveTime",
            keep,
        ];
        let _: () = redis::cmd("HSET")
            .arg(&name)
            .arg(&fields)
            .query_async(&mut raw)
            .await
            .unwrap();
        let _: () = redis::cmd("PEXPIRE")
            .arg(&name)
            .arg(1_000)
            .query_async(&mut raw)
            .await
            .unwrap();
        let limiter = client.rate_limiter(&name);
        for _ in 0..5 {
            assert!(limiter.try_acquire(1).await.unwrap(), "{version}");
        }
        for key in &keys {
            let ttl: i64 = raw.pttl(key).await.unwrap();
            match keep {
                "0" => assert!((1..=1_000).contains(&ttl), "{version}: {key}: {ttl} ms"),
                _ => assert!(ttl > 59_000, "{version}: {key} kept {ttl} ms"),
            }
        }
    }
    // A second and a half later (the keep-alive left behind): the 3.x window is still
    // full; the 4.x limiter went at its deadline.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let limiter = client.rate_limiter("rate_limit:left:3.24");
    assert!(!limiter.try_acquire(1).await.unwrap(), "the window forgotten");
    let gone = client.rate_limiter("rate_limit:left:4.7").try_acquire(1).await;
    assert!(matches!(gone, Err(Error::NotInitialized { .. })), "{gone:?}");
}

/// The same left `keepAliveTime`, met by a settle made after its grant left the window
/// (an excess charged late): the settle's TTL rule reads the stored config's interval,
/// not the grant's, and keeps every key the minute. With the grant's (1 s), the settle
/// put the second back on every key.
#[tokio::test]
async fn a_late_settle_keeps_the_window_of_a_longer_interval_set_since() {
    let (_server, client, clock, mut raw) = setup().await;
    let name = "rate_limit:left:settle";
    let rule = Rule::new(name, 5, SEC).settled();
    let reservation = match client.reserve(std::slice::from_ref(&rule)).await.unwrap() {
        redlimit::Reserved::Granted(reservation) => reservation,
        refused => panic!("{refused:?}"),
    };
    // Redisson 3.24's setRate to 5 a minute: the fields it knows, `keepAliveTime` left.
    let _: () = redis::cmd("HSET")
        .arg(name)
        .arg(&["rate", "5", "interval", "60000", "type", "0"])
        .query_async(&mut raw)
        .await
        .unwrap();
    // (past the minute on the client's clock; a moment on Redis's, which keeps the TTLs)
    clock.advance(Duration::from_secs(61));
    let settled = reservation.settle(3).await.unwrap();
    assert!(settled.rules[0].applied, "the excess charged late");
    for key in [
        name,
        "{rate_limit:left:settle}:value",
        "{rate_limit:left:settle}:permits",
    ] {
        let ttl: i64 = raw.pttl(key).await.unwrap();
        assert!(ttl > 59_000, "{key} kept {ttl} ms");
    }
}

#[tokio::test]
async fn a_deleted_value_is_rebuilt_from_the_log_without_over_granting() {
    let (_server, client, clock, mut raw) = setup().await;
    let limiter = client.rate_limiter("rate_limit:lost");
    limiter.try_set_rate(RateType::Overall, 3, SEC).await.unwrap();
    assert!(limiter.try_acquire(2).await.unwrap());
    let _: () = raw.del("{rate_limit:lost}:value").await.unwrap();
    assert!(limiter.try_acquire(1).await.unwrap());
    assert!(
        !limiter.try_acquire(1).await.unwrap(),
        "the log still holds 3 permits"
    );
    // A lost log with a surviving value is repaired too: the log is the authority.
    clock.advance(Duration::from_millis(10));
    let _: () = raw.del("{rate_limit:lost}:permits").await.unwrap();
    assert!(limiter.try_acquire(3).await.unwrap());
    assert!(!limiter.try_acquire(1).await.unwrap());
    let value: String = raw.get("{rate_limit:lost}:value").await.unwrap();
    assert_eq!(
        value, "0",
        "the rebuilt value less the grant: value + permits in the log = rate"
    );
    // A full limiter whose log is lost, asked for one permit: the rebuilt value is
    // written whole (3 - 1), not spent from the stale one (0 - 1).
    let full = client.rate_limiter("rate_limit:lost:full");
    full.try_set_rate(RateType::Overall, 3, SEC).await.unwrap();
    for _ in 0..3 {
        assert!(full.try_acquire(1).await.unwrap());
    }
    let _: () = raw.del("{rate_limit:lost:full}:permits").await.unwrap();
    assert!(full.try_acquire(1).await.unwrap());
    let value: String = raw.get("{rate_limit:lost:full}:value").await.unwrap();
    assert_eq!(value, "2", "value + permits in the log = rate");
    // A value inflated by hand is recounted by permits when grants are released.
    let _: () = raw.set("{rate_limit:lost}:value", "50").await.unwrap();
    clock.advance(SEC);
    assert_eq!(limiter.available_permits().await.unwrap(), 3);
}

/// A value above the rate, which no grant, give-back or settle leaves (Redisson caps
/// its value at the rate too), is rebuilt from the log at the next call, whether or
/// not a grant left the window: one rule (the usual call's script), two rules (the
/// general one) and Redisson's own `try_acquire` each grant what the log leaves, never
/// the inflated value (1 001 of 2 001 calls granted with `1000`, every call with
/// `99999999999999999`, before).
#[tokio::test]
async fn a_value_above_the_rate_is_rebuilt_from_the_log() {
    let (server, _, clock, mut raw) = setup().await;
    // every call asked of Redis: no refusal answered again in process
    let client = Client::builder()
        .clock(clock.clone())
        .local_refusals(false)
        .connect(&server.url())
        .await
        .unwrap();
    let minute = Duration::from_secs(60);
    for (case, inflated) in [("one", "1000"), ("two", "1000"), ("handle", "99999999999999999")] {
        let name = format!("rate_limit:inflated:{case}");
        let value_key = format!("{{{name}}}:value");
        let rule = Rule::new(&name, 10, minute);
        let other = Rule::new(format!("rate_limit:inflated:{case}:wide"), 1_000_000, minute);
        let rules: Vec<Rule> = match case {
            "two" => vec![rule, other],
            _ => vec![rule],
        };
        for _ in 0..3 {
            assert!(client.check_rules(&rules).await.unwrap().allowed);
        }
        // 3 in the log before the first value, all 10 after it
        for (value, left) in [(inflated, 7), ("99999999999999999", 0)] {
            let _: () = raw.set(&value_key, value).await.unwrap();
            let mut granted = 0;
            for _ in 0..50 {
                let allowed = match case {
                    "handle" => client.rate_limiter(&name).try_acquire(1).await.unwrap(),
                    _ => client.check_rules(&rules).await.unwrap().allowed,
                };
                granted += u32::from(allowed);
            }
            assert_eq!(granted, left, "{case}, value {value}");
        }
        let value: String = raw.get(&value_key).await.unwrap();
        assert_eq!(value, "0", "{case}: value + permits in the log = rate");
    }
}

/// A window's count or config field past 2^53 (another program's, or a hand's) is not
/// read rounded. A count past 2^53 is above any rate: a call and a release rebuild it
/// from the log, and a settle leaves it for the next call to. A config field past 2^53 is refused as
/// corrupt by the scripts and by the Rust reading alike (which also refused no `+`).
/// Read rounded, 9007199254740993 over a log of 2^32 - 1 permits at a rate of 2^53 was
/// taken for 2^53: 2^32 - 1 permits granted past the log.
#[tokio::test]
async fn a_count_or_config_past_2_53_is_not_read_rounded() {
    let (_server, client, _clock, mut raw) = setup().await;
    let (most, rate) = (u64::from(u32::MAX), 1_u64 << 53);
    let minute = Duration::from_secs(60);
    for (case, text) in [
        ("call", "9007199254740993"),
        ("zeros", "09007199254740993"),
        ("settle", "9007199254740993"),
        ("release", "9007199254740993"),
    ] {
        let name = format!("rate_limit:past:{case}");
        let value_key = format!("{{{name}}}:value");
        let rule = Rule::new(&name, rate, minute);
        assert!(
            client
                .check_rules(&[rule.clone().permits(most)])
                .await
                .unwrap()
                .allowed
        );
        if case == "settle" {
            let reserved = client
                .reserve(&[rule.clone().settled().permits(10)])
                .await
                .unwrap();
            let redlimit::Reserved::Granted(reservation) = reserved else {
                panic!("refused");
            };
            let _: () = raw.set(&value_key, text).await.unwrap();
            reservation.settle(0).await.unwrap();
            let value: String = raw.get(&value_key).await.unwrap();
            assert_eq!(value, text, "the settle left it as it was");
        } else {
            let _: () = raw.set(&value_key, text).await.unwrap();
        }
        // (a release gives one permit of the log's grant back, from the log's count)
        let mut left = rate - 2 * most;
        if case == "release" {
            client.rate_limiter(&name).release(1).await.unwrap();
            left += 1;
        }
        let next = client.check_rules(&[rule.permits(most)]).await.unwrap();
        assert_eq!(next.remaining, left, "{case}: rebuilt from the log");
    }
    for (field, text) in [
        ("rate", "9007199254740993"),
        ("interval", "09007199254740993"),
        ("keepAliveTime", "9007199254740993"),
        ("rate", "+5"),
    ] {
        let name = format!("rate_limit:past:{field}:{text}");
        let limiter = client.rate_limiter(&name);
        assert!(limiter.try_set_rate(RateType::Overall, 5, minute).await.unwrap());
        let _: () = raw.hset(&name, field, text).await.unwrap();
        let read = limiter.config().await;
        assert!(
            matches!(read, Err(Error::CorruptConfig { .. })),
            "{field}={text}: {read:?}"
        );
        let called = limiter.try_acquire(1).await;
        assert!(
            matches!(called, Err(Error::CorruptConfig { .. })),
            "{field}={text}: {called:?}"
        );
        // (release.lua checks a config it writes beside as lib/stored_config.lua does)
        let released = limiter.release(1).await;
        assert!(
            matches!(released, Err(Error::CorruptConfig { .. })),
            "{field}={text}: {released:?}"
        );
    }
}

/// Every key of limiter `name` as this client sees it, serialised (DUMP), to show an
/// error left them exactly as they were.
async fn snapshot(raw: &mut MultiplexedConnection, client: &Client, name: &str) -> Vec<Option<Vec<u8>>> {
    let keys = client.rate_limiter(name).keys().unwrap().all();
    let mut dumps = Vec::new();
    for key in keys {
        let dump: Option<Vec<u8>> = redis::cmd("DUMP").arg(&key).query_async(raw).await.unwrap();
        dumps.push(dump);
    }
    dumps
}

#[tokio::test]
async fn foreign_or_corrupted_state_gives_errors_naming_the_key() {
    let (_server, client, _clock, mut raw) = setup().await;
    let rule = |name: &str| [Rule::new(name, 5, SEC)];

    let _: () = raw.set("wrong", "a string").await.unwrap();
    let before = snapshot(&mut raw, &client, "wrong").await;
    let err = client.check_rules(&rule("wrong")).await.unwrap_err();
    assert_eq!(
        snapshot(&mut raw, &client, "wrong").await,
        before,
        "wrong type: untouched"
    );
    assert!(
        matches!(&err, Error::WrongType { key, role: "config", .. } if key == "wrong"),
        "{err:?}"
    );
    assert!(err.to_string().contains("`wrong`"), "{err}");
    let err = client.rate_limiter("wrong").config().await.unwrap_err();
    assert!(
        matches!(&err, Error::WrongType { key, .. } if key == "wrong"),
        "{err:?}"
    );

    let _: () = raw
        .hset_multiple(
            "log_is_hash",
            &[("rate", "5"), ("interval", "1000"), ("type", "0")],
        )
        .await
        .unwrap();
    let _: () = raw.hset("{log_is_hash}:permits", "x", "y").await.unwrap();
    client
        .rate_limiter("log_is_hash")
        .set_rate(RateType::Overall, 5, SEC)
        .await
        .unwrap();
    let _: () = raw.hset("{log_is_hash}:permits", "x", "y").await.unwrap();
    let before = snapshot(&mut raw, &client, "log_is_hash").await;
    let err = client
        .rate_limiter("log_is_hash")
        .try_acquire(1)
        .await
        .unwrap_err();
    assert_eq!(
        snapshot(&mut raw, &client, "log_is_hash").await,
        before,
        "log of the wrong type: untouched"
    );
    assert!(
        matches!(&err, Error::WrongType { key, role: "permits", .. } if key == "{log_is_hash}:permits"),
        "{err:?}"
    );

    let _: () = redis::cmd("HSET")
        .arg("garbage")
        .arg(&["rate", "ten", "interval", "1000", "type", "0"])
        .query_async(&mut raw)
        .await
        .unwrap();
    let before = snapshot(&mut raw, &client, "garbage").await;
    let err = client.rate_limiter("garbage").try_acquire(1).await.unwrap_err();
    assert!(
        matches!(&err, Error::CorruptConfig { key, field: "rate", value } if key == "garbage" && value == "ten"),
        "{err:?}"
    );
    let err = client.rate_limiter("garbage").config().await.unwrap_err();
    assert!(
        matches!(&err, Error::CorruptConfig { field: "rate", .. }),
        "{err:?}"
    );
    let err = client.check_rules(&rule("garbage")).await.unwrap_err();
    assert!(matches!(&err, Error::CorruptConfig { .. }), "{err:?}");
    assert_eq!(
        snapshot(&mut raw, &client, "garbage").await,
        before,
        "garbage config: untouched"
    );

    let limiter = client.rate_limiter("bad_value");
    limiter.try_set_rate(RateType::Overall, 5, SEC).await.unwrap();
    let _: () = raw.set("{bad_value}:value", "lots").await.unwrap();
    let before = snapshot(&mut raw, &client, "bad_value").await;
    let err = limiter.try_acquire(1).await.unwrap_err();
    assert_eq!(
        snapshot(&mut raw, &client, "bad_value").await,
        before,
        "bad value: untouched"
    );
    assert!(
        matches!(&err, Error::CorruptValue { key, value } if key == "{bad_value}:value" && value == "lots"),
        "{err:?}"
    );

    let limiter = client.rate_limiter("old_members");
    limiter.try_set_rate(RateType::Overall, 5, SEC).await.unwrap();
    assert!(limiter.try_acquire(1).await.unwrap());
    // Redisson 3.13-3.16 wrote "fI"-packed members that do not decode as Bc0I.
    let _: () = raw
        .zadd(
            "{old_members}:permits",
            &b"\x00\x00\x80?\x01\x00\x00\x00"[..],
            T0 - 5_000,
        )
        .await
        .unwrap();
    let before: Vec<(Vec<u8>, f64)> = raw
        .zrange_withscores("{old_members}:permits", 0, -1)
        .await
        .unwrap();
    let err = limiter.try_acquire(1).await.unwrap_err();
    assert!(
        matches!(&err, Error::CorruptMember { key, .. } if key == "{old_members}:permits"),
        "{err:?}"
    );
    assert!(err.to_string().contains("does not decode"), "{err}");
    let after: Vec<(Vec<u8>, f64)> = raw
        .zrange_withscores("{old_members}:permits", 0, -1)
        .await
        .unwrap();
    assert_eq!(before, after, "an error leaves the state as it was");
    let value: String = raw.get("{old_members}:value").await.unwrap();
    assert_eq!(value, "4");
}

/// A config field of any bytes or length (another program's, or a hand's) is named
/// corrupt in a short line, by every path that reads it, and nothing is written: the
/// handle's `config` quoted it whole (a 1 MB rate, a 1 MB error), and `keep_alive`
/// never checked it (an interval of spaces and digits passed Lua's `tonumber` and was
/// called too short; one of letters let it write keepAliveTime beside it).
#[tokio::test]
async fn a_config_of_any_bytes_or_length_is_named_corrupt_in_a_short_line() {
    let (_server, client, _clock, mut raw) = setup().await;
    let (digits, spaced) = ("9".repeat(1 << 20), format!("{}100000", " ".repeat(1 << 20)));
    let fields: [(&str, &[u8]); 4] = [
        ("rate", digits.as_bytes()),
        ("rate", b"\xff\xfe"),
        ("interval", spaced.as_bytes()),
        ("interval", b"ten"),
    ];
    for (i, (field, text)) in fields.into_iter().enumerate() {
        let name = format!("odd_config:{i}");
        let mut config: Vec<(&str, &[u8])> = vec![("rate", b"10"), ("interval", b"1000"), ("type", b"0")];
        config.retain(|(f, _)| f != &field);
        config.push((field, text));
        let _: () = raw.hset_multiple(&name, &config).await.unwrap();
        let before = snapshot(&mut raw, &client, &name).await;
        let limiter = client.rate_limiter(&name);
        let errors = [
            limiter.config().await.unwrap_err(),
            limiter.keep_alive(Duration::from_secs(60)).await.unwrap_err(),
            limiter.try_acquire(1).await.unwrap_err(),
        ];
        for error in errors {
            assert!(
                matches!(&error, Error::CorruptConfig { key, field: f, .. } if *key == name && f == &field),
                "{name}: {error:?}"
            );
            assert!(
                error.to_string().len() < 600,
                "{name}: {} bytes",
                error.to_string().len()
            );
            assert!(format!("{error:?}").len() < 600, "{name}");
        }
        assert_eq!(
            snapshot(&mut raw, &client, &name).await,
            before,
            "{name}: untouched"
        );
    }
}

#[tokio::test]
async fn a_refused_rule_leaves_the_other_rules_keys_unspent() {
    let (_server, client, _clock, mut raw) = setup().await;
    let rules = [Rule::new("first", 5, SEC), Rule::new("second", 1, SEC)];
    assert!(client.check_rules(&rules).await.unwrap().allowed);
    let snapshot = |raw: &mut MultiplexedConnection| {
        let mut raw = raw.clone();
        async move {
            let value: String = raw.get("{first}:value").await.unwrap();
            let log: usize = raw.zcard("{first}:permits").await.unwrap();
            (value, log)
        }
    };
    assert_eq!(snapshot(&mut raw).await, ("4".to_owned(), 1));
    for _ in 0..5 {
        let refused = client.check_rules(&rules).await.unwrap();
        assert_eq!(refused.refused_by, Some(1));
    }
    assert_eq!(snapshot(&mut raw).await, ("4".to_owned(), 1));
}

#[tokio::test]
async fn the_largest_rate_is_stored_with_every_digit() {
    let (_server, client, _clock, mut raw) = setup().await;
    let limiter = client.rate_limiter("huge");
    limiter
        .try_set_rate(RateType::Overall, redlimit::MAX_RATE, SEC)
        .await
        .unwrap();
    assert!(limiter.try_acquire(1).await.unwrap());
    let value: String = raw.get("{huge}:value").await.unwrap();
    assert_eq!(value, (redlimit::MAX_RATE - 1).to_string());
    assert_eq!(limiter.available_permits().await.unwrap(), redlimit::MAX_RATE - 1);
    limiter
        .update_rate(RateType::Overall, redlimit::MAX_RATE - 10, SEC)
        .await
        .unwrap();
    let value: String = raw.get("{huge}:value").await.unwrap();
    assert_eq!(value, (redlimit::MAX_RATE - 11).to_string());
}
