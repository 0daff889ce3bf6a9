//! Helpers for this crate's unit tests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

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
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
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
