//! Token-bucket rules, on both backends at one manual clock: a burst, then a
//! continuous refill; exact waits for any number of permits; config changes that keep
//! whole tokens up to the new burst; mixed with sliding windows in one all-or-nothing
//! decision; the Redis layout, its expiry and clear errors for foreign state.

use redlimit_test_support as support;

use std::time::Duration;

use redis::AsyncCommands;
use redlimit::{Algorithm, Client, Clock, Error, ManualClock, Reserved, Rule};
use support::RedisServer;

const T0: u64 = 1_700_000_000_000;
const SEC: Duration = Duration::from_secs(1);

fn bucket(name: &str, rate: u64, interval: Duration, burst: u64) -> Rule {
    Rule::new(name, rate, interval)
        .algorithm(Algorithm::TokenBucket)
        .burst(burst)
}

/// Both backends at one clock.
async fn backends(server: &RedisServer, clock: &ManualClock) -> [Client; 2] {
    let memory = Client::builder().clock(clock.clone()).memory();
    let (redis, _) = server.clocked_client(clock).await;
    [memory, redis]
}

#[tokio::test]
async fn a_burst_then_a_continuous_refill_with_exact_waits() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    for client in backends(&server, &clock).await {
        let name = if client.is_memory() { "tb:m" } else { "tb:r" };
        // 10 per second, holding 5: a token every 100 ms.
        let rule = [bucket(name, 10, SEC, 5)];
        for left in (0..5).rev() {
            let d = client.check_rules(&rule).await.unwrap();
            assert!(d.allowed);
            assert_eq!(d.remaining, left);
        }
        let refused = client.check_rules(&rule).await.unwrap();
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after, Some(Duration::from_millis(100)));
        // Three permits: 300 ms, exactly, from an empty bucket.
        let three = [bucket(name, 10, SEC, 5).permits(3)];
        clock.advance(Duration::from_millis(40));
        assert_eq!(
            client.check_rules(&three).await.unwrap().retry_after,
            Some(Duration::from_millis(260))
        );
        clock.advance(Duration::from_millis(60));
        assert!(
            client.check_rules(&rule).await.unwrap().allowed,
            "one token at 100 ms"
        );
        assert!(!client.check_rules(&rule).await.unwrap().allowed);
        // After a quiet second the burst is back, and no more than the burst.
        clock.advance(Duration::from_secs(10));
        let d = client.check_rules(&three).await.unwrap();
        assert_eq!((d.allowed, d.remaining), (true, 2));
        clock.advance(Duration::from_secs(100));
    }
}

/// A call whose time was read before a refill that reached the bucket first is decided
/// at that refill's time (so the bucket never refills backwards), when it is at most
/// 1 s later; further apart is clock skew, and the call keeps its own time. One bucket
/// (the tokens script's one-bucket path), two (its phases), and a bucket beside a
/// sliding window (the acquire script's phases).
#[tokio::test]
async fn a_call_overtaken_on_its_way_is_decided_at_the_later_refill() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    for client in backends(&server, &clock).await {
        let side = if client.is_memory() { "m" } else { "r" };
        let b = |i: usize| bucket(&format!("tb:late:{side}:{i}"), 1, SEC, 2);
        let w = |i: usize| Rule::new(format!("tb:late:w:{side}:{i}"), 10, SEC);
        for rules in [vec![b(1)], vec![b(2), b(3)], vec![w(4), b(4)]] {
            let first = &rules[0];
            clock.set(T0 + 500);
            assert_eq!(client.check_rules(&rules).await.unwrap().at_ms, T0 + 500);
            // Read at T0 + 200, arriving after the call of T0 + 500.
            clock.set(T0 + 200);
            let late = client.check_rules(&rules).await.unwrap();
            assert!(late.allowed, "{side} {}: {late:?}", first.name());
            assert_eq!(late.at_ms, T0 + 500, "{side} {}", first.name());
            // Further apart than 1 s: the call's own time.
            clock.set(T0 - 600);
            let skewed = client.check_rules(&rules).await.unwrap();
            assert_eq!(skewed.at_ms, T0 - 600, "{side} {}", first.name());
        }
    }
}

#[tokio::test]
async fn the_redis_layout_is_one_small_value_that_vanishes_once_full() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let (client, mut raw) = server.clocked_client(&clock).await;
    let rule = [bucket("rate_limit:api:7", 100, Duration::from_secs(60), 20).permits(4)];
    assert!(client.check_rules(&rule).await.unwrap().allowed);
    // rate:interval:burst:tokens:at, tokens in 1/60000 of a token: 16 left.
    let state: String = raw.get("{rate_limit:api:7}:bucket").await.unwrap();
    assert_eq!(state, format!("100:60000:20:{}:{T0}", 16 * 60_000));
    // 4 tokens at 100 per minute come back in 2.4 s: the key lives that long.
    let ttl: i64 = raw.pttl("{rate_limit:api:7}:bucket").await.unwrap();
    assert!((2_300..=2_400).contains(&ttl), "{ttl}");
    let keys: Vec<String> = raw.keys("*").await.unwrap();
    assert_eq!(keys, ["{rate_limit:api:7}:bucket"], "no other key");
    // Mixed with a window, the bucket is written the same way.
    let mixed = [
        bucket("rate_limit:api:8", 100, Duration::from_secs(60), 20).permits(4),
        Rule::new("rate_limit:api:8:w", 5, Duration::from_secs(60)),
    ];
    assert!(client.check_rules(&mixed).await.unwrap().allowed);
    let state: String = raw.get("{rate_limit:api:8}:bucket").await.unwrap();
    assert_eq!(state, format!("100:60000:20:{}:{T0}", 16 * 60_000));
}

