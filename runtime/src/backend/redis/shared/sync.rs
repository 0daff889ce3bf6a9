//! A Redis client's background task: once a second it reads the rate overrides and the
//! limiters reset ([`resets`](super::resets)), reports the refusals counted, and
//! publishes the process's rules (when they changed, or a minute passed). Started by
//! the first decision; no decision waits for it after that.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{overrides_key, refusals_key, rules_key};
use crate::backend::redis::ongoing::Ongoing;
use crate::backend::redis::RedisBackend;
use crate::observe::refusal_reports::REPORT_TTL_MS;
use crate::rules::overrides::{RateOverride, Table};
use crate::Error;

/// How often each process reads the overrides and reports its refusals.
pub(crate) const REFRESH: Duration = Duration::from_secs(1);

/// How often a process publishes its rules when they did not change, and how long
/// the published table is kept after the last publication.
const RULES_REFRESH_MS: u64 = 60_000;
const RULES_TTL_MS: u64 = 3_600_000;

/// The task's state: whether it runs, and what it published last.
#[derive(Debug, Default)]
pub(crate) struct Background {
    /// Set once the first read is done (or failed) and the task runs: the first
    /// read's timeout (its `after` and `connecting`) when it timed out.
    started: std::sync::OnceLock<Option<(Duration, bool)>>,
    /// Told when `started` is set.
    ready: tokio::sync::Notify,
    /// The task spawned to start it, while it runs ([`RedisBackend::start_background`]).
    starting: Ongoing,
    /// The task that refreshes, started again when its runtime ended.
    task: Ongoing,
    /// The registry's generation (plus one) last published, and when.
    published: AtomicU64,
    published_ms: AtomicU64,
}

impl RedisBackend {
    /// Publishes this process's rules, when they changed or a minute passed: fields
    /// of the rules key, kept an hour after the last process publishing them.
    async fn publish_rules(&self) {
        let generation = crate::rules::registry::generation() as u64 + 1;
        let state = &self.shared.background;
        let now = self.now_ms();
        if state.published.load(Ordering::Relaxed) == generation
            && now.saturating_sub(state.published_ms.load(Ordering::Relaxed)) < RULES_REFRESH_MS
        {
            return;
        }
        let fields: Vec<(String, u64)> = crate::rules::registry::published_fields()
            .into_iter()
            .map(|f| (f, 0))
            .collect();
        if fields.is_empty() {
            return;
        }
        if self
            .add_counts(&rules_key(&self.owner.prefix), &fields, RULES_TTL_MS)
            .await
            .is_ok()
        {
            state.published.store(generation, Ordering::Relaxed);
            state.published_ms.store(now, Ordering::Relaxed);
        }
    }

    /// Makes sure this client's background task runs: the first call has the
    /// overrides read (one round trip, once per client) and the task started that
    /// refreshes them and reports refusals every second; later calls return at once.
    /// When that first read timed out, the calls that waited on it answer its
    /// timeout: the server does not answer, and a decision sent after it would wait a
    /// second timeout. The read runs in a task of its own ([`start_background`]): one
    /// left on a runtime that stopped, or dropped with one, is made again at the next
    /// turn of the wait, which no caller then waits on for good.
    ///
    /// [`start_background`]: RedisBackend::start_background
    pub(crate) async fn background_ready(self: &Arc<Self>) -> Result<Arc<Table>, Error> {
        let state = &self.shared.background;
        if state.started.get().is_some() {
            if state.task.needed(|| self.moving()) {
                self.keep_refreshing();
            }
            return Ok(self.owner.overrides.table());
        }
        loop {
            // (told from here on, then looked at: a read set in between is seen)
            let ready = state.ready.notified();
            let mut ready = std::pin::pin!(ready);
            ready.as_mut().enable();
            // A call that waited for the first read answers what it found.
            if let Some(timed_out) = state.started.get() {
                return match *timed_out {
                    Some((after, connecting)) => Err(Error::Timeout { after, connecting }),
                    None => Ok(self.owner.overrides.table()),
                };
            }
            self.start_background();
            let _ = tokio::time::timeout(self.timeout, ready).await;
        }
    }

