//! Which servers a client accepts, and what it tells an operator about them: a server
//! older than the oldest supported is refused by its version; a policy that can evict
//! limiter keys is warned about (once) and shown by a gauge; a full server fails with
//! its own error kind. Whatever binary the suite runs on (REDLIMIT_REDIS_SERVER).

use redlimit_test_support as support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::time::Duration;

use std::sync::OnceLock;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redlimit::{rate_limit, Client, Error, ManualClock, RateLimited, Rule};
use support::capture::Capture;
use support::RedisServer;

/// The `redlimit_redis_evictable` gauge's last value for `server` (its URL; the
/// recorder is this binary's).
fn evictable_gauge(server: &str) -> Option<f64> {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    let snapshotter = SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().unwrap();
        snapshotter
    });
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .find(|(key, ..)| {
            key.key().name() == "redlimit_redis_evictable"
                && key
                    .key()
                    .labels()
                    .any(|l| l.key() == "server" && l.value() == server)
        })
        .and_then(|(_, _, _, value)| match value {
            DebugValue::Gauge(v) => Some(v.into_inner()),
            _ => None,
        })
}

/// Everything this binary's tests logged, from any thread (spawned checks included).
fn logged() -> &'static Capture {
    static CAPTURE: OnceLock<Capture> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let capture = Capture::default();
        tracing::subscriber::set_global_default(capture.clone()).unwrap();
        capture
    })
}

