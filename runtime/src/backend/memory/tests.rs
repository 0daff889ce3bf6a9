//! The in-process backend's tests: a decision's config, the sweep of idle limiters
//! and what it costs, the bound on the limiters held and its count.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::*;
use crate::backend::{Call, ConfigChange, Configure};
use crate::{LimiterKeys, RateLimiterConfig, RateType};

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn a_rule_creates_its_config_and_grants() {
    let backend = MemoryBackend::default();
    let keys = LimiterKeys::new("a", "c").unwrap();
    let config = RateLimiterConfig::new(RateType::Overall, 2, Duration::from_secs(1));
    let calls = [Call {
        keys: keys.borrowed(),
        permits: 1,
        rule: Some(&config),
        bucket: None,
    }];
    let out = block_on(backend.acquire(&calls, 1_000)).unwrap();
    assert!(out.granted);
    assert_eq!(
        out.rules.to_vec(),
        vec![crate::backend::RuleOutcome {
            left: 1,
            config: ConfigChange::Created
        }]
    );
}

#[test]
fn idle_limiters_are_swept() {
    let backend = MemoryBackend::default();
    let config = RateLimiterConfig::new(RateType::Overall, 5, Duration::from_millis(100))
        .with_keep_alive(Duration::from_millis(100));
    block_on(async {
        for user in 0..10_000 {
            let keys = LimiterKeys::new(&format!("user:{user}"), "c").unwrap();
            let calls = [Call {
                keys: keys.borrowed(),
                permits: 1,
                rule: Some(&config),
                bucket: None,
            }];
            backend.acquire(&calls, 1_000).await.unwrap();
        }
        assert_eq!(backend.len(), 10_000);
        // Past the keep-alive, new traffic sweeps the idle limiters away, a few
        // buckets of a shard in turn: 16 shards of 1 024 buckets, 32 buckets
        // every 64 decisions.
        let keys = LimiterKeys::new("hot", "c").unwrap();
        for call in 0..40_000u64 {
            let calls = [Call {
                keys: keys.borrowed(),
                permits: 1,
                rule: Some(&config),
                bucket: None,
            }];
            backend.acquire(&calls, 2_000 + call * 10).await.unwrap();
        }
    });
    assert_eq!(backend.len(), 1);
}

/// One rule of `rate` per 60 s on `name`, with the keep-alive rules give.
fn call_on<'a>(keys: &'a LimiterKeys, config: &'a RateLimiterConfig) -> [Call<'a>; 1] {
    [Call {
        keys: keys.borrowed(),
        permits: 1,
        rule: Some(config),
        bucket: None,
    }]
}

fn minute(rate: u64) -> RateLimiterConfig {
    RateLimiterConfig::new(RateType::Overall, rate, Duration::from_secs(60))
        .with_keep_alive(Duration::from_secs(60))
}

/// Limiters every sweep of `backend` has looked at so far.
fn swept(backend: &MemoryBackend) -> u64 {
    backend.shards.iter().map(|s| s.lock().unwrap().swept).sum()
}

#[test]
fn a_decision_sweeps_a_bounded_number_of_limiters() {
    let backend = MemoryBackend::new(200_000);
    let config = minute(5);
    block_on(async {
        for user in 0..100_000 {
            let keys = LimiterKeys::new(&format!("user:{user}"), "c").unwrap();
            backend.acquire(&call_on(&keys, &config), 1_000).await.unwrap();
        }
        // Every limiter is live: a sweep finds nothing to drop, yet looks.
        let hot = LimiterKeys::new("hot", "c").unwrap();
        let hot_config = minute(1_000_000);
        let mut most = 0;
        for call in 0..5_000u64 {
            let before = swept(&backend);
            backend
                .acquire(&call_on(&hot, &hot_config), 2_000 + call)
                .await
                .unwrap();
            most = most.max(swept(&backend) - before);
        }
        assert!(
            most <= MOST_SWEPT,
            "one decision swept {most} limiters, more than {MOST_SWEPT}"
        );
    });
}