/// A refusal changes nothing that must be stored, so it writes nothing: the stored
/// bucket (value and TTL) stays as the last grant left it, and the decisions after it
/// are those of the in-process twin, which refills at every call.
#[tokio::test]
async fn a_refusal_writes_nothing() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let [memory, redis] = backends(&server, &clock).await;
    let mut raw = server.raw().await;
    // 10 per 1 000 s: a bucket full again only minutes later, in real time too (its
    // TTL is real time, the test's clock is not)
    let rule = [bucket("tb:quiet", 10, Duration::from_secs(1000), 2)];
    for client in [&memory, &redis] {
        assert!(client.check_rules(&rule).await.unwrap().allowed);
        assert!(client.check_rules(&rule).await.unwrap().allowed);
    }
    let mut stored: String = raw.get("{tb:quiet}:bucket").await.unwrap();
    let mut refused = 0;
    for step in 0..12 {
        clock.advance(Duration::from_secs(30));
        let monitor = support::monitor::Monitor::start(server.port);
        let decisions = [
            memory.check_rules(&rule).await.unwrap(),
            redis.check_rules(&rule).await.unwrap(),
        ];
        let commands = monitor.script_commands();
        assert_eq!(decisions[0], decisions[1], "step {step}");
        let now: String = raw.get("{tb:quiet}:bucket").await.unwrap();
        if decisions[1].allowed {
            stored = now;
        } else {
            refused += 1;
            let writes: Vec<_> = commands.iter().filter(|c| c[0] != "get").collect();
            assert!(writes.is_empty(), "step {step}: a refusal ran {writes:?}");
            assert_eq!(now, stored, "step {step}");
        }
    }
    assert!(refused >= 6, "{refused} refusals");
}

/// A refused reservation of one bucket writes nothing either, in process as on Redis:
/// with a clock set back more than the reordering margin afterwards, both refill from
/// the last grant. (In process it stored its refill: 5 tokens left where Redis had 2.)
#[tokio::test]
async fn a_refused_reservation_writes_nothing_either() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let clients = backends(&server, &clock).await;
    let mut left = Vec::new();
    for (i, client) in clients.iter().enumerate() {
        let name = format!("tb:reserve-refused:{i}");
        let rule = || bucket(&name, 10, Duration::from_secs(60), 10);
        clock.set(T0);
        assert!(client.check_rules(&[rule().permits(10)]).await.unwrap().allowed);
        clock.set(T0 + 30_000);
        let reserved = client.reserve(&[rule().settled().permits(10)]).await.unwrap();
        assert!(matches!(reserved, Reserved::Refused(_)), "on {i}");
        left.push(ten_a_minute_left_at(client, &clock, &name, T0 + 12_000).await);
    }
    assert_eq!(left, [2, 2], "12 s of refill after the grant");
}

/// The tokens left at `at` in the bucket of 10 a minute `name`, the clock set there.
async fn ten_a_minute_left_at(client: &Client, clock: &ManualClock, name: &str, at: u64) -> u64 {
    clock.set(at);
    let bucket = client.token_bucket(name, 10, Duration::from_secs(60));
    bucket.available().await.unwrap()
}

/// A bucket in debt (a settle's excess left it below zero) is decided as any other:
/// its refusal writes nothing on Redis as in process, and with a clock set back more
/// than the reordering margin afterwards both refill from the excess's time. (Redis
/// left the debt to the general script, which stored the refusal's refill: 5 tokens
/// where in process there were none.)
#[tokio::test]
async fn a_bucket_in_debt_is_refused_without_a_write() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let clients = backends(&server, &clock).await;
    let mut raw = server.raw().await;
    let mut left = Vec::new();
    for (i, client) in clients.iter().enumerate() {
        let name = format!("tb:debt:{i}");
        let rule = || bucket(&name, 10, Duration::from_secs(60), 10);
        clock.set(T0);
        let reserved = match client.reserve(&[rule().settled().permits(1)]).await.unwrap() {
            Reserved::Granted(reservation) => reservation,
            Reserved::Refused(decision) => panic!("refused: {decision:?}"),
        };
        reserved.settle(11).await.unwrap();
        let stored: Option<String> = raw.get(format!("{{{name}}}:bucket")).await.unwrap();
        clock.set(T0 + 36_000);
        assert!(!client.check_rules(&[rule().permits(10)]).await.unwrap().allowed);
        let after: Option<String> = raw.get(format!("{{{name}}}:bucket")).await.unwrap();
        assert_eq!(after, stored, "on {i}: the refusal wrote");
        left.push(ten_a_minute_left_at(client, &clock, &name, T0 + 6_000).await);
    }
    assert_eq!(left, [0, 0], "a token owed, 1 refilled by 6 s after the excess");
}

/// A bucket whose capacity is near 2^53 units, in as deep a debt as a settle leaves it
/// (the capacity less 2^53: its room 2^53): the usual script leaves a debt that far
/// below the capacity to the general one, whose arithmetic is exact there, to the ms.
/// A debt one unit deeper (an earlier build's settle stored such debts) is read at that
/// floor: its room past 2^53 is what a double rounds (the whole burst asked 2^21 ms
/// later was granted one unit short, when such a room was read).
#[tokio::test]
async fn a_debt_far_below_a_huge_capacity_is_decided_exactly() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let (client, mut raw) = server.clocked_client(&clock).await;
    let (rate, interval, burst) = (1_u64 << 32, 1_u64 << 21, (1_u64 << 32) - 1);
    let rule = bucket("tb:huge", rate, Duration::from_millis(interval), burst).permits(burst);
    // the capacity less 2^53 units, 2^21 ms of refill from full
    let stored = format!("{rate}:{interval}:{burst}:-2097152:{T0}");
    let _: () = raw.set("{tb:huge}:bucket", &stored).await.unwrap();
    let at_once = client.check_rules(std::slice::from_ref(&rule)).await.unwrap();
    assert!(!at_once.allowed);
    assert_eq!(at_once.retry_after, Some(Duration::from_millis(interval)));
    clock.set(T0 + interval - 1);
    let short = client.check_rules(std::slice::from_ref(&rule)).await.unwrap();
    assert_eq!(
        (short.allowed, short.retry_after),
        (false, Some(Duration::from_millis(1)))
    );
    clock.set(T0 + interval);
    assert!(
        client
            .check_rules(std::slice::from_ref(&rule))
            .await
            .unwrap()
            .allowed
    );
    let deeper = format!("{rate}:{interval}:{burst}:-2097153:{T0}");
    let _: () = raw.set("{tb:huge}:bucket", &deeper).await.unwrap();
    clock.set(T0 + interval - 1);
    let short = client.check_rules(&[rule]).await.unwrap();
    assert_eq!(
        (short.allowed, short.retry_after),
        (false, Some(Duration::from_millis(1))),
        "read at the floor"
    );
}

