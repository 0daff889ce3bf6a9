//! The runtime API on both backends: every test runs on the in-process backend and on
//! a real redis-server started for it, with an injected clock.

use redlimit_test_support as support;

use std::time::Duration;

use redlimit::{Algorithm, Client, Decision, Error, ManualClock, RateLimiterConfig, RateType, Rule};
use support::RedisServer;

const T0: u64 = 1_700_000_000_000;
const SEC: Duration = Duration::from_secs(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Runs the same test body on the memory backend and on Redis.
macro_rules! on_both_backends {
    ($name:ident, |$client:ident, $clock:ident, $server:ident| $body:block) => {
        mod $name {
            use super::*;

            #[allow(unused_variables)]
            async fn run($client: Client, $clock: ManualClock, $server: Option<RedisServer>) $body

            #[tokio::test]
            async fn memory() {
                let clock = ManualClock::new(T0);
                let client = Client::builder().clock(clock.clone()).memory();
                run(client, clock, None).await;
            }

            #[tokio::test]
            async fn redis() {
                let server = RedisServer::start();
                let clock = ManualClock::new(T0);
                let client = Client::builder().clock(clock.clone()).connect(&server.url()).await.unwrap();
                run(client, clock, Some(server)).await;
            }
        }
    };
}

on_both_backends!(try_set_rate_only_takes_effect_once, |client, clock, server| {
    let limiter = client.rate_limiter("rate_limit:a");
    assert!(!limiter.is_exists().await.unwrap());
    assert_eq!(limiter.config().await.unwrap(), None);
    assert!(limiter.try_set_rate(RateType::Overall, 3, SEC).await.unwrap());
    assert!(!limiter.try_set_rate(RateType::PerClient, 9, ms(5)).await.unwrap());
    assert!(limiter.is_exists().await.unwrap());
    assert_eq!(
        limiter.config().await.unwrap(),
        Some(RateLimiterConfig::new(RateType::Overall, 3, SEC))
    );
});

on_both_backends!(
    grants_up_to_rate_and_releases_at_the_inclusive_boundary,
    |client, clock, server| {
        let limiter = client.rate_limiter("rate_limit:b");
        limiter.try_set_rate(RateType::Overall, 3, SEC).await.unwrap();
        for left in [2, 1, 0] {
            let decision = limiter.check(1).await.unwrap();
            assert!(decision.allowed);
            assert_eq!(decision.remaining, left);
            assert_eq!(decision.retry_after, None);
        }
        let refused = limiter.check(1).await.unwrap();
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after, Some(SEC));
        assert_eq!(refused.refused_by, Some(0));
        clock.advance(ms(999));
        assert!(
            !limiter.try_acquire(1).await.unwrap(),
            "one ms before the window ends"
        );
        clock.advance(ms(1));
        assert_eq!(
            limiter.available_permits().await.unwrap(),
            3,
            "score <= now - interval is released"
        );
        assert!(limiter.try_acquire(3).await.unwrap());
    }
);

on_both_backends!(retry_after_is_exact_for_many_permits, |client, clock, server| {
    let limiter = client.rate_limiter("rate_limit:c");
    limiter.try_set_rate(RateType::Overall, 4, SEC).await.unwrap();
    assert!(limiter.try_acquire(1).await.unwrap()); // t0
    clock.advance(ms(100));
    assert!(limiter.try_acquire(2).await.unwrap()); // t0 + 100
    clock.advance(ms(100));
    assert!(limiter.try_acquire(1).await.unwrap()); // t0 + 200
    clock.advance(ms(50));
    // 0 left; 3 permits need the first two grants (1 + 2) to leave: at t0 + 1100.
    let refused = limiter.check(3).await.unwrap();
    assert_eq!(refused.retry_after, Some(ms(850)));
    let one = limiter.check(1).await.unwrap();
    assert_eq!(one.retry_after, Some(ms(750)));
    let four = limiter.check(4).await.unwrap();
    assert_eq!(four.retry_after, Some(ms(950)));
    clock.advance(ms(849));
    assert!(!limiter.try_acquire(3).await.unwrap());
    clock.advance(ms(1));
    assert!(limiter.try_acquire(3).await.unwrap());
});

