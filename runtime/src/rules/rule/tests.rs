//! Tests of `rule.rs`.

use super::*;

const MIN: Duration = Duration::from_secs(60);

#[test]
fn a_warm_up_counts_in_whole_milliseconds_rounded_up() {
    let ms = |w: Option<Duration>| BucketShape::new(5, w).warmup_ms;
    assert_eq!(ms(None), 0);
    assert_eq!(ms(Some(Duration::ZERO)), 0, "zero is none");
    assert_eq!(ms(Some(Duration::from_micros(1))), 1, "not silently none");
    assert_eq!(ms(Some(Duration::from_micros(1_500))), 2);
    assert_eq!(ms(Some(Duration::from_secs(30))), 30_000);
    assert_eq!(ms(Some(Duration::MAX)), u64::MAX, "left to the bound check");
    // Computed in 64 bits: as the 128-bit definition at the edges of a millisecond
    // and of the range.
    let defined = |w: Duration| u64::try_from(w.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
    let secs = [
        0,
        1,
        59,
        3_600,
        u64::MAX / 1000 - 1,
        u64::MAX / 1000,
        u64::MAX / 1000 + 1,
        u64::MAX,
    ];
    for s in secs {
        for n in [0, 1, 999_999, 1_000_000, 1_000_001, 500_000_000, 999_999_999] {
            let w = Duration::new(s, n);
            assert_eq!(ms(Some(w)), defined(w), "{w:?}");
        }
    }
}

#[test]
fn distinct_limiters_stay_apart() {
    let rules = [Rule::new("a", 3, MIN), Rule::new("b", 10, MIN)];
    assert_eq!(
        merge(&rules).unwrap().to_vec(),
        [
            Merged {
                first: 0,
                config: 0,
                permits: 1
            },
            Merged {
                first: 1,
                config: 1,
                permits: 1
            }
        ]
    );
}

#[test]
fn coinciding_rules_take_the_strictest_config_once() {
    let rules = [
        Rule::new("k", 10, MIN).permits(3),
        Rule::new("other", 5, MIN),
        Rule::new("k", 3, MIN),
    ];
    assert_eq!(
        merge(&rules).unwrap().to_vec(),
        [
            Merged {
                first: 0,
                config: 2,
                permits: 3
            },
            Merged {
                first: 1,
                config: 1,
                permits: 1
            }
        ]
    );
    // 5 in 2 s holds 10 a second: every second lies within two.
    let rules = [
        Rule::new("k", 10, Duration::from_secs(1)),
        Rule::new("k", 5, Duration::from_secs(2)),
    ];
    assert_eq!(merge(&rules).unwrap()[0].config, 1);
    // Overall holds per client at a rate no higher.
    let rules = [
        Rule::new("k", 5, MIN).mode(RateType::PerClient),
        Rule::new("k", 3, MIN),
    ];
    assert_eq!(merge(&rules).unwrap()[0].config, 1);
    // A bucket of a smaller burst refilled no faster holds the other, though the
    // strictest by the smaller rate is the other one.
    let rules = [
        Rule::new("k", 10, MIN)
            .algorithm(Algorithm::TokenBucket)
            .burst(10),
        Rule::new("k", 20, 2 * MIN)
            .algorithm(Algorithm::TokenBucket)
            .burst(5),
    ];
    assert_eq!(merge(&rules).unwrap()[0].config, 1);
    // A bucket of a smaller burst refilled no faster holds the other.
    let rules = [
        Rule::new("k", 120, MIN)
            .algorithm(Algorithm::TokenBucket)
            .burst(20),
        Rule::new("k", 1, Duration::from_secs(1))
            .algorithm(Algorithm::TokenBucket)
            .burst(5),
    ];
    assert_eq!(merge(&rules).unwrap()[0].config, 1);
}

/// Coinciding rules neither of whose limits holds the other are refused: one limiter
/// keeps one config, and either would let the other's limit go (10 a second beside
/// 100 a minute granted 100 at once; 10 a minute per client beside 1 000 a minute
/// overall granted 1 000 to one client).
#[test]
fn coinciding_rules_neither_of_which_holds_the_other_are_refused() {
    let second = Duration::from_secs(1);
    let bucket = |rate, per, burst| {
        Rule::new("k", rate, per)
            .algorithm(Algorithm::TokenBucket)
            .burst(burst)
    };
    for rules in [
        [Rule::new("k", 10, second), Rule::new("k", 100, MIN)],
        [
            Rule::new("k", 10, MIN).mode(RateType::PerClient),
            Rule::new("k", 1_000, MIN),
        ],
        [Rule::new("k", 120, MIN), Rule::new("k", 2, second)],
        [bucket(10, second, 10), bucket(100, MIN, 100)],
        [bucket(1, second, 50), bucket(120, MIN, 20)],
        [
            bucket(10, MIN, 10).warmup(MIN),
            bucket(10, MIN, 10).warmup(second),
        ],
        // the same warm-up, another rate: a colder bucket costs more a permit
        [
            bucket(1, second, 100).warmup(MIN),
            bucket(100, second, 100).warmup(MIN),
        ],
        [bucket(1, second, 100).warmup(MIN), bucket(100, second, 100)],
    ] {
        match merge(&rules) {
            Err(crate::Error::InvalidConfig { name, problem }) => {
                assert_eq!(name, "k");
                assert!(problem.contains("none of which holds the others"), "{problem}");
            }
            other => panic!("{rules:?}: {other:?}"),
        }
    }
}

/// Coinciding rules take the largest permits on the strictest config: a call whose
/// largest permits that config never grants is refused, not counted short (a rule of
/// 100 a minute taking 90 a call, whose key a caller made the same limiter as a rule
/// of 10's, was granted 90 and counted 10).
#[test]
fn coinciding_rules_asking_more_than_the_strictest_grants_are_refused() {
    let rules = [Rule::new("k", 100, MIN).permits(90), Rule::new("k", 10, MIN)];
    match merge(&rules) {
        Err(crate::Error::PermitsExceedRate { name, permits, rate }) => {
            assert_eq!((name.as_str(), permits, rate), ("k", 90, 10));
        }
        other => panic!("{other:?}"),
    }
    let buckets = [
        Rule::new("b", 100, MIN)
            .algorithm(Algorithm::TokenBucket)
            .permits(90),
        Rule::new("b", 10, MIN)
            .algorithm(Algorithm::TokenBucket)
            .burst(20),
    ];
    match merge(&buckets) {
        Err(crate::Error::PermitsExceedBurst { name, permits, burst }) => {
            assert_eq!((name.as_str(), permits, burst), ("b", 90, 20));
        }
        other => panic!("{other:?}"),
    }
    // within the strictest: taken once, the largest
    let fits = [Rule::new("k", 100, MIN).permits(10), Rule::new("k", 10, MIN)];
    assert_eq!(merge(&fits).unwrap()[0].permits, 10);
}

#[test]
fn the_window_kept_is_the_config_checked_last() {
    let rule = Rule::new("rate_limit:w", 5, Duration::from_millis(1_500)).keep_alive(Some(MIN));
    rule.mark_checked();
    assert_eq!(rule.window_ms(), (1_500, 60_000));
    assert_eq!(rule.clone().window_ms(), (1_500, 60_000), "a clone keeps it");
    // a setter makes the rule checked again, and its window is kept again
    let rule = rule.keep_alive(None);
    assert!(!rule.settings_checked());
    rule.mark_checked();
    assert_eq!(rule.window_ms(), (1_500, 0), "no keep-alive");
    let rule = rule.keep_alive(Some(Duration::from_micros(2_000_500)));
    rule.mark_settings_checked();
    assert_eq!(rule.window_ms(), (1_500, 2_000), "whole ms, as keep_alive_ms");
}
