//! A cluster's decision on a slot being moved between nodes, tried again within its
//! own timeout. While a slot moves, its calls are answered `TRYAGAIN` (some of a
//! call's keys moved, some not), `ASK` or `MOVED` (the nodes not yet agreeing which
//! one serves it): the try they answer did not run, and the cluster client tries again at
//! once or after a few milliseconds, four times. A move that lasts longer (its tool
//! descheduled on a busy host, keys still being migrated) outlasts those tries, and
//! the call would fail where waiting a little longer serves it. So a decision's
//! script call is sent again after 10 ms, then 30, 90 and so on, while the wait ends
//! within half the command timeout (the rest left for the last try), each try
//! written at the time it is sent (`acquire.rs`). Only decisions: a refund or a
//! settle is not sent again (a proxy that ran one and answered `TRYAGAIN` would have
//! it run again at each try). Not a call whose pace (its slot's own after a redirect,
//! else its node's) had failures in a row when it began. (A try of the cluster
//! client's lost with its connection before such an answer may have run: the
//! decision then runs again, counting its permits twice: stricter, never more.)
//! Tries again are paid for from the client's reserve of [`MOST_SAVED`], which time
//! refills by [`TRIES_A_SECOND`] whatever else the client serves: a node that
//! redirects for good, or redirects to a node no connection reaches, is sent at most
//! that many tries more (each up to five commands: the cluster client's own tries),
//! however many calls are made.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::RedisError;

/// The first wait before a call is sent again; each next is three times the last.
const FIRST_WAIT: Duration = Duration::from_millis(10);

/// A try again, in the reserve's units.
const TRY: u32 = 10;

/// The most tries again held in reserve, in the reserve's units: 20 tries.
pub(super) const MOST_SAVED: u32 = 20 * TRY;

/// The tries again time adds to the reserve, a second.
pub(super) const TRIES_A_SECOND: u32 = 5;

/// The time that adds one unit to the reserve.
const UNIT_EVERY: Duration = Duration::from_millis(1000 / (TRIES_A_SECOND * TRY) as u64);

/// The tries again a client has in reserve.
#[derive(Debug)]
pub(super) struct MoveRetries {
    saved: AtomicU32,
    /// Up to when time was added to the reserve.
    refilled: Mutex<Instant>,
}

impl Default for MoveRetries {
    fn default() -> Self {
        MoveRetries {
            saved: AtomicU32::new(MOST_SAVED),
            refilled: Mutex::new(Instant::now()),
        }
    }
}

impl MoveRetries {
    fn save(&self, units: u32) {
        if self.saved.load(Ordering::Relaxed) < MOST_SAVED {
            let _ = self
                .saved
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |saved| {
                    (saved < MOST_SAVED).then(|| saved.saturating_add(units).min(MOST_SAVED))
                });
        }
    }

    /// Adds to the reserve what the time since the last refill added, as of `now`.
    fn refill(&self, now: Instant) {
        let mut refilled = self.refilled.lock().unwrap_or_else(PoisonError::into_inner);
        let units = now.saturating_duration_since(*refilled).as_nanos() / UNIT_EVERY.as_nanos();
        if units == 0 {
            return;
        }
        self.save(u32::try_from(units).unwrap_or(u32::MAX));
        *refilled = match u32::try_from(units) {
            Ok(units) if units < MOST_SAVED => *refilled + UNIT_EVERY * units,
            _ => now,
        };
    }

    /// How long to wait before sending again a call sent `elapsed` ago and tried
    /// again `tries` times so far, its last answer a slot being moved; `None` when the
    /// wait would end past half of `timeout`, or no try again is left in reserve.
    pub fn wait(&self, tries: u32, elapsed: Duration, timeout: Duration) -> Option<Duration> {
        let wait = FIRST_WAIT.checked_mul(3u32.checked_pow(tries)?)?;
        if elapsed.saturating_add(wait) > timeout / 2 {
            return None;
        }
        self.refill(Instant::now());
        self.saved
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |saved| {
                saved.checked_sub(TRY)
            })
            .ok()?;
        Some(wait)
    }
}

