//! Settled rules at the layer: a request's permits reserved as an estimate before the
//! inner service runs, then settled with what the response says it used: a header
//! the handler sets ([`Settle::header`]), or a [`Usage`] the handler records while its
//! body streams ([`Settle::usage`]), settled when the last handle to it is dropped
//! (the body ended, or the client went away mid-stream).
//!
//! The layer holds a request's reservation ([`Held`]) until the response's head is
//! back. When every amount is known by then (a header, or a `Usage` no longer held
//! anywhere else), the settle is made before the head goes out, and the RateLimit
//! fields say what is left after it; otherwise the last `Usage` dropped settles, in
//! the background, and the fields are the grant's.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use http::HeaderName;
use redlimit_runtime::engine::{Granted, Pending};
use redlimit_runtime::RateLimited;

use super::per_request::Keys;
use super::shared::{KeyHeader, Shared};

/// Where a settled rule's actual amount comes from ([`LayerRule::settle`](super::LayerRule::settle)).
#[derive(Clone, Debug)]
pub struct Settle(From);

#[derive(Clone, Debug)]
enum From {
    Header(String),
    Usage,
}

impl Settle {
    /// A response header the handler sets, a decimal amount (`x-tokens-used: 1234`),
    /// read when the response's head is back, before it goes out; the header is left
    /// on the response. A response without it, or with a value that is not a
    /// decimal number, keeps the estimate counted (a warning is logged); a number
    /// past `u64` counts as `u64::MAX`. A line is a comma-separated list, as HTTP
    /// reads a field sent more than once, and a word that is one number in groups
    /// (`1,000`, `1,00,000`), or holds several side by side (`1,000,2,000`), also
    /// reads as each; the largest reading counts, and
    /// never less than the estimate when a value is not a decimal number.
    pub fn header(name: &str) -> Settle {
        Settle(From::Header(name.to_owned()))
    }

    /// The [`Usage`] the layer puts in the request's extensions, which the handler
    /// records into as it goes (an LLM's tokens as its answer streams). The rule is
    /// settled with what was recorded when the last handle to it is dropped: when a
    /// streamed body that holds it ends, or the client disconnects and the server
    /// drops the body. A `Usage` never recorded into keeps the estimate counted.
    pub fn usage() -> Settle {
        Settle(From::Usage)
    }

    /// The header's name, for a header's settle.
    pub(super) fn header_name(&self) -> Option<&str> {
        match &self.0 {
            From::Header(name) => Some(name),
            From::Usage => None,
        }
    }

    /// As the layer reads it: the header's name parsed (checked when the layer is built).
    pub(super) fn source(&self) -> Option<Source> {
        Some(match &self.0 {
            From::Header(name) => {
                Source::Header(KeyHeader::new(HeaderName::from_bytes(name.as_bytes()).ok()?))
            }
            From::Usage => Source::Usage,
        })
    }
}

/// A settled rule's source, as the layer reads it.
pub(super) enum Source {
    Header(KeyHeader),
    Usage,
}

/// What a request used, recorded by its handler for the rules settled by
/// [`Settle::usage`]: the layer puts one in the request's extensions (axum:
/// `Extension<Usage>`; actix-web: `ReqData<Usage>`). Cheap to clone; move a clone
/// into the body's stream, and record as it goes. The rules are settled with what
/// was recorded when the last clone is dropped.
///
/// Under two layers that settle by usage, what is recorded goes to both.
#[derive(Clone)]
pub struct Usage {
    inner: Arc<Recorded>,
}

struct Recorded {
    amount: AtomicU64,
    recorded: AtomicBool,
    /// An outer layer's `Usage`, which every amount is recorded into too.
    outer: Option<Usage>,
    /// The reservation to settle when the last handle goes.
    settling: Mutex<Option<Settling>>,
}