/// A config change carries whole tokens and whole tokens of coldness over, up to the
/// new config's maximum, alike on both backends where the products pass 64 bits (a
/// large old burst or coldness taken to a long new interval): in process they
/// wrapped, 4 096 tokens carried to 1 per 2^52 ms read as none, and a bucket cold to
/// its 2^45 taken to an interval of 2^19 ms as warm (30 permits a call granted three
/// times where the cold bucket grants once).
#[tokio::test]
async fn a_config_change_caps_what_it_carries_past_64_bits() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let ms = Duration::from_millis(1);
    for client in backends(&server, &clock).await {
        let tag = if client.is_memory() { "memory" } else { "redis" };
        let wide = format!("tb:wide:{tag}");
        let left = client
            .check_rules(&[bucket(&wide, 1, ms, 5_000).permits(904)])
            .await
            .unwrap();
        assert_eq!(left.remaining, 4_096);
        let long = bucket(&wide, 1, Duration::from_millis(1 << 52), 2).permits(2);
        let carried = client.check_rules(&[long]).await.unwrap();
        assert!(carried.allowed, "{tag}: {carried:?}");

        let cold = format!("tb:cold:{tag}");
        let warming = || bucket(&cold, 1, ms, 1_000).warmup(Duration::from_millis(1 << 45));
        assert!(client.check_rules(&[warming()]).await.unwrap().allowed);
        let Reserved::Granted(reserved) = client.reserve(&[warming().settled().permits(10)]).await.unwrap()
        else {
            panic!("{tag}: refused");
        };
        reserved.settle(0).await.unwrap();
        let changed = || {
            bucket(&cold, 100, Duration::from_millis(1 << 19), 100)
                .warmup(Duration::from_secs(600))
                .permits(30)
        };
        let first = client.check_rules(&[changed()]).await.unwrap();
        assert_eq!(
            (first.allowed, first.remaining),
            (true, 10),
            "{tag}: cold, 3 tokens a permit"
        );
        assert!(!client.check_rules(&[changed()]).await.unwrap().allowed, "{tag}");
    }
}

#[tokio::test]
async fn a_changed_config_keeps_whole_tokens_up_to_the_new_burst() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    for client in backends(&server, &clock).await {
        let name = if client.is_memory() { "tb:cm" } else { "tb:cr" };
        assert!(
            client
                .check_rules(&[bucket(name, 10, SEC, 10).permits(3)])
                .await
                .unwrap()
                .allowed
        );
        // 7 tokens kept, clamped to the new burst of 5.
        let smaller = client
            .check_rules(&[bucket(name, 60, Duration::from_secs(60), 5)])
            .await
            .unwrap();
        assert_eq!((smaller.allowed, smaller.remaining), (true, 4));
        // A larger burst does not fill the bucket.
        let larger = client
            .check_rules(&[bucket(name, 60, Duration::from_secs(60), 50)])
            .await
            .unwrap();
        assert_eq!((larger.allowed, larger.remaining), (true, 3));
    }
}

#[tokio::test]
async fn mixed_with_sliding_windows_all_or_nothing() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    for client in backends(&server, &clock).await {
        let tag = if client.is_memory() { "m" } else { "r" };
        let tokens = bucket(&format!("mix:{tag}:tokens"), 1, SEC, 3);
        let window = Rule::new(format!("mix:{tag}:window"), 2, Duration::from_secs(60));
        let both = [tokens.clone(), window.clone()];
        assert!(client.check_rules(&both).await.unwrap().allowed);
        assert!(client.check_rules(&both).await.unwrap().allowed);
        // The window refuses: the bucket keeps its last token.
        let refused = client.check_rules(&both).await.unwrap();
        assert_eq!(refused.refused_by, Some(1));
        let alone = client.check_rules(std::slice::from_ref(&tokens)).await.unwrap();
        assert_eq!(
            (alone.allowed, alone.remaining),
            (true, 0),
            "the refused call took no token"
        );
        // The bucket refuses: the window is not spent either.
        let window2 = Rule::new(format!("mix:{tag}:window2"), 5, Duration::from_secs(60));
        let refused = client
            .check_rules(&[tokens.clone(), window2.clone()])
            .await
            .unwrap();
        assert_eq!(refused.refused_by, Some(0));
        assert_eq!(refused.retry_after, Some(SEC));
        let w = client.rate_limiter(window2.name());
        assert_eq!(
            w.available_permits().await.unwrap(),
            5,
            "its config written, no permit taken"
        );
        clock.advance(Duration::from_secs(100));
    }
}