on_both_backends!(
    a_call_overtaken_on_its_way_is_decided_at_the_later_time,
    |client, clock, server| {
        let limiter = client.rate_limiter("rate_limit:reorder");
        limiter.try_set_rate(RateType::Overall, 2, SEC).await.unwrap();
        clock.set(T0 + 500);
        assert_eq!(limiter.check(1).await.unwrap().at_ms, T0 + 500);
        // A call whose clock read T0 + 200 arrives after it: decided at T0 + 500, so the
        // log stays in time order.
        clock.set(T0 + 200);
        let late = limiter.check(1).await.unwrap();
        assert!(late.allowed);
        assert_eq!(late.at_ms, T0 + 500);
        let refused = limiter.check(1).await.unwrap();
        assert_eq!(refused.retry_after, Some(SEC), "both grants are at T0 + 500");
        // Further apart than 1 s is clock skew, and the call keeps its own time.
        clock.set(T0 - 600);
        assert_eq!(limiter.check(1).await.unwrap().at_ms, T0 - 600);
    }
);

// The same through rules that own their config, one and two (the script's path for
// plain rules), and two where only the second rule's log holds the later grant (that
// path planned the first rule at the caller's time, and leaves the call to the
// general phases).
on_both_backends!(
    rules_decide_an_overtaken_call_at_the_later_time,
    |client, clock, server| {
        for rules in [
            vec![Rule::new("rate_limit:reorder:one", 2, SEC)],
            vec![
                Rule::new("rate_limit:reorder:a", 2, SEC),
                Rule::new("rate_limit:reorder:b", 5, SEC),
            ],
        ] {
            clock.set(T0 + 500);
            assert_eq!(client.check_rules(&rules).await.unwrap().at_ms, T0 + 500);
            clock.set(T0 + 200);
            let late = client.check_rules(&rules).await.unwrap();
            assert!(late.allowed);
            assert_eq!(late.at_ms, T0 + 500, "{} rule(s)", rules.len());
            let refused = client.check_rules(&rules).await.unwrap();
            assert_eq!(refused.retry_after, Some(SEC), "both grants are at T0 + 500");
            clock.set(T0 + 1499);
            let d = client.check_rules(&rules).await.unwrap();
            assert!(!d.allowed, "{} rule(s): {d:?}", rules.len());
            clock.set(T0 + 1500);
            assert!(client.check_rules(&rules).await.unwrap().allowed);
            // Further apart than 1 s is clock skew, and the call keeps its own time.
            clock.set(T0 - 600);
            assert_eq!(client.check_rules(&rules).await.unwrap().at_ms, T0 - 600);
        }
        let x = [Rule::new("rate_limit:reorder:x", 2, SEC)];
        let y = [Rule::new("rate_limit:reorder:y", 5, SEC)];
        let both = [x[0].clone(), y[0].clone()];
        // x's config stored, with a grant long gone by T0 + 200
        clock.set(T0 - 5000);
        assert!(client.check_rules(&x).await.unwrap().allowed);
        clock.set(T0 + 500);
        assert_eq!(client.check_rules(&y).await.unwrap().at_ms, T0 + 500);
        // A call read at T0 + 200 arrives now; the later grant is in y's log alone.
        clock.set(T0 + 200);
        let late = client.check_rules(&both).await.unwrap();
        assert!(late.allowed);
        assert_eq!(late.at_ms, T0 + 500, "decided at y's later grant");
        clock.set(T0 + 510);
        assert!(client.check_rules(&x).await.unwrap().allowed);
        // x's grants are at T0 + 500 and 510: at T0 + 1300 (past the window of a grant
        // at T0 + 200) x has none to give.
        clock.set(T0 + 1300);
        let d = client.check_rules(&x).await.unwrap();
        assert!(!d.allowed, "{d:?}");
    }
);

on_both_backends!(refusals_spend_nothing, |client, clock, server| {
    let limiter = client.rate_limiter("rate_limit:d");
    limiter.try_set_rate(RateType::Overall, 5, SEC).await.unwrap();
    assert!(limiter.try_acquire(4).await.unwrap());
    for _ in 0..10 {
        assert!(!limiter.try_acquire(2).await.unwrap());
    }
    assert_eq!(limiter.available_permits().await.unwrap(), 1);
    assert!(limiter.try_acquire(1).await.unwrap());
});

on_both_backends!(set_rate_restarts_the_window, |client, clock, server| {
    let limiter = client.rate_limiter("rate_limit:e");
    limiter.set_rate(RateType::Overall, 2, SEC).await.unwrap();
    assert!(limiter.try_acquire(2).await.unwrap());
    assert!(!limiter.try_acquire(1).await.unwrap());
    limiter.set_rate(RateType::Overall, 3, SEC).await.unwrap();
    assert_eq!(limiter.config().await.unwrap().unwrap().rate, 3);
    assert_eq!(limiter.available_permits().await.unwrap(), 3);
});

