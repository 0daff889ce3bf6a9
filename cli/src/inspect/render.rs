//! A limiter as `inspect` prints it: labelled lines for people (names and stored
//! values escaped), or one JSON document with `--json`.

use serde_json::{json, Value as Json};

use super::read::{KeyState, TokenKey};
use super::Inspection;
use crate::duration::{show_ms, show_secs};
use crate::tokens;
use crate::words::count;

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
                    "available_now": b.available_now,
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
            let available = b.available_now.map_or("-".to_owned(), |v| v.to_string());
            out.line(
                who,
                format!(
                    "value {}, available now {available}; log {}, {} in the window ({})",
                    match (b.value, &b.unread) {
                        (Some(v), _) if v < 0 => format!("{v} (a debt)"),
                        (Some(v), _) => v.to_string(),
                        (None, Some(text)) => format!("{text:?} (not read as a value)"),
                        (None, None) => "missing".to_owned(),
                    },
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