/// The lines logged about `server` (its URL).
fn logged_about(server: &str) -> String {
    logged()
        .text()
        .lines()
        .filter(|l| l.contains(server))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The warning lines an evicting policy of `server` logged so far.
fn eviction_warnings(server: &str) -> usize {
    logged_about(server)
        .lines()
        .filter(|l| l.contains("can evict rate limiter keys"))
        .count()
}

/// Lets spawned checks (the client's own task) run to their end.
async fn settle(server: &RedisServer) {
    // A round trip on another connection, after the tasks had a turn.
    for _ in 0..20 {
        tokio::task::yield_now().await;
        let mut raw = server.raw().await;
        let _: () = redis::cmd("PING").query_async(&mut raw).await.unwrap();
    }
}

/// A loopback server speaking just enough RESP to be taken for a Redis whose INFO
/// server reports `info` and whose HELLO answers `hello` (an error line, or a RESP
/// reply): PING, CLIENT SETINFO, INFO and HELLO. Answers on one thread per connection.
fn fake_server(info: &'static str, hello: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut out = stream;
                while let Some(args) = read_command(&mut reader) {
                    let name = args.first().map(|a| a.to_ascii_uppercase()).unwrap_or_default();
                    let reply = match name.as_str() {
                        "PING" => "+PONG\r\n".to_owned(),
                        "CLIENT" => "+OK\r\n".to_owned(),
                        "INFO" if info.starts_with('-') => format!("{info}\r\n"),
                        "INFO" => format!("${}\r\n{info}\r\n", info.len()),
                        "HELLO" => hello.to_owned(),
                        _ => "-ERR unknown command\r\n".to_owned(),
                    };
                    if out.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// One RESP array of bulk strings; `None` at the end of the stream.
fn read_command(reader: &mut impl BufRead) -> Option<Vec<String>> {
    let mut line = String::new();
    reader.read_line(&mut line).ok().filter(|n| *n > 0)?;
    let count: usize = line.trim().strip_prefix('*')?.parse().ok()?;
    let mut args = Vec::with_capacity(count);
    for _ in 0..count {
        line.clear();
        reader.read_line(&mut line).ok()?;
        let len: usize = line.trim().strip_prefix('$')?.parse().ok()?;
        let mut buf = vec![0u8; len + 2];
        reader.read_exact(&mut buf).ok()?;
        args.push(String::from_utf8_lossy(&buf[..len]).into_owned());
    }
    Some(args)
}

#[tokio::test]
async fn a_server_older_than_supported_is_refused_naming_both_versions() {
    let old = fake_server("# Server\r\nredis_version:6.0.20\r\nos:Linux\r\n", "");
    let err = Client::connect(&format!("redis://127.0.0.1:{old}/"))
        .await
        .expect_err("Redis 6.0 is older than supported");
    assert!(matches!(err, Error::UnsupportedServer { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("Redis 6.0.20"), "the version found: {text}");
    assert!(
        text.contains("Redis 6.2.0 or later"),
        "the version needed: {text}"
    );
    assert!(text.contains("Valkey 7.2.0 or later"), "{text}");

    // INFO forbidden (an ACL user without +info): HELLO says the version instead.
    let hello_old = fake_server(
        "-NOPERM this user has no permissions to run the 'info' command",
        "*4\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n5.0.7\r\n",
    );
    let err = Client::connect(&format!("redis://127.0.0.1:{hello_old}/"))
        .await
        .expect_err("Redis 5.0 is older than supported");
    assert!(err.to_string().contains("Redis 5.0.7"), "{err}");

    // INFO renamed away (an unknown command): HELLO again.
    let renamed = fake_server(
        "-ERR unknown command 'INFO', with args beginning with: 'server'",
        "*4\r\n$6\r\nserver\r\n$6\r\nvalkey\r\n$7\r\nversion\r\n$5\r\n7.0.0\r\n",
    );
    let err = Client::connect(&format!("redis://127.0.0.1:{renamed}/"))
        .await
        .expect_err("no Valkey 7.0 was released; older than 7.2 all the same");
    assert!(err.to_string().contains("Valkey 7.0.0"), "{err}");

    // A server that says nothing of its version is not taken for a supported one.
    let silent = fake_server("# Server\r\nos:Linux\r\n", "-ERR unknown command 'HELLO'\r\n");
    let err = Client::connect(&format!("redis://127.0.0.1:{silent}/"))
        .await
        .expect_err("no version");
    assert!(matches!(err, Error::UnsupportedServer { .. }), "{err:?}");
    assert!(err.to_string().contains("does not report its version"), "{err}");

    // The same server claiming a supported version is connected to.
    let new = fake_server("# Server\r\nredis_version:6.2.14\r\n", "");
    Client::connect(&format!("redis://127.0.0.1:{new}/"))
        .await
        .expect("Redis 6.2.14 is supported");
}

/// Whatever the suite runs on (Redis 6.2, 7.x, Valkey), the server is accepted and a
/// script's own error reaches the caller as the same misuse error: a permit count
/// above the rate refuses, it is not a backend failure `on_error` could let through.
#[tokio::test]
async fn the_server_under_test_is_accepted_and_script_errors_are_misuse() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let limiter = client.rate_limiter("servers:misuse");
    limiter
        .try_set_rate(redlimit::RateType::Overall, 2, Duration::from_secs(60))
        .await
        .unwrap();
    let err = limiter.try_acquire(3).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::PermitsExceedRate {
                permits: 3,
                rate: 2,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!err.is_backend_failure(), "{err:?}");
    let err = client
        .rate_limiter("servers:none")
        .try_acquire(1)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotInitialized { .. }), "{err:?}");
    assert!(!err.is_backend_failure(), "{err:?}");
    let rule = [Rule::new("servers:rule", 1, Duration::from_secs(60))];
    assert!(client.check_rules(&rule).await.unwrap().allowed);
}

#[tokio::test]
async fn an_evicting_policy_is_warned_about_once_and_shown_by_a_gauge() {
    evictable_gauge("none: this installs the recorder");
    logged();
    let server = RedisServer::start_with(&["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"]);
    let clock = ManualClock::new(1_000_000);
    let client = Client::builder()
        .clock(clock.clone())
        .connect(&server.url())
        .await
        .unwrap();
    assert_eq!(
        eviction_warnings(&server.url()),
        1,
        "on connect: {}",
        logged_about(&server.url())
    );
    let text = logged_about(&server.url());
    assert!(
        text.contains("allkeys-lru") && text.contains("noeviction"),
        "{text}"
    );
    assert!(text.contains("When Redis loses data"), "{text}");
    assert_eq!(evictable_gauge(&server.url()), Some(1.0));
    let rule = [Rule::new("servers:evict", 100, Duration::from_secs(60))];
    for _ in 0..5 {
        client.check_rules(&rule).await.unwrap();
        clock.advance(Duration::from_secs(61));
        settle(&server).await;
    }
    assert_eq!(
        eviction_warnings(&server.url()),
        1,
        "one warning, not one per check"
    );

    // Once a minute (the client's clock) the policy is read again: noeviction clears
    // the gauge; an evicting policy again warns again, once.
    let mut raw = server.raw().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query_async(&mut raw)
        .await
        .unwrap();
    clock.advance(Duration::from_secs(61));
    client.check_rules(&rule).await.unwrap();
    settle(&server).await;
    assert_eq!(evictable_gauge(&server.url()), Some(0.0));
    for policy in ["volatile-ttl", "volatile-lru"] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg(policy)
            .query_async(&mut raw)
            .await
            .unwrap();
        clock.advance(Duration::from_secs(61));
        client.check_rules(&rule).await.unwrap();
        settle(&server).await;
    }
    assert_eq!(evictable_gauge(&server.url()), Some(1.0));
    assert_eq!(
        eviction_warnings(&server.url()),
        2,
        "{}",
        logged_about(&server.url())
    );
    assert!(
        logged_about(&server.url()).contains("volatile-ttl"),
        "{}",
        logged_about(&server.url())
    );

    // A lazily connecting client finds out at its first decision.
    let lazy = Client::builder().connect_lazy(&server.url()).unwrap();
    lazy.check_rules(&rule).await.unwrap();
    settle(&server).await;
    assert_eq!(
        eviction_warnings(&server.url()),
        3,
        "{}",
        logged_about(&server.url())
    );
}

/// A server under noeviction whose memory is full refuses every write with OOM, and
/// the limiter says so by its own error kind, a backend failure.
#[tokio::test]
async fn a_full_server_fails_with_out_of_memory() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let client = Client::connect(&server.url()).await.unwrap();
    let rule = [Rule::new("servers:oom", 5, Duration::from_secs(60))];
    assert!(client.check_rules(&rule).await.unwrap().allowed, "room yet");
    let mut raw = server.raw().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query_async(&mut raw)
        .await
        .unwrap();
    let err = client.check_rules(&rule).await.unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err:?}");
    assert!(err.is_backend_failure());
    let text = err.to_string();
    assert!(
        text.contains("out of memory") && text.contains("maxmemory"),
        "{text}"
    );
    let other = [Rule::new("servers:oom:new", 5, Duration::from_secs(60))];
    let err = client.check_rules(&other).await.unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "a new limiter: {err:?}");

    // Through the attribute, OOM is a backend failure that lasts until someone adds
    // memory (a spray of new keys can fill a server): "allow" decides in process, as
    // "local" does, so the rule of 1 a minute still holds; "deny" refuses.
    redlimit::set_default(client).unwrap();
    for call in 0..10 {
        let allowed = full_allow().await;
        if call == 0 {
            allowed.expect("decided in process: the first call of the minute");
        } else {
            let refused = allowed.unwrap_err();
            assert!(
                refused.cause().is_none(),
                "refused by the in-process limit: {refused:?}"
            );
        }
        let refused = full_deny().await.unwrap_err();
        assert!(
            matches!(refused.cause(), Some(Error::OutOfMemory { .. })),
            "{refused:?}"
        );
    }
}