    /// The first read of the overrides, and the refreshing task started, once; the
    /// calls waiting for it told.
    async fn first_read(self: &Arc<Self>) {
        let timed_out = match self.read_overrides().await {
            Ok(list) => {
                self.owner.overrides.replace(Table::from_list(&list));
                None
            }
            Err(Error::Timeout { after, connecting }) => Some((after, connecting)),
            Err(_) => None,
        };
        let state = &self.shared.background;
        if state.started.set(timed_out).is_ok() {
            self.keep_refreshing();
        }
        state.ready.notify_waiters();
    }

    /// Starts the task that refreshes every [`REFRESH`], on a runtime that lasts (a
    /// caller's made for its call would end it at once, and no override set after
    /// would be read), when it does not run there.
    fn keep_refreshing(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        self.keep_going(&self.shared.background.task, |turn| async move {
            loop {
                tokio::time::sleep(REFRESH).await;
                let Some(redis) = weak.upgrade().filter(|_| turn.still()) else {
                    return;
                };
                // A failed read keeps the table it has: the backend failing is
                // on_error's business, not a reason to drop the overrides.
                if let Ok(list) = redis.read_overrides().await {
                    redis.owner.overrides.replace(Table::from_list(&list));
                }
                redis.read_announcements().await;
                redis.report_refusals().await;
                redis.publish_rules().await;
            }
        });
    }

    /// Starts the background task without waiting for it, when it does not run yet
    /// (a client deciding by hand keeps refusals: the task reads the announcements
    /// that end them), or again when it ran on a runtime that ended or is not driven.
    /// The first read runs on a runtime that lasts; left on the client's
    /// current-thread runtime, which its callers no longer run, or dropped with its
    /// runtime, it is made again (on the library's runtime) at the next call.
    pub(crate) fn start_background(self: &Arc<Self>) {
        let state = &self.shared.background;
        if state.started.get().is_some() {
            if state.task.needed(|| self.moving()) {
                self.keep_refreshing();
            }
            return;
        }
        if !state.starting.needed(|| self.moving()) {
            return;
        }
        let redis = self.clone();
        self.keep_going(&state.starting, |turn| async move {
            let _turn = turn;
            redis.first_read().await;
        });
    }

    /// Counts a refusal of the limiter `name` of rule `rule` for the next report (see
    /// `observe::refusal_reports`).
    pub(crate) fn note_refused(&self, name: &str, rule: &str) {
        self.shared.reports.note(self.now_ms() / 1000, name, rule);
    }

    /// Adds the refusals counted since the last report to Redis.
    async fn report_refusals(&self) {
        let by_second = self.shared.reports.take();
        if by_second.is_empty() {
            return;
        }
        for (second, counts) in by_second {
            let key = refusals_key(&self.owner.prefix, second);
            // Lost when Redis fails: these are for watching, not for deciding.
            let _ = self.add_counts(&key, &counts, REPORT_TTL_MS).await;
        }
    }

    /// The overrides set, read from their hash; entries that do not parse are left
    /// out.
    pub(crate) async fn read_overrides(&self) -> Result<Vec<RateOverride>, Error> {
        let fields = self.read_hash(&overrides_key(&self.owner.prefix)).await?;
        Ok(fields
            .iter()
            .filter_map(|(field, value)| RateOverride::parse(field, value))
            .collect())
    }

    /// The rules every process using this Redis and prefix published.
    pub(crate) async fn published_rules(&self) -> Result<Vec<String>, Error> {
        let fields = self.read_hash(&rules_key(&self.owner.prefix)).await?;
        Ok(fields.into_iter().map(|(field, _)| field).collect())
    }

    /// Sets (`Some`) or deletes (`None`) the override of `field`; true when it existed
    /// before a delete.
    pub(crate) async fn write_override(&self, field: &str, value: Option<&str>) -> Result<bool, Error> {
        self.write_hash(&overrides_key(&self.owner.prefix), field, value)
            .await
    }
}
