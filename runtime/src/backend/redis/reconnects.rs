//! A server no connection reaches, tried at a measured pace. The connection manager
//! tries a new connection at each command that finds the last one failed: with the
//! server down behind a proxy that takes each connection and closes it, 4 calling
//! tasks made about 1 800 connections a second, each failing at once, and a fleet
//! would bring a recovering server as many per client.
//!
//! Now a failure that follows another (the command sent after the first, on the
//! connection it had made) pauses the connecting: until the pause ends, calls fail at
//! once with the last failure's cause, sending nothing; the first call after it tries
//! again. The pause doubles from [`FIRST_PAUSE`] at each such try that fails, up to
//! [`LONGEST_PAUSE`], and ends at the first reply. One connection lost on a server that
//! answers pauses nothing: the command after it reconnects at once. What the client
//! sends beside the calls (a check of the server, a refund) is not sent while the
//! connecting is paused: each would try a connection of its own.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The pause after the second failure in a row.
pub(crate) const FIRST_PAUSE: Duration = Duration::from_millis(100);

/// The longest pause: a server back is reached within it.
pub(crate) const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// How a client's connecting to one server is paced.
#[derive(Default)]
pub(crate) struct Reconnects {
    /// Commands that failed to reach the server since the last reply.
    in_a_row: AtomicU32,
    /// Whether `pause` holds one: read before each command.
    paused: AtomicBool,
    pause: Mutex<Option<Pause>>,
}

struct Pause {
    /// Until when calls fail at once.
    until: Instant,
    length: Duration,
    /// Whether a call tries again since the pause began: its failure doubles the
    /// pause (failures of calls sent before it began leave it as it is).
    tried: bool,
    /// The last failure's cause, as its error said it.
    cause: String,
}

impl Reconnects {
    /// Before a command: the failures in a row so far (what [`failed`](Self::failed)
    /// is given), and whether the command is the one that tries again after a pause
    /// (on a connection made anew: the last one holds the failure of an attempt made
    /// when the pause began); or, while the connecting is paused, why the call fails
    /// at once.
    #[inline]
    pub(crate) fn before(&self) -> Result<(u32, bool), String> {
        let tries = self.paused.load(Ordering::Relaxed) && self.paused_for()?;
        Ok((self.in_a_row.load(Ordering::Relaxed), tries))
    }

    #[cold]
    fn paused_for(&self) -> Result<bool, String> {
        let mut pause = self.pause.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(pause) = pause.as_mut() else {
            return Ok(false);
        };
        let now = Instant::now();
        if now < pause.until {
            return Err(format!(
                "{}; no connection is tried for {:?} after a failed one",
                pause.cause, pause.length
            ));
        }
        // This call tries: the others wait out the same pause again meanwhile.
        pause.until = now + pause.length;
        pause.tried = true;
        Ok(true)
    }

    /// Whether the connecting is paused: what would be sent beside the calls (a check
    /// of the server, a refund) waits for a reply. (Sent after one lost connection,
    /// it waits on the connection the next call makes, and makes none of its own.)
    pub(crate) fn paused(&self) -> bool {
        self.paused.load(Ordering::Relaxed)
    }

    /// A reply came: the server is reached.
    #[inline]
    pub(crate) fn answered(&self) {
        if self.in_a_row.load(Ordering::Relaxed) != 0 {
            self.reached();
        }
    }

    #[cold]
    fn reached(&self) {
        let mut pause = self.pause.lock().unwrap_or_else(PoisonError::into_inner);
        self.in_a_row.store(0, Ordering::Relaxed);
        self.paused.store(false, Ordering::Relaxed);
        *pause = None;
    }

    /// A command sent after `before` failures in a row failed to reach the server,
    /// for `cause`. Sent after one, it was on the connection that failure had made:
    /// that one failed too, and the connecting pauses.
    #[cold]
    pub(crate) fn failed(&self, before: u32, cause: &str) {
        let mut pause = self.pause.lock().unwrap_or_else(PoisonError::into_inner);
        self.in_a_row.fetch_add(1, Ordering::Relaxed);
        if before == 0 {
            return;
        }
        let length = match pause.as_ref() {
            None => FIRST_PAUSE,
            Some(pause) if pause.tried => (pause.length * 2).min(LONGEST_PAUSE),
            // Sent before the pause began (calls failing together): one failure.
            Some(_) => return,
        };
        *pause = Some(Pause {
            until: Instant::now() + length,
            length,
            tried: false,
            cause: cause.to_owned(),
        });
        self.paused.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_after_a_failure_pauses_and_a_reply_ends_the_pause() {
        let reconnects = Reconnects::default();
        // A connection lost: the next command tries at once.
        assert_eq!(reconnects.before(), Ok((0, false)));
        reconnects.failed(0, "refused");
        assert_eq!(reconnects.before(), Ok((1, false)));
        // The new connection failed too: paused.
        reconnects.failed(1, "refused");
        let err = reconnects.before().unwrap_err();
        assert!(
            err.starts_with("refused; no connection is tried for 100ms"),
            "{err}"
        );
        // The pause over, one call tries; failing, the pause doubles.
        std::thread::sleep(FIRST_PAUSE);
        assert_eq!(reconnects.before(), Ok((2, true)));
        assert!(reconnects.before().is_err(), "one call tries, the others wait");
        reconnects.failed(2, "refused");
        assert!(reconnects.before().unwrap_err().contains("for 200ms"));
        // A reply ends it.
        reconnects.answered();
        assert_eq!(reconnects.before(), Ok((0, false)));
    }

    #[test]
    fn calls_failing_together_are_one_failure() {
        let reconnects = Reconnects::default();
        reconnects.failed(0, "reset");
        for _ in 0..10 {
            reconnects.failed(1, "reset");
        }
        assert!(reconnects.before().unwrap_err().contains("for 100ms"));
    }

    #[test]
    fn the_pause_stops_doubling_at_the_longest() {
        let reconnects = Reconnects::default();
        reconnects.failed(0, "reset");
        reconnects.failed(1, "reset");
        for before in 2..10 {
            reconnects.pause.lock().unwrap().as_mut().unwrap().until = Instant::now();
            assert!(reconnects.before().is_ok(), "the pause is over: one call tries");
            reconnects.failed(before, "reset");
        }
        assert!(reconnects.before().unwrap_err().contains("for 1s"));
    }
}