#[rate_limit(key = "servers:full:allow", rate = 1, interval = "60s", on_error = "allow")]
async fn full_allow() -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "servers:full:deny", rate = 1, interval = "60s", on_error = "deny")]
async fn full_deny() -> Result<(), RateLimited> {
    Ok(())
}

/// Grants of `rule` until the first refusal (at most 100).
async fn grants_until_refused(client: &Client, rule: &[Rule]) -> u32 {
    let mut granted = 0;
    while granted < 100 && client.check_rules(rule).await.unwrap().allowed {
        granted += 1;
    }
    granted
}

/// Writes 1 KiB values under `junk:<n>` until the server refuses or `stop` says
/// so, or `limit` keys; answers whether a write was refused (OOM).
async fn fill(raw: &mut redis::aio::MultiplexedConnection, from: u32, limit: u32) -> (u32, bool) {
    let value = vec![b'x'; 1024];
    let mut n = from;
    while n < from + limit {
        let mut pipe = redis::pipe();
        for i in n..n + 100 {
            pipe.cmd("SET").arg(format!("junk:{i}")).arg(&value[..]).ignore();
        }
        n += 100;
        let done: Result<(), redis::RedisError> = pipe.query_async(raw).await;
        if done.is_err() {
            return (n, true);
        }
    }
    (n, false)
}

