//! Differential test: random sequences of operations run against the Redis backend and
//! the memory backend on the same clock give the same answers, step for step (sliding
//! windows and token buckets, alone and mixed in one call).

use redlimit_test_support as support;

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use redlimit::{Algorithm, Client, Clock, ManualClock, RateType, Rule};
use support::RedisServer;

const NAMES: [&str; 3] = ["diff:a", "diff:b", "{diff}:c"];
/// Long enough that no TTL runs out on the server's real clock during a sequence.
const HOUR: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone)]
enum Op {
    Check {
        limiter: usize,
        permits: u64,
    },
    Rules {
        rules: Vec<Rule>,
    },
    Advance(u64),
    TrySetRate {
        limiter: usize,
        mode: RateType,
        rate: u64,
        interval: u64,
    },
    SetRate {
        limiter: usize,
        mode: RateType,
        rate: u64,
        interval: u64,
    },
    UpdateRate {
        limiter: usize,
        mode: RateType,
        rate: u64,
        interval: u64,
    },
    Available {
        limiter: usize,
    },
    Release {
        limiter: usize,
        permits: u64,
    },
    Config {
        limiter: usize,
    },
    Expire {
        limiter: usize,
    },
    KeepAlive {
        limiter: usize,
    },
    Delete {
        limiter: usize,
    },
}

fn random_op(rng: &mut StdRng) -> Op {
    let limiter = rng.random_range(0..NAMES.len());
    let mode = if rng.random_range(0..4) == 0 {
        RateType::PerClient
    } else {
        RateType::Overall
    };
    let rate = rng.random_range(1..=6);
    let interval = [100, 250, 1000, 2000][rng.random_range(0..4)];
    match rng.random_range(0..100) {
        0..=34 => Op::Check {
            limiter,
            permits: rng.random_range(1..=7),
        },
        35..=49 => {
            let count = rng.random_range(1..=3);
            let rules = (0..count)
                .map(|_| {
                    let name = NAMES[rng.random_range(0..NAMES.len())];
                    // One config per name so rules of one call never conflict.
                    let (rate, interval) = match name {
                        "diff:a" => (3, 250),
                        "diff:b" => (5, 1000),
                        _ => (2, 100),
                    };
                    let rule = Rule::new(name, rate, Duration::from_millis(interval)).keep_alive(Some(HOUR));
                    if rng.random_range(0..3) == 0 {
                        // A token bucket on the same name (its own key), mixed in;
                        // its burst and warm-up vary, so stored configs change.
                        let burst = rate + rng.random_range(0..=2);
                        let warmup = [0, 0, 300, 2_000][rng.random_range(0..4)];
                        rule.algorithm(Algorithm::TokenBucket)
                            .burst(burst)
                            .warmup(Duration::from_millis(warmup))
                            .permits(rng.random_range(1..=burst))
                    } else {
                        rule.permits(rng.random_range(1..=rate))
                    }
                })
                .collect();
            Op::Rules { rules }
        }
        50..=69 => Op::Advance(rng.random_range(0..=1200)),
        70..=74 => Op::TrySetRate {
            limiter,
            mode,
            rate,
            interval,
        },
        75..=77 => Op::SetRate {
            limiter,
            mode,
            rate,
            interval,
        },
        78..=83 => Op::UpdateRate {
            limiter,
            mode,
            rate,
            interval,
        },
        84..=88 => Op::Available { limiter },
        89..=91 => Op::Release {
            limiter,
            permits: rng.random_range(1..=4),
        },
        92..=94 => Op::Config { limiter },
        95..=96 => Op::Expire { limiter },
        97..=98 => Op::KeepAlive { limiter },
        _ => Op::Delete { limiter },
    }
}

