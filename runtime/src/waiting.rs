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
    loop {
        let decision = attempt().await?;
        if decision.allowed {
            return Ok(decision);
        }
        let wait = decision
            .retry_after
            .unwrap_or(Duration::from_millis(1))
            .max(Duration::from_millis(1));
        let wake = Instant::now() + wait + jitter(wait);
        match deadline {
            None => tokio::time::sleep_until(wake).await,
            Some(deadline) if Instant::now() + wait > deadline => return Ok(decision),
            Some(deadline) => tokio::time::sleep_until(wake.min(deadline)).await,
        }
    }
}
