//! Attacks on the Redis side, each against a real redis-server: what a caller's value
//! can make a decision cost Redis, and what it can reach.

use redlimit_test_support as support;

use std::time::Duration;

use redlimit::{Client, Clock, ManualClock, Rule};
use support::RedisServer;

const START: u64 = 1_700_000_000_000;

/// A log of `grants` one-permit grants, one per ms from START, on a limiter of rate
/// `grants` per 10 minutes that a rule owns: every permit taken, value 0.
async fn full_log(server: &RedisServer, clock: &ManualClock, name: &str, grants: u64) -> (Client, Rule) {
    // every refusal asked of Redis: none answered again in process
    let client = Client::builder()
        .clock(clock.clone())
        .local_refusals(false)
        .connect(&server.url())
        .await
        .unwrap();
    let mut raw = server.raw().await;
    let rule = Rule::new(name, grants, Duration::from_secs(600));
    assert!(
        client
            .check_rules(std::slice::from_ref(&rule))
            .await
            .unwrap()
            .allowed
    );
    // the other grants written in bulk, as the script would have written them, in
    // batches short enough for a connection's reply timeout on a busy machine
    let script = redis::Script::new(
        r"
        for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
          redis.call('zadd', KEYS[1], ARGV[3] + i, struct.pack('Bc0I', 16, string.format('%016d', i), 1))
        end
        redis.call('set', KEYS[2], '0', 'keepttl')
        ",
    );
    for first in (1..grants).step_by(5_000) {
        let _: () = script
            .key(format!("{{{name}}}:permits"))
            .key(format!("{{{name}}}:value"))
            .arg(first)
            .arg((first + 4_999).min(grants - 1))
            .arg(START)
            .invoke_async(&mut raw)
            .await
            .unwrap();
    }
    clock.set(START + grants + 1);
    (client, rule)
}

/// What the server spent on the last script call, in microseconds (SLOWLOG logs
/// every command on these servers).
async fn last_script_us(raw: &mut redis::aio::MultiplexedConnection) -> u64 {
    let entries: Vec<Vec<redis::Value>> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(10)
        .query_async(raw)
        .await
        .unwrap();
    for entry in entries {
        let (redis::Value::Int(us), redis::Value::Array(args)) = (&entry[2], &entry[3]) else {
            panic!("a SLOWLOG entry: {entry:?}")
        };
        if matches!(&args[0], redis::Value::BulkString(name) if name.eq_ignore_ascii_case(b"evalsha")) {
            return *us as u64;
        }
    }
    panic!("no script call in SLOWLOG")
}

#[tokio::test]
async fn a_refusal_for_many_permits_reads_a_bounded_part_of_the_log() {
    let server = RedisServer::start_with(&["--slowlog-log-slower-than", "0"]);
    let clock = ManualClock::new(START);
    let grants = 100_000;
    let (client, rule) = full_log(&server, &clock, "rate_limit:attack:walk", grants).await;
    let mut raw = server.raw().await;

    let mut spent = Vec::new();
    for permits in [1, 1_000, 100_000] {
        let monitor = support::monitor::Monitor::start(server.port);
        let decision = client
            .check_rules(&[rule.clone().permits(permits)])
            .await
            .unwrap();
        let commands = monitor.script_commands();
        // the least of five (a refusal writes nothing, so each is the same work): the
        // machine's other load only ever adds
        let mut least = last_script_us(&mut raw).await;
        for _ in 0..4 {
            client
                .check_rules(&[rule.clone().permits(permits)])
                .await
                .unwrap();
            least = least.min(last_script_us(&mut raw).await);
        }
        spent.push(least);
        assert!(!decision.allowed, "{permits} permits granted on a full log");
        // The exact wait: the grant at which `permits` have left is START + permits - 1.
        let exact = START + permits - 1 + 600_000 - clock.now_ms();
        let retry = decision.retry_after.unwrap().as_millis() as u64;
        assert!(
            retry >= exact,
            "{permits} permits: retry {retry} ms is shorter than the exact {exact} ms"
        );
        if permits <= 64 {
            assert_eq!(
                retry, exact,
                "{permits} permits: the wait is exact within the walk"
            );
        }
        // Every range of the log a script read is at most the walk's 64 entries.
        for args in &commands {
            if args[0] == "zrange" && args[1].ends_with(":permits") {
                let (start, stop): (i64, i64) = (args[2].parse().unwrap(), args[3].parse().unwrap());
                let read = if stop < 0 { 1 } else { stop - start + 1 };
                assert!(
                    read <= 64,
                    "{permits} permits: the script read {read} entries of the log: {args:?}"
                );
            }
        }
    }
    // And the server's time follows: a refusal of 100 000 permits costs about what one
    // of 1 permit does (a whole walk of the log cost 2 000 times more).
    println!("server time per refusal, 1 / 1 000 / 100 000 permits: {spent:?} us");
    assert!(
        spent[2] < 20 * spent[0].max(50),
        "a refusal of 100 000 permits took {} us against {} us for 1 permit",
        spent[2],
        spent[0]
    );
}