on_both_backends!(update_rate_keeps_the_window, |client, clock, server| {
    let limiter = client.rate_limiter("rate_limit:f");
    limiter.try_set_rate(RateType::Overall, 5, SEC).await.unwrap();
    assert!(limiter.try_acquire(3).await.unwrap());
    limiter.update_rate(RateType::Overall, 10, SEC).await.unwrap();
    assert_eq!(limiter.available_permits().await.unwrap(), 7);
    // Lowering below what the window holds leaves nothing until those grants leave.
    limiter.update_rate(RateType::Overall, 2, SEC).await.unwrap();
    assert_eq!(limiter.available_permits().await.unwrap(), 0);
    assert!(!limiter.try_acquire(1).await.unwrap());
    clock.advance(SEC);
    assert_eq!(limiter.available_permits().await.unwrap(), 2);
    assert!(limiter.try_acquire(2).await.unwrap());
    assert!(!limiter.try_acquire(1).await.unwrap());
    // A change of mode clears the state of the new mode.
    limiter.update_rate(RateType::PerClient, 2, SEC).await.unwrap();
    assert_eq!(limiter.available_permits().await.unwrap(), 2);
});

on_both_backends!(expire_delete_and_keep_alive, |client, clock, server| {
    let limiter = client.rate_limiter("rate_limit:g");
    assert!(!limiter.expire(SEC).await.unwrap(), "nothing to expire yet");
    limiter.try_set_rate(RateType::Overall, 2, SEC).await.unwrap();
    assert!(limiter.try_acquire(1).await.unwrap());
    assert!(limiter.expire(Duration::from_secs(3600)).await.unwrap());
    limiter.keep_alive(Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        limiter.config().await.unwrap().unwrap().keep_alive,
        Some(Duration::from_secs(30))
    );
    if let Some(server) = &server {
        let mut raw = server.raw().await;
        for key in ["rate_limit:g", "{rate_limit:g}:value", "{rate_limit:g}:permits"] {
            let ttl: i64 = redis::cmd("PTTL").arg(key).query_async(&mut raw).await.unwrap();
            assert!((29_000..=30_000).contains(&ttl), "{key}: {ttl}");
        }
    } else {
        clock.advance(Duration::from_secs(30));
        assert!(!limiter.is_exists().await.unwrap(), "idle past keep-alive");
        limiter.try_set_rate(RateType::Overall, 2, SEC).await.unwrap();
    }
    assert!(limiter.delete().await.unwrap());
    assert!(!limiter.is_exists().await.unwrap());
    assert!(!limiter.delete().await.unwrap());
    let err = limiter.keep_alive(SEC).await.unwrap_err();
    assert!(matches!(err, Error::NotInitialized { .. }), "{err:?}");
});

on_both_backends!(misuse_errors_say_what_to_do, |client, clock, server| {
    let limiter = client.rate_limiter("rate_limit:h");
    let err = limiter.try_acquire(1).await.unwrap_err();
    assert!(matches!(err, Error::NotInitialized { .. }), "{err:?}");
    assert!(
        err.to_string().contains("RateLimiter is not initialized"),
        "{err}"
    );
    assert!(err.to_string().contains("rate_limit:h"), "{err}");
    limiter.try_set_rate(RateType::Overall, 2, SEC).await.unwrap();
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
    assert!(err
        .to_string()
        .contains("Requested permits amount cannot exceed defined rate"));
    let err = limiter.try_acquire(0).await.unwrap_err();
    assert!(matches!(err, Error::ZeroPermits { .. }), "{err:?}");
    let err = limiter.try_set_rate(RateType::Overall, 0, SEC).await.unwrap_err();
    assert!(err.to_string().contains("at least 1"), "{err}");
    let err = limiter
        .try_set_rate(RateType::Overall, 1, Duration::from_micros(10))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("interval"), "{err}");
    for name in ["a{b", "a{}b", "{}", "a}b"] {
        let err = client.rate_limiter(name).try_acquire(1).await.unwrap_err();
        assert!(matches!(err, Error::CrossSlotName { .. }), "{name}: {err:?}");
        assert!(err.to_string().contains("hash tag"), "{err}");
    }
    let err = client
        .check_rules(&[Rule::new("x", 2, SEC).permits(3)])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::PermitsExceedRate { .. }), "{err:?}");
});

