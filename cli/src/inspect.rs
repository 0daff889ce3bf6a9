//! One limiter as it is stored: its config, keys, TTLs, value and grant log, per-client
//! keys, and what is wrong with it. Read-only: nothing is written or released.

use redis::AsyncCommands;
use redlimit_runtime::keys::suffix;
use redlimit_runtime::member::decode_permits;
use redlimit_runtime::Error;
use serde_json::{json, Value as Json};

use crate::duration::{show_ms, show_secs};
use crate::store::{glob_escape, server_now, Store};
use crate::tokens;
use crate::words::count;

/// A limiter's config as stored in its hash.
#[derive(Debug, Clone)]
pub struct Config {
    pub rate: i64,
    pub interval_ms: i64,
    /// 0 overall, 1 per client.
    pub mode: i64,
    /// `None`: no `keepAliveTime` field (written by Redisson before 4.4).
    pub keep_alive_ms: Option<i64>,
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
        }),
        _ => None,
    })
}

/// One key: its type and TTL (`-2` missing, `-1` none, else milliseconds).
#[derive(Debug, Clone)]
pub struct KeyState {
    pub key: String,
    pub kind: String,
    pub ttl_ms: i64,
}

async fn key_state(store: &Store, key: &str) -> Result<KeyState, Error> {
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
    let mut conn = store.conn.clone();
    let entries: Vec<(Vec<u8>, f64)> = conn
        .zrange_withscores(key, 0, -1)
        .await
        .map_err(|e| store.fail(e))?;
    let mut log = Log::default();
    for (member, score) in entries {
        let score = score as i64;
        log.entries += 1;
        let Some(permits) = decode_permits(&member) else {
            log.undecodable += 1;
            continue;
        };
        let permits = u64::from(permits);
        log.permits += permits;
        log.oldest_ms = Some(log.oldest_ms.map_or(score, |o| o.min(score)));
        log.newest_ms = Some(log.newest_ms.map_or(score, |n| n.max(score)));
        if score > now - interval_ms {
            log.in_window_entries += 1;
            log.in_window_permits += permits;
            let release = score + interval_ms;
            log.next_release_ms = Some(log.next_release_ms.map_or(release, |r| r.min(release)));
        }
    }
    Ok(log)
}

