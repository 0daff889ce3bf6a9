//! What a client shares with every process using its Redis and prefix, as its API
//! names it: the keys of the library's own state, a reset announced, a refusal
//! counted for the reports, the overrides once the background task runs. The work
//! itself is the Redis backend's (`backend/redis/shared/`); in process each is
//! nothing, or the client's own table.

use std::sync::Arc;

use crate::backend::redis::shared::{overrides_key, refusals_key, resets_key, rules_key};
use crate::rules::overrides::Table;
use crate::{Client, Error};

impl Client {
    /// The key of the overrides hash: `<prefix>redlimit:overrides`.
    pub fn overrides_key(&self) -> String {
        overrides_key(self.prefix())
    }

    /// The key of the table where each process publishes the rules it runs (what an
    /// override must fit, see [`Client::set_override`]): `<prefix>redlimit:rules`.
    pub fn rules_key(&self) -> String {
        rules_key(self.prefix())
    }

    /// The key of the refusals reported for the epoch second `second`:
    /// `<prefix>redlimit:refused:<second>`.
    pub fn refusals_key(&self, second: u64) -> String {
        refusals_key(self.prefix(), second)
    }

    /// The key of the stream of limiters reset: `<prefix>redlimit:resets`.
    pub fn resets_key(&self) -> String {
        resets_key(self.prefix())
    }

    /// Tells every process using this Redis and prefix that the limiter `name` was
    /// restarted or deleted (by hand, or by a writer that does not say so), so that
    /// each drops the refusal it keeps of it and ends its batch of it (`Rule::batch`)
    /// within about a second, this client at once: every client's keys of it may have
    /// gone, `per_client` ones included. A limiter's own resets
    /// ([`RateLimiter::delete`](crate::RateLimiter::delete), and `set_rate` and
    /// `update_rate` to a `per_client` config) announce that they left every other
    /// client's `per_client` state as it counts: a batch another client took
    /// `per_client` then serves on. Nothing to do in process.
    pub async fn announce_reset(&self, name: &str) -> Result<(), Error> {
        self.backend().announce_reset(name, true).await
    }

    /// [`announce_reset`](Client::announce_reset) after a change of this client's that
    /// took effect, which left every other client's `per_client` state as it counts
    /// when `leaves_per_client` (a delete: the next call makes the config again; a
    /// `per_client` config); a failure is logged, not returned (the change itself was
    /// made).
    pub(crate) async fn announce_reset_made(&self, name: &str, leaves_per_client: bool) {
        if let Err(error) = self.backend().announce_reset(name, !leaves_per_client).await {
            tracing::warn!(
                limiter = name,
                "the limiter was reset, but announcing it failed: other processes may keep \
                 refusing calls on it until the waits Redis gave them end, and serving \
                 batches of it until their leases end: {error}"
            );
        }
    }

    /// Counts a refusal of the limiter `name` of rule `rule` for the next report
    /// (Redis clients; see `observe::refusal_reports`).
    pub(crate) fn note_refused(&self, name: &str, rule: &str) {
        self.backend().note_refused(name, rule);
    }

    /// Makes sure this client's background task runs (Redis clients: the first call
    /// reads the overrides, once per client; later calls return at once), and answers
    /// the overrides in force, or the first read's timeout to the calls that waited
    /// on it.
    pub(crate) async fn background_ready(&self) -> Result<Arc<Table>, crate::Error> {
        self.backend().background_ready(self.overrides()).await
    }
}