impl Usage {
    /// Adds `amount` to what the request used (saturating at `u64::MAX`).
    pub fn add(&self, amount: u64) {
        let add = |used: u64| Some(used.saturating_add(amount));
        let _ = self
            .inner
            .amount
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, add);
        self.inner.recorded.store(true, Ordering::Relaxed);
        if let Some(outer) = &self.inner.outer {
            outer.add(amount);
        }
    }

    /// Sets what the request used to `amount` (the total a model reported, say).
    pub fn set(&self, amount: u64) {
        self.inner.amount.store(amount, Ordering::Relaxed);
        self.inner.recorded.store(true, Ordering::Relaxed);
        if let Some(outer) = &self.inner.outer {
            outer.set(amount);
        }
    }

    /// What was recorded so far; `None` when nothing was.
    pub fn get(&self) -> Option<u64> {
        self.inner.recorded()
    }
}

impl fmt::Debug for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Usage").field("recorded", &self.get()).finish()
    }
}

impl Recorded {
    fn recorded(&self) -> Option<u64> {
        self.recorded
            .load(Ordering::Relaxed)
            .then(|| self.amount.load(Ordering::Relaxed))
    }
}

impl Drop for Recorded {
    /// The last handle gone: the request's rules settled with what was recorded.
    fn drop(&mut self) {
        let settling = self
            .settling
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(settling) = settling {
            settling.in_background(self.recorded());
        }
    }
}

/// A request's reservation, and what the response has said of it so far.
pub(crate) struct Settling {
    shared: Arc<Shared>,
    pending: Pending,
    /// Each rule's estimate (0: the rule did not apply).
    estimates: Vec<u64>,
    /// Each rule's amount from its header, once the head is back.
    headers: Vec<Option<u64>>,
}

impl Settling {
    /// Each rule's actual amount: its header's or what was `recorded`, else its
    /// estimate; `None` when no amount is known (every estimate stays counted).
    fn actual(&self, recorded: Option<u64>) -> Option<Vec<u64>> {
        let mut known = false;
        let actual = (self.shared.rules.iter().enumerate())
            .map(|(i, rule)| {
                let amount = match &rule.settle {
                    Some(Source::Header(_)) => self.headers[i],
                    Some(Source::Usage) => recorded,
                    None => None,
                };
                known |= amount.is_some() && self.estimates[i] > 0;
                amount.unwrap_or(self.estimates[i])
            })
            .collect();
        known.then_some(actual)
    }

    /// Settles with what is known: the grant after the settle, or the grant's own
    /// when nothing was settled or the settle failed.
    async fn settle(self, recorded: Option<u64>) -> Granted {
        let granted = self.pending.granted();
        match self.actual(recorded) {
            Some(actual) => (self.pending.settle(&self.shared.engine, &actual).await).unwrap_or(granted),
            None => granted,
        }
    }

    /// Settles with no caller to answer, on the layer's own background thread: not on
    /// the runtime where the last handle went, which may be ending (a handler's own,
    /// a server's shutting down, dropping a task it was given unstarted) or run
    /// without a timer (a settle in Redis times its wait), and not in the drop
    /// itself, which would wait or panic there.
    fn in_background(self, recorded: Option<u64>) {
        background(Box::pin(async move {
            self.settle(recorded).await;
        }));
    }

    /// Reads each header-settled rule's amount with `values` (a header's values).
    fn read_headers<'a, I>(&mut self, values: impl Fn(&KeyHeader) -> I)
    where
        I: Iterator<Item = &'a [u8]>,
    {
        for (i, rule) in self.shared.rules.iter().enumerate() {
            if let (Some(Source::Header(name)), true) = (&rule.settle, self.estimates[i] > 0) {
                let reported = Reported::read(values(name));
                self.headers[i] = reported.amount(self.estimates[i]);
                if self.headers[i].is_none() || reported.unreadable {
                    warn_no_amount(&rule.name, name);
                }
            }
        }
    }
}

type Task = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// The most settles of dropped `Usage`s the layer's thread runs at once; the rest wait
/// their turn, not yet started. Settles are no caller's answer, and thousands dropped
/// at once (a server's streams ending as it shuts down) would otherwise all be sent at
/// once, queueing the client's other commands behind them past their timeout.
const MOST_SETTLES_AT_ONCE: usize = 256;

