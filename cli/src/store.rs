//! The Redis the CLI talks to: one node or a cluster, raw commands for reading state
//! as it is stored, the server's time, and SCAN over every primary (and its patterns). Connections, to the cluster's
//! primaries too, are made by the runtime, as a client makes its own, so that every
//! command names a failure the same way.

use std::time::Duration;

use redis::{AsyncCommands, RedisError};
use redlimit_runtime::{Client, ClientBuilder, Error, RawConnection};

/// The longest connecting may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest one command may take: an operator's SCAN of a large keyspace is not a
/// request's decision.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// How much of a string key the CLI reads: a limiter's value or a bucket's state fits.
pub const SHORT_VALUE: isize = 256;

/// The first [`SHORT_VALUE`] bytes of a string read with one more, as text (each byte
/// that is not UTF-8 replaced), `…` after them when there was more.
fn shortened(head: &[u8]) -> String {
    let mut text = String::from_utf8_lossy(&head[..head.len().min(SHORT_VALUE as usize)]).into_owned();
    if head.len() > SHORT_VALUE as usize {
        text.push('…');
    }
    text
}

/// Whether the scripts read `text` as a limiter's value: an optional `-` and digits,
/// nothing else (no `+`, no spaces). On anything else every call of the limiter
/// fails until it is reset.
pub fn scripts_read(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// A limiter's value as the scripts count it: an optional `-` and digits, at most 16
/// characters and not past 2^53 (read as text before a double rounds it). Any other
/// number the scripts take for one above any rate, and the next call rebuilds the value
/// from the log: `None` here, as for a text that is no number.
pub fn limiter_value(text: &str) -> Option<i64> {
    let past = text.len() > 16 || (text.len() == 16 && text > "9007199254740992");
    (scripts_read(text) && !past).then(|| text.parse().ok()).flatten()
}

/// A limiter's value as the next call uses it, when the scripts read it: a count they
/// take for one above any rate (see [`limiter_value`]) as 2^62, beyond any rate and any
/// log.
pub fn value_for_call(text: &str) -> Option<i64> {
    const BEYOND: i64 = 1 << 62;
    limiter_value(text).or(scripts_read(text).then_some(BEYOND))
}

/// Why a limiter's value that is there is not read as one: what the CLI says of it.
pub fn unread_value(text: &str) -> &'static str {
    if text.ends_with('…') {
        "a value longer than the CLI reads: what a call would do is not said here"
    } else if scripts_read(text) {
        "a number of more than 16 characters or past 2^53, which no limiter writes and the \
         scripts take for one above any rate: the next call rebuilds the value from the log \
         (`available now` is what it finds)"
    } else {
        "not a number: every call of the limiter fails until it is reset"
    }
}

/// How many entries of a limiter's log one command reads.
pub const LOG_RANGE: isize = 1_000;

/// The most entries of a log read with its value in one transaction
/// ([`Store::window`]): well under the 20 ms of Redis's time no command of the CLI
/// takes (one `ZRANGE` of 2 000 000 took 0.4 s); a longer log is read in ranges.
pub const SNAPSHOT_LOG: isize = 10_000;

/// A sliding window's value (as [`Store::short_string`] reads it) and its log, read
/// together; `changed` when a longer log, read in ranges, changed at its oldest end or
/// the value changed while it was read (a call landed between the reads).
pub struct Window {
    pub value: Option<String>,
    pub log: Entries,
    pub changed: bool,
}

/// A log's members and their scores, oldest first.
pub type Entries = Vec<(Vec<u8>, f64)>;

/// The settings every command connects with.
pub fn builder() -> ClientBuilder {
    Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .command_timeout(COMMAND_TIMEOUT)
}

/// Where the CLI reads: the routed connection, and one connection per primary for SCAN.
pub struct Store {
    pub conn: RawConnection,
    primaries: Vec<RawConnection>,
}

impl Store {
    pub async fn open(url: &str) -> Result<Store, Error> {
        let conn = builder().connect_raw(url).await?;
        let primaries = builder().connect_raw_primaries(url, &conn).await?;
        Ok(Store { conn, primaries })
    }