#[tokio::test]
async fn foreign_state_and_impossible_requests_are_clear_errors() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let (client, mut raw) = server.clocked_client(&clock).await;
    let _: () = raw.hset("{tb:hash}:bucket", "tokens", "1").await.unwrap();
    let error = client
        .check_rules(&[bucket("tb:hash", 1, SEC, 1)])
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::WrongType { key, .. } if key == "{tb:hash}:bucket"),
        "{error}"
    );
    for (name, state) in [
        ("tb:bad", "lots"),
        ("tb:zero", "0:1000:1:0:0"),
        ("tb:short", "1:1000:1:5"),
        // Five tokens in a bucket of one, the rule's own config: no code of the library
        // stores more than a bucket holds (before, the one-rule call granted them).
        ("tb:full", "1:1000:1:5000:0"),
    ] {
        let key = format!("{{{name}}}:bucket");
        let _: () = raw.set(&key, state).await.unwrap();
        // Alone (tokens.lua) and mixed with a window (acquire.lua): the same error.
        for rules in [
            vec![bucket(name, 1, SEC, 1)],
            vec![bucket(name, 1, SEC, 1), Rule::new(format!("{name}:w"), 1, SEC)],
        ] {
            let error = client.check_rules(&rules).await.unwrap_err();
            assert!(
                matches!(&error, Error::CorruptBucket { key: k, detail } if *k == key && detail == state),
                "{error}"
            );
        }
    }
    for client in backends(&server, &clock).await {
        let error = client
            .check_rules(&[bucket("tb:big", 10, SEC, 3).permits(4)])
            .await
            .unwrap_err();
        assert!(
            matches!(error, Error::PermitsExceedBurst { burst: 3, .. }),
            "{error}"
        );
        assert_eq!(
            error.to_string(),
            "token bucket `tb:big`: 4 permits requested but it holds at most 3 tokens; \
             ask for at most 3, or give it a larger burst"
        );
        let error = client
            .check_rules(&[bucket(
                "tb:huge",
                10,
                Duration::from_secs(86_400 * 365),
                u64::MAX / 4,
            )])
            .await
            .unwrap_err();
        assert!(error.to_string().contains("2^53"), "{error}");
    }
}

/// The attribute: `algorithm = "token_bucket"` with a `burst`, stacked on a sliding
/// window, on a default client at a manual clock.
mod attribute {
    use super::*;
    use redlimit::{rate_limit, RateLimited};

    #[rate_limit(
        key = "tbattr:{user}",
        rate = 2,
        interval = "1s",
        algorithm = "token_bucket",
        burst = 4
    )]
    #[rate_limit(key = "tbattr:daily", rate = 5, interval = "1d")]
    async fn call(user: u32) -> Result<(), RateLimited> {
        let _ = user;
        Ok(())
    }

    #[rate_limit(
        key = "tbattr:cold:bucket",
        rate = 10,
        interval = "1s",
        algorithm = "token_bucket",
        warmup = "10s"
    )]
    async fn cold() -> Result<(), RateLimited> {
        Ok(())
    }

    #[tokio::test]
    async fn a_token_bucket_rule_on_a_function() {
        let clock = ManualClock::new(T0);
        redlimit::set_default(Client::builder().clock(clock.clone()).memory()).unwrap();
        for _ in 0..4 {
            call(1).await.unwrap();
        }
        let refused = call(1).await.unwrap_err();
        assert_eq!(refused.rule(), 0);
        assert_eq!(refused.retry_after(), Some(Duration::from_millis(500)));
        clock.advance(Duration::from_millis(500));
        call(1).await.unwrap();
        // The daily window's 5 are spent; the bucket refilled does not help.
        clock.advance(Duration::from_secs(10));
        let refused = call(1).await.unwrap_err();
        assert_eq!(refused.rule(), 1);
        // Warming up from cold: 4 of the burst of 10 at once, then a wait of about
        // 3 tokens' time.
        for _ in 0..4 {
            cold().await.unwrap();
        }
        let refused = cold().await.unwrap_err();
        let wait = refused.retry_after().unwrap();
        assert!(
            (Duration::from_millis(200)..=Duration::from_millis(300)).contains(&wait),
            "{wait:?}"
        );
    }
}

/// The handle: take, ask, wait, change the rate keeping the tokens, delete.
#[tokio::test]
async fn the_token_bucket_handle() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    for client in backends(&server, &clock).await {
        let name = if client.is_memory() { "h:m" } else { "h:r" };
        let bucket = client.token_bucket(name, 10, SEC).burst(4);
        assert_eq!(bucket.available().await.unwrap(), 4, "a missing bucket is full");
        assert!(bucket.try_acquire(3).await.unwrap());
        assert_eq!(bucket.available().await.unwrap(), 1);
        assert_eq!(bucket.available().await.unwrap(), 1, "asking takes nothing");
        let refused = bucket.check(3).await.unwrap();
        assert_eq!(refused.retry_after, Some(Duration::from_millis(200)));
        // Another rate, the same tokens: 1 left, now refilled at 60 per minute.
        let slower = bucket.clone().with_rate(60, Duration::from_secs(60));
        assert_eq!(slower.capacity(), 4);
        assert_eq!(slower.check(2).await.unwrap().retry_after, Some(SEC));
        assert!(bucket.delete().await.unwrap());
        assert!(!bucket.delete().await.unwrap());
        assert_eq!(bucket.available().await.unwrap(), 4, "deleted: full again");
        let error = client
            .token_bucket("a{b", 1, SEC)
            .try_acquire(1)
            .await
            .unwrap_err();
        assert!(matches!(error, Error::CrossSlotName { .. }), "{error}");
    }
    // Waiting, on the real clock: 20 per second, so a token every 50 ms.
    let client = Client::connect(&server.url()).await.unwrap();
    let bucket = client.token_bucket("h:wait", 20, SEC).burst(1);
    assert!(bucket.try_acquire(1).await.unwrap());
    let started = std::time::Instant::now();
    assert!(bucket
        .try_acquire_for(1, Duration::from_millis(500))
        .await
        .unwrap());
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(40) && waited < Duration::from_millis(400),
        "{waited:?}"
    );
    assert!(
        !bucket
            .try_acquire_for(1, Duration::from_millis(10))
            .await
            .unwrap(),
        "50 ms away, 10 allowed"
    );
}