/// Runs one operation; the answer (or the error's message) as text.
async fn apply(client: &Client, clock: &ManualClock, op: &Op) -> String {
    let limiter = |i: usize| client.rate_limiter(NAMES[i]);
    let ms = Duration::from_millis;
    let answer = match op {
        Op::Check { limiter: i, permits } => limiter(*i).check(*permits).await.map(|d| format!("{d:?}")),
        Op::Rules { rules } => client.check_rules(rules).await.map(|d| format!("{d:?}")),
        Op::Advance(by) => {
            clock.advance(ms(*by));
            Ok(String::new())
        }
        Op::TrySetRate {
            limiter: i,
            mode,
            rate,
            interval,
        } => limiter(*i)
            .try_set_rate(*mode, *rate, ms(*interval))
            .await
            .map(|set| set.to_string()),
        Op::SetRate {
            limiter: i,
            mode,
            rate,
            interval,
        } => limiter(*i)
            .set_rate(*mode, *rate, ms(*interval))
            .await
            .map(|()| String::new()),
        Op::UpdateRate {
            limiter: i,
            mode,
            rate,
            interval,
        } => limiter(*i)
            .update_rate(*mode, *rate, ms(*interval))
            .await
            .map(|updated| updated.to_string()),
        Op::Release { limiter: i, permits } => limiter(*i).release(*permits).await.map(|()| String::new()),
        Op::Available { limiter: i } => limiter(*i).available_permits().await.map(|n| n.to_string()),
        Op::Config { limiter: i } => limiter(*i).config().await.map(|c| format!("{c:?}")),
        Op::Expire { limiter: i } => limiter(*i).expire(HOUR).await.map(|set| set.to_string()),
        Op::KeepAlive { limiter: i } => limiter(*i).keep_alive(HOUR).await.map(|()| String::new()),
        Op::Delete { limiter: i } => limiter(*i).delete().await.map(|d| d.to_string()),
    };
    answer.unwrap_or_else(|err| format!("error: {err}"))
}

/// The in-process backend and the Redis backend, on one clock.
async fn both_backends(server: &RedisServer, clock: &ManualClock) -> (Client, Client) {
    let memory = Client::builder().clock(clock.clone()).memory();
    let redis = Client::builder()
        .clock(clock.clone())
        .connect(&server.url())
        .await
        .unwrap();
    (memory, redis)
}

#[tokio::test]
async fn memory_and_redis_agree_on_random_sequences() {
    let server = RedisServer::start();
    let mut raw = server.raw().await;
    // How often each kind of answer came up: the sequences must exercise them all.
    let (mut grants, mut refusals, mut errors) = (0, 0, 0);
    for seed in 0..40u64 {
        let _: () = redis::cmd("FLUSHALL").query_async(&mut raw).await.unwrap();
        let clock = ManualClock::new(1_700_000_000_000 + seed * 7);
        let (memory, redis) = both_backends(&server, &clock).await;
        let mut rng = StdRng::seed_from_u64(seed);
        let mut history = Vec::new();
        for _ in 0..200 {
            let op = random_op(&mut rng);
            let on_memory = apply(&memory, &clock, &op).await;
            let on_redis = apply(&redis, &clock, &op).await;
            history.push(format!("{op:?} -> {on_redis}"));
            assert_eq!(
                on_memory,
                on_redis,
                "seed {seed}, step {}: backends disagree\nhistory:\n{}",
                history.len(),
                history.join("\n")
            );
            grants += usize::from(on_redis.contains("allowed: true"));
            refusals += usize::from(on_redis.contains("allowed: false"));
            errors += usize::from(on_redis.starts_with("error: "));
        }
        // After each sequence the backends also agree on what every limiter has left.
        for name in NAMES {
            let left = |c: &Client| {
                let limiter = c.rate_limiter(name);
                async move {
                    format!(
                        "{:?}",
                        limiter.available_permits().await.map_err(|e| e.to_string())
                    )
                }
            };
            assert_eq!(left(&memory).await, left(&redis).await, "seed {seed}, {name}");
        }
    }
    println!("{grants} grants, {refusals} refusals, {errors} errors compared");
    assert!(grants > 500, "the sequences must exercise grants, saw {grants}");
    assert!(errors > 100, "the sequences must exercise errors, saw {errors}");
    assert!(
        refusals > 500,
        "the sequences must exercise refusals, saw {refusals}"
    );
}