    /// Each member of the sorted set `key` with its score, in order, read in ranges of
    /// [`LOG_RANGE`] (a log of millions is not one command that holds Redis while the
    /// limiters it serves wait: 2 000 000 entries took one `ZRANGE` 0.4 s).
    ///
    /// The log is live: the scripts drop its oldest entries, give one back, add new
    /// ones while it is read. Each range starts after the last entry read, wherever that
    /// entry now is (`ZRANK`), not at a count of entries: the entries dropped before it
    /// do not make the next range skip as many. When that entry itself is gone (given
    /// back), the range starts at the first entry of its score and passes over those of
    /// that score already read (a sorted set orders one score's entries by their bytes).
    /// Each entry that stays is read once; one added behind the reading is not read, as
    /// a reading of a moment that has passed would not have it.
    ///
    /// The reading is of the log as it was when it began: it ends at the newest entry
    /// then (an entry added later has a later time), after as many entries as the log
    /// then held (an entry dated ahead by a skewed clock is the newest for a while),
    /// and after twice as many ranges as it then filled, and one more: a log written
    /// faster than it is read, or replaced again and again, is not followed for ever.
    pub async fn each_in_log(&self, key: &str, mut f: impl FnMut(&[u8], f64)) -> Result<(), Error> {
        let mut conn = self.conn.clone();
        let newest: Vec<(Vec<u8>, f64)> = conn
            .zrange_withscores(key, -1, -1)
            .await
            .map_err(|e| self.fail(e))?;
        let Some(&(_, until)) = newest.first() else {
            return Ok(());
        };
        let held: usize = conn.zcard(key).await.map_err(|e| self.fail(e))?;
        let (mut entries_left, mut ranges_left) = (held, 2 * (held / LOG_RANGE as usize + 1));
        let mut start: isize = 0;
        // The last entry read, when its range starts before it (it was given back).
        let mut read_up_to: Option<(Vec<u8>, f64)> = None;
        while ranges_left > 0 {
            ranges_left -= 1;
            let range: Vec<(Vec<u8>, f64)> = conn
                .zrange_withscores(key, start, start + LOG_RANGE - 1)
                .await
                .map_err(|e| self.fail(e))?;
            // Whether an entry was read in an earlier range.
            let read = |member: &[u8], score: f64| {
                read_up_to
                    .as_ref()
                    .is_some_and(|(last, at)| score < *at || (score == *at && member <= last.as_slice()))
            };
            for (member, score) in &range {
                if *score > until || entries_left == 0 {
                    return Ok(());
                }
                if !read(member, *score) {
                    entries_left -= 1;
                    f(member, *score);
                }
            }
            let Some((last, at)) = range.last().filter(|_| range.len() == LOG_RANGE as usize) else {
                return Ok(());
            };
            // (when this range's last entry was passed over, those up to the one given
            // back are still to be)
            let passed_over = read(last, *at);
            let rank: Option<isize> = conn.zrank(key, last).await.map_err(|e| self.fail(e))?;
            match rank {
                Some(rank) => {
                    start = rank + 1;
                    if !passed_over {
                        read_up_to = None;
                    }
                }
                None => {
                    start = conn
                        .zcount(key, "-inf", format!("({at}"))
                        .await
                        .map_err(|e| self.fail(e))?;
                    if !passed_over {
                        read_up_to = Some((last.clone(), *at));
                    }
                }
            }
        }
        Ok(())
    }

    /// The string `key` as far as its first [`SHORT_VALUE`] bytes (as text, each byte
    /// that is not UTF-8 replaced), `…` after them when there is more: a limiter's
    /// value or a bucket's state is a few dozen, and a string of another program's
    /// may be any size, which is not read whole or shown whole. `None` for a missing
    /// key; an error for one of another type.
    pub async fn short_string(&self, key: &str) -> Result<Option<String>, Error> {
        let mut conn = self.conn.clone();
        let head: Vec<u8> = conn
            .getrange(key, 0, SHORT_VALUE)
            .await
            .map_err(|e| self.fail(e))?;
        if head.is_empty() && !conn.exists::<_, bool>(key).await.map_err(|e| self.fail(e))? {
            return Ok(None);
        }
        Ok(Some(shortened(&head)))
    }

