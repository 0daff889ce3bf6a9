//! A server no connection reaches, tried at a measured pace. The connection manager
//! tries a new connection at each command that finds the last one failed: with the
//! server down behind a proxy that takes each connection and closes it, 4 calling
//! tasks made about 1 800 connections a second, each failing at once, and a fleet
//! would bring a recovering server as many per client.
//!
//! Now a failure that follows another (the command sent after the first, on the
//! connection it had made) pauses the connecting. A failure is a connection lost or
//! refused, one whose `AUTH` or `SELECT` is refused (which the connection manager
//! never makes again by itself), a command that timed out when nothing has come back
//! for a command timeout since an earlier one timed out (a network that drops every
//! packet, a server that has stopped: each call would otherwise wait out its timeout
//! for as long as it lasts), or the server's error reply about itself rather than the
//! call (`BUSY` with another program's script, `LOADING`, `MISCONF`, a plain `ERR`
//! such as out of connections or a proxy refusing: without the pause every call is
//! sent and refused, and behind a proxy that answers so and closes, a cluster's client
//! connects again for each; on a cluster, once the slot map gives the node a pace of
//! its own; `TRYAGAIN`, `WRONGTYPE` and the like are about the call). Until the
//! pause ends, calls fail at once with the last failure's kind and cause, sending
//! nothing; the first call after it tries again (on one server, on a new connection).
//! The pause doubles from [`FIRST_PAUSE`] at each such try that fails or answers
//! nothing within the command timeout, up to [`LONGEST_PAUSE`]. A reply ends it; an
//! error reply about the call (a script's) lets the calls go on but keeps its length
//! for the next failure. One connection lost on a server
//! that answers pauses nothing: the command after it reconnects at once. What the
//! client sends beside the calls (a check of the server, a refund) is not sent while
//! the connecting is paused: each would try a connection of its own. On a Redis
//! Cluster each primary has a pace of its own (`nodes`): one down pauses the calls to
//! its slots only; a slot whose calls end in a redirect has one of its own.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The pause after the second failure in a row.
pub(crate) const FIRST_PAUSE: Duration = Duration::from_millis(100);

/// The longest pause: a server back is reached at the first try after it is back,
/// within this and the try under way when it came back.
pub(crate) const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// How a client's connecting to one server is paced.
#[derive(Default)]
pub(crate) struct Reconnects {
    /// Commands that failed to reach the server since the last reply that was not
    /// an error.
    in_a_row: AtomicU32,
    /// Whether `state` holds a pause: read before each command.
    paused: AtomicBool,
    /// Whether `state` holds when the server went silent: read at each reply.
    silent: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    pause: Option<Pause>,
    /// The last pause's length, kept past an error reply (a server that answers a
    /// command with an error and closes is reached by nothing the client can use),
    /// forgotten at a reply that is not an error.
    last: Option<Duration>,
    /// When the first timeout since the last reply was seen.
    silent_since: Option<Instant>,
}

struct Pause {
    /// Until when calls fail at once.
    until: Instant,
    length: Duration,
    /// Whether a call tries again since the pause began: its failure doubles the
    /// pause (failures of calls sent before it began leave it as it is).
    tried: bool,
    /// The last failure, and its cause as its error said it.
    failure: Failure,
    cause: String,
}

/// What kind of failure keeps the client from the server: no connection, a
/// connection whose opening commands (`AUTH`, `SELECT`) are refused, which the
/// connection manager never makes again by itself, or a server that answers the
/// calls with an error about none of their keys (loading its data, busy with another
/// program's script, out of connections, a proxy refusing them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    Unreachable,
    Credentials,
    Database,
    Refusing,
    /// Not the kind of server the URL names.
    WrongServer,
}