#[tokio::test]
async fn a_bounded_wait_is_the_same_in_process() {
    // The in-process backend answers the same upper bound as the script, decision for
    // decision, past the walk and within it.
    let server = RedisServer::start();
    let clock = ManualClock::new(START);
    let grants = 500;
    let (client, rule) = full_log(&server, &clock, "rate_limit:attack:walk_twin", grants).await;
    let memory_clock = ManualClock::new(START);
    let memory = Client::builder().clock(memory_clock.clone()).memory();
    assert!(
        memory
            .check_rules(std::slice::from_ref(&rule))
            .await
            .unwrap()
            .allowed
    );
    for _ in 1..grants {
        memory_clock.advance(Duration::from_millis(1));
        assert!(
            memory
                .check_rules(std::slice::from_ref(&rule))
                .await
                .unwrap()
                .allowed
        );
    }
    memory_clock.set(clock.now_ms());
    for permits in [1, 63, 64, 65, 200, 500] {
        let redis = client
            .check_rules(&[rule.clone().permits(permits)])
            .await
            .unwrap();
        let local = memory
            .check_rules(&[rule.clone().permits(permits)])
            .await
            .unwrap();
        assert!(!redis.allowed && !local.allowed);
        assert_eq!(redis.retry_after, local.retry_after, "{permits} permits");
        let exact = START + permits - 1 + 600_000 - clock.now_ms();
        let bound = START + grants - 1 + 600_000 - clock.now_ms();
        let want = if permits <= 64 { exact } else { bound };
        assert_eq!(
            redis.retry_after,
            Some(Duration::from_millis(want)),
            "{permits} permits"
        );
    }
}

/// Refusals with a distinct key each, refused before Redis (a cost above the rate):
/// what they report to Redis stays within the per-second budget, and every refusal is
/// still counted, under its rule past the budget.
#[cfg(feature = "axum")]
#[tokio::test]
async fn refusal_reports_of_sprayed_keys_stay_within_their_budget() {
    use redlimit::tower::{Key, LayerRule, RateLimitLayer};
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let layer = RateLimitLayer::builder()
        .client(client.clone())
        .rule(
            LayerRule::new("quota", 5, Duration::from_secs(60))
                .key(Key::header("x-api-key"))
                .cost(support::http::cost_header),
        )
        .build()
        .unwrap();
    let addr = support::http::serve_route("/", |app| app.layer(layer)).await;
    let sprayed = 2_000;
    let started = std::time::Instant::now();
    for i in 0..sprayed {
        let key = format!("attacker-{i:06}-{}", "x".repeat(200));
        let reply = support::http::send(addr, "GET", "/", &[("x-api-key", &key), ("x-cost", "100")]).await;
        assert_eq!(reply.status, 429);
    }
    let seconds = started.elapsed().as_secs() + 2;
    tokio::time::sleep(Duration::from_millis(2_500)).await;

    let mut raw = server.raw().await;
    let reports: Vec<String> = redis::cmd("KEYS")
        .arg("rate_limit:redlimit:refused:*")
        .query_async(&mut raw)
        .await
        .unwrap();
    let (mut fields, mut counted, mut by_rule) = (0, 0, 0);
    for report in reports {
        let counts: std::collections::HashMap<String, u64> = redis::cmd("HGETALL")
            .arg(&report)
            .query_async(&mut raw)
            .await
            .unwrap();
        for (field, count) in counts {
            fields += 1;
            counted += count;
            if field == "rule:quota" {
                by_rule += count;
            }
        }
    }
    assert_eq!(counted, sprayed, "every refusal is counted");
    assert!(
        fields as u64 <= 101 * seconds,
        "{fields} fields reported in about {seconds} s: more than 100 limiters a second"
    );
    assert!(
        by_rule > 0,
        "past the budget, refusals are counted under their rule"
    );
}