    /// The value `value_key` and the log `log_key` of one window (both keys of one
    /// limiter, in one cluster slot) as one moment holds them: in one transaction when
    /// the log holds at most [`SNAPSHOT_LOG`] entries, so that no call lands between
    /// the reads (a call moving what left the window from the log into the value would
    /// otherwise be seen in neither); a longer log is read in ranges
    /// ([`Store::each_in_log`]), and the value and the oldest entry read again after
    /// it: `changed` when either moved. Either key of another type is an error.
    pub async fn window(&self, value_key: &str, log_key: &str) -> Result<Window, Error> {
        let mut conn = self.conn.clone();
        let (head, exists, held, log): (Vec<u8>, bool, isize, Entries) = redis::pipe()
            .atomic()
            .getrange(value_key, 0, SHORT_VALUE)
            .exists(value_key)
            .zcard(log_key)
            .zrange_withscores(log_key, 0, SNAPSHOT_LOG - 1)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail(e))?;
        let value = exists.then(|| shortened(&head));
        if held <= SNAPSHOT_LOG {
            return Ok(Window {
                value,
                log,
                changed: false,
            });
        }
        let oldest = log.first().cloned();
        let mut log = Vec::new();
        self.each_in_log(log_key, |member, score| log.push((member.to_vec(), score)))
            .await?;
        let (head_after, exists_after, oldest_after): (Vec<u8>, bool, Entries) = redis::pipe()
            .atomic()
            .getrange(value_key, 0, SHORT_VALUE)
            .exists(value_key)
            .zrange_withscores(log_key, 0, 0)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail(e))?;
        let changed = (exists_after, head_after) != (exists, head)
            || log.first() != oldest.as_ref()
            || oldest_after.first() != oldest.as_ref();
        Ok(Window { value, log, changed })
    }

    /// The types of two keys (`none` for a missing one).
    pub async fn types(&self, a: &str, b: &str) -> Result<(String, String), Error> {
        let mut conn = self.conn.clone();
        redis::pipe()
            .cmd("TYPE")
            .arg(a)
            .cmd("TYPE")
            .arg(b)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.fail(e))
    }

    /// The error a client would answer for `err`, a failure of a command sent here.
    pub fn fail(&self, err: RedisError) -> Error {
        self.conn.error(&err)
    }

    /// Every key matching `pattern` (and of `kind`, when given) on every primary, at
    /// most `limit` of them. A name that is not UTF-8 is passed over: no limiter's
    /// is (Rust's and Redisson's names are text), and another program's key is not
    /// the CLI's to show or delete.
    pub async fn scan(&self, pattern: &str, kind: Option<&str>, limit: usize) -> Result<Vec<String>, Error> {
        let mut found = Vec::new();
        for node in &self.primaries {
            let mut node = node.clone();
            let mut cursor: u64 = 0;
            loop {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(1000);
                if let Some(kind) = kind {
                    cmd.arg("TYPE").arg(kind);
                }
                let (next, keys): (u64, Vec<Vec<u8>>) =
                    cmd.query_async(&mut node).await.map_err(|e| node.error(&e))?;
                found.extend(keys.into_iter().filter_map(|key| String::from_utf8(key).ok()));
                if found.len() >= limit {
                    found.truncate(limit);
                    return Ok(found);
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        Ok(found)
    }
}

/// The time on the Redis server, in epoch milliseconds.
pub async fn server_now(store: &Store) -> Result<i64, Error> {
    let mut conn = store.conn.clone();
    let (secs, micros): (i64, i64) = redis::cmd("TIME")
        .query_async(&mut conn)
        .await
        .map_err(|e| store.fail(e))?;
    Ok(secs * 1000 + micros / 1000)
}

/// `*`, `?`, `[`, `]` and `\` of a key, escaped for a SCAN pattern.
pub fn glob_escape(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use redis::aio::MultiplexedConnection;
    use redis::{AsyncCommands, Cmd};
    use redlimit_test_support::RedisServer;

    use super::{Store, LOG_RANGE};

    /// Entry `i` of a test's log, `per_score` to a score (grants in one millisecond).
    fn entry(i: usize, per_score: usize) -> (String, f64) {
        (format!("m{i:05}"), (1_000 + i / per_score) as f64)
    }

    /// The members of a log of `total` entries, `per_score` to a score, as
    /// [`Store::each_in_log`] reads them while `change` is sent after the `n`th read
    /// (before the reading for 0).
    async fn read_while(total: usize, per_score: usize, changes: &[(usize, Cmd)]) -> Vec<String> {
        let server = RedisServer::start();
        let mut raw = server.raw().await;
        let entries: Vec<(f64, String)> = (0..total)
            .map(|i| (entry(i, per_score).1, entry(i, per_score).0))
            .collect();
        let _: () = raw.zadd_multiple("log", &entries).await.unwrap();
        for (_, cmd) in changes.iter().filter(|(after, _)| *after == 0) {
            cmd.query_async::<()>(&mut raw).await.unwrap();
        }
        let store = Store::open(&server.url()).await.unwrap();
        let handle = tokio::runtime::Handle::current();
        let send = |raw: &mut MultiplexedConnection, cmd: &Cmd| {
            // (the reading waits for it, as if the scripts ran between two ranges)
            tokio::task::block_in_place(|| {
                handle.block_on(async { cmd.query_async::<()>(raw).await.unwrap() })
            })
        };
        let mut seen = Vec::new();
        store
            .each_in_log("log", |member, score| {
                let member = String::from_utf8(member.to_vec()).unwrap();
                if member.starts_with('m') {
                    assert_eq!(score, entry(seen.len(), per_score).1, "{member}");
                }
                seen.push(member);
                for (_, cmd) in changes.iter().filter(|(after, _)| *after == seen.len()) {
                    send(&mut raw, cmd);
                }
            })
            .await
            .unwrap();
        seen
    }

    /// A log read while the scripts change it: its oldest entries dropped, the last
    /// entry of a range given back, an entry added behind the reading and one ahead.
    /// Every entry that was there throughout is read, and read once; the one added
    /// ahead is not (the reading is of the log when it began).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_live_log_is_read_once_through() {
        let (range, total) = (LOG_RANGE as usize, 3 * LOG_RANGE as usize + 500);
        let seen = read_while(
            total,
            10,
            &[
                // the oldest 200 dropped, as the window moves on
                (500, Cmd::zrembyscore("log", "-inf", entry(199, 10).1)),
                // the last entry of the second range given back, once read
                (1_500, Cmd::zrem("log", entry(2 * range - 1, 10).0)),
                // one added behind the reading, one ahead of it
                (2_500, Cmd::zadd("log", "early", 0)),
                (2_500, Cmd::zadd("log", "n-late", 9_999)),
            ],
        )
        .await;
        // (the entry added ahead is newer than the log's newest when the reading began)
        let expected: Vec<String> = (0..total).map(|i| entry(i, 10).0).collect();
        assert_eq!(seen.len(), expected.len());
        assert!(seen == expected, "the entries read differ from the log's");
    }

    /// A range's last entry given back where thousands share its score: the entries
    /// of that score already read are passed over, over more than one range.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_entry_given_back_among_thousands_of_its_score_is_passed() {
        let range = LOG_RANGE as usize;
        let total = 3 * range + 500;
        let seen = read_while(
            total,
            total,
            &[(range * 5 / 2, Cmd::zrem("log", entry(3 * range - 1, total).0))],
        )
        .await;
        let expected: Vec<String> = (0..total).map(|i| entry(i, total).0).collect();
        assert_eq!(seen.len(), expected.len());
        assert!(seen == expected, "the entries read differ from the log's");
    }

    /// `total` entries' log given a range of newer entries after every half range read.
    fn newer_at_each_half_range(total: usize) -> Vec<(usize, Cmd)> {
        let range = LOG_RANGE as usize;
        let newer = |n: usize| {
            let entries: Vec<(f64, String)> = (0..range)
                .map(|i| (1e6 + (n * range + i) as f64, format!("n{n}-{i:04}")))
                .collect();
            Cmd::zadd_multiple("log", &entries)
        };
        (0..total).step_by(range / 2).map(|n| (n + 1, newer(n))).collect()
    }

    /// A log written faster than it is read: 1 000 newer entries added at each half
    /// range. The reading ends at the newest entry when it began.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_log_written_faster_than_it_is_read_ends_where_it_began() {
        let total = 3 * LOG_RANGE as usize;
        let seen = read_while(total, 10, &newer_at_each_half_range(total)).await;
        assert_eq!(seen.len(), total, "read past the log's newest entry");
    }

    /// A log whose newest entry is dated ahead (a skewed clock) while newer entries are
    /// added at each half range: the reading ends after as many entries as the log held.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_log_dated_ahead_is_read_no_further_than_it_held() {
        let total = 3 * LOG_RANGE as usize;
        let mut changes = newer_at_each_half_range(total);
        // (in the log before the reading: the entry a skewed clock dated far ahead)
        changes.insert(0, (0, Cmd::zadd("log", "skewed", 1e9)));
        let seen = read_while(total, 10, &changes).await;
        assert_eq!(seen.len(), total + 1, "read more entries than the log held");
    }

    /// Replaces `log` by 3 000 entries of score 0 named after `generation`, each
    /// generation's sorting before the last's.
    async fn replace_log(raw: &mut MultiplexedConnection, generation: u64) {
        let replace = "redis.call('DEL', KEYS[1]) for i = 1, 3000 do \
                       redis.call('ZADD', KEYS[1], 0, ARGV[1] .. string.format('%05d', i)) end";
        let prefix = format!("g{:06}-", 999_999 - generation);
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(replace).arg(1).arg("log").arg(prefix);
        cmd.query_async::<()>(raw).await.unwrap();
    }

    /// A log replaced again and again while it is read (all of one score, new members
    /// each time): the reading ends, after at most twice the ranges the log filled and
    /// one more.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_log_replaced_while_it_is_read_is_not_followed_for_ever() {
        let server = RedisServer::start();
        replace_log(&mut server.raw().await, 0).await;
        let store = Store::open(&server.url()).await.unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let replacing = {
            let (stop, mut raw) = (stop.clone(), server.raw().await);
            tokio::spawn(async move {
                let mut generation = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    generation += 1;
                    replace_log(&mut raw, generation).await;
                }
            })
        };
        let mut read = 0usize;
        let reading = store.each_in_log("log", |_, _| read += 1);
        let ended = tokio::time::timeout(std::time::Duration::from_secs(20), reading).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        replacing.await.unwrap();
        assert!(ended.is_ok(), "still reading after 20 s");
        assert!(
            read <= 8 * LOG_RANGE as usize,
            "{read} entries read of a log of 3 000"
        );
    }
}