/// Grants in each second of `seconds`, from a cold start, to a caller that takes every
/// token as soon as it can be had (waiting exactly each refusal's `retry_after`).
async fn saturated(client: &Client, clock: &ManualClock, rule: &Rule, seconds: u64) -> Vec<u64> {
    let start = clock.now_ms();
    let mut per_second = vec![0; seconds as usize];
    while clock.now_ms() < start + seconds * 1_000 {
        let d = client.check_rules(std::slice::from_ref(rule)).await.unwrap();
        match d.retry_after {
            None => per_second[((clock.now_ms() - start) / 1_000) as usize] += 1,
            Some(wait) => clock.advance(wait),
        }
    }
    per_second
}

#[tokio::test]
async fn a_cold_bucket_warms_up_to_the_full_rate() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let mut curves = Vec::new();
    for client in backends(&server, &clock).await {
        let name = if client.is_memory() { "tb:wm" } else { "tb:wr" };
        // 10 per second, holding 10, warming up over 10 s.
        let rule = bucket(name, 10, SEC, 10).warmup(Duration::from_secs(10));
        let cold = saturated(&client, &clock, &rule, 20).await;
        // A third of the burst and of the rate at first (the first second also
        // holds the burst), rising to the full rate as tokens are taken.
        assert!(cold[0] <= 8, "{cold:?}");
        assert!((3..=4).contains(&cold[1]), "{cold:?}");
        assert!(
            cold[1..].windows(2).all(|w| w[1] >= w[0]),
            "never slower: {cold:?}"
        );
        let full = cold.iter().position(|&n| n == 10).unwrap();
        assert!(
            (8..=10).contains(&full),
            "the full rate after about 10 s: {cold:?}"
        );
        assert!(cold[full..].iter().all(|&n| n == 10), "{cold:?}");

        // Busy, it stays warm: a short pause gives the whole burst back at once.
        clock.advance(Duration::from_secs(2));
        let burst = saturated(&client, &clock, &rule, 1).await;
        assert_eq!(burst, [19], "the burst and a second of refill, at full speed");
        // Idle for long (full for more than the warm-up): cold again.
        clock.advance(Duration::from_secs(60));
        let again = saturated(&client, &clock, &rule, 2).await;
        assert!(again[0] <= 8 && again[1] <= 4, "{again:?}");

        // Without a warm-up: the burst and the full rate at once.
        let plain = bucket(&format!("{name}:plain"), 10, SEC, 10);
        let warm = saturated(&client, &clock, &plain, 3).await;
        assert_eq!(warm, [19, 10, 10]);
        curves.push(cold);
    }
    assert_eq!(curves[0], curves[1], "both backends grant alike");
}

#[tokio::test]
async fn a_warming_bucket_keeps_its_coldness_in_its_value_and_lives_until_cold() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let (client, mut raw) = server.clocked_client(&clock).await;
    // 100 per minute, holding 20, warming up over 30 s: coldness up to 50 tokens, so
    // 4 permits cost 12 tokens at first.
    let rule = [bucket("rate_limit:api:9", 100, Duration::from_secs(60), 20)
        .warmup(Duration::from_secs(30))
        .permits(4)];
    let d = client.check_rules(&rule).await.unwrap();
    assert_eq!((d.allowed, d.remaining), (true, 8));
    // rate:interval:burst:units:at:warmup:cold, in 1/60000 of a token.
    let state: String = raw.get("{rate_limit:api:9}:bucket").await.unwrap();
    assert_eq!(
        state,
        format!("100:60000:20:{}:{T0}:30000:{}", 8 * 60_000, 46 * 60_000)
    );
    // Full again after 12 tokens (7.2 s), cold again after 4 more (2.4 s).
    let ttl: i64 = raw.pttl("{rate_limit:api:9}:bucket").await.unwrap();
    assert!((9_500..=9_600).contains(&ttl), "{ttl}");
    // Taken to its last token and beyond: a debt, which waits pay back exactly.
    let two = [bucket("rate_limit:api:9", 100, Duration::from_secs(60), 20)
        .warmup(Duration::from_secs(30))
        .permits(2)];
    let mut debt = 0;
    while client.check_rules(&two).await.unwrap().allowed {
        debt += 1;
    }
    let state: String = raw.get("{rate_limit:api:9}:bucket").await.unwrap();
    let units: i64 = state.split(':').nth(3).unwrap().parse().unwrap();
    assert!(debt >= 1 && units < 0, "{debt} grants, {state}");
    let wait = client.check_rules(&two).await.unwrap().retry_after.unwrap();
    assert_eq!(wait.as_millis() as i64, (2 * 60_000 - units + 99) / 100);
    clock.advance(wait - Duration::from_millis(1));
    assert!(!client.check_rules(&two).await.unwrap().allowed);
    clock.advance(Duration::from_millis(1));
    assert!(client.check_rules(&two).await.unwrap().allowed);
}

#[tokio::test]
async fn warm_up_settings_that_cannot_hold_are_clear_errors() {
    let clock = ManualClock::new(T0);
    let client = Client::builder().clock(clock).memory();
    let window = Rule::new("tb:e1", 10, SEC).warmup(SEC);
    let err = client.check_rules(&[window]).await.unwrap_err();
    assert!(err.to_string().contains("token bucket's"), "{err}");
    // Coldness (warm-up ms times the rate) must stay below 2^45.
    let long = bucket("tb:e2", 1 << 20, SEC, 10).warmup(Duration::from_secs(1 << 26));
    let err = client.check_rules(&[long]).await.unwrap_err();
    assert!(err.to_string().contains("shorter warm-up"), "{err}");
    let wide = bucket("tb:e3", 10, Duration::from_millis(1 << 20), 1 << 32).warmup(SEC);
    let err = client.check_rules(&[wide]).await.unwrap_err();
    assert!(err.to_string().contains("2^51"), "{err}");
}

