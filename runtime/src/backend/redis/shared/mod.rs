//! The library's own keys in Redis, which every process using the same prefix shares:
//! hashes (the rate overrides, the rules published, the refusal reports) and the
//! stream of limiters reset, read and written with plain commands (no script); the
//! reading of the stream ([`resets`]) and the background task that keeps a client in
//! step with the others ([`sync`]).

use super::RedisBackend;
use crate::observe::refusal_reports::RefusalReports;
use crate::{Error, LIBRARY_SEGMENT};

pub(crate) mod resets;
pub(crate) mod sync;

/// What a Redis client shares with the others, on its side: the refusals it has to
/// report, its background task's state, how far it read the stream of resets.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub reports: RefusalReports,
    pub background: sync::Background,
    pub resets: resets::Cursor,
}

/// The key of the overrides hash: `<prefix>redlimit:overrides`.
pub(crate) fn overrides_key(prefix: &str) -> String {
    format!("{prefix}{LIBRARY_SEGMENT}:overrides")
}

/// The key of the table where each process publishes the rules it runs:
/// `<prefix>redlimit:rules`.
pub(crate) fn rules_key(prefix: &str) -> String {
    format!("{prefix}{LIBRARY_SEGMENT}:rules")
}

/// The key of the refusals reported for the epoch second `second`:
/// `<prefix>redlimit:refused:<second>`.
pub(crate) fn refusals_key(prefix: &str, second: u64) -> String {
    format!("{prefix}{LIBRARY_SEGMENT}:refused:{second}")
}

/// The key of the stream of limiters reset: `<prefix>redlimit:resets`.
pub(crate) fn resets_key(prefix: &str) -> String {
    format!("{prefix}{LIBRARY_SEGMENT}:resets")
}

/// Entries the stream of limiters reset keeps, about (`XADD ... MAXLEN ~`): a second's
/// resets, many times over, for processes that read it every second.
pub(crate) const RESETS_KEPT: usize = 1_000;

/// The field and value of a reset's entry when the reset left every other client's
/// `per_client` keys as they count (a limiter's own `delete`, and `set_rate` and
/// `update_rate` to a `per_client` config): a batch another client took `per_client`,
/// counted in those keys, serves on. An entry without it (the CLI's `reset`, which
/// deletes every client's keys, or `Client::announce_reset`) ends it.
pub(crate) const OWN_KEYS: (&str, &str) = ("keys", "own");

/// Entries of the stream of limiters reset: (id, fields), the fields as bytes (one
/// that is not UTF-8 names no limiter, but must not fail the reading).
pub(crate) type ResetEntries = Vec<(String, Vec<(Vec<u8>, Vec<u8>)>)>;

impl RedisBackend {
    /// Every field of the hash `key` (the rate overrides).
    pub async fn read_hash(&self, key: &str) -> Result<Vec<(String, String)>, Error> {
        self.run(&[], |mut conn| async move {
            redis::cmd("HGETALL").arg(key).query_async(&mut conn).await
        })
        .await
    }

    /// Sets (`Some`) or deletes (`None`) one field of the hash `key`; true when the
    /// field existed before a delete.
    pub async fn write_hash(&self, key: &str, field: &str, value: Option<&str>) -> Result<bool, Error> {
        self.run(&[], |mut conn| async move {
            match value {
                Some(value) => redis::cmd("HSET")
                    .arg(key)
                    .arg(field)
                    .arg(value)
                    .query_async::<u64>(&mut conn)
                    .await
                    .map(|_| true),
                None => redis::cmd("HDEL")
                    .arg(key)
                    .arg(field)
                    .query_async::<u64>(&mut conn)
                    .await
                    .map(|n| n > 0),
            }
        })
        .await
    }

    /// Appends `name` to the stream `key` of limiters reset, which keeps about its
    /// last [`RESETS_KEPT`] entries; with the field `keys` `own` when the reset left
    /// every other client's `per_client` keys (see `resets`).
    pub async fn append_reset(&self, key: &str, name: &str, every_client: bool) -> Result<(), Error> {
        self.run(&[], |mut conn| async move {
            let mut xadd = redis::cmd("XADD");
            xadd.arg(key)
                .arg("MAXLEN")
                .arg("~")
                .arg(RESETS_KEPT)
                .arg("*")
                .arg("name")
                .arg(name);
            if !every_client {
                xadd.arg(OWN_KEYS.0).arg(OWN_KEYS.1);
            }
            xadd.query_async::<String>(&mut conn).await.map(|_| ())
        })
        .await
    }

    /// The stream `key` of limiters reset: its oldest entry's id and the entries from
    /// `from` on (at most [`RESETS_KEPT`] + 1 000, however many were appended), as
    /// (id, fields).
    pub async fn read_resets(&self, key: &str, from: &str) -> Result<(Option<String>, ResetEntries), Error> {
        self.run(&[], |mut conn| async move {
            let (oldest, entries): (ResetEntries, ResetEntries) = redis::pipe()
                .cmd("XRANGE")
                .arg(key)
                .arg("-")
                .arg("+")
                .arg("COUNT")
                .arg(1)
                .cmd("XRANGE")
                .arg(key)
                .arg(from)
                .arg("+")
                .arg("COUNT")
                .arg(RESETS_KEPT + 1_000)
                .query_async(&mut conn)
                .await?;
            Ok((oldest.into_iter().next().map(|(id, _)| id), entries))
        })
        .await
    }

    /// Adds `counts` to the fields of the hash `key`, and gives it `ttl_ms`.
    pub async fn add_counts(&self, key: &str, counts: &[(String, u64)], ttl_ms: u64) -> Result<(), Error> {
        self.run(&[], |mut conn| async move {
            let mut pipe = redis::pipe();
            for (field, count) in counts {
                pipe.cmd("HINCRBY").arg(key).arg(field).arg(*count).ignore();
            }
            pipe.cmd("PEXPIRE").arg(key).arg(ttl_ms).ignore();
            pipe.query_async::<()>(&mut conn).await
        })
        .await
    }
}
