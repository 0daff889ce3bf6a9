//! What a client asks of its backend beside its limiters, answered by whichever backend
//! it is, one `match` each, so that nothing outside `backend/` asks which it has. On
//! Redis: the refusals kept, the library's own keys shared by every process, the
//! background task. In process each is nothing, or the process's own table.

use std::sync::Arc;

use super::memory::MemoryBackend;
use super::Backend;
use crate::rules::overrides::{Overrides, RateOverride, Table};
use crate::Error;

impl Backend {
    /// True for the in-process backend.
    pub fn is_memory(&self) -> bool {
        matches!(self, Backend::Memory(_))
    }

    /// The in-process backend, for a decision made where it is called.
    pub fn in_process(&self) -> Option<&MemoryBackend> {
        match self {
            Backend::Memory(memory) => Some(memory),
            Backend::Redis(_) => None,
        }
    }

    /// The runtime a settle runs on, which must outlive the call that started it: on
    /// Redis the client's own while it is a multi-thread runtime still running, the
    /// caller's when that is the client's own, else the library's own; in process, or
    /// outside any runtime, the caller's if any.
    pub fn lasting(&self) -> Option<tokio::runtime::Handle> {
        match self {
            Backend::Memory(_) => tokio::runtime::Handle::try_current().ok(),
            Backend::Redis(redis) => redis.lasting(),
        }
    }

    /// Drops the refusal kept of the limiter `name`, if any: it changed.
    pub fn forget_refusal(&self, name: &str) {
        match self {
            Backend::Memory(_) => {}
            Backend::Redis(redis) => redis.forget_refusal(name),
        }
    }

    /// A refusal of `rules` this client keeps, answered without a round trip (never
    /// a grant: a batch's permits are not a reservation's).
    pub fn kept_refusal(&self, rules: &[crate::Rule], now: u64) -> Option<crate::Decision> {
        match self {
            Backend::Memory(_) => None,
            Backend::Redis(redis) => redis.answered_here(rules, now).filter(|d| !d.allowed),
        }
    }

    /// Counts a refusal of the limiter `name` of rule `rule` for the next report.
    pub fn note_refused(&self, name: &str, rule: &str) {
        match self {
            Backend::Memory(_) => {}
            Backend::Redis(redis) => redis.note_refused(name, rule),
        }
    }

    /// The overrides in force once the background task runs (`overrides`, the
    /// client's, at once in process); the timeout of the first read of them, for the
    /// calls that waited on it.
    pub async fn background_ready(&self, overrides: &Overrides) -> Result<Arc<Table>, Error> {
        match self {
            // In process there is nothing to start: no wait, ever.
            Backend::Memory(_) => Ok(overrides.table()),
            Backend::Redis(redis) => redis.background_ready().await,
        }
    }

    /// Tells every process that the limiter `name` was restarted or deleted (with
    /// every client's `per_client` keys, or this client's only); nothing to do in
    /// process.
    pub async fn announce_reset(&self, name: &str, every_client: bool) -> Result<(), Error> {
        match self {
            Backend::Memory(_) => Ok(()),
            Backend::Redis(redis) => redis.announce_reset(name, every_client).await,
        }
    }

    /// The overrides set: in Redis, else those of `overrides`, the client's.
    pub async fn read_overrides(&self, overrides: &Overrides) -> Result<Vec<RateOverride>, Error> {
        match self {
            Backend::Memory(_) => Ok(overrides.table().list()),
            Backend::Redis(redis) => redis.read_overrides().await,
        }
    }

    /// The rules every process using this Redis published (none in process).
    pub async fn published_rules(&self) -> Result<Vec<String>, Error> {
        match self {
            Backend::Memory(_) => Ok(Vec::new()),
            Backend::Redis(redis) => redis.published_rules().await,
        }
    }

    /// Sets (`Some`) or removes (`None`) the override of `field` for every process:
    /// on Redis whether a removed one existed; `None` in process, which keeps
    /// overrides in the client only.
    pub async fn write_override(&self, field: &str, value: Option<&str>) -> Result<Option<bool>, Error> {
        match self {
            Backend::Memory(_) => Ok(None),
            Backend::Redis(redis) => redis.write_override(field, value).await.map(Some),
        }
    }
}
