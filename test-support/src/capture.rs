//! A tracing subscriber that keeps every event's and span's text (message and fields),
//! for tests that search all output of failing calls for a secret, or check the spans
//! and fields a decision reports. It tracks the entered spans, so `Span::current()`
//! works under it.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};
use tracing_core::span::Current;

#[derive(Clone, Debug, Default)]
pub struct Capture {
    lines: Arc<Mutex<Vec<String>>>,
    next_id: Arc<AtomicU64>,
    /// Each span's metadata, by id - 1.
    spans: Arc<Mutex<Vec<&'static Metadata<'static>>>>,
    /// The entered spans, innermost last (tests run their futures on one thread).
    entered: Arc<Mutex<Vec<Id>>>,
}

impl Capture {
    /// Every event so far, one line each.
    pub fn text(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }
}

struct Line<'a>(&'a mut String);

impl Visit for Line<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst) + 1;
        let mut line = format!("span {} #{id}", span.metadata().name());
        span.record(&mut Line(&mut line));
        self.lines.lock().unwrap().push(line);
        self.spans.lock().unwrap().push(span.metadata());
        Id::from_u64(id)
    }
    fn record(&self, id: &Id, values: &Record<'_>) {
        let mut line = format!("record #{}", id.into_u64());
        values.record(&mut Line(&mut line));
        self.lines.lock().unwrap().push(line);
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut line = event.metadata().level().to_string();
        event.record(&mut Line(&mut line));
        self.lines.lock().unwrap().push(line);
    }
    fn enter(&self, id: &Id) {
        self.entered.lock().unwrap().push(id.clone());
    }
    fn exit(&self, id: &Id) {
        let mut entered = self.entered.lock().unwrap();
        if let Some(at) = entered.iter().rposition(|e| e == id) {
            entered.remove(at);
        }
    }
    fn current_span(&self) -> Current {
        let entered = self.entered.lock().unwrap();
        match entered.last() {
            Some(id) => {
                let metadata = self.spans.lock().unwrap()[id.into_u64() as usize - 1];
                Current::new(id.clone(), metadata)
            }
            None => Current::none(),
        }
    }
}