/// Runs each task `queued` receives, at most `most` at once, in the order received.
async fn run_queued(mut queued: tokio::sync::mpsc::UnboundedReceiver<Task>, most: usize) {
    let turns = Arc::new(tokio::sync::Semaphore::new(most));
    while let Some(task) = queued.recv().await {
        let Ok(turn) = turns.clone().acquire_owned().await else {
            return;
        };
        tokio::spawn(async move {
            task.await;
            drop(turn);
        });
    }
}

/// Runs `task` on one thread kept for the settles of `Usage`s dropped: a runtime of its
/// own that lives as long as the process, so that a settle it retries in the
/// background is not cut short; at most [`MOST_SETTLES_AT_ONCE`] at once.
fn background(task: Task) {
    static TASKS: std::sync::OnceLock<Option<tokio::sync::mpsc::UnboundedSender<Task>>> =
        std::sync::OnceLock::new();
    let tasks = TASKS.get_or_init(|| {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Task>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        let thread = std::thread::Builder::new().name("redlimit-settle".into());
        let spawned = thread.spawn(move || runtime.block_on(run_queued(rx, MOST_SETTLES_AT_ONCE)));
        spawned.ok().map(|_| tx)
    });
    // Without a thread the settle is dropped: its reservation keeps its estimates.
    if let Some(tasks) = tasks {
        let _ = tasks.send(task);
    }
}

/// Logs a response without its settle header's amount: at most once per 10 s per
/// process, so that a handler that never sets it does not flood the log.
fn warn_no_amount(rule: &str, header: &HeaderName) {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::UNIX_EPOCH.elapsed().map_or(0, |since| since.as_secs());
    if due(&LAST, now) {
        tracing::warn!(
            rule,
            header = %header,
            "redlimit: a settled response's settle header has no decimal amount, or a \
             value that is not one; the request's estimate stays counted, at the least"
        );
    }
}

/// Whether a throttled log last written at `last` (epoch s, 0: never) is due at `now`,
/// and if so, `now` is its time.
fn due(last: &AtomicU64, now: u64) -> bool {
    let then = last.load(Ordering::Relaxed);
    (then == 0 || now >= then + 10)
        && last
            .compare_exchange(then, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

/// What a settle header says: the largest decimal amount among its values (a value
/// past `u64` is `u64::MAX`), each line read as the comma-separated list HTTP makes
/// of a field sent more than once (`0, 500` is two values; empty elements are none),
/// and each number in groups within a word of it (`1,000`, `1,00,000`, each of
/// `1,000,2,000`) also as that number: the largest reading counts, so that a report is never read as less
/// than it may mean; and whether any element is not a decimal amount.
#[derive(Debug, Default, PartialEq)]
struct Reported {
    largest: Option<u64>,
    unreadable: bool,
}

impl Reported {
    fn read<'a>(lines: impl Iterator<Item = &'a [u8]>) -> Reported {
        let mut reported = Reported::default();
        for line in lines {
            for word in line.split(u8::is_ascii_whitespace) {
                in_groups(word, |number| reported.note(number));
            }
            for element in line.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                match element.iter().all(u8::is_ascii_digit) {
                    _ if element.is_empty() => {}
                    true => reported.note(decimal(element.iter())),
                    false => reported.unreadable = true,
                }
            }
        }
        reported
    }

    fn note(&mut self, value: u64) {
        self.largest = self.largest.max(Some(value));
    }

    /// The amount to settle a grant of `estimate` at: `None` (the estimate stays
    /// counted) when no element is a decimal amount. Beside one that is not, an
    /// amount below the estimate is not believed: the handler's report is garbled,
    /// and a garbled report never counts less than was reserved.
    fn amount(&self, estimate: u64) -> Option<u64> {
        match self.unreadable {
            true => self.largest.map(|largest| largest.max(estimate)),
            false => self.largest,
        }
    }
}

/// `digits` as a decimal number (past `u64`: `u64::MAX`).
fn decimal<'a>(digits: impl Iterator<Item = &'a u8>) -> u64 {
    digits.fold(0u64, |n, d| {
        n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    })
}

