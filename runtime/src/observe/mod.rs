//! What redlimit reports about itself: metrics through the `metrics` facade (cargo
//! feature `metrics`; nothing is recorded until the application installs a recorder)
//! and spans through `tracing`.
//!
//! Metric handles are registered with the recorder on first use and kept, so a
//! recorder must be installed before the first decision (as exporters' set-up does,
//! at the start of `main`); what is decided before it is not recorded.
//!
//! Metrics (every label is bounded: a rule is named by its key template or its
//! function's path, never by an interpolated key):
//! - `redlimit_decisions_total{rule, outcome}`: per rule of a call (attribute or
//!   layer). `allowed`: the call went on with the rule applied. `limited`: the rule
//!   refused it. `shadow_limited`: a shadow rule would have refused. On a backend
//!   failure each applied rule counts its `on_error`: `error_allowed`, `error_denied`,
//!   `error_local` (decided in process). A call refused for misconfiguration counts
//!   `error_denied`.
//! - `redlimit_backend_seconds{backend, operation}`: histogram of every operation on
//!   Redis (`backend` is `redis`; `operation` is `acquire`, `try_set_rate`,
//!   `configure`, `release`, `config`, `keep_alive`, `expire`, `delete`, `is_exists`
//!   or `settle`), failed ones included. The in-process backend has no round trip and is not
//!   timed.
//! - `redlimit_wait_seconds`: histogram of the time calls slept waiting for permits.
//! - `redlimit_refunds_total`: refunds a cluster call made (one per slot whose grants
//!   it gave back after a later slot refused or failed).
//! - `redlimit_config_changes_total`: stored configs a rule overwrote.
//! - `redlimit_memory_full_total`: decisions an in-process backend refused because it
//!   held its maximum of live limiters (`ClientBuilder::max_limiters`) and the call
//!   needed a new one ([`Error::MemoryFull`](crate::Error::MemoryFull)).
//! - `redlimit_memory_evicted_total`: limiters an in-process backend let go at that
//!   bound to make room for a new one, keeping their traces in its summary (a key
//!   made again from its traces counts at least what it had counted).
//! - `redlimit_memory_limiters`: gauge of the limiters the in-process backends hold
//!   (live, or expired and kept until the table needs their room), at most the sum of
//!   their `max_limiters`.
//! - Reservations ([`Client::reserve`](crate::Client::reserve)), per settled rule
//!   (`rule` is `by_hand` for a reservation made by hand):
//!   `redlimit_reserved_permits_total{rule}` (the estimates taken),
//!   `redlimit_settled_permits_total{rule}` (the amounts counted once settled),
//!   `redlimit_refunded_permits_total{rule}` (given back: used less than reserved),
//!   `redlimit_overdrawn_permits_total{rule}` (charged beyond the estimate),
//!   `redlimit_uncharged_permits_total{rule}` (used beyond a rule's
//!   `max_overdraft`, not counted), and `redlimit_settles_abandoned_total{rule}`:
//!   settles that never reached the backend before their grants left the window,
//!   each an under-count (or an over-count, for a refund) the operator must see.
//!
//! Spans: `redlimit.decide` (debug) around each call's decision, with `rules`,
//! `backend`, `outcome`, `remaining`, `retry_after_ms` and `waited_ms`; inside it,
//! `redlimit.redis` (debug) around each script call, with OpenTelemetry's database
//! fields `db.system.name = "redis"` and `db.operation.name = "EVALSHA"`. The
//! interpolated keys appear only in a trace-level event.

pub(crate) mod refusal_reports;

use std::time::Duration;

/// What one rule of a call is counted as: the `outcome` label of
/// `redlimit_decisions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counted {
    Allowed,
    Limited,
    ShadowLimited,
    ErrorAllowed,
    ErrorDenied,
    ErrorLocal,
}

impl Counted {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn label(self) -> &'static str {
        match self {
            Counted::Allowed => "allowed",
            Counted::Limited => "limited",
            Counted::ShadowLimited => "shadow_limited",
            Counted::ErrorAllowed => "error_allowed",
            Counted::ErrorDenied => "error_denied",
            Counted::ErrorLocal => "error_local",
        }
    }
}

