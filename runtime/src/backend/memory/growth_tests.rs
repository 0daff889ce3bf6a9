//! How much of its log one in-process decision reads, held against what a caller
//! controls: the permits of its calls, how many it makes, what it settles and
//! releases. A decision reads the entries that left the window since the limiter's
//! last call, each once (then they are dropped), and at most `WALK` more for a
//! refusal's wait: never more than the log holds, and the log never holds more
//! entries than the rate (each holds at least one permit, and value + log = rate).

use std::time::Duration;

use crate::algorithm::call_time::WALK;
use crate::algorithm::window::read;
use crate::{Client, Clock, ManualClock, RateType, Reserved, Rule};

const START: u64 = 1_700_000_000_000;

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

/// The entries of `name`'s log (overall), as held at `now`.
fn log_len(client: &Client, name: &str, now: u64) -> usize {
    let memory = client.backend().in_process().expect("an in-process client");
    let mut store = memory.lock(name);
    let limiter = store.limiters.get_mut(name).expect("the limiter is held");
    limiter
        .bucket(RateType::Overall, now)
        .map_or(0, |bucket| bucket.log.len())
}

#[test]
fn a_decision_reads_no_more_of_its_log_for_more_permits_or_a_fuller_window() {
    const RATE: u64 = 100_000;
    for window in [10, 50_000] {
        let clock = ManualClock::new(START);
        let client = Client::builder().clock(clock.clone()).memory();
        let rule = Rule::new("growth:window", RATE, Duration::from_secs(3600));
        block_on(async {
            for _ in 0..window {
                assert!(
                    client
                        .check_rules(std::slice::from_ref(&rule))
                        .await
                        .unwrap()
                        .allowed
                );
            }
            clock.advance(Duration::from_millis(1));
            // a grant of 1, a grant of every permit left, refusals of 1 and of the rate
            for (permits, granted) in [(1, true), (RATE - window - 1, true), (1, false), (RATE, false)] {
                read::take();
                let decision = client
                    .check_rules(&[rule.clone().permits(permits)])
                    .await
                    .unwrap();
                assert_eq!(
                    decision.allowed, granted,
                    "{permits} permits, {window} in the window"
                );
                let (entries, _) = read::take();
                assert!(
                    entries <= WALK + 1,
                    "{permits} permits on a window of {window} grants read {entries} entries of its log"
                );
            }
        });
    }
}

#[test]
fn what_left_the_window_is_at_most_the_rate_whatever_the_caller_does() {
    const RATE: u64 = 50;
    const NAME: &str = "growth:left";
    let clock = ManualClock::new(START);
    let client = Client::builder().clock(clock.clone()).memory();
    // kept past its window, so that what left it is still there to read
    let rule = Rule::new(NAME, RATE, Duration::from_secs(1)).keep_alive(Some(Duration::from_secs(3600)));
    let held = |step: &str| {
        let entries = log_len(&client, NAME, clock.now_ms());
        assert!(
            entries as u64 <= RATE,
            "after {step}, the log holds {entries} entries, more than the rate {RATE}"
        );
    };
    block_on(async {
        // ten times the rate in one-permit calls, at one instant
        for _ in 0..10 * RATE {
            client.check_rules(std::slice::from_ref(&rule)).await.unwrap();
        }
        held("ten times the rate in calls");
        // a window later, ten times the rate in reservations given back whole
        clock.advance(Duration::from_secs(1));
        for _ in 0..10 * RATE {
            if let Reserved::Granted(r) = client.reserve(&[rule.clone().settled()]).await.unwrap() {
                r.settle(0).await.unwrap();
            }
        }
        held("reservations given back whole");
        // every size of call, settled with less, or with far more (a debt)
        for permits in 1..=RATE {
            clock.advance(Duration::from_millis(1));
            let rules = [rule.clone().settled().permits(permits)];
            if let Reserved::Granted(r) = client.reserve(&rules).await.unwrap() {
                let actual = if permits % 2 == 0 {
                    permits / 2
                } else {
                    permits * 1_000
                };
                r.settle(actual).await.unwrap();
            }
            client.rate_limiter(NAME).release(permits).await.unwrap();
            held("reservations settled with less and with more, and releases");
        }
        // then, a window later, ten times the rate again, and the first decision after
        // the window: what left is what the log held, the rate's worth at most
        clock.advance(Duration::from_secs(1));
        for _ in 0..10 * RATE {
            client.check_rules(std::slice::from_ref(&rule)).await.unwrap();
        }
        let before = log_len(&client, NAME, clock.now_ms());
        assert_eq!(before as u64, RATE, "one-permit calls fill the log to the rate");
        clock.advance(Duration::from_secs(1));
        read::take();
        client.check_rules(std::slice::from_ref(&rule)).await.unwrap();
        let (_, most) = read::take();
        assert_eq!(most, before, "the decision read what left the window, once");
        assert!(
            most as u64 <= RATE,
            "one decision read {most} entries that left, more than the rate"
        );
    });
}