/// An override a rule cannot take: refused when set from a process that runs the
/// rule, and, written into Redis by hand, ignored with a warning (the rule's own rate
/// applies) instead of failing every request.
#[cfg(feature = "axum")]
#[tokio::test]
async fn an_override_a_rule_cannot_take_never_takes_a_route_down() {
    use redlimit::tower::{LayerRule, RateLimitLayer};
    use redlimit::{Algorithm, OverrideOf, RateOverride};
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let capture = support::capture::Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    let layer = RateLimitLayer::builder()
        .client(client.clone())
        .rule(
            LayerRule::new("attack:search", 5, Duration::from_secs(60))
                .algorithm(Algorithm::TokenBucket)
                .warmup(Duration::from_secs(60)),
        )
        .build()
        .unwrap();
    let addr = support::http::serve_route("/", |app| app.layer(layer)).await;
    assert_eq!(support::http::send(addr, "GET", "/", &[]).await.status, 200);

    // Warm-up times rate far above what the bucket counts: refused, with the reason.
    let huge = RateOverride {
        of: OverrideOf::Rule("attack:search".into()),
        rate: 1_000_000_000,
        interval: Duration::from_secs(1),
    };
    let error = client.set_override(&huge).await.unwrap_err();
    assert!(
        matches!(&error, redlimit::Error::UnusableOverride { .. }) && error.to_string().contains("warm-up"),
        "{error}"
    );
    assert!(
        client.list_overrides().await.unwrap().is_empty(),
        "nothing written"
    );

    // The same override written by hand: ignored, every request decided by the rule.
    let mut raw = server.raw().await;
    let _: () = redis::cmd("HSET")
        .arg(client.overrides_key())
        .arg("rule:attack:search")
        .arg("1000000000/1000")
        .query_async(&mut raw)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.push(support::http::send(addr, "GET", "/", &[]).await.status);
    }
    assert!(
        !statuses.contains(&500),
        "an unusable override failed requests: {statuses:?}"
    );
    assert!(
        statuses.contains(&429),
        "the rule's own rate still limits: {statuses:?}"
    );
    assert!(
        capture.text().contains("rate override ignored"),
        "{}",
        capture.text()
    );

    // One limiter's override (checked when decided), the limiter's state gone: ignored
    // too, the rule's own rate deciding from a full bucket.
    let _: () = redis::cmd("HDEL")
        .arg(client.overrides_key())
        .arg("rule:attack:search")
        .query_async(&mut raw)
        .await
        .unwrap();
    let name = "rate_limit:attack:search";
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{name}*"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(!keys.is_empty(), "{name}: no keys");
    let _: () = redis::cmd("DEL")
        .arg(&keys[..])
        .query_async(&mut raw)
        .await
        .unwrap();
    // Written with a usable override of another limiter, in one command: that one
    // deciding shows the table holding both was read, so the rule's own rate below is
    // the unusable one ignored, not one never read.
    let probe = RateLimitLayer::builder()
        .client(client.clone())
        .rule(LayerRule::new("attack:probe", 5, Duration::from_secs(60)))
        .build()
        .unwrap();
    let probe = support::http::serve_route("/", |app| app.layer(probe)).await;
    let _: () = redis::cmd("HSET")
        .arg(client.overrides_key())
        .arg(format!("key:{name}"))
        .arg("1000000000/1000")
        .arg("key:rate_limit:attack:probe")
        .arg("1/60000")
        .query_async(&mut raw)
        .await
        .unwrap();
    let warned = capture.text().matches("rate override ignored").count();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let probed = [
        support::http::send(probe, "GET", "/", &[]).await.status,
        support::http::send(probe, "GET", "/", &[]).await.status,
    ];
    assert_eq!(
        probed,
        [200, 429],
        "the override table written with the unusable override was read"
    );
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.push(support::http::send(addr, "GET", "/", &[]).await.status);
    }
    assert!(
        statuses.contains(&200) && statuses.contains(&429) && !statuses.contains(&500),
        "the rule's own rate decides: {statuses:?}"
    );
    // (warned once per 10 s per client: the rule's override above had it said)
    assert_eq!(
        capture.text().matches("rate override ignored").count(),
        warned,
        "{}",
        capture.text()
    );
}