// Settings at their extremes: a fraction of a millisecond in an interval (which the
// backends would drop, shortening every window), a keep-alive shorter than the
// interval (in process as on Redis), a TTL past 2^53 ms (which wrapped to a few
// hundred ms), and waits of `Duration::MAX` (which overflowed the deadline). Each is
// refused with what is accepted, or waits as long as the clock can; the limit holds.
on_both_backends!(
    extreme_settings_are_refused_and_the_limit_holds,
    |client, clock, server| {
        let limiter = client.rate_limiter("rate_limit:extreme");
        let err = limiter
            .try_set_rate(RateType::Overall, 1, Duration::from_micros(1_999))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("whole number of milliseconds"), "{err}");
        let rule = Rule::new("rate_limit:extreme:rule", 1, Duration::from_micros(1_999));
        let err = client.check_rules(&[rule]).await.unwrap_err();
        assert!(err.to_string().contains("whole number of milliseconds"), "{err}");

        limiter
            .try_set_rate(RateType::Overall, 5, 60 * SEC)
            .await
            .unwrap();
        // Waits without end grant at once when the permits are there.
        assert!(limiter.try_acquire_for(1, Duration::MAX).await.unwrap());
        let rule = Rule::new("rate_limit:extreme:waited", 1, 60 * SEC);
        assert!(
            client
                .check_rules_for(&[rule], Duration::MAX)
                .await
                .unwrap()
                .allowed
        );
        for _ in 0..4 {
            assert!(limiter.try_acquire(1).await.unwrap());
        }
        let err = limiter.keep_alive(SEC).await.unwrap_err();
        assert!(
            err.to_string()
                .contains("keep_alive is shorter than the interval"),
            "{err}"
        );
        for ttl in [Duration::MAX, Duration::from_secs(18_446_744_073_709_552)] {
            let err = limiter.expire(ttl).await.unwrap_err();
            assert!(matches!(err, Error::InvalidConfig { .. }), "{ttl:?}: {err:?}");
            assert!(err.to_string().contains("2^53"), "{err}");
        }
        // (The scripts decide at the client's clock.)
        clock.advance(2 * SEC);
        assert!(
            !limiter.try_acquire(1).await.unwrap(),
            "a sixth grant within the minute"
        );
        assert!(limiter.is_exists().await.unwrap());
    }
);

// A keep-alive removed by a new config takes its TTLs with it: left, they expired a
// limiter that no longer has a keep-alive 300 ms later, and its window with it, so a
// rate of 1 per 10 s granted again (on both backends, restarted or kept).
on_both_backends!(
    a_keep_alive_removed_takes_its_ttl_with_it,
    |client, clock, server| {
        for keep_state in [true, false] {
            let limiter = client.rate_limiter(format!("rate_limit:unkept:{keep_state}"));
            let short = redlimit::RateLimiterArgs::new(RateType::Overall, 1, ms(300)).keep_alive(ms(300));
            limiter.set_rate_with(&short).await.unwrap();
            let none = redlimit::RateLimiterArgs::new(RateType::Overall, 1, 10 * SEC).keep_state(keep_state);
            assert!(limiter.update_rate_with(&none).await.unwrap());
            assert!(limiter.try_acquire(1).await.unwrap());
            clock.advance(ms(400));
            if server.is_some() {
                // (Redis counts TTLs on its own clock.)
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
            let config = limiter.config().await.unwrap();
            assert_eq!(
                config.map(|c| (c.rate, c.keep_alive)),
                Some((1, None)),
                "{keep_state}"
            );
            assert!(
                !limiter.try_acquire(1).await.unwrap(),
                "a second grant within 10 s ({keep_state})"
            );
        }
    }
);

// A rate lowered on a per-client limiter, keeping the window, reaches the caller's
// own window at once; another client's window keeps what it holds until its grants
// leave it (its keys are not the caller's to reach, as in Redisson): within the window
// of the change that client is granted up to the old rate, and at the new one after.
#[tokio::test]
async fn a_lowered_per_client_rate_reaches_other_clients_as_their_grants_leave() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let url = server.url();
    let connect = || Client::builder().clock(clock.clone()).connect(&url);
    let (a, b) = (connect().await.unwrap(), connect().await.unwrap());
    let limiter = a.rate_limiter("rate_limit:pc:lowered");
    limiter
        .try_set_rate(RateType::PerClient, 5, 60 * SEC)
        .await
        .unwrap();
    assert!(limiter.try_acquire(1).await.unwrap());
    let lowered = redlimit::RateLimiterArgs::new(RateType::PerClient, 4, 60 * SEC).keep_state(true);
    assert!(b
        .rate_limiter("rate_limit:pc:lowered")
        .update_rate_with(&lowered)
        .await
        .unwrap());
    let mut granted = 0;
    for _ in 0..10 {
        granted += u32::from(limiter.try_acquire(1).await.unwrap());
    }
    assert_eq!(granted, 4, "5 in the window of the change: the old rate");
    clock.advance(60 * SEC);
    let mut granted = 0;
    for _ in 0..10 {
        granted += u32::from(limiter.try_acquire(1).await.unwrap());
    }
    assert_eq!(granted, 4, "the new rate once the old grants left");
}