/// `rules` on both backends, which must give the same answer: Redis's answer, with
/// `asked` and the answer added to `history` (printed when they disagree).
async fn agree(
    memory: &Client,
    redis: &Client,
    rules: &[Rule],
    asked: String,
    history: &mut Vec<String>,
) -> String {
    let on_memory = format!("{:?}", memory.check_rules(rules).await);
    let on_redis = format!("{:?}", redis.check_rules(rules).await);
    history.push(format!("{asked} -> {on_redis}"));
    assert_eq!(
        on_memory,
        on_redis,
        "backends disagree\nhistory:\n{}",
        history.join("\n")
    );
    on_redis
}

/// The usual calls, many times: one, two or three rules whose configs are already
/// stored, with grants leaving the window between calls and refusals waiting on them
/// (the Redis backend's path for such rules, and its way back to the general one when
/// a value is lost or a rule of several asks for no permit), in both modes, with and
/// without a keep-alive.
#[tokio::test]
async fn plain_rule_calls_agree_step_for_step() {
    let server = RedisServer::start();
    let mut raw = server.raw().await;
    let (mut grants, mut refusals) = (0, 0);
    let mut stacked = 0;
    for seed in 0..30u64 {
        let _: () = redis::cmd("FLUSHALL").query_async(&mut raw).await.unwrap();
        let clock = ManualClock::new(1_700_000_000_000 + seed * 11);
        let (memory, redis) = both_backends(&server, &clock).await;
        let mut rng = StdRng::seed_from_u64(seed);
        let mode = if seed % 4 == 0 {
            RateType::PerClient
        } else {
            RateType::Overall
        };
        let keep = [None, Some(HOUR)][(seed % 2) as usize];
        let count = 1 + (seed % 3) as usize;
        let mut history = Vec::new();
        for step in 0..300 {
            if step == 150 && seed % 5 < 2 {
                // The value lost (an eviction): rebuilt from the log, as the memory
                // backend's value already is.
                let _: () = redis::cmd("DEL")
                    .arg("{one}:value")
                    .query_async(&mut raw)
                    .await
                    .unwrap();
            }
            let shapes = [("one", 3, 1000), ("two", 5, 700), ("three", 2, 400)];
            let rule: Vec<Rule> = shapes[..count]
                .iter()
                .map(|&(name, rate, interval)| {
                    // several rules: a rule asking for no permit now and then
                    let permits = if count == 1 || rng.random_range(0..10) == 0 {
                        rng.random_range(0..=rate)
                    } else {
                        rng.random_range(1..=rate)
                    };
                    Rule::new(name, rate, Duration::from_millis(interval))
                        .mode(mode)
                        .keep_alive(keep)
                        .permits(permits)
                })
                .collect();
            stacked += usize::from(count > 1);
            let permits: Vec<u64> = rule.iter().map(Rule::permits_per_call).collect();
            let asked = format!("seed {seed}, step {step}: {permits:?}");
            let on_redis = agree(&memory, &redis, &rule, asked, &mut history).await;
            grants += usize::from(on_redis.contains("allowed: true"));
            refusals += usize::from(on_redis.contains("allowed: false"));
            let advance = rng.random_range(0..=700);
            clock.advance(Duration::from_millis(advance));
            history.push(format!("advance {advance}"));
        }
    }
    println!("{grants} grants, {refusals} refusals compared, {stacked} calls of several rules");
    assert!(
        grants > 1500 && refusals > 1500,
        "{grants} grants, {refusals} refusals"
    );
}

/// The clock moved on by up to `most` ms, and now and then set behind the last call's,
/// within the reorder bound: a refusal must have written nothing a later call reads.
fn moves_on(rng: &mut StdRng, clock: &ManualClock, most: u64, history: &mut Vec<String>) {
    let advance = rng.random_range(0..=most);
    clock.advance(Duration::from_millis(advance));
    history.push(format!("advance {advance}"));
    if rng.random_range(0..12) == 0 {
        let back = rng.random_range(1..=400);
        clock.set(clock.now_ms() - back);
        history.push(format!("back {back}"));
    }
}

