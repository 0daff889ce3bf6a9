//! Tests of `server.rs`.

use super::*;

#[test]
fn the_errors_name_the_versions_checked() {
    assert_eq!(needed(), crate::outcomes::error::SUPPORTED_SERVERS);
}

#[test]
fn versions_of_each_server() {
    let redis62 = "# Server\r\nredis_version:6.2.14\r\nredis_git_sha1:40305114\r\n";
    assert_eq!(
        from_info(redis62),
        Some(Server {
            product: "Redis",
            version: Version(6, 2, 14)
        })
    );
    let valkey = "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.8\r\n";
    assert_eq!(
        from_info(valkey),
        Some(Server {
            product: "Valkey",
            version: Version(8, 1, 8)
        })
    );
    assert_eq!(from_info("# Server\r\nos:Linux\r\n"), None);
    assert_eq!(from_info("redis_version:banana\r\n"), None);
    assert!(Version(6, 0, 20) < OLDEST_REDIS && Version(6, 2, 0) >= OLDEST_REDIS);
    assert!(Version(10, 0, 0) > Version(7, 4, 2), "numbers compare as numbers");
    let hello = Value::Array(
        ["server", "valkey", "version", "8.1.8", "proto"]
            .iter()
            .map(|s| Value::BulkString(s.as_bytes().to_vec()))
            .chain([Value::Int(2)])
            .collect(),
    );
    assert_eq!(
        from_hello(&hello),
        Some(Server {
            product: "Valkey",
            version: Version(8, 1, 8)
        })
    );
}

#[test]
fn eviction_policies() {
    let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
    let reply = Value::Array(
        [
            "maxmemory",
            "1000000",
            "maxmemory-policy",
            "allkeys-lru",
            "maxmemory-samples",
            "5",
        ]
        .map(bulk)
        .to_vec(),
    );
    let found = from_config(&reply).unwrap();
    assert_eq!(found.policy, "allkeys-lru");
    assert!(found.can_evict());
    for (policy, maxmemory, evicts) in [
        ("volatile-ttl", 1, true),
        ("volatile-lfu", 1, true),
        ("allkeys-random", 1, true),
        ("noeviction", 1, false),
        ("allkeys-lru", 0, false),
    ] {
        let e = Eviction {
            policy: policy.to_owned(),
            maxmemory,
        };
        assert_eq!(e.can_evict(), evicts, "{e:?}");
    }
    let info = "# Memory\r\nused_memory:1\r\nmaxmemory:2048\r\nmaxmemory_human:2.00K\r\nmaxmemory_policy:volatile-lru\r\n";
    assert_eq!(
        from_info_memory(info),
        Some(Eviction {
            policy: "volatile-lru".to_owned(),
            maxmemory: 2048
        })
    );
}
