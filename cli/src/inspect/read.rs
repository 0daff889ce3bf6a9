//! What `inspect` reads from Redis: a limiter's config hash, each key's type and TTL,
//! a window's value and grant log (overall and each client's), a token bucket's keys
//! and state. Read-only: nothing is written or released.

use redis::AsyncCommands;
use redlimit_runtime::algorithm::stored_number;
use redlimit_runtime::keys::suffix;
use redlimit_runtime::member::decode_permits;
use redlimit_runtime::Error;

use crate::store::{glob_escape, Store};
use crate::tokens;

/// A limiter's config as stored in its hash.
#[derive(Debug, Clone)]
pub struct Config {
    pub rate: i64,
    pub interval_ms: i64,
    /// 0 overall, 1 per client.
    pub mode: i64,
    /// `None`: no `keepAliveTime` field (written by Redisson before 4.4).
    pub keep_alive_ms: Option<i64>,
    /// Why a call refuses this config, as the scripts read its text (`rate="+10"`,
    /// no `type`); `None` when it does not.
    pub call_refuses: Option<String>,
}

impl Config {
    pub fn mode_name(&self) -> &'static str {
        if self.mode == 1 {
            "per_client"
        } else {
            "overall"
        }
    }

    /// Whether a rule most likely wrote it: rules write keep-alive = interval, the
    /// runtime API and Redisson what they are given.
    pub fn rule_wrote(&self) -> bool {
        self.keep_alive_ms == Some(self.interval_ms)
    }

    /// Who wrote it, where that can be told.
    pub fn writer(&self) -> &'static str {
        match self.keep_alive_ms {
            None => "Redisson before 4.4 (no keepAliveTime field; redlimit always writes one)",
            Some(k) if k == self.interval_ms => {
                "a redlimit rule, most likely: rules write keep-alive = interval (as would a \
                 client given that keep-alive)"
            }
            Some(_) => "redlimit's runtime API or Redisson 4.4+ (they write the same fields)",
        }
    }
}

/// Reads the config hash `name`; `None` when it has no rate and interval.
pub async fn read_config(store: &Store, name: &str) -> Result<Option<Config>, Error> {
    let mut conn = store.conn.clone();
    // The four fields only: `ls` reads every hash it finds, some of them large (the
    // refusal counts processes report).
    let fields: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(name)
        .arg(&["rate", "interval", "type", "keepAliveTime"])
        .query_async(&mut conn)
        .await
        .map_err(|e| store.fail(e))?;
    let number = |i: usize| fields.get(i)?.as_deref()?.parse::<i64>().ok();
    Ok(match (number(0), number(1)) {
        (Some(rate), Some(interval_ms)) => Some(Config {
            rate,
            interval_ms,
            mode: number(2).unwrap_or(0),
            keep_alive_ms: number(3),
            call_refuses: call_refuses(&fields),
        }),
        _ => None,
    })
}

/// Why a call refuses the config fields `rate`, `interval`, `type`, `keepAliveTime`, as
/// the scripts check their text (`algorithm::stored_number`: digits up to 2^53, read as
/// text), rate and interval from 1, type `0` or `1`.
fn call_refuses(fields: &[Option<String>]) -> Option<String> {
    let field = |i: usize| fields.get(i).cloned().flatten();
    let decimal = |text: &str, least: u64| stored_number(text).is_some_and(|n| n >= least);
    for (i, name, least) in [(0, "rate", 1), (1, "interval", 1)] {
        match field(i) {
            Some(text) if decimal(&text, least) => {}
            Some(text) => return Some(format!("{name}={text:?}")),
            None => return Some(format!("no {name}")),
        }
    }
    match field(2).as_deref() {
        Some("0" | "1") => {}
        Some(text) => return Some(format!("type={text:?}")),
        None => return Some("no type".to_owned()),
    }
    match field(3) {
        Some(text) if !decimal(&text, 0) => Some(format!("keepAliveTime={text:?}")),
        _ => None,
    }
}

/// One key: its type and TTL (`-2` missing, `-1` none, else milliseconds).
#[derive(Debug, Clone)]
pub struct KeyState {
    pub key: String,
    pub kind: String,
    pub ttl_ms: i64,
}

pub(super) async fn key_state(store: &Store, key: &str) -> Result<KeyState, Error> {
    let mut conn = store.conn.clone();
    let kind: String = redis::cmd("TYPE")
        .arg(key)
        .query_async(&mut conn)
        .await
        .map_err(|e| store.fail(e))?;
    let ttl_ms: i64 = conn.pttl(key).await.map_err(|e| store.fail(e))?;
    Ok(KeyState {
        key: key.to_owned(),
        kind,
        ttl_ms,
    })
}

/// A grant log, summed up at `now`.
#[derive(Debug, Clone, Default)]
pub struct Log {
    pub entries: u64,
    pub permits: u64,
    pub in_window_entries: u64,
    pub in_window_permits: u64,
    pub undecodable: u64,
    pub oldest_ms: Option<i64>,
    pub newest_ms: Option<i64>,
    /// When the oldest grant still in the window leaves it.
    pub next_release_ms: Option<i64>,
}

