//! Helpers for this crate's unit tests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// A tracing subscriber that counts the events of one level; nothing else.
#[derive(Clone)]
pub struct CountEvents {
    level: Level,
    count: Arc<AtomicUsize>,
}

impl CountEvents {
    pub fn new(level: Level) -> Self {
        CountEvents {
            level,
            count: Arc::default(),
        }
    }

    /// A handle on the count that outlives the subscriber's installation.
    pub fn counter(&self) -> Arc<AtomicUsize> {
        self.count.clone()
    }
}

impl Subscriber for CountEvents {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= self.level
    }
    /// Its level, the most verbose it takes: the process's most verbose level while it
    /// is installed. (With none given, tracing takes every level as wanted, and code
    /// that asks `level_enabled!(DEBUG)` on another thread, as an engine's decision
    /// does, would take another path while it is installed.)
    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::from_level(self.level))
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        if *event.metadata().level() == self.level {
            self.count.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// Numbers below a bound from a xorshift generator started at `seed` (nonzero): the
/// random tests' draws, the same on every run.
pub(crate) fn draws(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |below| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    }
}
