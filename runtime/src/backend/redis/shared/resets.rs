//! Limiters restarted or deleted, announced to every process: a refusal a client keeps
//! (`kept::refusals`) would otherwise outlive an operator's reset for the whole
//! wait Redis gave, and a batch it serves (`kept::batches`) would go on serving, until
//! its lease ended, permits counted in the window the reset ended (a rate of 10 a
//! window granted 19 in the window after a reset: 10 there, 9 of the old batch). A
//! batch taken `per_client` is counted in its client's own keys, which another
//! client's `RateLimiter::delete`, and its `set_rate` to a `per_client` config, leave
//! as they count (their entry says so, with the field `keys` `own`): it serves on (a
//! config of the other mode starts that client's state afresh at its next call, which
//! writes its own mode back: no `keys` `own` then). An entry without that field (the CLI's `reset`,
//! which deletes every client's keys; `Client::announce_reset`) ends it too. A client
//! holding batches reads the stream from its batches' sweeper as well, whether or not
//! its background task runs.
//!
//! Whatever restarts or deletes a limiter through redlimit ([`RateLimiter::delete`],
//! `set_rate` and `update_rate`, [`TokenBucket::delete`], the CLI's `reset` and
//! `set-rate`) appends its name to a stream, `<prefix>redlimit:resets` (the field
//! `name`, and `keys` `own` from a limiter's own resets: see above), which keeps about
//! its last [`RESETS_KEPT`] entries. Each client reads the entries it has not seen
//! every second in the background (`shared::sync`; the first reading takes the whole
//! stream) and drops what it kept of those limiters, so a reset reaches every process
//! within about a second. A client that finds entries it has not seen trimmed away
//! (more resets in a second than the stream keeps) drops every refusal it keeps and
//! ends every batch: keeping none is always safe, it only costs the round trips they
//! saved. Writers outside redlimit (a Java service's `setRate` or `delete`) announce
//! nothing, unless they append to the stream themselves
//! (`XADD <prefix>redlimit:resets * name <limiter>`): until then a refusal kept of that
//! limiter lasts at most the wait Redis gave, a batch at most its lease. A stream that
//! cannot be read (another type at its key, an entry too large to read within the
//! command timeout) or that can take no more entries (its last id is the last there
//! is) is logged once, and until that changes every reading drops every kept refusal
//! and ends every batch: none outlives a reset by more than about a second, whatever
//! the key holds. The client that resets a limiter ends its own at once.
//!
//! [`RateLimiter::delete`]: crate::RateLimiter::delete
//! [`TokenBucket::delete`]: crate::TokenBucket::delete

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{resets_key, ResetEntries, OWN_KEYS, RESETS_KEPT};
use crate::backend::redis::RedisBackend;
use crate::Error;

/// What a client keeps of its readings of the stream.
#[derive(Debug, Default)]
pub(crate) struct Cursor {
    /// The last entry read (`None`: none yet).
    last: Mutex<Option<Id>>,
    /// Whether a failed reading was logged.
    logged: AtomicBool,
    /// When the last reading began.
    began: Mutex<Option<Instant>>,
}

/// How long after a reading began the sweeper of batches does not read again
/// ([`RedisBackend::read_announcements_if_due`]): the background task reads each
/// second.
const READ_AGAIN: Duration = Duration::from_millis(900);

impl Cursor {
    /// Logs, once per client, that the stream could not be read.
    fn unreadable(&self, key: &str, error: &Error) {
        if !self.logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                key,
                "the stream of limiters reset cannot be read, so refusals are kept in process \
                 for a second at most until it can (logged once): {error}"
            );
        }
    }
}

/// A stream entry's id: milliseconds, then a sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Id(u64, u64);

impl Id {
    const LAST: Id = Id(u64::MAX, u64::MAX);

    fn parse(text: &str) -> Option<Id> {
        let (ms, seq) = text.split_once('-')?;
        Some(Id(ms.parse().ok()?, seq.parse().ok()?))
    }

    /// The first id after this one, as `XRANGE` takes it.
    fn next(self) -> String {
        match self.1.checked_add(1) {
            Some(seq) => format!("{}-{seq}", self.0),
            None => format!("{}-0", self.0.saturating_add(1)),
        }
    }
}

impl RedisBackend {
    /// Tells every process using this Redis and prefix that the limiter `name` was
    /// restarted or deleted (`Client::announce_reset`), dropping the refusal this
    /// client keeps of it first.
    pub(crate) async fn announce_reset(&self, name: &str, every_client: bool) -> Result<(), Error> {
        self.forget_reset(name, true);
        self.append_reset(&resets_key(&self.owner.prefix), name, every_client)
            .await
    }