#[test]
fn distinct_keys_cannot_grow_the_table_past_its_bound() {
    let backend = MemoryBackend::default();
    let config = minute(5);
    block_on(async {
        for user in 0..DEFAULT_MAX_LIMITERS + 1_000 {
            let keys = LimiterKeys::new(&format!("spray:{user}"), "c").unwrap();
            let _ = backend.acquire(&call_on(&keys, &config), 1_000).await;
        }
    });
    assert!(
        backend.len() <= DEFAULT_MAX_LIMITERS,
        "{} limiters held, the bound is {DEFAULT_MAX_LIMITERS}",
        backend.len()
    );
}

fn bucket_call<'a>(keys: &'a LimiterKeys, config: &'a RateLimiterConfig) -> [Call<'a>; 1] {
    [Call {
        keys: keys.borrowed(),
        permits: 1,
        rule: Some(config),
        bucket: Some(crate::BucketShape {
            burst: 5,
            warmup_ms: 0,
        }),
    }]
}

fn is_full(result: Result<crate::backend::Outcome, Error>) -> bool {
    matches!(result, Err(Error::MemoryFull { max: 100, .. }))
}

#[test]
fn at_the_bound_new_keys_are_refused_and_the_held_ones_kept() {
    let backend = MemoryBackend::new(100);
    let config = minute(5);
    block_on(async {
        // An exhausted key, and 99 others: the bound.
        let victim = LimiterKeys::new("victim", "c").unwrap();
        for _ in 0..5 {
            assert!(
                backend
                    .acquire(&call_on(&victim, &config), 1_000)
                    .await
                    .unwrap()
                    .granted
            );
        }
        for user in 0..99 {
            let keys = LimiterKeys::new(&format!("user:{user}"), "c").unwrap();
            assert!(
                backend
                    .acquire(&call_on(&keys, &config), 1_000)
                    .await
                    .unwrap()
                    .granted
            );
        }
        // A spray of new keys, sliding windows and token buckets: each refused.
        for user in 0..10_000u64 {
            let keys = LimiterKeys::new(&format!("spray:{user}"), "c").unwrap();
            let now = 1_000 + user;
            assert!(is_full(backend.acquire(&call_on(&keys, &config), now).await));
            assert!(is_full(backend.acquire(&bucket_call(&keys, &config), now).await));
            assert!(backend.len() <= 100, "{} limiters held", backend.len());
        }
        // By hand too.
        let keys = LimiterKeys::new("by-hand", "c").unwrap();
        assert!(matches!(
            backend.try_set_rate(&keys, &config, 20_000).await,
            Err(Error::MemoryFull { max: 100, .. })
        ));
        let how = Configure {
            keep_state: true,
            require_exists: false,
        };
        assert!(matches!(
            backend.configure(&keys, &config, how, 20_000).await,
            Err(Error::MemoryFull { max: 100, .. })
        ));
        // A call of a held limiter and a new one: refused, and nothing spent.
        let held = LimiterKeys::new("user:0", "c").unwrap();
        let both = [
            call_on(&held, &config)[0].clone(),
            call_on(&keys, &config)[0].clone(),
        ];
        assert!(is_full(backend.acquire(&both, 20_000).await));
        let ask = [Call {
            permits: 0,
            ..call_on(&held, &config)[0].clone()
        }];
        let left = backend.acquire(&ask, 20_000);
        assert_eq!(left.await.unwrap().rules[0].left, 4);
        // The exhausted key stays exhausted: the spray reset nothing.
        let out = backend.acquire(&call_on(&victim, &config), 30_000).await.unwrap();
        assert!(!out.granted);
        assert_eq!(out.retry_ms, 31_000);
        // Once the windows and keep-alives are over, the expired limiters make
        // room (swept at the bound, a few buckets per decision).
        // (The refusal at 30 s kept the victim's limiter alive for another 60 s, as
        // Redisson's keep-alive does.)
        let later = 30_000 + 60_000 + 1;
        let mut admitted = 0;
        for user in 0..1_000 {
            let keys = LimiterKeys::new(&format!("after:{user}"), "c").unwrap();
            if let Ok(out) = backend.acquire(&call_on(&keys, &config), later).await {
                assert!(out.granted);
                admitted += 1;
            }
            assert!(backend.len() <= 100);
        }
        assert_eq!(admitted, 100, "every expired limiter's room, and no more");
    });
}