/// A rule is checked on its first call and kept as checked; every setter makes a new
/// rule that is checked again, so a rule first called with good settings and then
/// changed to bad ones is refused, on both backends.
#[tokio::test]
async fn a_rule_changed_after_its_first_call_is_checked_again() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    for client in backends(&server, &clock).await {
        let window = Rule::new("checked:window", 5, SEC);
        let tokens = bucket("checked:tokens", 5, SEC, 5);
        for good in [&window, &tokens] {
            for _ in 0..2 {
                assert!(
                    client
                        .check_rules(std::slice::from_ref(good))
                        .await
                        .unwrap()
                        .allowed
                );
            }
        }
        let changed = [
            window.clone().permits(6),
            window.clone().burst(3),
            window.clone().warmup(SEC),
            window.clone().keep_alive(Some(Duration::from_millis(10))),
            tokens.clone().permits(6),
            tokens.clone().burst(0),
            window
                .clone()
                .algorithm(Algorithm::TokenBucket)
                .burst(3)
                .permits(4),
        ];
        for bad in changed {
            let answer = client.check_rules(std::slice::from_ref(&bad)).await;
            assert!(
                answer.as_ref().is_err_and(|e| !e.is_backend_failure()),
                "{bad:?}: {answer:?}"
            );
        }
    }
}

/// A call naming reservation ids that are not ones this library's client makes (15
/// digits, the first not 0) is refused by the script before it writes anything: the
/// bucket is as it was, no segment opened. The calls are a reservation's own, as
/// MONITOR shows it sent them (alone: tokens.lua; beside a window: acquire.lua), sent
/// again with the ids replaced; sent again as they were, each is granted.
#[tokio::test]
async fn a_call_naming_malformed_reservation_ids_writes_nothing() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let (client, mut raw) = server.clocked_client(&clock).await;
    let (name, key) = ("tb:ids", "{tb:ids}:bucket");
    // (an hour's rate: the bucket, full again, would be gone before it is read)
    let hour = Duration::from_secs(3_600);
    let reserved = || bucket(name, 1_000, hour, 1_000).settled().permits(2);
    let monitor = support::monitor::Monitor::start(server.port);
    for rules in [
        vec![reserved()],
        vec![reserved(), Rule::new("tb:ids:w", 1_000, hour)],
    ] {
        let Reserved::Granted(reservation) = client.reserve(&rules).await.unwrap() else {
            panic!("a fresh bucket refused");
        };
        std::mem::forget(reservation);
    }
    // (each sent twice: first refused as a script the server had not loaded yet)
    let mut calls = monitor.client_script_calls();
    calls.dedup();
    assert_eq!(calls.len(), 2, "{calls:?}");
    for call in calls {
        let ids = call.last().unwrap().clone();
        assert!(
            ids.len() >= 15 && ids.iter().all(|b| b.is_ascii_digit() || *b == b','),
            "{ids:?}"
        );
        let before: String = raw.get(key).await.unwrap();
        for bad in [
            "12",
            "012345678901234",
            "1234567890123456",
            "12345678901234x",
            "1,2",
        ] {
            let mut sent = call.clone();
            *sent.last_mut().unwrap() = bad.as_bytes().to_vec();
            let refused: Result<redis::Value, _> =
                redis::cmd("EVALSHA").arg(sent).query_async(&mut raw).await;
            let error = refused.expect_err(bad).to_string();
            assert!(error.contains("bad_argument"), "{bad}: {error}");
            let after: String = raw.get(key).await.unwrap();
            assert_eq!(after, before, "{bad}: written");
        }
        // (the same call as sent: granted, and written)
        let _: redis::Value = redis::cmd("EVALSHA")
            .arg(call)
            .query_async(&mut raw)
            .await
            .unwrap();
        let after: String = raw.get(key).await.unwrap();
        assert_ne!(after, before);
    }
}