/// `release` on a log of 100 000 grants reads the newest grant it takes its permit
/// from, not the log.
#[tokio::test]
async fn a_release_reads_what_it_gives_back_not_the_log() {
    let server = RedisServer::start();
    let clock = ManualClock::new(START);
    let (client, rule) = full_log(&server, &clock, "rate_limit:attack:release", 100_000).await;
    let limiter = client.rate_limiter(rule.name());
    let monitor = support::monitor::Monitor::start(server.port);
    limiter.release(1).await.unwrap();
    assert_eq!(limiter.available_permits().await.unwrap(), 1);
    for args in monitor.script_commands() {
        if args[0].starts_with("zrange") || args[0].starts_with("zrevrange") {
            let (start, stop): (i64, i64) = (args[2].parse().unwrap_or(0), args[3].parse().unwrap_or(0));
            let read = if args[0] == "zrangebyscore" {
                0
            } else if stop < 0 {
                i64::MAX
            } else {
                stop - start + 1
            };
            assert!(read <= 1, "release read {args:?}");
        }
    }
}

/// Layer rules whose limiters could never be decided (their keys would split across
/// cluster slots) are refused when the layer is built, naming the rule and the field,
/// instead of answering every request 500.
#[cfg(feature = "tower")]
#[test]
fn attack_rule_names_with_stray_braces_are_refused_at_build() {
    use redlimit::tower::{LayerRule, RateLimitLayer};
    for (name, reason) in [
        ("a{b", "never closed"),
        ("{}", "empty `{}` tag"),
        ("a}b", "no `{`"),
    ] {
        let refused = RateLimitLayer::builder()
            .rule(LayerRule::new(name, 5, Duration::from_secs(60)))
            .build()
            .err()
            .unwrap_or_else(|| panic!("`{name}` built"));
        let text = refused.to_string();
        assert!(text.contains(&format!("rule `{name}`: field `name`")), "{text}");
        assert!(text.contains(reason), "{text}");
    }
    // A name with a hash tag of its own is a name the runtime decides.
    RateLimitLayer::builder()
        .rule(LayerRule::new("{tenant}:api", 5, Duration::from_secs(60)))
        .build()
        .unwrap();
    // So is the client's prefix before it: one with a stray brace is refused with the
    // layer's client, not answered 500 on every request.
    for prefix in ["app}", "{", "{}:"] {
        let client = Client::builder().prefix(prefix).memory();
        let refused = RateLimitLayer::builder()
            .client(client)
            .rule(LayerRule::new("api", 5, Duration::from_secs(60)))
            .build()
            .err()
            .unwrap_or_else(|| panic!("prefix `{prefix}` built"));
        assert!(
            refused
                .to_string()
                .contains(&format!("the client's key prefix `{prefix}`")),
            "{refused}"
        );
    }
}

/// A cost a request chooses that no grant can hold (past the permits log's 4-byte
/// field, under a rate that would allow it) is refused as any cost above the rate is:
/// 429 without Retry-After, not a server error, on both backends and both algorithms;
/// the key's limit still holds afterwards.
#[cfg(feature = "axum")]
#[tokio::test]
async fn attack_a_cost_past_the_log_field_is_limited_not_a_server_error() {
    use redlimit::tower::{Key, LayerRule, RateLimitLayer};
    use redlimit::{Algorithm, MAX_PERMITS, MAX_RATE};
    let server = RedisServer::start();
    let redis = Client::connect(&server.url()).await.unwrap();
    for client in [Client::memory(), redis] {
        for (algorithm, interval) in [
            (Algorithm::SlidingWindow, Duration::from_secs(60)),
            (Algorithm::TokenBucket, Duration::from_millis(1)),
        ] {
            let layer = RateLimitLayer::builder()
                .client(client.clone())
                .rule(
                    // (a bucket of 2^53 tokens fits its count only over 1 ms)
                    LayerRule::new(format!("metered-{algorithm:?}"), MAX_RATE, interval)
                        .algorithm(algorithm)
                        .key(Key::header("x-api-key"))
                        .cost(support::http::cost_header),
                )
                .build()
                .unwrap();
            let addr = support::http::serve_route("/", |app| app.layer(layer)).await;
            for cost in [MAX_PERMITS + 1, u64::MAX] {
                let cost = cost.to_string();
                let reply =
                    support::http::send(addr, "GET", "/", &[("x-api-key", "k"), ("x-cost", &cost)]).await;
                assert_eq!(reply.status, 429, "{algorithm:?}, cost {cost}: {reply:?}");
                assert_eq!(reply.header("retry-after"), None, "{reply:?}");
            }
            let most = MAX_PERMITS.to_string();
            let reply = support::http::send(addr, "GET", "/", &[("x-api-key", "k"), ("x-cost", &most)]).await;
            assert_eq!(
                reply.status, 200,
                "{algorithm:?}: the most one grant holds: {reply:?}"
            );
        }
    }
}