/// Every rule's outcome counters of one engine (a function or a layer), registered with the recorder on
/// its first decision and kept: a decision then costs one atomic increment per
/// rule (with a recorder installed), not a registry lookup.
#[derive(Debug, Default)]
pub(crate) struct RuleCounters {
    #[cfg(feature = "metrics")]
    counters: std::sync::OnceLock<Vec<[metrics::Counter; OUTCOMES]>>,
}

#[cfg(feature = "metrics")]
const OUTCOMES: usize = 6;

impl RuleCounters {
    pub(crate) const fn new() -> Self {
        RuleCounters {
            #[cfg(feature = "metrics")]
            counters: std::sync::OnceLock::new(),
        }
    }

    /// Counts `outcome` for rule `index`; `names` gives every rule's name, asked for
    /// once, when the counters are registered.
    #[inline]
    pub(crate) fn count(
        &self,
        names: impl FnOnce() -> Vec<std::borrow::Cow<'static, str>>,
        index: usize,
        outcome: Counted,
    ) {
        #[cfg(feature = "metrics")]
        {
            let counters = self.counters.get_or_init(|| {
                names()
                    .into_iter()
                    .map(|rule| {
                        [
                            Counted::Allowed,
                            Counted::Limited,
                            Counted::ShadowLimited,
                            Counted::ErrorAllowed,
                            Counted::ErrorDenied,
                            Counted::ErrorLocal,
                        ]
                        .map(|outcome| {
                            metrics::counter!(
                                "redlimit_decisions_total",
                                "rule" => rule.clone(),
                                "outcome" => outcome.label()
                            )
                        })
                    })
                    .collect()
            });
            if let Some(rule) = counters.get(index) {
                rule[outcome as usize].increment(1);
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (names, index, outcome);
    }
}

/// Times one operation on Redis.
pub(crate) async fn redis<T>(operation: Operation, work: impl std::future::Future<Output = T>) -> T {
    #[cfg(feature = "metrics")]
    {
        let started = std::time::Instant::now();
        let result = work.await;
        operation.histogram().record(started.elapsed().as_secs_f64());
        result
    }
    #[cfg(not(feature = "metrics"))]
    {
        let _ = operation;
        work.await
    }
}

/// The operations on Redis, each with its histogram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    Acquire,
    TrySetRate,
    Configure,
    Release,
    Config,
    KeepAlive,
    Expire,
    Delete,
    IsExists,
    Settle,
}

#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
impl Operation {
    const ALL: [Operation; 10] = [
        Operation::Acquire,
        Operation::TrySetRate,
        Operation::Configure,
        Operation::Release,
        Operation::Config,
        Operation::KeepAlive,
        Operation::Expire,
        Operation::Delete,
        Operation::IsExists,
        Operation::Settle,
    ];

    fn label(self) -> &'static str {
        match self {
            Operation::Acquire => "acquire",
            Operation::TrySetRate => "try_set_rate",
            Operation::Configure => "configure",
            Operation::Release => "release",
            Operation::Config => "config",
            Operation::KeepAlive => "keep_alive",
            Operation::Expire => "expire",
            Operation::Delete => "delete",
            Operation::IsExists => "is_exists",
            Operation::Settle => "settle",
        }
    }

    /// The handle of this operation on Redis, registered on first use.
    #[cfg(feature = "metrics")]
    fn histogram(self) -> &'static metrics::Histogram {
        use std::sync::OnceLock;
        type Handles = [metrics::Histogram; 10];
        static REDIS: OnceLock<Handles> = OnceLock::new();
        let handles = REDIS.get_or_init(|| {
            Operation::ALL.map(|operation| {
                metrics::histogram!(
                    "redlimit_backend_seconds",
                    "backend" => "redis",
                    "operation" => operation.label()
                )
            })
        });
        &handles[self as usize]
    }
}

/// Records the time a call slept waiting for permits.
pub(crate) fn waited(slept: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("redlimit_wait_seconds").record(slept.as_secs_f64());
    tracing::Span::current().record("waited_ms", slept.as_millis() as u64);
}