/// A stored bucket holding a number past 2^53 (another program's, or a hand's) is
/// named corrupt by every script that reads it, as the Rust reading names it, not read
/// rounded: a double rounds 2^53 + 1 to 2^53, so that tokens past a bucket of 2^53
/// units read as a full bucket, and a refill time past 2^53 as one at 2^53. So is a
/// capacity of 2^53 + 1 (its product rounds to 2^53: the bucket read as full). A debt
/// leaving more than 2^53 of room (an earlier build's settle left one) is read at the
/// floor a settle leaves now, the capacity less 2^53: read as it was, the refill added
/// to its room rounded, and the full burst was granted where a token less was held.
#[tokio::test]
async fn a_stored_number_past_2_53_is_named_corrupt_not_rounded() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let (client, mut raw) = server.clocked_client(&clock).await;
    let past = "9007199254740993";
    // A bucket of 2^53 units: 2^20 tokens of 2^33 ms.
    let large = (1, Duration::from_millis(1 << 33), 1 << 20);
    let cases = [
        // the rule's own config (tokens_one.lua), tokens past its capacity
        (format!("1:8589934592:1048576:{past}:{T0}"), large),
        // another config (tokens.lua): a rate, a refill time, a warm-up
        (format!("{past}:1000:1:0:{T0}"), large),
        (format!("1:1000:1:0:{past}"), large),
        (format!("1:1000:1:0:{T0}:{past}:0"), large),
        // 3 x 3002399751580331 = 2^53 + 1 units
        (format!("1:3002399751580331:3:9007199254740992:{T0}"), large),
    ];
    for (i, (text, (rate, interval, burst))) in cases.iter().enumerate() {
        let name = format!("tb:past{i}");
        let key = format!("{{{name}}}:bucket");
        // Alone, mixed with a window (acquire.lua), and deleted (reset.lua).
        for rules in [
            vec![bucket(&name, *rate, *interval, *burst)],
            vec![
                bucket(&name, *rate, *interval, *burst),
                Rule::new(format!("{name}:w"), 1, SEC),
            ],
        ] {
            let _: () = raw.set(&key, text).await.unwrap();
            let error = client.check_rules(&rules).await.expect_err(text);
            assert!(
                matches!(&error, Error::CorruptBucket { key: k, .. } if *k == key),
                "{text}: {error}"
            );
            let stored: String = raw.get(&key).await.unwrap();
            assert_eq!(&stored, text, "left as it was");
        }
        let handle = client.token_bucket(&name, *rate, *interval).burst(*burst);
        let refused = handle.delete().await;
        assert!(
            matches!(refused, Err(Error::NotALimiter { .. })),
            "{text}: {refused:?}"
        );
        let stored: String = raw.get(&key).await.unwrap();
        assert_eq!(&stored, text, "not deleted");
    }
    // A bucket of 2^52 + 3 units, a token a ms, refilled at 2^52 + 2 a ms, in the rule's
    // own config at the debt floor 2 ms ago: read at the capacity less 2^53, refilled
    // full, one token taken.
    let (rate, burst) = (4_503_599_627_370_498, 4_503_599_627_370_499);
    let rule = bucket("tb:deep", rate, Duration::from_millis(1), burst);
    let text = format!("{rate}:1:{burst}:-4503599627370496:{}", T0 - 2);
    let handle = client
        .token_bucket("tb:deep", rate, Duration::from_millis(1))
        .burst(burst);
    // (alone, and beside a window of its own, whose call reads it in acquire.lua; the
    // bucket, full again 1 ms after the take, keeps its key 1 ms of real time: a
    // reading that found it expired, full, is made again)
    for (i, rules) in [vec![rule.clone()], vec![rule, Rule::new("tb:deep:w", 1, SEC)]]
        .into_iter()
        .enumerate()
    {
        for attempt in 0.. {
            let _: () = raw
                .del(&["tb:deep:w", "{tb:deep:w}:value", "{tb:deep:w}:permits"])
                .await
                .unwrap();
            let _: () = raw.set("{tb:deep}:bucket", &text).await.unwrap();
            assert!(client.check_rules(&rules).await.unwrap().allowed, "{i}");
            let left = handle.available().await.unwrap();
            let kept: bool = raw.exists("{tb:deep}:bucket").await.unwrap();
            if left == burst && !kept && attempt < 50 {
                continue;
            }
            assert_eq!(left, burst - 1, "{i}");
            break;
        }
    }
}