async fn read_log(store: &Store, key: &str, now: i64, interval_ms: i64) -> Result<Log, Error> {
    let mut log = Log::default();
    store
        .each_in_log(key, |member, score| {
            let score = score as i64;
            log.entries += 1;
            let Some(permits) = decode_permits(member) else {
                log.undecodable += 1;
                return;
            };
            let permits = u64::from(permits);
            log.permits += permits;
            log.oldest_ms = Some(log.oldest_ms.map_or(score, |o| o.min(score)));
            log.newest_ms = Some(log.newest_ms.map_or(score, |n| n.max(score)));
            if score > now.saturating_sub(interval_ms) {
                log.in_window_entries += 1;
                log.in_window_permits += permits;
                let release = score.saturating_add(interval_ms);
                log.next_release_ms = Some(log.next_release_ms.map_or(release, |r| r.min(release)));
            }
        })
        .await?;
    Ok(log)
}

/// The state of one mode's value and log (overall, or one client's).
#[derive(Debug, Clone)]
pub struct Bucket {
    /// `None` for overall, else the client id.
    pub client: Option<String>,
    pub value_key: KeyState,
    pub value: Option<i64>,
    /// The value key's text when it is not read as a value (see `store::unread_value`).
    pub unread: Option<String>,
    pub log_key: KeyState,
    pub log: Log,
    /// The permits a call finds available now (`crate::peek::next_call`); `None` when a
    /// call fails on the state, or there is no config.
    pub available_now: Option<i64>,
}

/// One token bucket's key and state (overall, or one client's).
#[derive(Debug, Clone)]
pub struct TokenKey {
    /// `None` for overall, else the client id.
    pub client: Option<String>,
    pub key: KeyState,
    /// What the key holds, when a string.
    pub raw: Option<String>,
    /// The stored state refilled to now, when it is one.
    pub state: Option<tokens::State>,
}

async fn token_key(store: &Store, client: Option<String>, key: String, now: i64) -> Result<TokenKey, Error> {
    let key = key_state(store, &key).await?;
    let raw: Option<String> = if key.kind == "string" {
        store.short_string(&key.key).await?
    } else {
        None
    };
    let state = raw.as_deref().and_then(tokens::State::parse).map(|s| s.at(now));
    Ok(TokenKey {
        client,
        key,
        raw,
        state,
    })
}

/// The token bucket keys of limiter `name` (overall, then at most `client_limit`
/// clients'), and how many clients have one.
pub async fn token_keys(
    store: &Store,
    name: &str,
    now: i64,
    client_limit: usize,
) -> Result<(Vec<TokenKey>, usize), Error> {
    let key = suffix(name, "bucket");
    let mut found = Vec::new();
    let overall = token_key(store, None, key.clone(), now).await?;
    if overall.key.ttl_ms != -2 {
        found.push(overall);
    }
    let mut clients: Vec<String> = store
        .scan(&format!("{}:*", glob_escape(&key)), None, usize::MAX)
        .await?
        .into_iter()
        .filter_map(|k| k.strip_prefix(&format!("{key}:")).map(str::to_owned))
        .collect();
    clients.sort();
    clients.dedup();
    for client in clients.iter().take(client_limit) {
        found.push(token_key(store, Some(client.clone()), format!("{key}:{client}"), now).await?);
    }
    Ok((found, clients.len()))
}

pub(super) async fn bucket(
    store: &Store,
    client: Option<String>,
    value_key: String,
    log_key: String,
    now: i64,
    config: Option<&Config>,
) -> Result<Bucket, Error> {
    let interval_ms = config.map_or(0, |c| c.interval_ms);
    let value_state = key_state(store, &value_key).await?;
    let value: Option<String> = if value_state.kind == "string" {
        store.short_string(&value_key).await?
    } else {
        None
    };
    let log_state = key_state(store, &log_key).await?;
    let log = if log_state.kind == "zset" {
        read_log(store, &log_key, now, interval_ms).await?
    } else {
        Log::default()
    };
    // What a call of 1 finds, read again as one moment holds it, for the keys a call
    // of the config's mode reads (the overall keys, or a client's); none when a call
    // fails on them or this tool does not follow its arithmetic there.
    let read = match config.filter(|c| (c.mode == 1) == client.is_some()) {
        Some(config) => crate::peek::read_window(store, &value_key, config, &value_key, &log_key)
            .await?
            .ok()
            .map(|(value, log)| crate::peek::next_call(&log, value, config, now, 1).available),
        None => None,
    };
    let available_now = read;
    Ok(Bucket {
        client,
        value_key: value_state,
        value: value.as_deref().and_then(crate::store::limiter_value),
        unread: value.filter(|text| crate::store::limiter_value(text).is_none()),
        log_key: log_state,
        log,
        available_now,
    })
}

/// The clients with window keys (value or log) of their own, sorted, and how many
/// such keys there are.
pub(super) async fn window_clients(
    store: &Store,
    value_key: &str,
    log_key: &str,
) -> Result<(Vec<String>, usize), Error> {
    let pattern = format!("{}:*", glob_escape(value_key));
    let client_values = store.scan(&pattern, None, usize::MAX).await?;
    let client_logs = store
        .scan(&format!("{}:*", glob_escape(log_key)), None, usize::MAX)
        .await?;
    let mut clients: Vec<String> = client_values
        .iter()
        .filter_map(|k| k.strip_prefix(&format!("{value_key}:")))
        .chain(
            client_logs
                .iter()
                .filter_map(|k| k.strip_prefix(&format!("{log_key}:"))),
        )
        .map(str::to_owned)
        .collect();
    clients.sort();
    clients.dedup();
    Ok((clients, client_values.len() + client_logs.len()))
}