/// Whether `err` is a cluster's answer that the call's slot is being moved, so that
/// the call did not run: `TRYAGAIN`, `ASK` or `MOVED`, the cluster client's own tries
/// spent.
pub(super) fn slot_moving(err: &RedisError) -> bool {
    matches!(err.code(), Some("TRYAGAIN" | "ASK" | "MOVED"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_millis(250);

    /// The waits grow three times a try, and end within half the timeout: at the
    /// default 250 ms, 10 and 30 ms (90 more would end at 130); at 2 s, four.
    #[test]
    fn waits_grow_and_end_within_half_the_timeout() {
        let retries = MoveRetries::default();
        let mut waited = Duration::ZERO;
        let mut waits = Vec::new();
        while let Some(wait) = retries.wait(waits.len() as u32, waited, TIMEOUT) {
            waits.push(wait.as_millis());
            waited += wait;
        }
        assert_eq!(waits, [10, 30]);
        let (mut waited, mut waits) = (Duration::ZERO, Vec::new());
        while let Some(wait) = retries.wait(waits.len() as u32, waited, Duration::from_secs(2)) {
            waits.push(wait.as_millis());
            waited += wait;
        }
        assert_eq!(waits, [10, 30, 90, 270]);
        assert_eq!(retries.wait(u32::MAX, Duration::ZERO, Duration::MAX), None);
    }

    /// The reserve holds 20 tries; once spent, time adds one a fifth of a second, never
    /// past the most.
    #[test]
    fn tries_again_are_paid_for_by_time() {
        let retries = MoveRetries::default();
        let start = Instant::now();
        // (no time added while the reserve is spent)
        *retries.refilled.lock().unwrap() = start + Duration::from_secs(3600);
        for _ in 0..20 {
            assert!(retries.wait(0, Duration::ZERO, TIMEOUT).is_some());
        }
        assert_eq!(retries.wait(0, Duration::ZERO, TIMEOUT), None);
        *retries.refilled.lock().unwrap() = start;
        retries.refill(start + Duration::from_millis(199));
        assert_eq!(retries.saved.load(Ordering::Relaxed), 9);
        retries.refill(start + Duration::from_millis(500));
        assert_eq!(retries.saved.load(Ordering::Relaxed), 25);
        *retries.refilled.lock().unwrap() = start + Duration::from_secs(3600);
        assert!(retries.wait(0, Duration::ZERO, TIMEOUT).is_some());
        assert!(retries.wait(0, Duration::ZERO, TIMEOUT).is_some());
        assert_eq!(retries.wait(0, Duration::ZERO, TIMEOUT), None);
        *retries.refilled.lock().unwrap() = start;
        retries.refill(start + Duration::from_secs(3600));
        assert_eq!(retries.saved.load(Ordering::Relaxed), MOST_SAVED);
        assert_eq!(
            *retries.refilled.lock().unwrap(),
            start + Duration::from_secs(3600)
        );
    }

    /// Only the answers of a slot being moved are tried again: not a node's error
    /// about itself, nor a refused script.
    #[test]
    fn only_a_slot_being_moved_is_tried_again() {
        // (an error reply as the connection reads it off the wire)
        let server = |code: &str| {
            redis::parse_redis_value(format!("-{code} 3999 127.0.0.1:6381\r\n").as_bytes())
                .unwrap()
                .extract_error()
                .unwrap_err()
        };
        for code in ["TRYAGAIN", "ASK", "MOVED"] {
            assert!(slot_moving(&server(code)), "{code}");
        }
        for code in ["CLUSTERDOWN", "BUSY", "ERR", "NOSCRIPT", "WRONGTYPE", "CROSSSLOT"] {
            assert!(!slot_moving(&server(code)), "{code}");
        }
    }
}
