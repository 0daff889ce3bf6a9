//! The engine's log lines, throttled per function: a backend failure at most once per
//! period (with how many were left out), one line when the backend recovers, a
//! shadow rule's refusal and a failed settle at most once per period.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::Error;

/// Backend failures of one function are logged at most this often.
pub(super) const LOG_EVERY_MS: u64 = 10_000;

/// Failures of one function: when one was last logged, how many were left out since,
/// and the outage they make up.
#[derive(Debug)]
pub(super) struct FailureLog {
    last_log_ms: AtomicU64,
    suppressed: AtomicU64,
    /// Failed calls since the last success, and when the first of them failed.
    failing: AtomicU64,
    failing_since_ms: AtomicU64,
}

impl FailureLog {
    pub(super) const fn new() -> Self {
        FailureLog {
            last_log_ms: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
            failing: AtomicU64::new(0),
            failing_since_ms: AtomicU64::new(0),
        }
    }

    /// Notes a failure of `function`'s call; logs it when a period has passed.
    pub(super) fn failed(&self, function: &'static str, error: &Error) {
        let now = epoch_ms();
        if self.failing.fetch_add(1, Ordering::Relaxed) == 0 {
            self.failing_since_ms.store(now, Ordering::Relaxed);
        }
        if !take_period(&self.last_log_ms, now) {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let suppressed = self.suppressed.swap(0, Ordering::Relaxed);
        if error.is_backend_failure() {
            tracing::error!(
                function,
                suppressed,
                "rate limiter backend failed, applying on_error: {error}"
            );
        } else if matches!(error, Error::MemoryFull { .. }) {
            tracing::error!(function, suppressed, "refusing the call: {error}");
        } else {
            tracing::error!(
                function,
                suppressed,
                "rate limiter misconfigured, refusing the call: {error}"
            );
        }
    }

    /// After failures, the first decision the backend makes again ends the outage in
    /// the log: one line, with how many calls failed over how long.
    #[inline]
    pub(super) fn succeeded(&self, function: &'static str) {
        if self.failing.load(Ordering::Relaxed) != 0 {
            self.recovered(function);
        }
    }

    #[cold]
    #[inline(never)]
    fn recovered(&self, function: &'static str) {
        let failed = self.failing.swap(0, Ordering::Relaxed);
        if failed > 0 {
            let since = self.failing_since_ms.load(Ordering::Relaxed);
            let over = Duration::from_millis(epoch_ms().saturating_sub(since));
            tracing::warn!(
                function,
                failed_calls = failed,
                "rate limiter backend recovered after {failed} failed calls over {over:?}"
            );
        }
    }
}

/// A shadow rule's refusals of one function: when one was last logged, and how many
/// were left out since.
#[derive(Debug)]
pub(super) struct ShadowLog {
    logged_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl ShadowLog {
    pub(super) const fn new() -> Self {
        ShadowLog {
            logged_ms: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Notes that shadow rule `rule` would have refused; logs it when a period passed.
    pub(super) fn refused(&self, function: &'static str, rule: &str, retry_after: Option<Duration>) {
        if !take_period(&self.logged_ms, epoch_ms()) {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let suppressed = self.suppressed.swap(0, Ordering::Relaxed);
        tracing::warn!(
            function,
            rule,
            retry_after_ms = retry_after.map_or(0, |d| d.as_millis() as u64),
            suppressed,
            "shadow rate limit would have refused this call; it was let through"
        );
    }
}

/// Settles of one function's reservations the backend did not take (each sent again
/// in the background): logged at most once per period, with how many were left out.
#[derive(Debug)]
pub(super) struct SettleLog {
    logged_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl SettleLog {
    pub(super) const fn new() -> Self {
        SettleLog {
            logged_ms: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Notes a settle of `function`'s call that failed with `error`.
    pub(super) fn failed(&self, function: &'static str, error: &Error) {
        if !take_period(&self.logged_ms, epoch_ms()) {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let suppressed = self.suppressed.swap(0, Ordering::Relaxed);
        tracing::warn!(
            function,
            suppressed,
            "a call's settle failed ({error}); it is sent again in the background"
        );
    }
}

/// Whether this caller may log now: a period has passed since `last`, and no other
/// caller took it first.
fn take_period(last: &AtomicU64, now: u64) -> bool {
    let seen = last.load(Ordering::Relaxed);
    now.saturating_sub(seen) >= LOG_EVERY_MS
        && last
            .compare_exchange(seen, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::CountEvents;

    fn timeout() -> Error {
        Error::Timeout {
            after: Duration::from_millis(1),
            connecting: false,
        }
    }

    #[test]
    fn an_outage_is_logged_once_per_period_not_per_call() {
        let log = FailureLog::new();
        let errors = CountEvents::new(tracing::Level::ERROR);
        let count = errors.counter();
        let _guard = tracing::subscriber::set_default(errors);
        for _ in 0..1000 {
            log.failed("tests::f", &timeout());
        }
        assert_eq!(count.load(Ordering::SeqCst), 1);
        assert_eq!(log.suppressed.load(Ordering::SeqCst), 999);
        // The next period's log reports what was left out, and starts counting again.
        log.last_log_ms.store(0, Ordering::SeqCst);
        log.failed("tests::f", &timeout());
        assert_eq!(count.load(Ordering::SeqCst), 2);
        assert_eq!(log.suppressed.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn the_end_of_an_outage_is_logged_once() {
        let log = FailureLog::new();
        let warnings = CountEvents::new(tracing::Level::WARN);
        let count = warnings.counter();
        let _guard = tracing::subscriber::set_default(warnings);
        log.succeeded("tests::g");
        assert_eq!(count.load(Ordering::SeqCst), 0, "no outage, nothing to report");
        for _ in 0..5 {
            log.failed("tests::g", &timeout());
        }
        assert_eq!(
            count.load(Ordering::SeqCst),
            0,
            "failures are errors, not warnings"
        );
        log.succeeded("tests::g");
        assert_eq!(count.load(Ordering::SeqCst), 1, "one line for the recovery");
        assert_eq!(log.failing.load(Ordering::SeqCst), 0);
        log.succeeded("tests::g");
        assert_eq!(count.load(Ordering::SeqCst), 1, "and only one");
    }
}
