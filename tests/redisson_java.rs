//! Java services on Redisson and Rust services on redlimit sharing limiters, checked
//! with Redisson's own client: `interop/redisson`'s driver runs Redisson 3.24.3 and
//! 4.7.0 in JVMs beside this test (started once per version for the whole file), and
//! every scenario runs on both versions, against a redis-server (or a Redis Cluster) of
//! its own, on the real clock of both sides.
//!
//! Needs `java` (17 or later) and, when the driver's jars are missing or older than its
//! sources, `mvn` and Maven Central (or the dependencies in `~/.m2`): the first test
//! builds them with `mvn -B -q -f interop/redisson/pom.xml package`.

mod support;

#[path = "redisson_java/driver.rs"]
mod driver;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use driver::{Java, Version};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use redlimit::{Client, RateLimiterArgs, RateLimiterConfig, RateType, Rule};
use support::RedisServer;

const SEC: Duration = Duration::from_secs(1);

/// A test per Redisson version for each scenario: `NAME::redisson_3_24_3` and
/// `NAME::redisson_4_7_0`.
macro_rules! on_both_versions {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redisson_3_24_3() {
                super::$name(super::Version::V3).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redisson_4_7_0() {
                super::$name(super::Version::V4).await
            }
        }
    )*};
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

async fn pttl(raw: &mut MultiplexedConnection, key: &str) -> i64 {
    raw.pttl(key).await.unwrap()
}

/// A TTL set to `ms` a moment ago: at most `ms`, and not far below it.
fn fresh_ttl(ttl: i64, ms: i64) -> bool {
    ttl <= ms && ttl > ms - 400
}

/// One server, a redlimit client and a Redisson client on it, and a plain connection.
struct Both {
    _server: RedisServer,
    rust: Client,
    java: Java,
    raw: MultiplexedConnection,
}

async fn both(version: Version) -> Both {
    let server = RedisServer::start();
    let rust = Client::connect(&server.url()).await.unwrap();
    let java = Java::connect(version, &server.url()).await;
    let raw = server.raw().await;
    Both {
        _server: server,
        rust,
        java,
        raw,
    }
}

/// The permits in a log member (its last 4 bytes, little-endian).
fn permits_of(member: &[u8]) -> u64 {
    u64::from(u32::from_le_bytes(member[member.len() - 4..].try_into().unwrap()))
}

/// The log's entries: (score, permits), oldest first.
async fn log(raw: &mut MultiplexedConnection, key: &str) -> Vec<(u64, u64)> {
    let entries: Vec<(Vec<u8>, f64)> = raw.zrange_withscores(key, 0, -1).await.unwrap();
    entries
        .iter()
        .map(|(m, s)| (*s as u64, permits_of(m)))
        .collect()
}