/// A key header sent twice (`x-api-key: z` then `x-api-key: a`) has no one value: the
/// request is refused 400, nothing spent, on both backends, whichever line comes first
/// and whatever the case of its name; a spent key stays refused when sent once.
#[cfg(feature = "axum")]
#[tokio::test]
async fn attack_a_key_header_sent_twice_is_refused_not_keyed_by_one_line() {
    use redlimit::tower::{Key, LayerRule, RateLimitLayer};
    let server = RedisServer::start();
    let redis = Client::connect(&server.url()).await.unwrap();
    for client in [Client::memory(), redis] {
        let layer = RateLimitLayer::builder()
            .client(client.clone())
            .rule(LayerRule::new("per-key", 1, Duration::from_secs(60)).key(Key::header("x-api-key")))
            .build()
            .unwrap();
        let addr = support::http::serve_route("/", |app| app.layer(layer)).await;
        let once = |key: &'static str| [("x-api-key", key)];
        assert_eq!(
            support::http::send(addr, "GET", "/", &once("a")).await.status,
            200
        );
        assert_eq!(
            support::http::send(addr, "GET", "/", &once("a")).await.status,
            429
        );
        for twice in [
            [("x-api-key", "z"), ("x-api-key", "a")],
            [("x-api-key", "a"), ("X-Api-Key", "y")],
            [("x-api-key", "fresh"), ("x-api-key", "fresh")],
        ] {
            let reply = support::http::send(addr, "GET", "/", &twice).await;
            assert_eq!(reply.status, 400, "{twice:?}: {reply:?}");
            assert_eq!(
                reply.body,
                "This request sends the x-api-key header more than once; send it once\n"
            );
        }
        assert_eq!(
            support::http::send(addr, "GET", "/", &once("fresh")).await.status,
            200,
            "nothing was spent by the refused requests"
        );
        assert_eq!(
            support::http::send(addr, "GET", "/", &once("a")).await.status,
            429
        );
    }
}

/// A rule's name that a caller's value makes (`Rule::new(format!("rate_limit:{value}"))`)
/// cannot land on the library's own keys: `check_rules` refuses it as the handles do,
/// writing nothing there, and resets still reach a process that keeps a refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_rule_names_cannot_take_the_librarys_own_keys() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    for value in [
        "redlimit:resets",
        "redlimit:overrides",
        "redlimit:refused:1",
        "redlimit:rules",
        "redlimit",
    ] {
        let name = format!("rate_limit:{value}");
        let rule = [Rule::new(name.as_str(), 5, Duration::from_secs(2))];
        let error = client.check_rules(&rule).await.unwrap_err();
        assert!(
            matches!(error, redlimit::Error::NotALimiter { .. }),
            "{name}: {error}"
        );
        let kind: String = redis::cmd("TYPE").arg(&name).query_async(&mut raw).await.unwrap();
        assert_eq!(kind, "none", "{name}: nothing written");
    }
    // The stream still carries resets: a refusal kept, then the limiter deleted.
    let rule = [Rule::new("rate_limit:after", 1, Duration::from_secs(600))];
    assert!(client.check_rules(&rule).await.unwrap().allowed);
    assert!(!client.check_rules(&rule).await.unwrap().allowed);
    let operator = Client::connect(&server.url()).await.unwrap();
    assert!(operator.rate_limiter("rate_limit:after").delete().await.unwrap());
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(client.check_rules(&rule).await.unwrap().allowed);
}