/// The scripts take a stored bucket for one they can read exactly when the Rust
/// reading (`algorithm::bucket::read_bucket`, which the CLI uses) does, and read it
/// alike: texts at every bound of its numbers (15, 16 and 17 characters, leading
/// zeros, 2^53 and one past, the debt floor and one below, the room at 2^53, one short
/// and one past, a capacity of 2^53 and one past), its segments (ids of another
/// program's text, of their length or not), and random texts of their alphabet, each
/// asked of by calls taking nothing, of the config most of them hold (the one-rule
/// script) and of another (the general one); what each call finds left is what the
/// Rust plan makes of the Rust reading (for a bucket refilled before the call).
#[tokio::test]
async fn the_scripts_read_a_stored_bucket_as_the_rust_reading_does() {
    use rand::{RngExt, SeedableRng};
    use redlimit_runtime::algorithm::bucket::{plan_tokens, read_bucket};
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let (client, mut raw) = server.clocked_client(&clock).await;
    let numbers = [
        "0",
        "1",
        "-1",
        "-0",
        "007",
        "999999999999999",
        "0000000000000001",
        "1000000000000000",
        "9007199254740992",
        "9007199254740993",
        "00000000000000001",
        "4503599627370496",
        "-4503599627370496",
        "-4503599627370497",
        "-0000000000000000001",
        "4503599627370497",
        "3002399751580331",
        "3",
        "8589934592",
        "1048576",
        "18446744073709551616",
        "",
    ];
    let ids = [
        "100000000000001",
        "abcdefghijklmno",
        "099999999999999",
        "1000000000000001",
        "10000000000000",
        "100000000000001X999999999999999",
    ];
    let mut texts = vec![
        format!("1:8589934592:1048576:0:{T0}"),
        format!("1:8589934592:1048576:-1:{T0}"),
        format!("4503599627370498:1:4503599627370499:-4503599627370493:{T0}"),
        format!("4503599627370498:1:4503599627370499:-4503599627370492:{T0}"),
        format!("4503599627370498:1:4503599627370499:-4503599627370494:{T0}"),
        format!("1:3002399751580331:3:9007199254740992:{T0}"),
        format!("1:3002399751580330:3:9007199254740990:{T0}"),
        format!("10:1000:5:5000:{T0}:2000:20000"),
        format!("10:1000:5:5000:{T0}:2000:20001"),
    ];
    for n in numbers {
        for field in 0..5 {
            let mut fields = ["10", "1000", "5", "5000", "1700000000000"];
            fields[field] = n;
            texts.push(fields.join(":"));
        }
    }
    for id in ids {
        texts.push(format!("10:1000:5:-1:{T0}|{T0}.0.{id}"));
        texts.push(format!("10:1000:5:-1:{T0}|{T0}.0.{id},{T0}.5000.100000000000002"));
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(53);
    let alphabet = b"0123456789:-|.,";
    for _ in 0..600 {
        let mut text = String::from("10:1000:5:");
        for _ in 0..rng.random_range(1..30) {
            text.push(alphabet[rng.random_range(0..alphabet.len())] as char);
        }
        texts.push(text);
    }
    let (mut accepted, mut refused) = (0, 0);
    for (i, text) in texts.iter().enumerate() {
        let name = format!("tb:read{i}");
        let _: () = raw.set(format!("{{{name}}}:bucket"), text).await.unwrap();
        // (a rule of another config, and the config most texts hold: the one-rule
        // script first, then the general one for any text it does not read)
        for (rate, burst) in [(7, 3), (10, 5)] {
            let read = client
                .token_bucket(&name, rate, SEC)
                .burst(burst)
                .available()
                .await;
            match (read_bucket(text), read) {
                (Some(stored), Ok(left)) => {
                    if stored.at <= T0 {
                        let (plan, _) = plan_tokens(rate, 1_000, burst, 0, Some(&stored), T0);
                        assert_eq!(left, plan.left(0), "{text:?} ({rate})");
                    }
                    accepted += 1;
                }
                (None, Err(Error::CorruptBucket { .. })) => refused += 1,
                (rust, script) => panic!("{text:?} ({rate}): Rust {rust:?}, the scripts {script:?}"),
            }
        }
    }
    assert!(
        accepted > 50 && refused > 50,
        "{accepted} accepted, {refused} refused"
    );
    // Debts past the room of 2^53 in the bucket's own config, refilled 1 ms: read at
    // the floor alike (5 tokens left at the floor; 2 as the text says).
    let (rate, burst) = (4_503_599_627_370_498, 4_503_599_627_370_499);
    for (i, units) in ["-4503599627370496", "-4503599627370494", "-4503599627370493"]
        .iter()
        .enumerate()
    {
        let text = format!("{rate}:1:{burst}:{units}:{}", T0 - 1);
        let name = format!("tb:deep-read{i}");
        let _: () = raw.set(format!("{{{name}}}:bucket"), &text).await.unwrap();
        let handle = client
            .token_bucket(&name, rate, Duration::from_millis(1))
            .burst(burst);
        let stored = read_bucket(&text).unwrap();
        let (plan, _) = plan_tokens(rate, 1, burst, 0, Some(&stored), T0);
        assert_eq!(handle.available().await.unwrap(), plan.left(0), "{text}");
        assert_eq!(plan.left(0), 5, "{text}");
    }
}

/// A stored bucket or window value of any bytes and any length (another program's, or
/// a hand's, in Redis) is named corrupt in a short line of text, by a call, a release
/// and a settle: the script quotes its
/// first bytes, visible ASCII, and the error its first 200 characters. Quoted whole,
/// a text not UTF-8 made the reply one the client could not read, and a long one an
/// error as long as the text.
#[tokio::test]
async fn a_stored_text_of_any_bytes_or_length_is_named_corrupt_in_a_short_line() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let (client, mut raw) = server.clocked_client(&clock).await;
    let (digits, letters) = ("9".repeat(1 << 20), "x".repeat(1 << 20));
    // (a bucket's text, a window value's)
    let texts: [(&[u8], &[u8]); 3] = [
        (b"\xff\xfe:1000:1:0:0", b"\xff\xfe"),
        (b"1:1000:1\r\n0:0\x00", b"1\r\n2\x00"),
        (digits.as_bytes(), letters.as_bytes()),
    ];
    for (i, (text, value)) in texts.into_iter().enumerate() {
        let name = format!("tb:odd{i}");
        let key = format!("{{{name}}}:bucket");
        let _: () = raw.set(&key, text).await.unwrap();
        // Alone (tokens.lua), mixed with a window (acquire.lua), and a window's value.
        let window = Rule::new(format!("{name}:w"), 1, SEC);
        let value_key = format!("{{{name}:w}}:value");
        for rules in [
            vec![bucket(&name, 1, SEC, 1)],
            vec![bucket(&name, 1, SEC, 1), window.clone()],
        ] {
            let error = client.check_rules(&rules).await.expect_err(&name);
            assert!(
                matches!(&error, Error::CorruptBucket { key: k, .. } if *k == key),
                "{error}"
            );
            assert!(error.to_string().len() < 400, "{} bytes", error.to_string().len());
            assert!(format!("{error:?}").len() < 400);
        }
        // The window's config written by a first call, then its value replaced.
        let _: () = raw.del(&key).await.unwrap();
        client.check_rules(std::slice::from_ref(&window)).await.unwrap();
        let _: () = raw.set(&value_key, value).await.unwrap();
        let error = client
            .check_rules(&[bucket(&name, 1, SEC, 1), window])
            .await
            .expect_err(&value_key);
        assert!(
            matches!(&error, Error::CorruptValue { key: k, .. } if *k == value_key),
            "{error}"
        );
        assert!(error.to_string().len() < 400, "{} bytes", error.to_string().len());
        // The window's value through release.lua.
        let error = client
            .rate_limiter(format!("{name}:w"))
            .release(1)
            .await
            .unwrap_err();
        assert!(
            matches!(&error, Error::CorruptValue { key: k, .. } if *k == value_key),
            "release: {error}"
        );
        // A reservation's bucket replaced before its settle (settle.lua).
        let reserved = bucket(&format!("{name}:r"), 10, SEC, 10).settled().permits(5);
        let Reserved::Granted(reservation) = client.reserve(&[reserved]).await.unwrap() else {
            panic!("a fresh bucket refused");
        };
        let _: () = raw.set(format!("{{{name}:r}}:bucket"), text).await.unwrap();
        let error = reservation.settle(1).await.unwrap_err();
        assert!(matches!(&error, Error::CorruptBucket { .. }), "settle: {error}");
        assert!(
            error.to_string().len() < 400,
            "settle: {} bytes",
            error.to_string().len()
        );
    }
}