/// What RELIABILITY.md's "When Redis loses data" states of eviction: under an
/// evicting policy a full server evicts the limiter's keys and the limit starts over
/// (here 5 per minute granted twice in one minute); under noeviction the keys stay,
/// the limit holds, and what cannot be written fails with OutOfMemory.
#[tokio::test]
async fn eviction_forgets_a_limit_and_noeviction_keeps_it() {
    let rule = [Rule::new("servers:evicted", 5, Duration::from_secs(60))];
    let keys = redlimit::LimiterKeys::new("servers:evicted", "unused").unwrap();
    for policy in ["allkeys-lru", "volatile-lru"] {
        let server = RedisServer::start_with(&["--maxmemory", "4mb", "--maxmemory-policy", policy]);
        // every refusal asked of Redis: a refusal kept in process outlives lost keys
        // until its wait ends (docs/guide/batches.md, "Refusals answered in process")
        let client = Client::builder()
            .local_refusals(false)
            .connect(&server.url())
            .await
            .unwrap();
        let mut raw = server.raw().await;
        assert_eq!(grants_until_refused(&client, &rule).await, 5);
        // allkeys-*: any key may go. volatile-*: only keys with a TTL, which the
        // limiter's keys carry: the junk gets one too, as a cache's would.
        let mut n = 0;
        let evicted = loop {
            let (next, _) = fill(&mut raw, n, 500).await;
            n = next;
            if policy.starts_with("volatile") {
                for i in (n - 500)..n {
                    let _: () = redis::cmd("PEXPIRE")
                        .arg(format!("junk:{i}"))
                        .arg(600_000)
                        .query_async(&mut raw)
                        .await
                        .unwrap_or(());
                }
            }
            let left: u32 = redis::cmd("EXISTS")
                .arg(keys.config())
                .arg(keys.value())
                .arg(keys.permits())
                .query_async(&mut raw)
                .await
                .unwrap();
            if left == 0 {
                break true;
            }
            if n > 200_000 {
                break false;
            }
        };
        assert!(evicted, "{policy}: the limiter's keys were not evicted");
        // A server at its limit can still answer a write OOM while its eviction
        // catches up, even under an evicting policy (one run on Valkey 8.1.8 did, on
        // the first call after the eviction): the call then fails, granting nothing,
        // and is asked again. What the server held then is printed.
        let mut granted = 0;
        let mut out_of_memory = 0;
        while granted < 100 {
            match client.check_rules(&rule).await {
                Ok(decision) if decision.allowed => granted += 1,
                Ok(_) => break,
                Err(Error::OutOfMemory { .. }) if out_of_memory < 50 => {
                    if out_of_memory == 0 {
                        let memory: String = redis::cmd("INFO")
                            .arg("memory")
                            .query_async(&mut raw)
                            .await
                            .unwrap();
                        let keys: u64 = redis::cmd("DBSIZE").query_async(&mut raw).await.unwrap();
                        let lines: Vec<&str> = memory
                            .lines()
                            .filter(|l| {
                                l.starts_with("used_memory:")
                                    || l.starts_with("used_memory_dataset:")
                                    || l.starts_with("mem_not_counted")
                            })
                            .collect();
                        println!("{policy}: OOM after the eviction, {keys} keys, {lines:?}");
                    }
                    out_of_memory += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("{policy}: {e:?} ({out_of_memory} OOM answers before)"),
            }
        }
        println!(
            "{policy}: evicted after {n} junk keys; {granted} more grants in the same minute \
             ({out_of_memory} OOM answers)"
        );
        assert_eq!(granted, 5, "{policy}: the limit started over");
    }

    let server = RedisServer::start_with(&["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"]);
    // every refusal asked of Redis: a refusal kept in process outlives lost keys
    // until its wait ends (docs/guide/batches.md, "Refusals answered in process")
    let client = Client::builder()
        .local_refusals(false)
        .connect(&server.url())
        .await
        .unwrap();
    let mut raw = server.raw().await;
    assert_eq!(grants_until_refused(&client, &rule).await, 5);
    let (_, refused) = fill(&mut raw, 0, 40_000).await;
    assert!(refused, "the server filled up and refused a write");
    // Right at the limit a small write may still fit: make sure it is over.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query_async(&mut raw)
        .await
        .unwrap();
    let left: u32 = redis::cmd("EXISTS")
        .arg(keys.config())
        .arg(keys.value())
        .arg(keys.permits())
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(left, 3, "noeviction keeps the limiter's keys");
    // The exhausted limiter's refusal writes nothing: it is still refused.
    let decision = client.check_rules(&rule).await.unwrap();
    assert!(!decision.allowed, "the limit holds when full");
    let fresh = [Rule::new("servers:evicted:new", 5, Duration::from_secs(60))];
    let err = client.check_rules(&fresh).await.unwrap_err();
    assert!(
        matches!(err, Error::OutOfMemory { .. }),
        "a new limiter cannot be written: {err:?}"
    );
}

/// FLUSHALL, and a restart of a server without persistence, forget every limit.
#[tokio::test]
async fn a_flush_or_a_restart_without_persistence_forgets_the_limits() {
    let rule = [Rule::new("servers:flushed", 5, Duration::from_secs(60))];
    let server = RedisServer::start();
    // every refusal asked of Redis: a refusal kept in process outlives lost keys
    // until its wait ends (docs/guide/batches.md, "Refusals answered in process")
    let client = Client::builder()
        .local_refusals(false)
        .connect(&server.url())
        .await
        .unwrap();
    assert_eq!(grants_until_refused(&client, &rule).await, 5);
    let mut raw = server.raw().await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut raw).await.unwrap();
    assert_eq!(grants_until_refused(&client, &rule).await, 5, "after FLUSHALL");

    let port = server.stop();
    let _restarted = RedisServer::start_on(port);
    // The first call after the restart may meet the lost connection.
    let mut again = 0;
    for _ in 0..200 {
        match client.check_rules(&rule).await {
            Ok(d) if d.allowed => again += 1,
            Ok(_) => break,
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    assert_eq!(again, 5, "after a restart without persistence");
}

/// `ACL SETUSER` on `raw`.
async fn acl_user(raw: &mut redis::aio::MultiplexedConnection, user: &str, rules: &[&str]) {
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(user)
        .arg("reset")
        .arg("on")
        .arg(">pw-4f1c")
        .arg(rules)
        .query_async(raw)
        .await
        .unwrap();
}

/// The rules docs/operating.md and Error::NoPermission recommend for the default prefix.
const RECOMMENDED: &[&str] = &[
    "~rate_limit:*",
    "~{rate_limit:*",
    "+@read",
    "+@write",
    "+@scripting",
    "+ping",
    "+time",
    "+info",
    "+config|get",
    "+client|setname",
];

/// ACL users in the URL: the recommended permissions run everything; a wrong user or
/// password is AuthFailed; a user without a permission the scripts need is
/// NoPermission, naming what was refused; INFO or CONFIG forbidden is worked around.
#[tokio::test]
async fn acl_users_work_and_missing_permissions_are_named() {
    let server = RedisServer::start_with(&["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"]);
    let mut raw = server.raw().await;
    let url = |user: &str, password: &str| format!("redis://{user}:{password}@127.0.0.1:{}/", server.port);
    let rule = [Rule::new("rate_limit:acl", 2, Duration::from_secs(60))];

    acl_user(&mut raw, "limiter", RECOMMENDED).await;
    let client = Client::connect(&url("limiter", "pw-4f1c")).await.unwrap();
    assert!(client.check_rules(&rule).await.unwrap().allowed);
    assert!(client.check_rules(&rule).await.unwrap().allowed);
    assert!(!client.check_rules(&rule).await.unwrap().allowed);
    let limiter = client.rate_limiter("rate_limit:acl:api");
    assert!(limiter
        .try_set_rate(redlimit::RateType::PerClient, 3, Duration::from_secs(60))
        .await
        .unwrap());
    assert!(limiter.try_acquire(2).await.unwrap());
    assert_eq!(limiter.available_permits().await.unwrap(), 1);
    let lazy = Client::builder()
        .connect_lazy(&url("limiter", "pw-4f1c"))
        .unwrap();
    assert!(!lazy.check_rules(&rule).await.unwrap().allowed);

    for (user, password) in [("nobody", "pw-4f1c"), ("limiter", "wrong")] {
        let err = Client::connect(&url(user, password)).await.unwrap_err();
        assert!(matches!(err, Error::AuthFailed { .. }), "{user}: {err:?}");
        assert!(
            err.to_string().contains("refused the connection's credentials"),
            "{err}"
        );
        assert!(!format!("{err} {err:?}").contains(password), "{err:?}");
    }

    // Without scripting: EVALSHA is refused, by name.
    let mut no_scripts = RECOMMENDED.to_vec();
    no_scripts.retain(|r| *r != "+@scripting");
    acl_user(&mut raw, "noscripts", &no_scripts).await;
    let client = Client::connect(&url("noscripts", "pw-4f1c")).await.unwrap();
    let err = client.check_rules(&rule).await.unwrap_err();
    assert!(matches!(err, Error::NoPermission { .. }), "{err:?}");
    assert!(err.is_backend_failure());
    let text = err.to_string();
    assert!(text.contains("NOPERM") && text.contains("evalsha"), "{text}");
    assert!(
        text.contains("ACL SETUSER") && !text.contains("pw-4f1c"),
        "{text}"
    );

    // A command inside the scripts refused (each server words it its own way).
    let mut no_zadd = RECOMMENDED.to_vec();
    no_zadd.push("-zadd");
    acl_user(&mut raw, "nozadd", &no_zadd).await;
    let client = Client::connect(&url("nozadd", "pw-4f1c")).await.unwrap();
    let err = client
        .check_rules(&[Rule::new("rate_limit:acl:zadd", 2, Duration::from_secs(60))])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NoPermission { .. }), "{err:?}");

    // The limiter's keys outside the user's key patterns.
    acl_user(&mut raw, "otherkeys", &["~other:*", "+@all"]).await;
    let client = Client::connect(&url("otherkeys", "pw-4f1c")).await.unwrap();
    let err = client.check_rules(&rule).await.unwrap_err();
    assert!(matches!(err, Error::NoPermission { .. }), "{err:?}");
    assert!(err.to_string().contains("keys"), "{err}");

    // INFO and CONFIG forbidden (as managed services do): the version comes from
    // HELLO, the eviction policy from... nowhere but INFO, so nothing is known and
    // nothing is claimed; calls work.
    let mut no_info = RECOMMENDED.to_vec();
    no_info.retain(|r| *r != "+info" && *r != "+config|get");
    acl_user(&mut raw, "noinfo", &no_info).await;
    let client = Client::connect(&url("noinfo", "pw-4f1c")).await.unwrap();
    assert!(
        client
            .check_rules(&[Rule::new("rate_limit:acl:noinfo", 2, Duration::from_secs(60))])
            .await
            .unwrap()
            .allowed
    );
}

