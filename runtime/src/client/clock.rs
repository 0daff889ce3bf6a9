//! Where the limiter's `now` comes from.
//!
//! Like Redisson, every decision is made at the caller's wall-clock time in epoch
//! milliseconds: it is the score of each grant in the permits log. Tests inject a
//! [`ManualClock`] to make every decision deterministic.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in epoch milliseconds.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system clock (what Redisson uses: `System.currentTimeMillis()`).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() * 1000 + u64::from(d.subsec_millis()))
    }
}

/// A clock that moves only when told to; clones share the same time.
///
/// ```
/// use redlimit_runtime::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new(1_000);
/// clock.advance(Duration::from_millis(250));
/// assert_eq!(clock.now_ms(), 1_250);
/// ```
#[derive(Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock that reads `epoch_ms` until moved.
    pub fn new(epoch_ms: u64) -> Self {
        ManualClock {
            now: Arc::new(AtomicU64::new(epoch_ms)),
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }

    /// Sets the clock to `epoch_ms` (it may move backwards, as real clocks do).
    pub fn set(&self, epoch_ms: u64) {
        self.now.store(epoch_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ManualClock").field(&self.now_ms()).finish()
    }
}