// Several rules in one call find their limiters by the hashes the rules keep: the
// limiters are the ones their names open elsewhere (a handle, a call of one rule).
on_both_backends!(
    several_rules_decide_the_limiters_their_names_open,
    |client, clock, server| {
        let rules = [
            Rule::new("rate_limit:several:a", 5, SEC),
            Rule::new("rate_limit:several:b", 4, SEC),
            Rule::new("rate_limit:several:c", 3, SEC),
        ];
        for _ in 0..2 {
            assert!(client.check_rules(&rules).await.unwrap().allowed);
        }
        for (rule, left) in rules.iter().zip([3, 2, 1]) {
            let handle = client.rate_limiter(rule.name());
            assert_eq!(handle.available_permits().await.unwrap(), left, "{}", rule.name());
            let alone = client.check_rules(std::slice::from_ref(rule)).await.unwrap();
            assert_eq!(alone.remaining, left - 1, "{}", rule.name());
        }
    }
);

on_both_backends!(rules_are_all_or_nothing, |client, clock, server| {
    let user = Rule::new("rate_limit:order:user:1", 3, SEC);
    let global = Rule::new("rate_limit:order", 2, ms(500));
    let rules = [user.clone(), global.clone()];
    let first = client.check_rules(&rules).await.unwrap();
    assert!(first.allowed);
    assert_eq!(first.remaining, 1);
    assert!(client.check_rules(&rules).await.unwrap().allowed);
    let refused = client.check_rules(&rules).await.unwrap();
    assert!(!refused.allowed);
    assert_eq!(refused.refused_by, Some(1));
    assert_eq!(refused.retry_after, Some(ms(500)));
    // The user rule had one permit left and still has it: the refusal spent nothing.
    let user_limiter = client.rate_limiter(user.name());
    assert_eq!(user_limiter.available_permits().await.unwrap(), 1);
    // Rules created their configs, with keep-alive = interval.
    assert_eq!(user_limiter.config().await.unwrap(), Some(*user.config()));
    assert_eq!(user.config().keep_alive, Some(SEC));
    clock.advance(ms(500));
    assert!(client.check_rules(&rules).await.unwrap().allowed);
    let refused = client.check_rules(&rules).await.unwrap();
    assert_eq!(refused.refused_by, Some(0), "now the user rule refuses");
    assert_eq!(
        refused.retry_after,
        Some(ms(500)),
        "its first grant leaves at t0 + 1 s"
    );

    let (short, long) = (
        Rule::new("rate_limit:short", 1, SEC),
        Rule::new("rate_limit:long", 1, 2 * SEC),
    );
    let both = [short, long];
    assert!(client.check_rules(&both).await.unwrap().allowed);
    let refused = client.check_rules(&both).await.unwrap();
    assert_eq!(refused.refused_by, Some(0), "the first refusing rule in order");
    assert_eq!(
        refused.retry_after,
        Some(2 * SEC),
        "long enough for every refusing rule"
    );
});

on_both_backends!(
    a_rule_overrides_a_stale_config_keeping_the_window,
    |client, clock, server| {
        let limiter = client.rate_limiter("rate_limit:deploy");
        limiter.try_set_rate(RateType::Overall, 10, SEC).await.unwrap();
        assert!(limiter.try_acquire(4).await.unwrap());
        let rule = Rule::new("rate_limit:deploy", 5, SEC);
        let decision = client.check_rules(std::slice::from_ref(&rule)).await.unwrap();
        assert!(decision.allowed);
        assert_eq!(decision.remaining, 0, "5 - 4 already in the window - 1");
        assert_eq!(limiter.config().await.unwrap(), Some(*rule.config()));
        assert!(!client.check_rules(&[rule]).await.unwrap().allowed);
    }
);