/// A call of more rules than one call decides is refused, on Redis before anything is
/// sent (a script run holds the server, longer the more rules), in process alike; a
/// call of the most is decided.
#[tokio::test]
async fn attack_a_call_of_too_many_rules_is_refused_before_redis_runs_it() {
    let server = RedisServer::start();
    let redis = Client::builder().connect(&server.url()).await.unwrap();
    let mut raw = server.raw().await;
    for (client, on_redis) in [(redis, true), (Client::memory(), false)] {
        let rules = |n: usize| -> Vec<Rule> {
            (0..n)
                .map(|i| Rule::new(format!("rate_limit:many:{i}"), 10, Duration::from_secs(60)))
                .collect()
        };
        let most = rules(redlimit::MAX_RULES_PER_CALL);
        assert!(client.check_rules(&most).await.unwrap().allowed);
        let too_many = rules(redlimit::MAX_RULES_PER_CALL + 1);
        let before: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut raw)
            .await
            .unwrap();
        for refused in [
            client.check_rules(&too_many).await.map(|_| ()),
            client.reserve(&too_many).await.map(|_| ()),
        ] {
            let err = refused.unwrap_err();
            assert!(
                matches!(
                    err,
                    redlimit::Error::TooManyRules {
                        rules: 257,
                        most: 256
                    }
                ),
                "{err:?}"
            );
            assert!(!err.is_backend_failure(), "misuse, not an outage: {err}");
            assert!(err.to_string().contains("at most 256"), "{err}");
        }
        let after: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut raw)
            .await
            .unwrap();
        let evalsha = |stats: &str| {
            stats
                .lines()
                .find(|l| l.starts_with("cmdstat_evalsha:"))
                .map(str::to_owned)
        };
        if on_redis {
            assert!(evalsha(&before).is_some(), "{before}");
            assert_eq!(evalsha(&before), evalsha(&after), "nothing sent");
        }
    }
}

/// A name that is one hash tag and nothing else, `{N}`, keeps its permits in the keys
/// of `N` (Redisson's layout). Rules on both counted the one state under two configs:
/// in one call each was counted and only the last written (a token bucket of 10 gave
/// 34 tokens: 6 calls of `{b}` for 5 beside `b` for 1, then `{b}` alone), and in
/// separate calls a looser `N` gave back what the stricter `{N}` had spent (`{t}` at
/// 10 a minute granted 55 of 72 in 6.3 s beside `t` at 10 a second). A rule on `{N}`
/// is refused as misuse, alone or beside others, on both backends, with nothing spent;
/// `N`, and a name with a tag and more (`{N}:x`), are decided as before.
#[tokio::test]
async fn attack_a_rule_on_a_name_that_is_one_hash_tag_is_refused() {
    let server = RedisServer::start();
    let redis = Client::builder()
        .prefix("")
        .local_refusals(false)
        .connect(&server.url())
        .await
        .unwrap();
    let minute = Duration::from_secs(60);
    let bucket = |name: &str, permits: u64| {
        Rule::new(name, 10, minute)
            .algorithm(redlimit::Algorithm::TokenBucket)
            .burst(10)
            .permits(permits)
    };
    let window = |name: &str, interval: Duration| Rule::new(name, 10, interval);
    for client in [redis, Client::builder().prefix("").memory()] {
        for (rules, braced, plain) in [
            (vec![bucket("{b}", 5), bucket("b", 1)], "{b}", "b"),
            (vec![bucket("b", 1), bucket("{b}", 5)], "{b}", "b"),
            (vec![bucket("{b}", 1)], "{b}", "b"),
            (vec![window("{t}", minute)], "{t}", "t"),
            (vec![window("x", minute), window("{t}", minute)], "{t}", "t"),
        ] {
            for _ in 0..6 {
                let refused = [
                    client.check_rules(&rules).await.map(|_| ()),
                    client.reserve(&rules).await.map(|_| ()),
                ];
                for err in refused {
                    let err = err.unwrap_err();
                    assert!(
                        matches!(&err, redlimit::Error::SharedKeys { name, other } if name == braced && other == plain),
                        "{err:?}"
                    );
                    assert!(!err.is_backend_failure(), "misuse, not an outage: {err}");
                    assert!(err.to_string().contains(&format!("`{braced}:value`")), "{err}");
                }
            }
            // Between refusals, the looser `t` at 10 a second: `{t}` was never counted.
            let t = client.check_rules(&[window("t", Duration::from_secs(1))]).await;
            assert!(t.unwrap().allowed, "t: five calls of its ten a second");
        }
        // Nothing spent: `b` has its whole bucket and `x` its whole window.
        let mut granted = 0;
        for _ in 0..12 {
            granted += u32::from(client.check_rules(&[bucket("b", 1)]).await.unwrap().allowed);
        }
        assert_eq!(granted, 10, "b: its burst, once");
        let mut granted = 0;
        for _ in 0..12 {
            granted += u32::from(client.check_rules(&[window("x", minute)]).await.unwrap().allowed);
        }
        assert_eq!(granted, 10, "x: its rate, once");
        // A name with a hash tag and more keeps keys of its own.
        assert!(
            client
                .check_rules(&[window("{t}:x", minute)])
                .await
                .unwrap()
                .allowed
        );
    }
}