impl Reconnects {
    /// Before a command: the failures in a row so far (what [`failed`](Self::failed)
    /// is given), and whether the command is the one that tries again after a pause
    /// (on a connection made anew: the last one holds the failure of an attempt made
    /// when the pause began); or, while the connecting is paused, why the call fails
    /// at once.
    #[inline]
    pub(crate) fn before(&self) -> Result<(u32, bool), (Failure, String)> {
        let tries = self.paused.load(Ordering::Relaxed) && self.paused_for()?;
        Ok((self.in_a_row.load(Ordering::Relaxed), tries))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[cold]
    fn paused_for(&self) -> Result<bool, (Failure, String)> {
        let mut state = self.state();
        let Some(pause) = state.pause.as_mut() else {
            return Ok(false);
        };
        let now = Instant::now();
        if now < pause.until {
            let cause = match pause.failure {
                Failure::Refusing => format!(
                    "{}; no call is sent for {:?} after calls in a row were refused",
                    pause.cause, pause.length
                ),
                _ => format!(
                    "{}; no connection is tried for {:?} after a failed one",
                    pause.cause, pause.length
                ),
            };
            return Err((pause.failure, cause));
        }
        // This call tries: the others wait out the same pause again meanwhile. (Also
        // on a new connection after refusals: a proxy may have closed the last one.)
        pause.until = now + pause.length;
        pause.tried = true;
        Ok(true)
    }

    /// Whether a pause is under way now: one over, which no call has tried yet (no
    /// call went to this server since), is not.
    pub(crate) fn pausing(&self) -> bool {
        self.paused()
            && self
                .state()
                .pause
                .as_ref()
                .is_some_and(|pause| Instant::now() < pause.until)
    }

    /// Whether the connecting is paused: what would be sent beside the calls (a check
    /// of the server, a refund) waits for a reply. (Sent after one lost connection,
    /// it waits on the connection the next call makes, and makes none of its own.)
    pub(crate) fn paused(&self) -> bool {
        self.paused.load(Ordering::Relaxed)
    }

    /// A reply that is not an error came: the server is reached.
    #[inline]
    pub(crate) fn answered(&self) {
        if self.in_a_row.load(Ordering::Relaxed) != 0 || self.silent.load(Ordering::Relaxed) {
            self.reached();
        }
    }

    #[cold]
    fn reached(&self) {
        let mut state = self.state();
        self.in_a_row.store(0, Ordering::Relaxed);
        self.paused.store(false, Ordering::Relaxed);
        self.silent.store(false, Ordering::Relaxed);
        *state = State::default();
    }

    /// An error reply came: the connection works, and the calls go on to the server;
    /// the next failure in a row pauses twice as long as the last pause did.
    #[inline]
    pub(crate) fn answered_with_error(&self) {
        if self.paused.load(Ordering::Relaxed) || self.silent.load(Ordering::Relaxed) {
            // Each flag with its field under the lock: a failure between them would
            // leave a pause that no call looks at.
            let mut state = self.state();
            state.pause = None;
            state.silent_since = None;
            self.paused.store(false, Ordering::Relaxed);
            self.silent.store(false, Ordering::Relaxed);
        }
    }

    /// A command sent after `before` failures in a row timed out `after` it was
    /// sent; whether the server has been silent since: nothing came back for at least
    /// `after` since an earlier command timed out. While the connecting is paused, the
    /// try answered nothing, and that is a failure (the pause doubles), rather than a
    /// try every pause each leaving a connection open. Otherwise a timeout in such a
    /// silence is a failure when `silence_fails`: with calls in a row, the third
    /// timeout pauses. Calls cut by one slow answer shorter than two timeouts, however
    /// many, are not (they time out together). Two timeouts far apart with no reply
    /// between them are a silence too: nothing came back.
    #[cold]
    pub(crate) fn timed_out(&self, before: u32, after: Duration, silence_fails: bool) -> bool {
        // The check and the failure under one lock: a reply between them would
        // otherwise leave a pause after it.
        let mut state = self.state();
        let now = Instant::now();
        self.silent.store(true, Ordering::Relaxed);
        let silent_for = now - *state.silent_since.get_or_insert(now);
        let silent = silent_for >= after;
        if self.paused() {
            let cause = format!("a connection made again answered nothing within {after:?}");
            self.fail(&mut state, before, Failure::Unreachable, &cause);
        } else if silent && silence_fails {
            // (in whole milliseconds: the cause is read by people)
            let millis = u64::try_from(silent_for.as_millis()).unwrap_or(u64::MAX);
            let cause = format!(
                "nothing came back from the server in the {:?} after a command timed out",
                Duration::from_millis(millis)
            );
            self.fail(&mut state, before, Failure::Unreachable, &cause);
        }
        silent
    }

    /// A command sent after `before` failures in a row failed to reach the server
    /// (`failure`, for `cause`). Sent after one, it was on the connection that failure
    /// had made: that one failed too, and the connecting pauses.
    #[cold]
    pub(crate) fn failed(&self, before: u32, failure: Failure, cause: &str) {
        self.fail(&mut self.state(), before, failure, cause);
    }

    /// [`failed`](Reconnects::failed), its state locked.
    fn fail(&self, state: &mut State, before: u32, failure: Failure, cause: &str) {
        self.in_a_row.fetch_add(1, Ordering::Relaxed);
        if before == 0 {
            return;
        }
        let length = match (&state.pause, state.last) {
            // Sent before the pause began (calls failing together): one failure.
            (Some(pause), _) if !pause.tried => return,
            (_, None) => FIRST_PAUSE,
            (_, Some(last)) => (last * 2).min(LONGEST_PAUSE),
        };
        state.last = Some(length);
        state.pause = Some(Pause {
            until: Instant::now() + length,
            length,
            tried: false,
            failure,
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
        reconnects.failed(0, Failure::Unreachable, "refused");
        assert_eq!(reconnects.before(), Ok((1, false)));
        // The new connection failed too: paused.
        reconnects.failed(1, Failure::Unreachable, "refused");
        let (failure, err) = reconnects.before().unwrap_err();
        assert_eq!(failure, Failure::Unreachable);
        assert!(
            err.starts_with("refused; no connection is tried for 100ms"),
            "{err}"
        );
        // The pause over, one call tries; failing, the pause doubles.
        std::thread::sleep(FIRST_PAUSE);
        assert_eq!(reconnects.before(), Ok((2, true)));
        assert!(reconnects.before().is_err(), "one call tries, the others wait");
        reconnects.failed(2, Failure::Unreachable, "refused");
        assert!(reconnects.before().unwrap_err().1.contains("for 200ms"));
        // A reply ends it.
        reconnects.answered();
        assert_eq!(reconnects.before(), Ok((0, false)));
    }

    #[test]
    fn a_try_that_times_out_doubles_the_pause() {
        let reconnects = Reconnects::default();
        // One timeout outside a pause is not a failure to connect.
        reconnects.timed_out(0, Duration::from_millis(200), true);
        assert_eq!(reconnects.before(), Ok((0, false)));
        reconnects.failed(0, Failure::Unreachable, "reset");
        reconnects.failed(1, Failure::Unreachable, "reset");
        reconnects.state().pause.as_mut().unwrap().until = Instant::now();
        assert_eq!(reconnects.before(), Ok((2, true)));
        reconnects.timed_out(2, Duration::from_millis(200), true);
        let (failure, cause) = reconnects.before().unwrap_err();
        assert_eq!(failure, Failure::Unreachable);
        assert!(
            cause.starts_with(
                "a connection made again answered nothing within 200ms; no connection is tried for 200ms"
            ),
            "{cause}"
        );
    }

    #[test]
    fn timeouts_in_a_silence_are_failures_and_a_reply_ends_the_silence() {
        let timeout = Duration::from_millis(200);
        let reconnects = Reconnects::default();
        // Calls cut by one slow answer: all time out together, none a failure.
        for _ in 0..16 {
            assert!(!reconnects.timed_out(0, timeout, true));
        }
        assert_eq!(reconnects.before(), Ok((0, false)));
        // Nothing back for a timeout since: a failure; the next, on a command sent
        // after it, pauses.
        reconnects.state().silent_since = Some(Instant::now() - timeout);
        assert!(reconnects.timed_out(0, timeout, true));
        assert_eq!(reconnects.before(), Ok((1, false)));
        assert!(reconnects.timed_out(1, timeout, true));
        let (failure, cause) = reconnects.before().unwrap_err();
        assert_eq!(failure, Failure::Unreachable);
        assert!(
            cause.starts_with("nothing came back from the server in the 2")
                && cause.ends_with(
                    "ms after a command timed out; no connection is tried for 100ms after a failed one"
                ),
            "{cause}"
        );
        assert!(reconnects.pausing());
        // A reply ends the pause and the silence: one timeout after it is none.
        reconnects.answered();
        assert!(!reconnects.timed_out(0, timeout, true));
        assert_eq!(reconnects.before(), Ok((0, false)));
        // An error reply ends the silence too.
        reconnects.state().silent_since = Some(Instant::now() - timeout);
        reconnects.answered_with_error();
        assert!(!reconnects.timed_out(0, timeout, true));
        assert_eq!(reconnects.before(), Ok((0, false)));
    }

    #[test]
    fn a_silence_that_does_not_fail_is_told_but_pauses_nothing() {
        // (a cluster's shared pace while some node answers)
        let timeout = Duration::from_millis(200);
        let reconnects = Reconnects::default();
        reconnects.timed_out(0, timeout, false);
        reconnects.state().silent_since = Some(Instant::now() - timeout);
        for before in 0..4 {
            assert!(reconnects.timed_out(before, timeout, false), "silent");
        }
        assert_eq!(reconnects.before(), Ok((0, false)), "no failure counted");
        // Once it counts, the silence kept so far counts too.
        assert!(reconnects.timed_out(0, timeout, true));
        assert_eq!(reconnects.before(), Ok((1, false)));
    }

    #[test]
    fn a_pause_over_that_no_call_tried_is_not_under_way() {
        let reconnects = Reconnects::default();
        reconnects.failed(0, Failure::Unreachable, "reset");
        reconnects.failed(1, Failure::Unreachable, "reset");
        assert!(reconnects.paused() && reconnects.pausing());
        reconnects.state().pause.as_mut().unwrap().until = Instant::now();
        assert!(reconnects.paused() && !reconnects.pausing());
    }

    #[test]
    fn calls_refused_in_a_row_pause_and_say_so() {
        let reconnects = Reconnects::default();
        reconnects.failed(0, Failure::Refusing, "BUSY Redis is busy running a script");
        assert_eq!(reconnects.before(), Ok((1, false)), "one refusal pauses nothing");
        reconnects.failed(1, Failure::Refusing, "BUSY Redis is busy running a script");
        let (failure, cause) = reconnects.before().unwrap_err();
        assert_eq!(failure, Failure::Refusing);
        assert_eq!(
            cause,
            "BUSY Redis is busy running a script; no call is sent for 100ms after calls in a row were refused"
        );
        reconnects.answered();
        assert_eq!(reconnects.before(), Ok((0, false)));
    }

    #[test]
    fn calls_failing_together_are_one_failure() {
        let reconnects = Reconnects::default();
        reconnects.failed(0, Failure::Unreachable, "reset");
        for _ in 0..10 {
            reconnects.failed(1, Failure::Unreachable, "reset");
        }
        assert!(reconnects.before().unwrap_err().1.contains("for 100ms"));
    }

    #[test]
    fn the_pause_stops_doubling_at_the_longest() {
        let reconnects = Reconnects::default();
        reconnects.failed(0, Failure::Unreachable, "reset");
        reconnects.failed(1, Failure::Unreachable, "reset");
        for before in 2..10 {
            reconnects.state().pause.as_mut().unwrap().until = Instant::now();
            assert!(reconnects.before().is_ok(), "the pause is over: one call tries");
            reconnects.failed(before, Failure::Unreachable, "reset");
        }
        assert!(reconnects.before().unwrap_err().1.contains("for 1s"));
    }

    #[test]
    fn an_error_reply_lets_calls_go_on_and_the_next_pause_is_longer() {
        let reconnects = Reconnects::default();
        reconnects.failed(0, Failure::Credentials, "refused the password");
        reconnects.failed(1, Failure::Credentials, "refused the password");
        let (failure, _) = reconnects.before().unwrap_err();
        assert_eq!(failure, Failure::Credentials, "a pause says what failed");
        // An error reply (a server answering, then closing): calls go on...
        reconnects.answered_with_error();
        assert_eq!(reconnects.before(), Ok((2, false)));
        // ...and the failure after it pauses twice as long as the last pause.
        reconnects.failed(2, Failure::Unreachable, "reset");
        assert!(reconnects.before().unwrap_err().1.contains("for 200ms"));
        // A reply that is not an error forgets it all.
        reconnects.answered();
        reconnects.failed(0, Failure::Unreachable, "reset");
        reconnects.failed(1, Failure::Unreachable, "reset");
        assert!(reconnects.before().unwrap_err().1.contains("for 100ms"));
    }
}