/// The state of one mode's value and log (overall, or one client's).
#[derive(Debug, Clone)]
pub struct Bucket {
    /// `None` for overall, else the client id.
    pub client: Option<String>,
    pub value_key: KeyState,
    pub value: Option<i64>,
    pub log_key: KeyState,
    pub log: Log,
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
    let mut conn = store.conn.clone();
    let key = key_state(store, &key).await?;
    let raw: Option<String> = if key.kind == "string" {
        conn.get(&key.key).await.map_err(|e| store.fail(e))?
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

/// A limiter, read whole.
#[derive(Debug, Clone)]
pub struct Inspection {
    pub name: String,
    pub now_ms: i64,
    pub config: Option<Config>,
    pub config_key: KeyState,
    pub buckets: Vec<Bucket>,
    /// Its token bucket's keys, when it is one.
    pub token_buckets: Vec<TokenKey>,
    /// Per-client keys found (for a per_client limiter, one bucket per client).
    pub client_keys: usize,
    pub problems: Vec<String>,
    pub notes: Vec<String>,
}

async fn bucket(
    store: &Store,
    client: Option<String>,
    value_key: String,
    log_key: String,
    now: i64,
    interval_ms: i64,
) -> Result<Bucket, Error> {
    let mut conn = store.conn.clone();
    let value_state = key_state(store, &value_key).await?;
    let value: Option<String> = if value_state.kind == "string" {
        conn.get(&value_key).await.map_err(|e| store.fail(e))?
    } else {
        None
    };
    let log_state = key_state(store, &log_key).await?;
    let log = if log_state.kind == "zset" {
        read_log(store, &log_key, now, interval_ms).await?
    } else {
        Log::default()
    };
    Ok(Bucket {
        client,
        value_key: value_state,
        value: value.and_then(|v| v.parse().ok()),
        log_key: log_state,
        log,
    })
}

/// The clients with window keys (value or log) of their own, sorted, and how many
/// such keys there are.
async fn window_clients(
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

pub async fn inspect(store: &Store, name: &str, client_limit: usize) -> Result<Inspection, Error> {
    let now = server_now(store).await?;
    let config_key = key_state(store, name).await?;
    let config = if config_key.kind == "hash" {
        read_config(store, name).await?
    } else {
        None
    };
    let interval_ms = config.as_ref().map_or(0, |c| c.interval_ms);
    let value_key = suffix(name, "value");
    let log_key = suffix(name, "permits");
    let mut buckets = vec![bucket(store, None, value_key.clone(), log_key.clone(), now, interval_ms).await?];
    let (clients, window_client_keys) = window_clients(store, &value_key, &log_key).await?;
    let (token_buckets, token_clients) = token_keys(store, name, now, client_limit).await?;
    let client_keys = window_client_keys + token_clients;
    for client in clients.iter().take(client_limit) {
        buckets.push(
            bucket(
                store,
                Some(client.clone()),
                format!("{value_key}:{client}"),
                format!("{log_key}:{client}"),
                now,
                interval_ms,
            )
            .await?,
        );
    }
    let mut inspection = Inspection {
        name: name.to_owned(),
        now_ms: now,
        config,
        config_key,
        buckets,
        token_buckets,
        client_keys,
        problems: Vec::new(),
        notes: Vec::new(),
    };
    for (count, what) in [(clients.len(), "window"), (token_clients, "token bucket")] {
        if count > client_limit {
            inspection.notes.push(format!(
                "{count} clients have {what} keys; the first {client_limit} are shown (--clients)"
            ));
        }
    }
    diagnose(&mut inspection);
    // The server's eviction policy (CONFIG GET, else INFO memory): one that can evict
    // limiter keys makes every limit forgettable.
    let mut conn = store.conn.clone();
    if let Ok(Some(eviction)) = redlimit_runtime::read_eviction(&mut conn).await {
        if eviction.can_evict() {
            inspection.problems.push(eviction.warning("this server"));
        }
    }
    Ok(inspection)
}

/// What is wrong with a token bucket's keys (problems) and worth knowing (notes).
fn diagnose_tokens(i: &mut Inspection) {
    for t in &i.token_buckets {
        if t.key.kind != "string" {
            i.problems.push(format!(
                "`{}` is a {}, not a token bucket's string",
                t.key.key, t.key.kind
            ));
        } else if t.state.is_none() {
            i.problems.push(format!(
                "`{}` holds {:?}, not a token bucket's state (rate:interval:burst:tokens:at); \
                 delete it (a missing bucket is a full one)",
                t.key.key,
                t.raw.as_deref().unwrap_or_default()
            ));
        } else if t.key.ttl_ms == -1 {
            i.problems.push(format!(
                "`{}` has no TTL: every write of a bucket sets one (until it is full again), \
                 so this key will never expire",
                t.key.key
            ));
        }
    }
    if i.config.is_some() && !i.token_buckets.is_empty() {
        i.notes.push(format!(
            "`{}` is both a sliding window (its config hash) and a token bucket: two rules of \
             different algorithms use this name",
            i.name
        ));
    }
}

/// Whether a key exists (TTL -2 is Redis's "no such key").
fn exists(k: &KeyState) -> bool {
    k.ttl_ms != -2
}

/// What is wrong (problems) and worth knowing (notes).
fn diagnose(i: &mut Inspection) {
    diagnose_tokens(i);
    diagnose_config_key(i);
    let Some(config) = i.config.clone() else {
        return;
    };
    diagnose_expiry(i, &config);
    for b in 0..i.buckets.len() {
        diagnose_window(i, b, &config);
    }
}

/// The config key: missing with state left behind, or not a config hash.
fn diagnose_config_key(i: &mut Inspection) {
    let any_state = i
        .buckets
        .iter()
        .any(|b| exists(&b.value_key) || exists(&b.log_key));
    match (&i.config, i.config_key.kind.as_str()) {
        (None, "none") if any_state => i.problems.push(format!(
            "no config at `{}`, but value or permits keys exist: state left behind (a deleted config, or keys that outlived it)",
            i.name
        )),
        (None, "none") => {}
        (None, "hash") => i.problems.push(format!("`{}` is a hash without rate and interval: not a limiter's config", i.name)),
        (None, kind) => i.problems.push(format!("`{}` is a {kind}, not a limiter's config hash", i.name)),
        _ => {}
    }
}

/// Keys without a TTL: a problem under a keep-alive, else a note.
fn diagnose_expiry(i: &mut Inspection, config: &Config) {
    let keep_alive = config.keep_alive_ms.unwrap_or(0) > 0;
    let no_ttl: Vec<String> = std::iter::once(&i.config_key)
        .chain(i.buckets.iter().flat_map(|b| [&b.value_key, &b.log_key]))
        .filter(|k| k.ttl_ms == -1)
        .map(|k| format!("`{}`", k.key))
        .collect();
    if !no_ttl.is_empty() && keep_alive {
        i.problems.push(format!(
            "{} without TTL although the limiter has a keep-alive of {}: they will never expire",
            no_ttl.join(", "),
            show_ms(config.keep_alive_ms.unwrap_or(0) as u64)
        ));
    } else if !no_ttl.is_empty() {
        i.notes.push(format!(
            "{} never expire (no keep-alive, Redisson's default): one limiter per user or client piles up",
            no_ttl.join(", ")
        ));
    }
}

/// One window (`i.buckets[b]`): its keys' types, its value against its log and rate,
/// members that are not grants.
fn diagnose_window(i: &mut Inspection, b: usize, config: &Config) {
    let (mut problems, mut notes) = (Vec::new(), Vec::new());
    let b = &i.buckets[b];
    for (key, expected) in [(&b.value_key, "string"), (&b.log_key, "zset")] {
        if exists(key) && key.kind != expected {
            problems.push(format!("`{}` is a {}, not a {expected}", key.key, key.kind));
        }
    }
    if let Some(value) = b.value {
        if value < 0 {
            problems.push(format!(
                "`{}` is {value}: the rate was lowered below what the window holds; calls are refused until the window drains",
                b.value_key.key
            ));
        }
        if b.log.undecodable == 0 && value + b.log.permits as i64 != config.rate {
            problems.push(format!(
                "value {value} + {} permits in the log = {}, not the rate {}: permits were lost or counted twice",
                b.log.permits,
                value + b.log.permits as i64,
                config.rate
            ));
        }
    } else if exists(&b.log_key) {
        notes.push(format!(
            "`{}` is missing: the next call rebuilds it from the log",
            b.value_key.key
        ));
    }
    if b.log.undecodable > 0 {
        problems.push(format!(
            "{} members of `{}` do not decode as grants",
            b.log.undecodable, b.log_key.key
        ));
    }
    i.problems.extend(problems);
    i.notes.extend(notes);
}

/// A token bucket's key and state for `--json`.
fn token_json(t: &TokenKey, key: Json) -> Json {
    let Some(s) = &t.state else {
        return json!({"client": t.client, "key": key, "stored": t.raw});
    };
    json!({
        "client": t.client,
        "key": key,
        "stored": t.raw,
        "rate": s.rate,
        "interval_ms": s.interval_ms,
        "burst": s.burst,
        "warmup_ms": s.warmup_ms,
        "tokens": s.tokens(),
        "full_in_ms": s.full_in_ms(),
        "coldness": s.coldness(),
        "cost_per_permit": s.cost_per_permit(),
        "expires_in_ms": s.rested_in_ms(),
    })
}

/// A token bucket's config: `10 per 1m, burst 20, warm-up 30s`.
pub fn token_config(s: &tokens::State) -> String {
    let warmup = if s.warmup_ms > 0 {
        format!(", warm-up {}", show_ms(s.warmup_ms as u64))
    } else {
        String::new()
    };
    format!(
        "{} per {}, burst {}{warmup}",
        s.rate,
        show_ms(s.interval_ms as u64),
        s.burst
    )
}

/// A token bucket's state: `7 tokens of 20, full in 12.0s; coldness 40%, ...`.
pub fn token_line(s: &tokens::State) -> String {
    let mut line = format!(
        "{} of {}, full in {}",
        count(s.tokens(), "token", "tokens"),
        s.burst,
        show_secs(s.full_in_ms())
    );
    if let Some(coldness) = s.coldness() {
        line.push_str(&format!(
            "; coldness {:.0}% (a permit costs {:.2} tokens), cold again in {}",
            coldness * 100.0,
            s.cost_per_permit(),
            show_secs(s.rested_in_ms())
        ));
    }
    line
}

impl Inspection {
    pub fn json(&self) -> Json {
        let key = |k: &KeyState| json!({"key": k.key, "type": k.kind, "ttl_ms": k.ttl_ms});
        let buckets: Vec<Json> = self
            .buckets
            .iter()
            .map(|b| {
                json!({
                    "client": b.client,
                    "value_key": key(&b.value_key),
                    "value": b.value,
                    "available_now": b.value.map(|v| v + (b.log.permits - b.log.in_window_permits) as i64),
                    "log_key": key(&b.log_key),
                    "log": {
                        "entries": b.log.entries,
                        "permits": b.log.permits,
                        "entries_in_window": b.log.in_window_entries,
                        "permits_in_window": b.log.in_window_permits,
                        "undecodable": b.log.undecodable,
                        "oldest_age_ms": b.log.oldest_ms.map(|t| self.now_ms - t),
                        "newest_age_ms": b.log.newest_ms.map(|t| self.now_ms - t),
                        "next_release_in_ms": b.log.next_release_ms.map(|t| t - self.now_ms),
                    },
                })
            })
            .collect();
        json!({
            "name": self.name,
            "config_key": key(&self.config_key),
            "config": self.config.as_ref().map(|c| json!({
                "rate": c.rate,
                "interval_ms": c.interval_ms,
                "mode": c.mode_name(),
                "keep_alive_ms": c.keep_alive_ms,
                "written_by": c.writer(),
            })),
            "buckets": buckets,
            "token_buckets": self.token_buckets.iter().map(|t| token_json(t, key(&t.key))).collect::<Vec<_>>(),
            "client_keys": self.client_keys,
            "healthy": self.problems.is_empty(),
            "problems": self.problems,
            "notes": self.notes,
        })
    }

    pub fn human(&self) -> String {
        let mut out = Lines::default();
        out.line("limiter", self.name.clone());
        self.config_lines(&mut out);
        self.key_lines(&mut out);
        self.window_lines(&mut out);
        self.bucket_lines(&mut out);
        out.line("client keys", self.client_keys.to_string());
        if self.problems.is_empty() {
            out.line("health", "ok".to_owned());
        }
        for p in &self.problems {
            out.line("PROBLEM", p.clone());
        }
        for n in &self.notes {
            out.line("note", n.clone());
        }
        out.0
    }

    /// The window's config and who wrote it; a token bucket's config.
    fn config_lines(&self, out: &mut Lines) {
        match &self.config {
            Some(c) => {
                out.line(
                    "config",
                    format!(
                        "{} per {}, {}, keep-alive {}",
                        c.rate,
                        show_ms(c.interval_ms.max(0) as u64),
                        c.mode_name(),
                        c.keep_alive_ms
                            .filter(|k| *k > 0)
                            .map_or("none".to_owned(), |k| show_ms(k as u64))
                    ),
                );
                out.line("written by", c.writer().to_owned());
            }
            None if self.token_buckets.is_empty() => out.line("config", "none".to_owned()),
            None => {}
        }
        if let Some(state) = self.token_buckets.iter().find_map(|t| t.state) {
            out.line("token bucket", token_config(&state));
        }
    }

    /// Every key, its type and its TTL, in a column.
    fn key_lines(&self, out: &mut Lines) {
        let ttl = |k: &KeyState| match k.ttl_ms {
            -2 => "missing".to_owned(),
            -1 => "no TTL".to_owned(),
            ms => format!("TTL {}", show_secs(ms)),
        };
        out.line("keys", String::new());
        let mut keys = vec![&self.config_key];
        for b in &self.buckets {
            keys.push(&b.value_key);
            keys.push(&b.log_key);
        }
        // A token bucket alone: the window's missing keys are not its own.
        if self.config.is_none() && !self.token_buckets.is_empty() {
            keys.retain(|k| k.ttl_ms != -2);
        }
        keys.extend(self.token_buckets.iter().map(|t| &t.key));
        let width = keys.iter().map(|k| k.key.len()).max().unwrap_or(0);
        for k in keys {
            out.line("", format!("{:<width$}  {:<6}  {}", k.key, k.kind, ttl(k)));
        }
    }

    /// Each window's value and log (overall, then per client).
    fn window_lines(&self, out: &mut Lines) {
        for b in &self.buckets {
            if b.value.is_none() && b.log.entries == 0 {
                continue;
            }
            if let Some(client) = &b.client {
                out.line("client", client.clone());
            }
            let who = if b.client.is_some() { "" } else { "overall" };
            let available = b.value.map_or("-".to_owned(), |v| {
                (v + (b.log.permits - b.log.in_window_permits) as i64).to_string()
            });
            out.line(
                who,
                format!(
                    "value {}, available now {available}; log {}, {} in the window ({})",
                    b.value.map_or("missing".to_owned(), |v| v.to_string()),
                    count(b.log.entries, "entry", "entries"),
                    count(b.log.in_window_permits, "permit", "permits"),
                    count(b.log.in_window_entries, "entry", "entries")
                ),
            );
            if let (Some(oldest), Some(newest)) = (b.log.oldest_ms, b.log.newest_ms) {
                out.line("", self.grant_ages(oldest, newest, b.log.next_release_ms));
            }
        }
    }

    /// `oldest grant 12.0s ago, newest 1.0s ago, next release in 48.0s`.
    fn grant_ages(&self, oldest: i64, newest: i64, next_release: Option<i64>) -> String {
        format!(
            "oldest grant {} ago, newest {} ago{}",
            show_secs(self.now_ms - oldest),
            show_secs(self.now_ms - newest),
            next_release.map_or(String::new(), |r| format!(
                ", next release in {}",
                show_secs(r - self.now_ms)
            ))
        )
    }

    /// Each token bucket's state (overall, then per client).
    fn bucket_lines(&self, out: &mut Lines) {
        for t in &self.token_buckets {
            if let Some(client) = &t.client {
                out.line("client", client.clone());
            }
            let who = if t.client.is_some() { "" } else { "overall" };
            match &t.state {
                Some(state) => out.line(who, token_line(state)),
                None => out.line(who, "not a token bucket's state".to_owned()),
            }
        }
    }
}

/// The text `inspect` prints: a label in a column of 14, then its text.
#[derive(Default)]
struct Lines(String);

impl Lines {
    /// A labelled line; `text` (names, stored values) is [`shown`](crate::shown::shown)
    /// escaped, so that it stays on its line.
    fn line(&mut self, label: &str, text: String) {
        let text = crate::shown::shown(&text);
        let out = &mut self.0;
        // A label too long for its column gets a line of its own.
        if label.len() >= 14 {
            out.push_str(label);
            out.push('\n');
            out.push_str(format!("{:<14}{text}", "").trim_end());
        } else {
            out.push_str(format!("{label:<14}{text}").trim_end());
        }
        out.push('\n');
    }
}