/// Counts one slot's grants given back by a cluster call's compensation (rare: no
/// handle is kept).
pub(crate) fn refunded() {
    #[cfg(feature = "metrics")]
    metrics::counter!("redlimit_refunds_total").increment(1);
}

/// The counters of the reservations and settles of one `rule` label, registered
/// with the recorder on the label's first reservation and kept: a reservation then
/// costs a lookup of its label, not a registration per counter.
#[derive(Debug)]
pub(crate) struct SettleCounters {
    /// The `rule` label: a rule's template, or `by_hand`.
    pub(crate) label: std::borrow::Cow<'static, str>,
    /// Reserved, settled, refunded, overdrawn and uncharged permits.
    #[cfg(feature = "metrics")]
    counters: [metrics::Counter; 5],
}

impl SettleCounters {
    /// Counts the estimate a reservation took.
    pub(crate) fn reserved(&self, permits: u64) {
        #[cfg(feature = "metrics")]
        self.counters[0].increment(permits);
        #[cfg(not(feature = "metrics"))]
        let _ = permits;
    }

    /// Counts what a settle did to one rule's grant.
    pub(crate) fn settled(&self, settled: &crate::RuleSettled) {
        #[cfg(feature = "metrics")]
        {
            let applied = |n: u64| if settled.applied { n } else { 0 };
            let counts = [
                settled.counted,
                applied(settled.estimate.saturating_sub(settled.counted)),
                applied(settled.counted.saturating_sub(settled.estimate)),
                settled.uncharged,
            ];
            for (counter, n) in self.counters[1..].iter().zip(counts) {
                if n > 0 {
                    counter.increment(n);
                }
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = settled;
    }
}

/// The kept counters of `label` (labels are rule templates and `by_hand`: as many
/// as the process has rules).
pub(crate) fn settle_counters(label: std::borrow::Cow<'static, str>) -> std::sync::Arc<SettleCounters> {
    use std::collections::HashMap;
    use std::sync::{Arc, LazyLock, Mutex, PoisonError};
    static KEPT: LazyLock<Mutex<HashMap<std::borrow::Cow<'static, str>, Arc<SettleCounters>>>> =
        LazyLock::new(Mutex::default);
    let mut kept = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(counters) = kept.get(&label) {
        return counters.clone();
    }
    #[cfg(feature = "metrics")]
    let counters = [
        "redlimit_reserved_permits_total",
        "redlimit_settled_permits_total",
        "redlimit_refunded_permits_total",
        "redlimit_overdrawn_permits_total",
        "redlimit_uncharged_permits_total",
    ]
    .map(|name| metrics::counter!(name, "rule" => label.clone()));
    let counters = Arc::new(SettleCounters {
        label: label.clone(),
        #[cfg(feature = "metrics")]
        counters,
    });
    kept.insert(label, counters.clone());
    counters
}

/// Counts a settle given up, labelled `rule`.
pub(crate) fn settle_abandoned(rule: std::borrow::Cow<'static, str>) {
    #[cfg(feature = "metrics")]
    metrics::counter!("redlimit_settles_abandoned_total", "rule" => rule).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = rule;
}

/// Counts a stored config a rule overwrote (rare: no handle is kept).
pub(crate) fn config_changed() {
    #[cfg(feature = "metrics")]
    metrics::counter!("redlimit_config_changes_total").increment(1);
}

/// Counts a decision refused at the in-process backend's bound (rare: no handle is
/// kept).
pub(crate) fn memory_full() {
    #[cfg(feature = "metrics")]
    metrics::counter!("redlimit_memory_full_total").increment(1);
}

/// Moves the gauge of limiters held in process by `change` (rare: on a limiter made
/// or dropped, never on a decision of one held).
pub(crate) fn memory_held(change: isize) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("redlimit_memory_limiters").increment(change as f64);
    #[cfg(not(feature = "metrics"))]
    let _ = change;
}

/// Counts a limiter let go at the in-process backend's bound.
pub(crate) fn memory_evicted() {
    #[cfg(feature = "metrics")]
    metrics::counter!("redlimit_memory_evicted_total").increment(1);
}
