//! `REDLIMIT_BENCH_ROW=<row> REDLIMIT_BENCH_CALLS=<n> cargo run --release --example
//! bench_memory`: `n` in-process decisions of one row, one after the other on one
//! thread, for counting the instructions each takes (`scripts/memory-instructions.sh`
//! runs every row under callgrind twice, with `n` and `2n` calls, and prints the
//! difference over `n`: what one decision costs, start-up and set-up left out).
//!
//! Rows: `window-hot` and `bucket-hot`, one limiter decided again and again (a
//! sliding window, a token bucket); `window-keys` and `bucket-keys`, 100 000 limiters
//! made first, then decided in turn; `governor-hot` and `governor-keys`, governor's
//! keyed limiter (`check_key`) on the same keys; `window-refused`, one exhausted
//! sliding window refused again and again; `governor-refused`, governor's refusal.
//! Every limiter but the refused ones grants every call (a rate of 10^9 a second), so
//! each row measures the work of a decision, not how often it refuses.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use redlimit::{Algorithm, Client, Rule};

const KEYS: usize = 100_000;
const RATE: u32 = 1_000_000_000;

/// `keys` rules granting every call, in their steady state: a sliding window of 10^9 a
/// second (its log loses its oldest grants as it gains new ones) kept alive for an
/// hour, so that no limiter expires between its turns even under an instruction
/// counter (an expired limiter is made again, which is not what the row measures); a
/// token bucket of 10^9 tokens refilling one an hour, so that it is never full again
/// (a full bucket is forgotten, as in Redis).
fn rules(algorithm: Algorithm, keys: usize) -> Vec<[Rule; 1]> {
    let hour = Duration::from_secs(3600);
    (0..keys)
        .map(|k| {
            let name = format!("rate_limit:bench:mem:{k}");
            [match algorithm {
                Algorithm::TokenBucket => Rule::new(name, 1, hour)
                    .algorithm(Algorithm::TokenBucket)
                    .burst(u64::from(RATE)),
                _ => Rule::new(name, u64::from(RATE), Duration::from_secs(1)).keep_alive(Some(hour)),
            }]
        })
        .collect()
}

async fn redlimit_row(algorithm: Algorithm, keys: usize, calls: usize) {
    let client = Client::builder().max_limiters(KEYS + 1).memory();
    let rules = rules(algorithm, keys);
    for rule in &rules {
        assert!(client.check_rules(rule).await.unwrap().allowed);
    }
    for i in 0..calls {
        let decision = client.check_rules(black_box(&rules[i % keys])).await.unwrap();
        assert!(decision.allowed);
    }
}

fn governor_row(keys: usize, calls: usize) {
    let quota = governor::Quota::per_second(NonZeroU32::new(RATE).unwrap());
    let limiter = governor::RateLimiter::keyed(quota);
    for k in 0..keys as u64 {
        assert!(limiter.check_key(&k).is_ok());
    }
    for i in 0..calls {
        assert!(limiter.check_key(black_box(&((i % keys) as u64))).is_ok());
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let row = std::env::var("REDLIMIT_BENCH_ROW").expect("REDLIMIT_BENCH_ROW is not set");
    let calls: usize = std::env::var("REDLIMIT_BENCH_CALLS")
        .ok()
        .map_or(200_000, |n| n.parse().expect("REDLIMIT_BENCH_CALLS is a number"));
    match row.as_str() {
        "window-hot" => redlimit_row(Algorithm::SlidingWindow, 1, calls).await,
        "window-keys" => redlimit_row(Algorithm::SlidingWindow, KEYS, calls).await,
        "bucket-hot" => redlimit_row(Algorithm::TokenBucket, 1, calls).await,
        "bucket-keys" => redlimit_row(Algorithm::TokenBucket, KEYS, calls).await,
        "governor-hot" => governor_row(1, calls),
        "governor-keys" => governor_row(KEYS, calls),
        "window-refused" => {
            let client = Client::memory();
            let rules = [Rule::new(
                "rate_limit:bench:mem:refused",
                1,
                Duration::from_secs(3600),
            )];
            let _ = client.check_rules(&rules).await.unwrap();
            for _ in 0..calls {
                assert!(!client.check_rules(black_box(&rules)).await.unwrap().allowed);
            }
        }
        "governor-refused" => {
            let limiter =
                governor::RateLimiter::keyed(governor::Quota::per_hour(NonZeroU32::new(1).unwrap()));
            let _ = limiter.check_key(&1u64);
            for _ in 0..calls {
                assert!(limiter.check_key(black_box(&1u64)).is_err());
            }
        }
        other => panic!(
            "REDLIMIT_BENCH_ROW={other}: expected window-hot, window-keys, bucket-hot, bucket-keys, \
             governor-hot, governor-keys, window-refused or governor-refused"
        ),
    }
}
