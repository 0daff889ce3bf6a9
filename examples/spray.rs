//! What a spray of new keys costs new users of an in-process client at its bound
//! (RELIABILITY.md, "In process"): a bound of 1 000 limiters, a rule of 5 per minute,
//! a spray of 10 and 100 times the bound in new keys spread over 30 s (each key making
//! 1 call, or 5), then 1 000 new users making 5 calls each; the calls of new users
//! refused, and the users refused every call. Sliding windows and token buckets (burst
//! 5), each in a client of its own on a manual clock.
//!
//!   cargo run --release --example spray

use std::time::Duration;

use redlimit::{Algorithm, Client, ManualClock, Rule};

const BOUND: usize = 1_000;
const MINUTE: Duration = Duration::from_secs(60);

fn rule(name: String, algorithm: Algorithm) -> Rule {
    let rule = Rule::new(name, 5, MINUTE).algorithm(algorithm);
    match algorithm {
        Algorithm::TokenBucket => rule.burst(5),
        _ => rule,
    }
}

/// Calls of new users refused, and users refused every call, after `times` the bound
/// in new keys making `calls` calls each.
async fn spray(algorithm: Algorithm, times: usize, calls: usize) -> (usize, usize) {
    let clock = ManualClock::new(1_000_000_000_000);
    let client = Client::builder()
        .max_limiters(BOUND)
        .clock(clock.clone())
        .memory();
    let keys = times * BOUND;
    for key in 0..keys {
        if key % (keys / 300).max(1) == 0 {
            clock.advance(Duration::from_millis(100));
        }
        for _ in 0..calls {
            let _ = client
                .check_rules(&[rule(format!("spray:{key}"), algorithm)])
                .await;
        }
    }
    let (mut refused, mut locked) = (0, 0);
    for user in 0..1_000 {
        let mut user_refused = 0;
        for _ in 0..5 {
            let decision = client
                .check_rules(&[rule(format!("user:{user}"), algorithm)])
                .await;
            user_refused += usize::from(!decision.is_ok_and(|d| d.allowed));
        }
        refused += user_refused;
        locked += usize::from(user_refused == 5);
    }
    (refused, locked)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    println!("| algorithm | spray | calls per sprayed key | calls of new users refused (of 5 000) | new users refused every call (of 1 000) |");
    println!("|---|---:|---:|---:|---:|");
    for (name, algorithm) in [
        ("sliding window", Algorithm::SlidingWindow),
        ("token bucket", Algorithm::TokenBucket),
    ] {
        for times in [10, 100] {
            for calls in [1, 5] {
                let (refused, locked) = spray(algorithm, times, calls).await;
                println!("| {name} | {times}x the bound | {calls} | {refused} | {locked} |");
            }
        }
    }
}