#[test]
fn the_count_of_limiters_held_is_exact_whatever_the_operations() {
    let backend = MemoryBackend::new(50);
    let short = RateLimiterConfig::new(RateType::Overall, 3, Duration::from_millis(500))
        .with_keep_alive(Duration::from_millis(500));
    let kept = RateLimiterConfig::new(RateType::PerClient, 3, Duration::from_millis(500));
    let how = Configure {
        keep_state: true,
        require_exists: false,
    };
    let mut seed = 7u64;
    let mut next = move |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    block_on(async {
        for step in 0..20_000u64 {
            let now = 1_000 + step * 7;
            let a = LimiterKeys::new(&format!("k:{}", next(80)), "c").unwrap();
            let b = LimiterKeys::new(&format!("k:{}", next(80)), "c").unwrap();
            let config = if next(2) == 0 { &short } else { &kept };
            let _ = match next(8) {
                0 => backend.acquire(&call_on(&a, config), now).await.map(|_| true),
                1 => backend.acquire(&bucket_call(&a, &short), now).await.map(|_| true),
                2 => {
                    let calls = [
                        call_on(&a, config)[0].clone(),
                        call_on(&b, &short)[0].clone(),
                        bucket_call(&a, &short)[0].clone(),
                    ];
                    backend.acquire(&calls, now).await.map(|_| true)
                }
                3 => backend.try_set_rate(&a, config, now).await,
                4 => backend.configure(&a, config, how, now).await,
                5 => backend.delete(&a, now).await,
                6 => backend.delete_bucket(&a, RateType::Overall, now).await,
                _ => backend.expire(&a, 100, now).await,
            };
            let held = backend.room.held.load(Ordering::Relaxed);
            assert_eq!(held, backend.len(), "after step {step}");
            assert!(held <= 50);
        }
    });
}

#[test]
fn a_limiter_without_keep_alive_is_never_swept_and_counts_towards_the_bound() {
    let backend = MemoryBackend::new(2);
    let forever = RateLimiterConfig::new(RateType::Overall, 5, Duration::from_secs(1));
    let by_hand = LimiterKeys::new("by-hand", "c").unwrap();
    let config = minute(5);
    let later = 1_000 + 20_000 * 61_000;
    block_on(async {
        assert!(backend.try_set_rate(&by_hand, &forever, 1_000).await.unwrap());
        // Two weeks of decisions on other keys, each expired before the next.
        for call in 0..20_000u64 {
            let keys = LimiterKeys::new(&format!("k:{call}"), "c").unwrap();
            let _ = backend
                .acquire(&call_on(&keys, &config), 1_000 + call * 61_000)
                .await;
        }
        // Every shard swept whole: what is left is what never expires.
        for shard in backend.shards.iter() {
            backend.sweep(&mut shard.lock().unwrap(), later, usize::MAX);
        }
        assert_eq!(backend.len(), 1);
        assert!(backend.is_exists(&by_hand, later).await.unwrap());
        // It holds one of the two places.
        let a = LimiterKeys::new("a", "c").unwrap();
        let b = LimiterKeys::new("b", "c").unwrap();
        assert!(
            backend
                .acquire(&call_on(&a, &config), later)
                .await
                .unwrap()
                .granted
        );
        assert!(matches!(
            backend.acquire(&call_on(&b, &config), later).await,
            Err(Error::MemoryFull { max: 2, .. })
        ));
    });
}