on_both_backends!(
    one_limiter_twice_in_a_call_counts_once,
    |client, clock, server| {
        let rule = Rule::new("rate_limit:twice", 3, SEC);
        let rules = [rule.clone(), rule.clone()];
        for left in [2, 1, 0] {
            let decision = client.check_rules(&rules).await.unwrap();
            assert!(decision.allowed);
            assert_eq!(decision.remaining, left);
        }
        let refused = client.check_rules(&rules).await.unwrap();
        assert!(!refused.allowed);
        assert_eq!(refused.refused_by, Some(0), "reported as the first of the two");
        let limiter = client.rate_limiter(rule.name());
        assert_eq!(limiter.available_permits().await.unwrap(), 0);
    }
);

// Two rules naming one limiter with different configs (a caller filled two templates
// with equal values): decided as one on the strictest config, the larger permits taken
// once. Neither rule is switched off, and calls are not all refused.
on_both_backends!(
    coinciding_rules_are_decided_on_the_strictest_config,
    |client, clock, server| {
        let loose = Rule::new("rate_limit:transfer:7", 10, Duration::from_secs(60));
        let strict = Rule::new("rate_limit:transfer:7", 3, Duration::from_secs(60));
        let other = Rule::new("rate_limit:transfer:all", 100, Duration::from_secs(60));
        let rules = [loose.clone(), other.clone(), strict.clone()];
        let mut granted = 0;
        for _ in 0..20 {
            if client.check_rules(&rules).await.unwrap().allowed {
                granted += 1;
            }
        }
        assert_eq!(granted, 3, "the strict rule's rate, one permit per call");
        let refused = client.check_rules(&rules).await.unwrap();
        assert_eq!(refused.refused_by, Some(0), "the first rule naming the limiter");
        assert_eq!(
            client.rate_limiter(strict.name()).config().await.unwrap(),
            Some(*strict.config())
        );
        assert_eq!(
            client
                .rate_limiter(other.name())
                .available_permits()
                .await
                .unwrap(),
            97,
            "the other rule spent exactly the granted calls"
        );
        // The larger permits above the enforced rate: refused, nothing taken (taken
        // capped at the rate, a call of 5 was counted 3, and the looser rule's limiter
        // then granted more than its rate in a window).
        let big = Rule::new("rate_limit:transfer:8", 10, Duration::from_secs(60)).permits(5);
        let small = Rule::new("rate_limit:transfer:8", 3, Duration::from_secs(60));
        match client.check_rules(&[big.clone(), small]).await {
            Err(Error::PermitsExceedRate {
                permits: 5, rate: 3, ..
            }) => {}
            other => panic!("{other:?}"),
        }
        let limiter = client.rate_limiter(big.name());
        let never = limiter.available_permits().await;
        assert!(
            matches!(never, Err(Error::NotInitialized { .. })),
            "nothing written: {never:?}"
        );
        // A token bucket's: its burst. 90 of a bucket of 100 taken alone, then 90 with
        // a stricter rule of a burst of 10 on the same bucket: refused, 10 left.
        let lax = Rule::new("rate_limit:transfer:9", 100, Duration::from_secs(60))
            .algorithm(Algorithm::TokenBucket)
            .permits(90);
        let strict =
            Rule::new("rate_limit:transfer:9", 10, Duration::from_secs(60)).algorithm(Algorithm::TokenBucket);
        assert!(
            client
                .check_rules(std::slice::from_ref(&lax))
                .await
                .unwrap()
                .allowed
        );
        match client.check_rules(&[lax.clone(), strict]).await {
            Err(Error::PermitsExceedBurst {
                permits: 90,
                burst: 10,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        let bucket = client.token_bucket(lax.name(), 100, Duration::from_secs(60));
        assert_eq!(bucket.available().await.unwrap(), 10);
        // ...and a reservation of such rules likewise (a settled one among them is
        // refused as naming another rule's limiter).
        let strict = || {
            Rule::new("rate_limit:transfer:9", 10, Duration::from_secs(60)).algorithm(Algorithm::TokenBucket)
        };
        match client.reserve(&[lax.clone(), strict()]).await {
            Err(Error::PermitsExceedBurst {
                permits: 90,
                burst: 10,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        match client.reserve(&[lax.clone().settled(), strict()]).await {
            Err(Error::InvalidReservation { .. }) => {}
            other => panic!("{other:?}"),
        }
    }
);

on_both_backends!(per_client_mode_uses_the_client_keys, |client, clock, server| {
    let rule = Rule::new("rate_limit:pc", 2, SEC).mode(RateType::PerClient);
    assert!(
        client
            .check_rules(std::slice::from_ref(&rule))
            .await
            .unwrap()
            .allowed
    );
    let limiter = client.rate_limiter("rate_limit:pc");
    assert_eq!(limiter.available_permits().await.unwrap(), 1);
    if let Some(server) = server {
        // A second client (another process, say) has a bucket of its own.
        let other = Client::connect(&server.url()).await.unwrap();
        let decision = other.check_rules(&[rule.permits(2)]).await.unwrap();
        assert!(decision.allowed);
        assert_eq!(decision.remaining, 0);
        assert_eq!(limiter.available_permits().await.unwrap(), 1);
        let mut raw = server.raw().await;
        let key = format!("{{rate_limit:pc}}:value:{}", client.client_id());
        let value: String = redis::cmd("GET").arg(&key).query_async(&mut raw).await.unwrap();
        assert_eq!(value, "1");
    }
});

#[tokio::test]
async fn overall_mode_is_shared_between_clients_and_per_client_is_not() {
    let server = RedisServer::start();
    let a = Client::connect(&server.url()).await.unwrap();
    let b = Client::connect(&server.url()).await.unwrap();
    assert_ne!(a.client_id(), b.client_id());
    assert_eq!(a.client_id().len(), 36);
    let shared = Rule::new("rate_limit:shared", 2, Duration::from_secs(60));
    assert!(
        a.check_rules(std::slice::from_ref(&shared))
            .await
            .unwrap()
            .allowed
    );
    assert!(
        b.check_rules(std::slice::from_ref(&shared))
            .await
            .unwrap()
            .allowed
    );
    assert!(
        !a.check_rules(std::slice::from_ref(&shared))
            .await
            .unwrap()
            .allowed
    );
    assert!(
        !b.check_rules(std::slice::from_ref(&shared))
            .await
            .unwrap()
            .allowed
    );
    let own = Rule::new("rate_limit:own", 2, Duration::from_secs(60)).mode(RateType::PerClient);
    for client in [&a, &b] {
        for _ in 0..2 {
            assert!(
                client
                    .check_rules(std::slice::from_ref(&own))
                    .await
                    .unwrap()
                    .allowed
            );
        }
        assert!(
            !client
                .check_rules(std::slice::from_ref(&own))
                .await
                .unwrap()
                .allowed
        );
    }
}

#[tokio::test]
async fn rules_take_one_script_call_on_redis() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let rules = [
        Rule::new("rate_limit:r1", 100, SEC),
        Rule::new("rate_limit:r2", 100, SEC),
        Rule::new("rate_limit:r3", 100, SEC),
    ];
    client.check_rules(&rules).await.unwrap(); // loads the script
    let monitor = support::monitor::Monitor::start(server.port);
    for _ in 0..10 {
        client.check_rules(&rules).await.unwrap();
    }
    // Everything the client sent, not just scripts: an extra GET would show here.
    let sent = monitor.client_commands();
    assert_eq!(sent, vec!["EVALSHA".to_owned(); 10]);
}

#[tokio::test]
async fn the_script_cache_can_be_flushed() {
    let server = RedisServer::start();
    let client = Client::connect(&server.url()).await.unwrap();
    let rule = [Rule::new("rate_limit:flush", 3, Duration::from_secs(60))];
    assert!(client.check_rules(&rule).await.unwrap().allowed);
    let mut raw = server.raw().await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw)
        .await
        .unwrap();
    let decision: Decision = client.check_rules(&rule).await.unwrap();
    assert!(decision.allowed);
    assert_eq!(decision.remaining, 1);
}

#[tokio::test]
async fn unreachable_redis_fails_fast_with_a_clear_error() {
    let port = RedisServer::start().stop();
    let started = std::time::Instant::now();
    let err = Client::connect(&format!("redis://127.0.0.1:{port}/"))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(
        err.is_backend_failure() || matches!(err, Error::Timeout { .. }),
        "{err:?}"
    );
    let err = Client::connect("http://nope").await.unwrap_err();
    assert!(matches!(err, Error::InvalidUrl { .. }), "{err:?}");
    assert!(err.to_string().contains("redis://"), "{err}");
}

#[tokio::test]
async fn a_grant_whose_answer_timed_out_is_refunded() {
    let server = RedisServer::start();
    let client = Client::builder()
        .command_timeout(ms(100))
        .connect(&server.url())
        .await
        .unwrap();
    let rules = [Rule::new("rate_limit:refund", 5, Duration::from_secs(60))];
    assert!(client.check_rules(&rules).await.unwrap().allowed);
    server.pause();
    let err = client.check_rules(&rules).await.unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    server.resume();
    // First establish that the timed-out call ran once the server woke up (a second
    // grant was logged) and that the refund found it (refund.lua's INCRBY runs only
    // for a grant it removed); only then read the state.
    let mut raw = server.raw().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut raw)
            .await
            .unwrap();
        let calls = |command: &str| -> u64 {
            stats
                .lines()
                .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
                .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
        };
        if calls("incrby") == 1 {
            assert_eq!(calls("zadd"), 2, "the first grant and the timed-out one: {stats}");
            assert_eq!(calls("zrem"), 1, "{stats}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no refund ran within 5 s: {stats}"
        );
        tokio::time::sleep(ms(50)).await;
    }
    let limiter = client.rate_limiter("rate_limit:refund");
    assert_eq!(limiter.available_permits().await.unwrap(), 4);
    let logged: usize = redis::cmd("ZCARD")
        .arg("{rate_limit:refund}:permits")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(logged, 1, "only the first grant is left");
}

/// A decision's future answers once: polled again after its answer it would decide
/// (and spend) again, so it panics, as an `async fn`'s future does.
#[test]
#[should_panic(expected = "polled after it completed")]
fn a_check_rules_future_polled_after_its_answer_does_not_decide_again() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let client = redlimit::Client::memory();
    let rules = [redlimit::Rule::new(
        "repoll",
        5,
        std::time::Duration::from_secs(60),
    )];
    let mut future = std::pin::pin!(client.check_rules(&rules));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(matches!(future.as_mut().poll(&mut cx), Poll::Ready(Ok(d)) if d.allowed));
    let _ = future.as_mut().poll(&mut cx);
}

/// In process, one limiter decided from 8 threads at once, 4 000 calls in all, grants
/// exactly its rate, on both algorithms' one-rule paths (a sliding window of 1 000 an
/// hour; a token bucket of 1 000 refilling one an hour): the shard's lock holds each
/// decision whole.
#[test]
fn an_in_process_limit_holds_across_threads() {
    let hour = Duration::from_secs(3600);
    let rules = [
        Rule::new("rate_limit:threads:window", 1_000, hour),
        Rule::new("rate_limit:threads:bucket", 1, hour)
            .algorithm(redlimit::Algorithm::TokenBucket)
            .burst(1_000),
    ];
    for rule in rules {
        let client = Client::memory();
        let granted = std::sync::atomic::AtomicU64::new(0);
        let start = std::sync::Barrier::new(8);
        std::thread::scope(|threads| {
            for _ in 0..8 {
                threads.spawn(|| {
                    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
                    start.wait();
                    for _ in 0..500 {
                        let rules = [rule.clone()];
                        if runtime.block_on(client.check_rules(&rules)).unwrap().allowed {
                            granted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(granted.into_inner(), 1_000, "{rule:?}");
    }
}

/// Calls of two rules sharing one limiter, decided from 8 threads at once in
/// process, the shared one second and first ([A, B] and [B, C]): B's 1 500 are
/// granted exactly, each call all or nothing, and A's and C's state is what their
/// grants took.
#[test]
fn several_rules_in_process_hold_across_threads() {
    let hour = Duration::from_secs(3600);
    let (a, b, c) = (
        Rule::new("rate_limit:threads:a", 1_000, hour),
        Rule::new("rate_limit:threads:b", 1_500, hour),
        Rule::new("rate_limit:threads:c", 1_000, hour),
    );
    let client = Client::memory();
    let granted = [
        std::sync::atomic::AtomicU64::new(0),
        std::sync::atomic::AtomicU64::new(0),
    ];
    let start = std::sync::Barrier::new(8);
    std::thread::scope(|threads| {
        for thread in 0..8 {
            let (client, start, granted) = (&client, &start, &granted);
            let rules = if thread % 2 == 0 {
                [a.clone(), b.clone()]
            } else {
                [b.clone(), c.clone()]
            };
            threads.spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
                start.wait();
                for _ in 0..500 {
                    if runtime.block_on(client.check_rules(&rules)).unwrap().allowed {
                        granted[thread % 2].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let [with_a, with_c] = granted.map(|g| g.into_inner());
    println!("[A, B] granted {with_a}, [B, C] granted {with_c}");
    assert_eq!(with_a + with_c, 1_500, "B's grants");
    assert!(with_a <= 1_000 && with_c <= 1_000);
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let left = |rule: &Rule| {
        let decision = runtime
            .block_on(client.check_rules(std::slice::from_ref(rule)))
            .unwrap();
        decision.remaining + u64::from(decision.allowed)
    };
    assert_eq!(left(&a), 1_000 - with_a, "A's permits left");
    assert_eq!(left(&c), 1_000 - with_c, "C's permits left");
    assert_eq!(left(&b), 0, "B's permits left");
}