/// Calls of several rules mixing a sliding window and token buckets (with and without
/// a warm-up, in both modes), many times on limiters held with their rules' configs
/// (the in-process backend's path for several held rules): tokens refilling and
/// grants leaving the window between calls, refusals waiting on either, the clock now
/// and then behind the last call's.
#[tokio::test]
async fn several_rules_with_token_buckets_agree_step_for_step() {
    let server = RedisServer::start();
    let mut raw = server.raw().await;
    let (mut grants, mut refusals) = (0, 0);
    for seed in 0..20u64 {
        let _: () = redis::cmd("FLUSHALL").query_async(&mut raw).await.unwrap();
        let clock = ManualClock::new(1_700_000_000_000 + seed * 17);
        let (memory, redis) = both_backends(&server, &clock).await;
        let mut rng = StdRng::seed_from_u64(seed);
        let mode = [RateType::Overall, RateType::PerClient][(seed % 3 == 0) as usize];
        let warmup = [0, 500, 0, 3_000][(seed % 4) as usize];
        let mut history = Vec::new();
        for step in 0..300 {
            let mut rules = vec![
                Rule::new("mixed:w", 4, Duration::from_millis(1_000))
                    .mode(mode)
                    .permits(rng.random_range(1..=2)),
                Rule::new("mixed:tb", 3, Duration::from_millis(900))
                    .mode(mode)
                    .algorithm(Algorithm::TokenBucket)
                    .burst(4)
                    .warmup(Duration::from_millis(warmup))
                    .permits(rng.random_range(1..=3)),
            ];
            if rng.random_range(0..2) == 0 {
                rules.push(
                    Rule::new("{mixed}:tb2", 2, Duration::from_millis(600))
                        .algorithm(Algorithm::TokenBucket)
                        .burst(3)
                        .permits(rng.random_range(1..=2)),
                );
            }
            if rng.random_range(0..2) == 0 {
                rules.reverse();
            }
            let permits: Vec<u64> = rules.iter().map(Rule::permits_per_call).collect();
            let asked = format!("seed {seed}, step {step}: {permits:?}");
            let on_redis = agree(&memory, &redis, &rules, asked, &mut history).await;
            grants += usize::from(on_redis.contains("allowed: true"));
            refusals += usize::from(on_redis.contains("allowed: false"));
            moves_on(&mut rng, &clock, 500, &mut history);
        }
    }
    println!("{grants} grants, {refusals} refusals compared");
    assert!(
        grants > 1_000 && refusals > 1_000,
        "{grants} grants, {refusals} refusals"
    );
}

/// The usual token-bucket call, many times: one rule whose bucket is held with its
/// config (the in-process backend's one-rule path), with and without a warm-up, in
/// both modes, tokens refilling between calls and refusals waiting on them; now and
/// then the same bucket called with another burst, which goes back to the general
/// path (the config changes) and then to the usual one again.
#[tokio::test]
async fn token_bucket_calls_agree_step_for_step() {
    let server = RedisServer::start();
    let mut raw = server.raw().await;
    let (mut grants, mut refusals) = (0, 0);
    for seed in 0..24u64 {
        let _: () = redis::cmd("FLUSHALL").query_async(&mut raw).await.unwrap();
        let clock = ManualClock::new(1_700_000_000_000 + seed * 13);
        let (memory, redis) = both_backends(&server, &clock).await;
        let mut rng = StdRng::seed_from_u64(seed);
        let mode = [RateType::Overall, RateType::PerClient][(seed % 3 == 0) as usize];
        let warmup = [0, 0, 500, 3_000][(seed % 4) as usize];
        let mut history = Vec::new();
        for step in 0..300 {
            let burst = if rng.random_range(0..25) == 0 { 6 } else { 4 };
            let rule = Rule::new("tb", 3, Duration::from_millis(900))
                .mode(mode)
                .algorithm(Algorithm::TokenBucket)
                .burst(burst)
                .warmup(Duration::from_millis(warmup))
                .permits(rng.random_range(0..=burst));
            let asked = format!(
                "seed {seed}, step {step}: burst {burst}, {}",
                rule.permits_per_call()
            );
            let on_redis = agree(&memory, &redis, &[rule], asked, &mut history).await;
            grants += usize::from(on_redis.contains("allowed: true"));
            refusals += usize::from(on_redis.contains("allowed: false"));
            moves_on(&mut rng, &clock, 600, &mut history);
        }
    }
    println!("{grants} grants, {refusals} refusals compared");
    assert!(
        grants > 1500 && refusals > 1500,
        "{grants} grants, {refusals} refusals"
    );
}