    /// Drops the refusals kept of every limiter announced since the last reading (all
    /// of them, when announcements were trimmed away unread).
    pub(crate) async fn read_announcements(&self) {
        *self.shared.resets.began.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        let key = resets_key(&self.owner.prefix);
        let cursor = *self.shared.resets.last.lock().unwrap_or_else(|e| e.into_inner());
        let from = cursor.unwrap_or(Id(0, 0));
        // A failed read keeps the cursor: the next one reads what this one missed.
        // Meanwhile no refusal is kept longer than the next reading (a second): an
        // announcement may be among what could not be read.
        let (oldest, entries) = match self.read_resets(&key, &from.next()).await {
            Ok(read) => read,
            Err(error) => {
                self.forget_every_reset();
                self.shared.resets.unreadable(&key, &error);
                return;
            }
        };
        let trimmed = oldest
            .as_deref()
            .and_then(Id::parse)
            .is_some_and(|oldest| oldest > from)
            && from != Id(0, 0);
        let last = self.forget_announced(&entries, trimmed || entries.len() > RESETS_KEPT);
        if last == Some(Id::LAST) {
            // No entry can follow the last id there is: resets can no longer be
            // announced, so none is kept past the next reading.
            self.forget_every_reset();
            let error = Error::InvalidConfig {
                name: key.clone(),
                problem: "its last entry has the last id a stream can have",
            };
            self.shared.resets.unreadable(&key, &error);
        }
        if let Some(last) = last {
            *self.shared.resets.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(last);
        }
    }

    /// [`read_announcements`](RedisBackend::read_announcements), unless a reading began
    /// less than [`READ_AGAIN`] ago: for the sweeper of batches, which runs while a
    /// client holds batches, whether or not its background task runs (a client that
    /// only takes batches through `Client::check_rules` keeps no refusal, which is
    /// what starts that task there). Read on the library's runtime, which always runs,
    /// holding the client for one command timeout at most: on the sweeper's, a
    /// current-thread runtime its callers stopped running while the reply was on its
    /// way would hold the client for good, and its batches would never go back.
    pub(crate) fn read_announcements_if_due(self: &Arc<Self>) {
        {
            let mut last = self.shared.resets.began.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|began| began.elapsed() < READ_AGAIN) {
                return;
            }
            *last = Some(Instant::now());
        }
        let Some(runtime) = crate::backend::redis::carrier::carrier() else {
            return;
        };
        let weak = Arc::downgrade(self);
        drop(runtime.spawn(async move {
            if let Some(redis) = weak.upgrade() {
                let timeout = redis.timeout;
                let _ = tokio::time::timeout(timeout, redis.read_announcements()).await;
            }
        }));
    }

    /// Forgets the limiters `entries` name, or every kept refusal when `all`; the last
    /// entry's id.
    fn forget_announced(&self, entries: &ResetEntries, all: bool) -> Option<Id> {
        if all {
            self.forget_every_reset();
        } else {
            for (_, fields) in entries {
                // (an entry saying the reset left every other client's `per_client`
                // keys leaves a batch this client took `per_client`)
                let own_keys = (fields.iter()).any(|(field, value)| {
                    (field.as_slice(), value.as_slice()) == (OWN_KEYS.0.as_bytes(), OWN_KEYS.1.as_bytes())
                });
                for (field, name) in fields {
                    if let (b"name", Ok(name)) = (field.as_slice(), std::str::from_utf8(name)) {
                        self.forget_reset(name, !own_keys);
                    }
                }
            }
        }
        entries.last().and_then(|(id, _)| Id::parse(id))
    }

    /// What this client keeps of the limiter `name`, reset: its refusal, and its
    /// batch, which serves no permit more (the window it was counted in is gone; a
    /// `per_client` batch's only when its keys went too: `per_client_keys`).
    fn forget_reset(&self, name: &str, per_client_keys: bool) {
        self.forget_refusal(name);
        self.end_batch(name, per_client_keys);
    }

    /// [`forget_reset`](RedisBackend::forget_reset) of every limiter, reset elsewhere.
    fn forget_every_reset(&self) {
        self.forget_every_refusal();
        self.end_every_batch();
    }
}

#[cfg(test)]
mod tests {
    use super::Id;

    #[test]
    fn ids_order_and_follow_as_the_stream_orders_them() {
        assert_eq!(Id::parse("1700000000000-3"), Some(Id(1_700_000_000_000, 3)));
        assert_eq!(Id::parse("17-x"), None);
        assert!(Id(5, 0) > Id(4, 9) && Id(5, 1) > Id(5, 0));
        assert_eq!(Id(5, 1).next(), "5-2");
        assert_eq!(Id(5, u64::MAX).next(), "6-0");
    }
}
