//! A client's background task: once a second it reads the rate overrides and the
//! limiters reset (`client::resets`), reports the refusals counted, and publishes the process's rules (when they changed, or a
//! minute passed). Started by the first decision; no decision waits for it after that.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;

use crate::observe::refusal_reports::REPORT_TTL_MS;
use crate::rules::overrides::Table;
use crate::{Client, LIBRARY_SEGMENT};

/// How often each process reads the overrides and reports its refusals.
pub(crate) const REFRESH: Duration = Duration::from_secs(1);

/// How often a process publishes its rules when they did not change, and how long
/// the published table is kept after the last publication.
const RULES_REFRESH_MS: u64 = 60_000;
const RULES_TTL_MS: u64 = 3_600_000;

/// The task's state: whether it runs, and what it published last.
#[derive(Debug, Default)]
pub(crate) struct Background {
    /// Set once the first read is done (or failed) and the task runs.
    started: OnceCell<()>,
    /// Set when a task was spawned to start it ([`Client::start_background`]).
    spawned: AtomicBool,
    /// The registry's generation (plus one) last published, and when.
    published: AtomicU64,
    published_ms: AtomicU64,
}

impl Client {
    /// The key of the table where each process publishes the rules it runs (what an
    /// override must fit, see [`Client::set_override`]): `<prefix>redlimit:rules`.
    pub fn rules_key(&self) -> String {
        format!("{}{LIBRARY_SEGMENT}:rules", self.prefix())
    }

    /// Publishes this process's rules, when they changed or a minute passed (Redis
    /// clients): fields of `rules_key()`, kept an hour after the last process
    /// publishing them.
    async fn publish_rules(&self) {
        let generation = crate::rules::registry::generation() as u64 + 1;
        let state = self.background();
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
        if let crate::backend::Backend::Redis(redis) = self.backend() {
            if redis
                .add_counts(&self.rules_key(), &fields, RULES_TTL_MS)
                .await
                .is_ok()
            {
                state.published.store(generation, Ordering::Relaxed);
                state.published_ms.store(now, Ordering::Relaxed);
            }
        }
    }

    /// Makes sure this client's background task runs: the first call reads the
    /// overrides (one round trip, once per client) and starts the task that refreshes
    /// them and reports refusals every second; later calls return at once. The
    /// in-process backend keeps overrides in this process only and reports nothing.
    pub(crate) async fn background_ready(&self) -> Arc<Table> {
        let state = self.background();
        // In process there is nothing to start: no wait, ever.
        if self.is_memory() || state.started.initialized() {
            return self.overrides().table();
        }
        state
            .started
            .get_or_init(|| async {
                if self.is_memory() {
                    return;
                }
                if let Ok(list) = self.read_overrides().await {
                    self.overrides().replace(Table::from_list(&list));
                }
                let weak = self.downgrade();
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(REFRESH).await;
                        let Some(client) = weak.upgrade() else {
                            return;
                        };
                        // A failed read keeps the table it has: the backend failing is
                        // on_error's business, not a reason to drop the overrides.
                        if let Ok(list) = client.read_overrides().await {
                            client.overrides().replace(Table::from_list(&list));
                        }
                        client.read_resets().await;
                        client.report_refusals().await;
                        client.publish_rules().await;
                    }
                });
            })
            .await;
        self.overrides().table()
    }

    /// Starts the background task without waiting for it, when it does not run yet
    /// (a client deciding by hand keeps refusals: the task reads the announcements
    /// that end them).
    pub(crate) fn start_background(&self) {
        let state = self.background();
        if self.is_memory() || state.started.initialized() || state.spawned.swap(true, Ordering::Relaxed) {
            return;
        }
        let client = self.clone();
        tokio::spawn(async move {
            client.background_ready().await;
        });
    }

    /// The key of the refusals reported for the epoch second `second`:
    /// `<prefix>redlimit:refused:<second>`.
    pub fn refusals_key(&self, second: u64) -> String {
        format!("{}{LIBRARY_SEGMENT}:refused:{second}", self.prefix())
    }

    /// Counts a refusal of the limiter `name` of rule `rule` for the next report
    /// (Redis clients; see `observe::refusal_reports`).
    pub(crate) fn note_refused(&self, name: &str, rule: &str) {
        if self.is_memory() {
            return;
        }
        self.refusal_reports().note(self.now_ms() / 1000, name, rule);
    }

    /// Adds the refusals counted since the last report to Redis.
    async fn report_refusals(&self) {
        let by_second = self.refusal_reports().take();
        if by_second.is_empty() {
            return;
        }
        if let crate::backend::Backend::Redis(redis) = self.backend() {
            for (second, counts) in by_second {
                let key = self.refusals_key(second);
                // Lost when Redis fails: these are for watching, not for deciding.
                let _ = redis.add_counts(&key, &counts, REPORT_TTL_MS).await;
            }
        }
    }
}