/// CONFIG forbidden but INFO allowed: the policy is read from INFO memory.
#[tokio::test]
async fn the_policy_is_read_from_info_where_config_is_forbidden() {
    logged();
    let server = RedisServer::start_with(&["--maxmemory", "100mb", "--maxmemory-policy", "volatile-random"]);
    let mut raw = server.raw().await;
    let mut no_config = RECOMMENDED.to_vec();
    no_config.retain(|r| *r != "+config|get");
    acl_user(&mut raw, "noconfig", &no_config).await;
    let url = format!("redis://noconfig:pw-4f1c@127.0.0.1:{}/", server.port);
    let _client = Client::connect(&url).await.unwrap();
    // The URL is shown with its credentials hidden: look for the address.
    let address = format!("127.0.0.1:{}/", server.port);
    let text = logged_about(&address);
    assert_eq!(eviction_warnings(&address), 1, "{text}");
    assert!(!text.contains("pw-4f1c"), "{text}");
    assert!(text.contains("volatile-random"), "{text}");
}

/// The connection that decides is named `redlimit` in CLIENT LIST, also after it was
/// lost and made again.
#[tokio::test]
async fn connections_announce_themselves_in_client_list() {
    let server = RedisServer::start();
    let mut raw = server.raw().await;
    let named = |list: &str| list.lines().filter(|l| l.contains(" name=redlimit ")).count();
    let client_list = |raw: &mut redis::aio::MultiplexedConnection| {
        let mut raw = raw.clone();
        async move {
            let list: String = redis::cmd("CLIENT")
                .arg("LIST")
                .query_async(&mut raw)
                .await
                .unwrap();
            list
        }
    };
    let rule = [Rule::new("rate_limit:named", 100, Duration::from_secs(60))];
    let client = Client::connect(&server.url()).await.unwrap();
    client.check_rules(&rule).await.unwrap();
    settle(&server).await;
    let list = client_list(&mut raw).await;
    assert_eq!(named(&list), 1, "{list}");

    let lazy = Client::builder().connect_lazy(&server.url()).unwrap();
    lazy.check_rules(&rule).await.unwrap();
    settle(&server).await;
    assert_eq!(named(&client_list(&mut raw).await), 2);

    // Kill both: the next decisions reconnect and name the new connections.
    let _: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("SKIPME")
        .arg("yes")
        .query_async(&mut raw)
        .await
        .unwrap();
    let mut raw = server.raw().await;
    for c in [&client, &lazy] {
        for _ in 0..50 {
            if c.check_rules(&rule).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    settle(&server).await;
    let list = client_list(&mut raw).await;
    assert_eq!(named(&list), 2, "{list}");
}

/// A URL that names a replica: every grant is refused with READONLY. That lasts until
/// someone fixes the URL, so it is its own kind, a backend failure that does not pass
/// by itself (`on_error = "allow"` then decides in process, as for OOM above).
#[tokio::test]
async fn a_replica_refuses_grants_as_read_only_and_that_is_not_transient() {
    let master = RedisServer::start();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
    let client = Client::connect(&replica.url()).await.unwrap();
    let rule = [Rule::new("servers:replica", 5, Duration::from_secs(60))];
    let err = client.check_rules(&rule).await.unwrap_err();
    assert!(matches!(err, Error::ReadOnlyReplica { .. }), "{err:?}");
    assert!(err.is_backend_failure() && !err.is_transient(), "{err:?}");
    assert!(err.to_string().contains("point the URL at the master"), "{err}");
}