/// The most grants in any window of `length` ms (`times` sorted).
fn busiest(times: &[u64], length: u64) -> usize {
    let mut most = 0;
    let mut start = 0;
    for end in 0..times.len() {
        while times[end] - times[start] >= length {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

// ---------------------------------------------------------------------------------
// Configuring on one side, acquiring on the other.

on_both_versions!(java_configures_rust_acquires, rust_creates_java_acquires);

async fn java_configures_rust_acquires(version: Version) {
    let Both {
        _server, rust, java, mut raw
    } = both(version).await;
    let name = "interop:java-configures";
    assert!(java.boolean("trySetRate", name, &[&"OVERALL", &5, &1000]).await);
    assert!(!java.boolean("trySetRate", name, &[&"OVERALL", &7, &1000]).await, "trySetRate takes effect once");
    let limiter = rust.rate_limiter(name);
    let config = limiter.config().await.unwrap().unwrap();
    assert_eq!((config.rate_type, config.rate, config.interval, config.keep_alive), (RateType::Overall, 5, SEC, None));
    for i in 0..5 {
        assert!(limiter.try_acquire(1).await.unwrap(), "grant {i}");
    }
    let refused = limiter.check(1).await.unwrap();
    assert!(!refused.allowed);
    let wait = refused.retry_after.unwrap();
    assert!(wait <= SEC && wait > SEC - Duration::from_millis(300), "{wait:?}");
    assert_eq!(java.available(name).await, 0);
    assert!(!java.try_acquire(name, 1).await);
    assert_eq!(java.config(name).await, ("OVERALL".to_owned(), 5, 1000));

    // setRate restarts the window, for Rust too.
    java.ok("setRate", name, &[&"OVERALL", &3, &1000]).await;
    assert_eq!(limiter.config().await.unwrap().unwrap().rate, 3);
    for i in 0..3 {
        assert!(limiter.try_acquire(1).await.unwrap(), "grant {i} after setRate");
    }
    assert!(!limiter.try_acquire(1).await.unwrap());
    assert_eq!(java.available(name).await, 0);

    if version == Version::V4 {
        // The forms with a keepAliveTime: trySetRate, setRate(RateLimiterArgs).
        let kept = "interop:java-configures:kept";
        assert!(java.boolean("trySetRate", kept, &[&"OVERALL", &2, &1000, &3000]).await);
        let config = rust.rate_limiter(kept).config().await.unwrap().unwrap();
        assert_eq!(config.keep_alive, Some(Duration::from_secs(3)));
        assert!(fresh_ttl(pttl(&mut raw, kept).await, 3000));
        java.ok("setRateArgs", name, &[&"OVERALL", &4, &1000, &2000, &false]).await;
        let config = limiter.config().await.unwrap().unwrap();
        assert_eq!((config.rate, config.keep_alive), (4, Some(Duration::from_secs(2))));
        for _ in 0..4 {
            assert!(limiter.try_acquire(1).await.unwrap());
        }
        assert!(!limiter.try_acquire(1).await.unwrap());
        for key in [name, "{interop:java-configures}:value", "{interop:java-configures}:permits"] {
            assert!(fresh_ttl(pttl(&mut raw, key).await, 2000), "{key}");
        }
    }
}

async fn rust_creates_java_acquires(version: Version) {
    let Both {
        _server, rust, java, mut raw
    } = both(version).await;
    let name = "interop:rust-creates";
    let rule = Rule::new(name, 4, SEC);
    let first = rust.check_rules(std::slice::from_ref(&rule)).await.unwrap();
    assert!(first.allowed && first.remaining == 3);
    assert_eq!(java.config(name).await, ("OVERALL".to_owned(), 4, 1000));
    assert_eq!(java.available(name).await, 3);
    for i in 0..3 {
        assert!(java.try_acquire(name, 1).await, "Java grant {i}");
    }
    assert!(!java.try_acquire(name, 1).await);
    let refused = rust.check_rules(std::slice::from_ref(&rule)).await.unwrap();
    assert!(!refused.allowed && refused.remaining == 0);
    assert_eq!(rust.rate_limiter(name).available_permits().await.unwrap(), 0);
    // Four grants in the log, one of Rust's and three of Java's, 21-byte members each.
    let members: Vec<Vec<u8>> = raw.zrange("{interop:rust-creates}:permits", 0, -1).await.unwrap();
    assert_eq!(members.len(), 4);
    assert!(members.iter().all(|m| m.len() == 21 && m[0] == 16 && permits_of(m) == 1));
    // A rule's limiter has keep-alive = interval: Java 4.x re-applies it at each
    // acquire; 3.24.3 knows no keepAliveTime and copies the config key's TTL instead.
    let stored: HashMap<String, String> = raw.hgetall(name).await.unwrap();
    assert_eq!(stored["keepAliveTime"], "1000");
    for key in [name, "{interop:rust-creates}:value", "{interop:rust-creates}:permits"] {
        let ttl = pttl(&mut raw, key).await;
        assert!(ttl > 0 && ttl <= 1000, "{key}: {ttl}");
    }
}