/// Each number written in groups within `word` (its elements between commas): one
/// to three digits, then groups of two or three (`1,000`, `1,00,000`), each as long
/// as it runs. A run ends at an element that is not a group (`500,0` is a list), and
/// a one-digit element starts the next, so `1,000,2,000` holds `1,000` and `2,000`.
/// The longest reading from a start is the largest, so only it is told: one pass.
fn in_groups(word: &[u8], mut number: impl FnMut(u64)) {
    // the run going on: its value, and whether a group followed its first element
    let mut run: Option<(u64, bool)> = None;
    for element in word.split(|&b| b == b',') {
        let digits = !element.is_empty() && element.iter().all(u8::is_ascii_digit);
        let extends = digits && (2..=3).contains(&element.len());
        match run {
            Some((value, _)) if extends => {
                run = Some((
                    value
                        .saturating_mul(10u64.pow(element.len() as u32))
                        .saturating_add(decimal(element.iter())),
                    true,
                ));
            }
            _ => {
                if let Some((value, true)) = run {
                    number(value);
                }
                run = (digits && element.len() <= 3).then(|| (decimal(element.iter()), false));
            }
        }
    }
    if let Some((value, true)) = run {
        number(value);
    }
}

/// What the layer holds while the inner service runs: the reservation, or the
/// `Usage` that holds it.
pub(crate) enum Held {
    Headers(Settling),
    Usage(Usage),
}

impl Held {
    /// The `Usage` to put in the request's extensions, if the rules record one.
    pub(crate) fn usage(&self) -> Option<Usage> {
        match self {
            Held::Usage(usage) => Some(usage.clone()),
            Held::Headers(_) => None,
        }
    }

    /// The response's head is back: each header-settled rule's amount read with
    /// `values` (a header's values).
    pub(crate) fn read_head<'a, I>(&mut self, values: impl Fn(&KeyHeader) -> I)
    where
        I: Iterator<Item = &'a [u8]>,
    {
        match self {
            Held::Headers(settling) => settling.read_headers(values),
            Held::Usage(usage) => {
                let mut settling = usage
                    .inner
                    .settling
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if let Some(settling) = settling.as_mut() {
                    settling.read_headers(values);
                }
            }
        }
    }

    /// After [`read_head`](Held::read_head): the rules settled when every amount is
    /// known (no other handle to the `Usage` is left); answers the grant the
    /// response's fields are about, after the settle when there was one.
    pub(crate) async fn finish(self) -> Granted {
        match self {
            Held::Headers(settling) => settling.settle(None).await,
            // The last handle: settled here, before the head goes out.
            Held::Usage(usage) => match Arc::try_unwrap(usage.inner) {
                Ok(mut recorded) => {
                    let settling = recorded
                        .settling
                        .get_mut()
                        .unwrap_or_else(PoisonError::into_inner)
                        .take();
                    let used = recorded.recorded();
                    drop(recorded);
                    match settling {
                        Some(settling) => settling.settle(used).await,
                        None => Granted::default(),
                    }
                }
                Err(shared) => {
                    let settling = shared.settling.lock().unwrap_or_else(PoisonError::into_inner);
                    settling.as_ref().map(|s| s.pending.granted()).unwrap_or_default()
                }
            },
        }
    }
}

impl Shared {
    /// Reserves a request's rules, as [`decide_keys`](Shared::decide_keys) decides
    /// them; `outer`: an outer layer's `Usage` on the request.
    pub(crate) async fn reserve_keys(
        self: &Arc<Self>,
        (mut keys, permits): Keys,
        outer: Option<Usage>,
    ) -> Result<Held, RateLimited> {
        let pending = (self.engine)
            .reserve_request(self.client.as_ref(), &mut keys, &permits)
            .await?;
        let settling = Settling {
            shared: self.clone(),
            pending,
            headers: vec![None; permits.len()],
            estimates: permits,
        };
        if !self.records_usage {
            return Ok(Held::Headers(settling));
        }
        Ok(Held::Usage(Usage {
            inner: Arc::new(Recorded {
                amount: AtomicU64::new(0),
                recorded: AtomicBool::new(false),
                outer,
                settling: Mutex::new(Some(settling)),
            }),
        }))
    }
}

#[cfg(test)]
mod tests;
