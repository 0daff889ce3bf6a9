//! Waiting for permits on the real clock, with short intervals: `try_acquire_for`,
//! `acquire` and `check_rules_for` sleep for the reported wait and respect deadlines.

use redlimit_test_support as support;

use std::time::{Duration, Instant};

use redlimit::{Client, RateType, Rule};
use support::RedisServer;

const INTERVAL: Duration = Duration::from_millis(300);

async fn clients() -> (Option<RedisServer>, Vec<Client>) {
    let server = RedisServer::start();
    let redis = Client::connect(&server.url()).await.unwrap();
    (Some(server), vec![Client::memory(), redis])
}

#[tokio::test]
async fn try_acquire_for_waits_then_grants() {
    let (_server, clients) = clients().await;
    for client in clients {
        let limiter = client.rate_limiter("wait:grant");
        limiter
            .try_set_rate(RateType::Overall, 2, INTERVAL)
            .await
            .unwrap();
        // (timed from before the grant it waits behind: the grant is stamped when it is
        // sent, and on a loaded machine its answer may come back milliseconds later)
        let started = Instant::now();
        assert!(limiter.try_acquire(2).await.unwrap());
        assert!(
            limiter.try_acquire_for(1, Duration::from_secs(2)).await.unwrap(),
            "{client:?}"
        );
        let waited = started.elapsed();
        assert!(
            waited >= INTERVAL - Duration::from_millis(5),
            "{client:?}: granted after {waited:?}"
        );
        assert!(waited < Duration::from_secs(2), "{client:?}: {waited:?}");
    }
}

#[tokio::test]
async fn try_acquire_for_gives_up_without_sleeping_past_the_deadline() {
    let (_server, clients) = clients().await;
    for client in clients {
        let limiter = client.rate_limiter("wait:give_up");
        limiter
            .try_set_rate(RateType::Overall, 1, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(limiter.try_acquire(1).await.unwrap());
        // The permit returns in 5 s: a 200 ms timeout cannot be met, so no sleep at all.
        let started = Instant::now();
        assert!(!limiter
            .try_acquire_for(1, Duration::from_millis(200))
            .await
            .unwrap());
        assert!(
            started.elapsed() < Duration::from_millis(150),
            "{client:?}: {:?}",
            started.elapsed()
        );
        assert_eq!(
            limiter.available_permits().await.unwrap(),
            0,
            "a refusal spends nothing"
        );
    }
}

#[tokio::test]
async fn a_wait_that_ends_just_before_the_deadline_is_granted() {
    let (_server, clients) = clients().await;
    for client in clients {
        let limiter = client.rate_limiter("wait:edge");
        limiter
            .try_set_rate(RateType::Overall, 1, INTERVAL)
            .await
            .unwrap();
        assert!(limiter.try_acquire(1).await.unwrap());
        let started = Instant::now();
        let granted = limiter
            .try_acquire_for(1, INTERVAL + Duration::from_millis(30))
            .await
            .unwrap();
        let waited = started.elapsed();
        assert!(granted, "{client:?}");
        assert!(
            waited <= INTERVAL + Duration::from_millis(80),
            "{client:?}: {waited:?}"
        );
    }
}

#[tokio::test]
async fn many_waiters_are_served_in_turn_and_never_over_granted() {
    let (_server, clients) = clients().await;
    for client in clients {
        let rule = Rule::new("wait:crowd", 5, INTERVAL);
        let started = Instant::now();
        let tasks: Vec<_> = (0..15)
            .map(|_| {
                let client = client.clone();
                let rule = rule.clone();
                tokio::spawn(async move { client.acquire_rules(&[rule]).await.unwrap().at_ms })
            })
            .collect();
        let mut times = Vec::new();
        for task in tasks {
            times.push(task.await.unwrap());
        }
        // Every window [t, t + interval) of grant times (each grant's score in the
        // log) holds at most the rate.
        times.sort_unstable();
        let interval = INTERVAL.as_millis() as u64;
        for (i, &t) in times.iter().enumerate() {
            let in_window = times[i..].iter().take_while(|&&g| g < t + interval).count();
            assert!(
                in_window <= 5,
                "{client:?}: {in_window} grants from {t}: {times:?}"
            );
        }
        // 15 permits at 5 per window: the last five cannot start before two windows.
        let took = started.elapsed();
        assert_eq!(times.len(), 15);
        assert!(
            took >= 2 * INTERVAL - Duration::from_millis(5),
            "{client:?}: {took:?}"
        );
        assert!(took < 6 * INTERVAL, "{client:?}: {took:?}");
    }
}

#[tokio::test]
async fn check_rules_for_waits_for_every_rule() {
    let (_server, clients) = clients().await;
    for client in clients {
        let rules = [
            Rule::new("wait:rules:a", 1, INTERVAL),
            Rule::new("wait:rules:b", 1, 2 * INTERVAL),
        ];
        // Timed from before the first grant, which is made at the call's time: its
        // reply comes later by the first call's round trips (loading the script,
        // reading the overrides), which must not count as waited.
        let started = Instant::now();
        assert!(client.check_rules(&rules).await.unwrap().allowed);
        let decision = client
            .check_rules_for(&rules, Duration::from_secs(2))
            .await
            .unwrap();
        assert!(decision.allowed);
        assert!(
            started.elapsed() >= 2 * INTERVAL - Duration::from_millis(5),
            "{client:?}: {:?}",
            started.elapsed()
        );
        let refused = client
            .check_rules_for(&rules, Duration::from_millis(50))
            .await
            .unwrap();
        assert!(!refused.allowed);
        assert!(refused.retry_after.unwrap() > Duration::from_millis(50));
        assert!(client.acquire_rules(&rules).await.unwrap().allowed);
    }
}
