//! The in-process backend's tests: a decision's config, the sweep of idle limiters
//! and what it costs, the bound on the limiters held and its count.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::usual::{decide_several, SEVERAL};
use super::*;
use crate::backend::{ConfigChange, Configure, RuleCall};
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
    let calls = [RuleCall {
        keys: keys.borrowed(),
        permits: 1,
        rule: Some(&config),
        bucket: None,
        reserved: None,
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
fn idle_limiters_are_kept_until_the_table_needs_room() {
    let backend = MemoryBackend::new(10_000);
    let config = RateLimiterConfig::new(RateType::Overall, 5, Duration::from_millis(100))
        .with_keep_alive(Duration::from_millis(100));
    block_on(async {
        for user in 0..10_000 {
            let keys = LimiterKeys::new(&format!("user:{user}"), "c").unwrap();
            assert!(granted(&backend, &call_on(&keys, &config), 1_000).await);
        }
        // Past the keep-alive, traffic on a key held sweeps a few buckets of a shard
        // in turn (16 shards of 1 024 buckets, 32 buckets every 64 decisions): the idle
        // limiters stay, to be made live again in place when their keys come back.
        let hot = LimiterKeys::new("user:0", "c").unwrap();
        for call in 0..40_000u64 {
            backend
                .acquire(&call_on(&hot, &config), 2_000 + call * 10)
                .await
                .unwrap();
        }
        assert_eq!(backend.len(), 10_000);
        // The table needs room: new keys take it from the idle limiters, every one
        // served, the count exact and within the bound.
        let now = 500_000;
        for user in 0..10_000 {
            let keys = LimiterKeys::new(&format!("new:{user}"), "c").unwrap();
            assert!(
                granted(&backend, &call_on(&keys, &config), now).await,
                "new:{user}"
            );
            assert_eq!(backend.room.held.load(Ordering::Relaxed), backend.len());
            assert!(backend.len() <= 10_000);
        }
    });
}

#[test]
fn a_key_back_after_its_window_emptied_or_its_bucket_filled_decides_as_a_new_one() {
    let backend = MemoryBackend::default();
    let window = RateLimiterConfig::new(RateType::Overall, 5, Duration::from_millis(100))
        .with_keep_alive(Duration::from_millis(100));
    let bucket = minute(5);
    let (w, b) = (
        LimiterKeys::new("w", "c").unwrap(),
        LimiterKeys::new("b", "c").unwrap(),
    );
    block_on(async {
        // Idle at 10 000 and at 10 100 (the window's grants and config expired), live
        // at 10 050; the bucket at rest again a minute after it was drained.
        for (now, live) in [(1_000, false), (10_000, false), (10_050, true), (10_100, false)] {
            let granted_now = async {
                let mut n = 0;
                while n < 10 && granted(&backend, &call_on(&w, &window), now).await {
                    n += 1;
                }
                n
            };
            assert_eq!(granted_now.await, if live { 0 } else { 5 }, "window at {now}");
        }
        for now in [1_000, 61_000, 200_000] {
            let mut n = 0;
            while n < 10 && granted(&backend, &bucket_call(&b, &bucket), now).await {
                n += 1;
            }
            assert_eq!(n, 5, "bucket at {now}");
        }
    });
    let mut store = backend.lock("w");
    assert_eq!(
        store.limiters.get_mut("w").unwrap().live_config(10_100),
        Some(window)
    );
}

#[test]
fn a_bucket_full_again_drops_its_pending_reservations_segments() {
    // A bucket full again is dropped, and with it the segments of its reservations
    // pending (as Redis's key expires with its text): the calls after take the usual
    // path again, not the phases until the segments are older than an empty bucket
    // takes to fill.
    let backend = MemoryBackend::default();
    let bucket = minute(5);
    let b = LimiterKeys::new("b", "c").unwrap();
    let segments = |backend: &MemoryBackend| {
        backend
            .lock("b")
            .limiters
            .get_mut("b")
            .unwrap()
            .segments
            .is_some()
    };
    block_on(async {
        let mut reserve = bucket_call(&b, &bucket);
        reserve[0].reserved = Some(7);
        assert!(granted(&backend, &reserve, 1_000).await);
        assert!(segments(&backend), "a reservation's grant opens a segment");
        // One token a 12 s: full again at 13 000, where its expiry is.
        assert!(granted(&backend, &bucket_call(&b, &bucket), 12_999).await);
        assert!(segments(&backend), "not full yet: the segment stays");
        assert!(granted(&backend, &bucket_call(&b, &bucket), 25_000).await);
    });
    assert!(!segments(&backend), "full again: its segments went with it");
}

#[test]
fn asking_what_an_idle_limiter_has_leaves_it_idle() {
    // A call of 0 permits (what `left_of` sends after a refusal) writes nothing: an
    // idle limiter it reads stays idle, for a sweep or the bound to drop, where a
    // window made live without an expiry would hold its place for good.
    let backend = MemoryBackend::new(4);
    let window = RateLimiterConfig::new(RateType::Overall, 5, Duration::from_millis(100))
        .with_keep_alive(Duration::from_millis(100));
    let bucket = minute(5);
    let (w, b) = (
        LimiterKeys::new("w", "c").unwrap(),
        LimiterKeys::new("b", "c").unwrap(),
    );
    let ask = |keys, config, bucket| {
        let mut call = if bucket {
            bucket_call(keys, config)
        } else {
            call_on(keys, config)
        };
        call[0].permits = 0;
        call
    };
    block_on(async {
        assert!(granted(&backend, &call_on(&w, &window), 1_000).await);
        assert!(granted(&backend, &bucket_call(&b, &bucket), 1_000).await);
        let later = 1_000_000;
        backend.acquire(&ask(&w, &window, false), later).await.unwrap();
        backend.acquire(&ask(&b, &bucket, true), later).await.unwrap();
        let mut store = backend.lock("w");
        assert!(store.limiters.get_mut("w").unwrap().is_idle(later));
        drop(store);
        let mut store = backend.lock("b");
        assert!(store.limiters.get_mut("b").unwrap().is_idle(later));
    });
}

/// One rule of `rate` per 60 s on `name`, with the keep-alive rules give.
fn call_on<'a>(keys: &'a LimiterKeys, config: &'a RateLimiterConfig) -> [RuleCall<'a>; 1] {
    [RuleCall {
        keys: keys.borrowed(),
        permits: 1,
        rule: Some(config),
        bucket: None,
        reserved: None,
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
    let backend = live_limiters(200_000, 100_000);
    block_on(async {
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

/// Live limiters on 16 shards, and one key's traffic: each shard's turn comes every
/// 64 decisions times 16 shards.
const ONE_TURN_EACH: u64 = 64 * 16;

/// A backend of bound `max` holding `n` live limiters (a minute's keep-alive, made
/// at 1 s).
fn live_limiters(max: usize, n: usize) -> MemoryBackend {
    let backend = MemoryBackend::new(max);
    let config = minute(5);
    block_on(async {
        for user in 0..n {
            let keys = LimiterKeys::new(&format!("user:{user}"), "c").unwrap();
            backend.acquire(&call_on(&keys, &config), 1_000).await.unwrap();
        }
    });
    backend
}

fn twenty_thousand_live() -> MemoryBackend {
    live_limiters(100_000, 20_000)
}

#[test]
fn a_sweep_in_turn_passes_a_shard_where_it_found_nothing_to_do_once() {
    let backend = twenty_thousand_live();
    let hot = LimiterKeys::new("hot", "c").unwrap();
    let hot_config = minute(1_000_000_000);
    block_on(async {
        let before = swept(&backend);
        for call in 0..20 * ONE_TURN_EACH {
            let calls = call_on(&hot, &hot_config);
            backend.acquire(&calls, 2_000 + call / 1_000).await.unwrap();
        }
        // Twenty turns of each shard, every limiter live: each shard swept every other
        // turn (one more where the first turn found the shard quiet), 32 buckets a
        // turn, not every turn.
        let looked = swept(&backend) - before;
        assert!(
            looked <= 11 * 16 * IN_TURN as u64,
            "{looked} buckets looked at in 20 turns of each shard, more than 11 turns' worth"
        );
    });
}

#[test]
fn a_sweep_in_turn_still_drops_what_expires_in_a_quiet_shard() {
    let backend = twenty_thousand_live();
    let hot = LimiterKeys::new("hot", "c").unwrap();
    let hot_config = minute(1_000_000_000);
    block_on(async {
        // The shards gone quiet first: their last turns found every limiter live.
        for _ in 0..4 * ONE_TURN_EACH {
            backend.acquire(&call_on(&hot, &hot_config), 2_000).await.unwrap();
        }
    });
    expiring_by_hand(&backend, 2_000);
    assert_eq!(backend.len(), 20_000 + 1 + 2_000);
    block_on(async {
        // The hot key's traffic alone, once they expired: the sweeps in turn go round
        // every shard's table (2 048 buckets, 64 turns of 32), each turn after a quiet
        // one passed, and drop them all.
        let round = 2_048 / IN_TURN as u64 * ONE_TURN_EACH;
        for _ in 0..2 * round {
            backend.acquire(&call_on(&hot, &hot_config), 3_200).await.unwrap();
        }
        assert_eq!(backend.len(), 20_000 + 1, "limiters expired in quiet shards left");
    });
}

/// `n` limiters configured by hand at 3 s, expired 100 ms later (nothing of theirs is
/// kept: a sweep drops them).
fn expiring_by_hand(backend: &MemoryBackend, n: usize) {
    let by_hand = RateLimiterConfig::new(RateType::Overall, 5, Duration::from_secs(1))
        .with_keep_alive(Duration::from_millis(100));
    block_on(async {
        for i in 0..n {
            let keys = LimiterKeys::new(&format!("by-hand:{i}"), "c").unwrap();
            assert!(backend.try_set_rate(&keys, &by_hand, 3_000).await.unwrap());
        }
    });
}

#[test]
fn threads_of_one_decision_each_sweep_every_shard_in_turn() {
    // A thread per request: each thread's first decision sweeps (its count starts at
    // 0), and the sweeps go round every shard, not the first shard over and over.
    let backend = twenty_thousand_live();
    expiring_by_hand(&backend, 2_000);
    let hot = LimiterKeys::new("hot", "c").unwrap();
    let hot_config = minute(1_000_000_000);
    let turns = 2 * 16 * (2_048 / IN_TURN);
    std::thread::scope(|scope| {
        for _ in 0..turns {
            scope
                .spawn(|| block_on(backend.acquire(&call_on(&hot, &hot_config), 3_200)).unwrap())
                .join()
                .unwrap();
        }
    });
    assert_eq!(
        backend.len(),
        20_000 + 1,
        "limiters expired in shards never swept left"
    );
}

#[test]
fn a_poisoned_shard_is_still_swept_in_turn() {
    let backend = twenty_thousand_live();
    expiring_by_hand(&backend, 2_000);
    // Every shard's lock poisoned by a panic while held.
    for shard in backend.shards.iter() {
        std::thread::scope(|scope| {
            let panicked = scope.spawn(|| {
                let _held = shard.lock();
                panic!("poisoning the shard for the test");
            });
            assert!(panicked.join().is_err());
        });
        assert!(shard.is_poisoned());
    }
    let hot = LimiterKeys::new("hot", "c").unwrap();
    let hot_config = minute(1_000_000_000);
    block_on(async {
        for _ in 0..2 * (2_048 / IN_TURN as u64) * ONE_TURN_EACH {
            backend.acquire(&call_on(&hot, &hot_config), 3_200).await.unwrap();
        }
    });
    assert_eq!(
        backend.len(),
        20_000 + 1,
        "limiters expired in poisoned shards left"
    );
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

fn bucket_call<'a>(keys: &'a LimiterKeys, config: &'a RateLimiterConfig) -> [RuleCall<'a>; 1] {
    [RuleCall {
        keys: keys.borrowed(),
        permits: 1,
        rule: Some(config),
        bucket: Some(crate::BucketShape {
            burst: 5,
            warmup_ms: 0,
        }),
        reserved: None,
    }]
}

fn is_full(result: Result<crate::backend::Outcome, Error>) -> bool {
    matches!(result, Err(Error::MemoryFull { max: 100, .. }))
}

async fn granted(backend: &MemoryBackend, calls: &[RuleCall<'_>], now: u64) -> bool {
    backend.acquire(calls, now).await.unwrap().granted
}

#[test]
fn at_the_bound_rule_limiters_are_let_go_and_come_back_at_least_as_used() {
    let backend = MemoryBackend::new(100);
    let config = minute(5);
    block_on(async {
        // An exhausted window and an exhausted bucket, and 98 others: the bound.
        let victim = LimiterKeys::new("victim", "c").unwrap();
        let drained = LimiterKeys::new("drained", "c").unwrap();
        for _ in 0..5 {
            assert!(granted(&backend, &call_on(&victim, &config), 1_000).await);
            assert!(granted(&backend, &bucket_call(&drained, &config), 1_000).await);
        }
        for user in 0..98 {
            let keys = LimiterKeys::new(&format!("user:{user}"), "c").unwrap();
            assert!(granted(&backend, &call_on(&keys, &config), 1_000).await);
        }
        // A spray of 10 times the bound in new keys, windows and buckets, within one
        // window: each new key is served, the table stays at its bound, and the
        // exhausted keys stay exhausted whether they are held or let go.
        for user in 0..1_000u64 {
            let keys = LimiterKeys::new(&format!("spray:{user}"), "c").unwrap();
            let now = 1_000 + user;
            let out = backend.acquire(&call_on(&keys, &config), now).await.unwrap();
            assert!(out.granted, "spray {user}: {:?}", out);
            assert!(
                granted(&backend, &bucket_call(&keys, &config), now).await,
                "spray {user}"
            );
            assert!(backend.len() <= 100, "{} limiters held", backend.len());
            if user % 50 == 0 {
                assert!(
                    !granted(&backend, &call_on(&victim, &config), now).await,
                    "after {user}"
                );
                assert!(
                    !granted(&backend, &bucket_call(&drained, &config), now).await,
                    "after {user}"
                );
            }
        }
        let out = backend.acquire(&call_on(&victim, &config), 30_000).await.unwrap();
        assert!(!out.granted);
        assert!(out.retry_ms >= 31_000, "{}", out.retry_ms);
        // A sprayed key let go comes back as used: at most 4 more in its minute, never
        // 5. (At most: a trace read from a cell it shares with others counts at least
        // its own, and may count theirs, as the exhausted window's 5: the keyed hash
        // that places traces differs from run to run. Its bucket, 29 s later, has
        // refilled the token it took.)
        let back = LimiterKeys::new("spray:7", "c").unwrap();
        let mut window = 0;
        for _ in 0..5 {
            window += u32::from(granted(&backend, &call_on(&back, &config), 30_000).await);
        }
        assert!(window <= 4, "{window} of 5");
        // A new key after the spray: each sprayed key took one permit, so it is
        // counted at most one it did not take.
        let fresh = LimiterKeys::new("fresh", "c").unwrap();
        let mut got = 0;
        for _ in 0..5 {
            got += u32::from(granted(&backend, &call_on(&fresh, &config), 30_000).await);
        }
        assert!(got >= 4, "{got} of 5");
        // Configured by hand at the bound: room is made, and that limiter is kept.
        let keys = LimiterKeys::new("by-hand", "c").unwrap();
        assert!(backend.try_set_rate(&keys, &config, 30_000).await.unwrap());
        for user in 0..1_000u64 {
            let keys = LimiterKeys::new(&format!("more:{user}"), "c").unwrap();
            assert!(granted(&backend, &call_on(&keys, &config), 30_000).await);
        }
        assert!(backend.is_exists(&keys, 30_000).await.unwrap());
        // Once every window is over, the victim is served again.
        assert!(granted(&backend, &call_on(&victim, &config), 30_000 + 61_000 + 30_000).await);
    });
}

#[test]
fn a_bound_of_limiters_configured_by_hand_refuses_new_ones() {
    let backend = MemoryBackend::new(100);
    let config = minute(5);
    block_on(async {
        for user in 0..100 {
            let keys = LimiterKeys::new(&format!("hand:{user}"), "c").unwrap();
            assert!(backend.try_set_rate(&keys, &config, 1_000).await.unwrap());
        }
        for user in 0..200u64 {
            let keys = LimiterKeys::new(&format!("spray:{user}"), "c").unwrap();
            assert!(is_full(
                backend.acquire(&call_on(&keys, &config), 1_000 + user).await
            ));
            assert!(is_full(
                backend.acquire(&bucket_call(&keys, &config), 1_000 + user).await
            ));
        }
        let how = Configure {
            keep_state: true,
            require_exists: false,
        };
        let keys = LimiterKeys::new("by-hand", "c").unwrap();
        assert!(matches!(
            backend.configure(&keys, &config, how, 2_000).await,
            Err(Error::MemoryFull { max: 100, .. })
        ));
        for user in 0..100 {
            let keys = LimiterKeys::new(&format!("hand:{user}"), "c").unwrap();
            assert!(backend.is_exists(&keys, 2_000).await.unwrap());
        }
        assert_eq!(backend.len(), 100);
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
            backend.sweep(
                &mut shard.lock().unwrap(),
                later,
                usize::MAX,
                super::idle::Idle::Drop,
            );
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
        // The other place goes round the keys a rule made, never to the one set by
        // hand.
        assert!(granted(&backend, &call_on(&b, &config), later).await);
        assert!(granted(&backend, &call_on(&a, &config), later).await);
        assert_eq!(backend.len(), 2);
        assert!(backend.is_exists(&by_hand, later).await.unwrap());
    });
}

/// A limiter let go and made again is decided at its own time: its grants come back
/// at the time of their newest, never later, so a decision reading them is not moved
/// forward and no grant leaves the window early. (Grants dated at the end of their
/// half-interval let a key of 5 per 10 s have 9 in one window.)
#[test]
fn a_recalled_window_keeps_its_grants_to_their_window() {
    let backend = MemoryBackend::new(2_000);
    let config = RateLimiterConfig::new(RateType::Overall, 5, Duration::from_secs(10))
        .with_keep_alive(Duration::from_secs(10));
    let heavy = RateLimiterConfig::new(RateType::Overall, 100, Duration::from_secs(10))
        .with_keep_alive(Duration::from_secs(10));
    let key = LimiterKeys::new("k", "c").unwrap();
    let base = 1_000_000_000_000;
    block_on(async {
        for _ in 0..4 {
            assert!(granted(&backend, &call_on(&key, &config), base + 4_500).await);
        }
        assert!(granted(&backend, &call_on(&key, &config), base + 10_000).await);
        // Keys heavier than k (6 permits each) fill the bound, then make room for a
        // thousand more, about sixty in k's shard, each letting go the lightest of the
        // next 64 buckets it scans: k, the lightest, is let go. None of them may leave
        // its traces in a cell of k's (a cell two limiters share counts the grants of
        // both, which would keep k refused past its own).
        let summary = summary::Summary::new(cells_per_shard(2_000));
        let k = crate::keys::name_hash("k");
        let shares_with_k = |hash: u64| {
            shard_of(hash) == shard_of(k)
                && (0..summary::SLOTS).any(|slot| {
                    let part = summary::Part::Window(slot);
                    let theirs = summary.cells_of(hash, part);
                    summary.cells_of(k, part).iter().any(|cell| theirs.contains(cell))
                })
        };
        let heavies = (0..3_000u64)
            .map(|user| format!("heavy:{user}"))
            .filter(|name| !shares_with_k(crate::keys::name_hash(name)));
        for name in heavies {
            let keys = LimiterKeys::new(&name, "c").unwrap();
            let call = [RuleCall {
                permits: 6,
                ..call_on(&keys, &heavy)[0].clone()
            }];
            assert!(granted(&backend, &call, base + 10_001).await);
        }
        assert!(backend.shards.iter().all(|s| !s
            .lock()
            .unwrap()
            .limiters
            .contains(crate::keys::name_hash("k"), "k")));
        // (base + 3 999, base + 13 999] holds k's 5 grants: every call refused.
        for _ in 0..5 {
            assert!(!granted(&backend, &call_on(&key, &config), base + 13_999).await);
        }
        // Served again once its 4 first grants have left.
        assert!(granted(&backend, &call_on(&key, &config), base + 14_501).await);
    });
}

/// The grants a shared cell added to a recalled window go with the window: a reset
/// (a change of mode, a deletion, expiry) drops their record, so the next eviction
/// cannot take them off grants made since in the same millisecond.
#[test]
fn a_reset_window_forgets_what_a_shared_cell_added() {
    use super::state::Limiter;
    for reset in 0..3 {
        let mut limiter = Limiter::default();
        limiter.bucket_or_default(RateType::Overall).push(5_000, 3);
        limiter.bucket_or_default(RateType::Overall).expires = Some(9_000);
        limiter.foreign[0] = Some(vec![(5_000, 3)].into_boxed_slice());
        match reset {
            0 => assert!(limiter.remove_bucket(RateType::Overall)),
            1 => {
                limiter.remove_window();
            }
            _ => assert!(limiter.bucket(RateType::Overall, 9_000).is_none()),
        }
        assert!(limiter.foreign[0].is_none(), "reset {reset}");
    }
}

/// Calls of several rules (sliding windows and token buckets, with and without a
/// warm-up) decided on their usual path, and reservations of one, answer, call for
/// call, as the phases answer them on a backend given the same calls: grants, refusals and their waits, clocks
/// moving back, limiters going idle, configs and bursts changed, a limiter named
/// twice, calls asking no permit or more than the rate; token buckets' grants now and
/// then a pending reservation's, whose segments (opened, peaked, merged past the most
/// kept, pruned) the two backends hold alike after every call.
#[test]
fn several_rules_decide_on_their_usual_path_as_the_phases_do() {
    let (usual, phased) = (MemoryBackend::default(), MemoryBackend::default());
    let names = [
        "several:a",
        "several:b",
        "{several}:c",
        "several:d",
        "several:e",
        "{several}:f",
    ];
    let keys: Vec<LimiterKeys> = names
        .iter()
        .map(|n| LimiterKeys::new(n, "client").unwrap())
        .collect();
    let hashes: Vec<u64> = names.iter().map(|n| crate::keys::name_hash(n)).collect();
    let config = |rate: u64, ms: u64, kind: RateType| {
        RateLimiterConfig::new(kind, rate, Duration::from_millis(ms))
            .with_keep_alive(Duration::from_millis(3 * ms))
    };
    let mut configs = [
        config(3, 1_000, RateType::Overall),
        config(5, 300, RateType::Overall),
        config(2, 700, RateType::PerClient),
        config(4, 450, RateType::Overall),
        config(2, 400, RateType::Overall),
        config(3, 900, RateType::PerClient),
    ];
    // (the last two are token buckets)
    let mut shapes = [
        crate::BucketShape {
            burst: 4,
            warmup_ms: 0,
        },
        crate::BucketShape {
            burst: 3,
            warmup_ms: 1_500,
        },
    ];
    let mut next = crate::test_support::draws(0x9e37_79b9_7f4a_7c15_u64);
    let (mut now, before) = (1_000_000u64, SEVERAL.with(|n| n.get()));
    let (mut grants, mut refusals, mut opened) = (0, 0, 0);
    for step in 0..20_000 {
        now = match next(20) {
            0 => now - next(60),
            1 => now + 2_000 + next(2_000),
            _ => now + next(120),
        };
        if next(400) == 0 {
            let i = next(6) as usize;
            let kind = if next(2) == 0 {
                RateType::Overall
            } else {
                RateType::PerClient
            };
            configs[i] = config(1 + next(6), 100 + next(900), kind);
        }
        if next(300) == 0 {
            shapes[next(2) as usize].burst = 2 + next(4);
        }
        let count = 2 + next(3) as usize;
        let mut picked: Vec<usize> = Vec::new();
        for _ in 0..count {
            let i = next(6) as usize;
            // (now and then a limiter named twice in one call)
            if next(30) == 0 || !picked.contains(&i) {
                picked.push(i);
            }
        }
        let calls: Vec<RuleCall<'_>> = picked
            .iter()
            .map(|&i| RuleCall {
                keys: keys[i].borrowed(),
                permits: match next(40) {
                    0 => 0,
                    1 => configs[i].rate + 1,
                    _ => 1 + next(configs[i].rate.min(3)),
                },
                rule: Some(&configs[i]),
                bucket: (i >= 4).then(|| shapes[i - 4]),
                reserved: (i >= 4 && next(3) == 0).then(|| crate::algorithm::segments::LEAST_ID + step),
            })
            .collect();
        let called: Vec<u64> = picked.iter().map(|&i| hashes[i]).collect();
        // (one rule decided as a reservation: its check takes the one-rule path)
        let answer = match calls.len() {
            1 => format!(
                "{:?}",
                usual
                    .reserve(&calls, &called, &[false], now)
                    .map(|(outcome, _)| outcome)
            ),
            _ => format!("{:?}", usual.decide_hashed(&calls, &called, now)),
        };
        let expected = format!("{:?}", phased.decide_phased(&calls, &called, now));
        let asked: Vec<(usize, u64)> = picked.iter().zip(&calls).map(|(&i, c)| (i, c.permits)).collect();
        assert_eq!(answer, expected, "step {step} at {now}: {asked:?}");
        // (each called bucket's segments of the call's kind: the sweeps, counted per
        // thread, visit the two backends at other calls, and drop what expired apart)
        let segments = |backend: &MemoryBackend, name: &str, kind: RateType| {
            let mut store = backend.lock(name);
            let limiter = store.limiters.get_mut(name);
            format!("{:?}", limiter.map(|l| l.segments(kind).cloned()))
        };
        for (&i, call) in picked.iter().zip(&calls).filter(|(&i, _)| i >= 4) {
            let kind = call.rule.expect("a rule").rate_type;
            let held = segments(&usual, names[i], kind);
            assert_eq!(
                held,
                segments(&phased, names[i], kind),
                "step {step} at {now}: {asked:?}"
            );
            opened += usize::from(held.contains("grants"));
        }
        grants += usize::from(answer.contains("granted: true"));
        refusals += usize::from(answer.contains("granted: false"));
    }
    let several = SEVERAL.with(|n| n.get()) - before;
    println!("{several} usual, {grants} grants, {refusals} refusals, {opened} with segments");
    assert!(
        several > 8_000 && grants > 4_000 && refusals > 2_000 && opened > 2_000,
        "{several} usual, {grants} grants, {refusals} refusals, {opened} with segments"
    );
}

/// A call of several rules the usual path leaves to the phases finds its limiters as
/// they were: what expired is not dropped before the phases run (they may refuse the
/// call first, at the bound, and leave it).
#[test]
fn several_rules_left_to_the_phases_find_their_limiters_as_they_were() {
    let backend = MemoryBackend::default();
    let x = LimiterKeys::new("left:x", "client").unwrap();
    let w = LimiterKeys::new("left:w", "client").unwrap();
    let config = RateLimiterConfig::new(RateType::Overall, 2, Duration::from_secs(1))
        .with_keep_alive(Duration::from_millis(500));
    let ([on_x], [on_w]) = (call_on(&x, &config), call_on(&w, &config));
    // x granted: its config and bucket live until 1 000 500
    assert!(
        block_on(backend.acquire(std::slice::from_ref(&on_x), 1_000_000))
            .unwrap()
            .granted
    );
    let hashes = [crate::keys::name_hash("left:x"), crate::keys::name_hash("left:w")];
    let calls = [on_x, on_w];
    let mut locked = backend.lock_all(&hashes);
    assert!(decide_several(&mut locked, &calls, &hashes, 1_002_000).is_none());
    let limiter = locked
        .store(hashes[0])
        .limiters
        .get_hashed(hashes[0], "left:x")
        .unwrap();
    assert!(
        limiter.config.is_some() && limiter.buckets.iter().any(Option::is_some),
        "the expired config and bucket of x were dropped before the phases ran"
    );
}
