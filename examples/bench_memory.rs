//! `REDLIMIT_BENCH_ROW=<row> REDLIMIT_BENCH_CALLS=<n> cargo run --release --example
//! bench_memory`: `n` in-process decisions of one row, one after the other on one
//! thread, for counting the instructions each takes: after the row's set-up and 1 000
//! decisions not counted (first uses, governor's clock calibrating itself), the `n`
//! decisions run in `counted`, the one function `scripts/memory-instructions.sh` has
//! callgrind count.
//!
//! Rows: `window-hot` and `bucket-hot`, one limiter decided again and again (a
//! sliding window, a token bucket); `window-keys` and `bucket-keys`, 100 000 limiters
//! made first, then decided in turn; `governor-hot` and `governor-keys`, governor's
//! keyed limiter (`check_key`) on the same keys; `window-refused`, one exhausted
//! sliding window refused again and again; `governor-refused`, governor's refusal.
//! Every limiter but the refused ones grants every call (a rate of 10^9 a second), so
//! each row measures the work of a decision, not how often it refuses.
//!
//! Keys that come and go: `window-stayed` / `window-returning` and `bucket-stayed` /
//! `bucket-returning` decide 100 000 keys in turn under a rule of 1 000 a minute (the
//! bucket's burst 1 000), on a clock the row moves: by nothing in the `-stayed` rows,
//! so each key comes back to the window or bucket it left, and by 1 ms a decision in
//! the `-returning` rows, so each key comes back 100 s later, after its window emptied
//! or its bucket filled again. `governor-returning` is governor's keyed limiter of the
//! same quota on a clock moved the same way.

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

fn redlimit_row(algorithm: Algorithm, keys: usize, calls: usize) {
    let client = Client::builder().max_limiters(KEYS + 1).memory();
    let rules = rules(algorithm, keys);
    let decide = |i: usize| {
        let decision = poll_once(client.check_rules(black_box(&rules[i % keys])));
        assert!(decision.unwrap().allowed);
    };
    (0..keys.max(1_000)).for_each(decide);
    counted(calls, decide);
}

/// A future polled once where it is made: in process nothing waits.
fn poll_once<F: std::future::Future>(future: F) -> F::Output {
    let future = std::pin::pin!(future);
    match future.poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
        std::task::Poll::Ready(output) => output,
        std::task::Poll::Pending => panic!("an in-process decision waited"),
    }
}

/// `calls` decisions: the function the script counts.
#[inline(never)]
fn counted(calls: usize, mut decide: impl FnMut(usize)) {
    for i in 0..calls {
        decide(i);
    }
}

/// The `-stayed` and `-returning` rows: `KEYS` keys of 1 000 a minute decided in turn on
/// a clock moved by `step` a decision (the move counted in both rows alike).
fn coming_and_going_row(algorithm: Algorithm, step: Duration, calls: usize) {
    let clock = redlimit::ManualClock::new(1_700_000_000_000);
    let client = Client::builder()
        .max_limiters(KEYS + 1)
        .clock(clock.clone())
        .memory();
    let minute = Duration::from_secs(60);
    let rules: Vec<[Rule; 1]> = (0..KEYS)
        .map(|k| {
            let rule = Rule::new(format!("rate_limit:bench:mem:{k}"), 1_000, minute);
            [match algorithm {
                Algorithm::TokenBucket => rule.algorithm(Algorithm::TokenBucket).burst(1_000),
                _ => rule,
            }]
        })
        .collect();
    let decide = |i: usize| {
        clock.advance(black_box(step));
        let decision = poll_once(client.check_rules(black_box(&rules[i % KEYS])));
        assert!(decision.unwrap().allowed);
    };
    (0..KEYS).for_each(decide);
    counted(calls, decide);
}

/// governor's keyed limiter of 1 000 a minute over `KEYS` keys on a clock moved by
/// 1 ms a decision, as `coming_and_going_row` moves its own.
fn governor_returning_row(calls: usize) {
    let clock = governor::clock::FakeRelativeClock::default();
    let quota = governor::Quota::per_minute(NonZeroU32::new(1_000).unwrap());
    let limiter = governor::RateLimiter::dashmap_with_clock(quota, clock.clone());
    let decide = |i: usize| {
        clock.advance(black_box(Duration::from_millis(1)));
        assert!(limiter.check_key(black_box(&((i % KEYS) as u64))).is_ok());
    };
    (0..KEYS).for_each(decide);
    counted(calls, decide);
}

fn governor_row(keys: usize, calls: usize) {
    let quota = governor::Quota::per_second(NonZeroU32::new(RATE).unwrap());
    let limiter = governor::RateLimiter::keyed(quota);
    let decide = |i: usize| assert!(limiter.check_key(black_box(&((i % keys) as u64))).is_ok());
    (0..keys.max(1_000)).for_each(decide);
    counted(calls, decide);
}

fn main() {
    let row = std::env::var("REDLIMIT_BENCH_ROW").expect("REDLIMIT_BENCH_ROW is not set");
    let calls: usize = std::env::var("REDLIMIT_BENCH_CALLS")
        .ok()
        .map_or(200_000, |n| n.parse().expect("REDLIMIT_BENCH_CALLS is a number"));
    match row.as_str() {
        "window-hot" => redlimit_row(Algorithm::SlidingWindow, 1, calls),
        "window-keys" => redlimit_row(Algorithm::SlidingWindow, KEYS, calls),
        "bucket-hot" => redlimit_row(Algorithm::TokenBucket, 1, calls),
        "bucket-keys" => redlimit_row(Algorithm::TokenBucket, KEYS, calls),
        "governor-hot" => governor_row(1, calls),
        "window-stayed" => coming_and_going_row(Algorithm::SlidingWindow, Duration::ZERO, calls),
        "window-returning" => coming_and_going_row(Algorithm::SlidingWindow, Duration::from_millis(1), calls),
        "bucket-stayed" => coming_and_going_row(Algorithm::TokenBucket, Duration::ZERO, calls),
        "bucket-returning" => coming_and_going_row(Algorithm::TokenBucket, Duration::from_millis(1), calls),
        "governor-returning" => governor_returning_row(calls),
        "governor-keys" => governor_row(KEYS, calls),
        "window-refused" => {
            let client = Client::memory();
            let rules = [Rule::new(
                "rate_limit:bench:mem:refused",
                1,
                Duration::from_secs(3600),
            )];
            let decide = |_| assert!(!poll_once(client.check_rules(black_box(&rules))).unwrap().allowed);
            let _ = poll_once(client.check_rules(&rules));
            (0..1_000).for_each(decide);
            counted(calls, decide);
        }
        "governor-refused" => {
            let limiter =
                governor::RateLimiter::keyed(governor::Quota::per_hour(NonZeroU32::new(1).unwrap()));
            let _ = limiter.check_key(&1u64);
            let decide = |_| assert!(limiter.check_key(black_box(&1u64)).is_err());
            (0..1_000).for_each(decide);
            counted(calls, decide);
        }
        other => panic!(
            "REDLIMIT_BENCH_ROW={other}: expected window-hot, window-keys, bucket-hot, bucket-keys, \
             governor-hot, governor-keys, window-refused, governor-refused, window-stayed, \
             window-returning, bucket-stayed, bucket-returning or governor-returning"
        ),
    }
}
