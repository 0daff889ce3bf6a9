//! Waiting for permits: sleep for the wait the backend reports, with jitter, in one
//! loop (no recursion, no busy polling), and give up at the deadline.

use std::future::Future;
use std::time::Duration;

use rand::RngExt;
use tokio::time::Instant;

use crate::{Decision, Error};

/// Jitter spreads waiters that were refused together, so they do not all come back
/// in the same millisecond: up to an eighth of the wait, at most 10 ms (more would
/// leave permits idle).
fn jitter(wait: Duration) -> Duration {
    let cap = (wait / 8).min(Duration::from_millis(10)).as_micros() as u64;
    Duration::from_micros(rand::rng().random_range(0..=cap))
}

/// The deadline `timeout` from now. A timeout past what the clock can count
/// (`Duration::MAX`) waits as long as the clock can: about 30 years, as Tokio's own
/// timers do.
pub(crate) fn deadline_in(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365 * 30))
}

/// Whether `attempt` is allowed within `timeout` (see [`until_allowed`]).
pub(crate) async fn within<F, Fut>(timeout: Duration, attempt: F) -> Result<bool, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Decision, Error>>,
{
    Ok(until_allowed(Some(deadline_in(timeout)), attempt).await?.allowed)
}

/// Retries `attempt` until it is allowed. With a deadline, returns the last refusal
/// as soon as the reported wait cannot end before the deadline, and never sleeps past
/// the deadline.
pub(crate) async fn until_allowed<F, Fut>(
    deadline: Option<Instant>,
    mut attempt: F,
) -> Result<Decision, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Decision, Error>>,
{
    let mut slept: Option<Instant> = None;
    let done = |slept: Option<Instant>| {
        if let Some(started) = slept {
            crate::observe::waited(started.elapsed());
        }
    };
    loop {
        let decision = attempt().await;
        if !matches!(&decision, Ok(d) if !d.allowed) {
            done(slept);
            return decision;
        }
        let decision = decision?;
        let wait = decision
            .retry_after
            .unwrap_or(Duration::from_millis(1))
            .max(Duration::from_millis(1));
        let now = Instant::now();
        let wake = now + wait + jitter(wait);
        if matches!(deadline, Some(deadline) if now + wait > deadline) {
            done(slept);
            return Ok(decision);
        }
        slept.get_or_insert(now);
        tokio::time::sleep_until(deadline.map_or(wake, |deadline| wake.min(deadline))).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(wait: Duration) -> Decision {
        Decision {
            allowed: false,
            remaining: 0,
            retry_after: Some(wait),
            refused_by: Some(0),
            at_ms: 0,
            tightest: Some(0),
        }
    }

    /// A wait that ends exactly at the deadline: the jitter would carry the next
    /// attempt past it, so the sleep is cut at the deadline and the attempt made there.
    #[tokio::test(start_paused = true)]
    async fn a_wait_ending_at_the_deadline_is_tried_at_the_deadline_not_after() {
        let wait = Duration::from_millis(80);
        for _ in 0..20 {
            let deadline = Instant::now() + wait;
            let mut attempts = Vec::new();
            let decision = until_allowed(Some(deadline), || {
                attempts.push(Instant::now());
                async move { Ok(refused(wait)) }
            })
            .await
            .unwrap();
            assert!(!decision.allowed);
            assert_eq!(attempts.len(), 2, "one attempt now, one at the deadline");
            assert_eq!(attempts[1], deadline, "{:?} after it", attempts[1] - deadline);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_past_the_deadline_gives_up_at_once() {
        let started = Instant::now();
        let mut attempts = 0;
        let decision = until_allowed(Some(started + Duration::from_millis(50)), || {
            attempts += 1;
            async { Ok(refused(Duration::from_millis(51))) }
        })
        .await
        .unwrap();
        assert!(!decision.allowed);
        assert_eq!(attempts, 1);
        assert_eq!(Instant::now(), started, "no sleep at all");
    }
}
