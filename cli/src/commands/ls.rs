//! `ls`: the sliding windows and token buckets whose names match a pattern, found by
//! SCAN on every primary, with kind, rate, usage and memory, as a table or JSON.

use redlimit_runtime::keys::suffix;
use redlimit_runtime::Error;
use serde_json::json;

use crate::args::{Cli, Sort};
use crate::duration;
use crate::inspect::read_config;
use crate::shown::{shown, shown_width};
use crate::store::{server_now, Store};
use crate::tokens;
use crate::Outcome;

/// One row of `ls`.
struct Row {
    name: String,
    algorithm: &'static str,
    rate: i64,
    interval_ms: i64,
    mode: &'static str,
    /// Share of the rate (window) or burst (bucket) in use, overall limiters only.
    used: Option<f64>,
    memory: u64,
}

async fn memory_usage(store: &Store, keys: &[&str]) -> Result<u64, Error> {
    let mut conn = store.conn.clone();
    let mut memory = 0;
    for key in keys {
        let bytes: Option<u64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .query_async(&mut conn)
            .await
            .map_err(|e| store.fail(e))?;
        memory += bytes.unwrap_or(0);
    }
    Ok(memory)
}

pub async fn ls(cli: &Cli, url: &str, pattern: &str, sort: Sort, limit: usize) -> Outcome {
    let store = Store::open(url).await?;
    let mut rows = window_rows(&store, pattern, limit).await?;
    bucket_rows(&store, pattern, limit, &mut rows).await?;
    match sort {
        Sort::Name => rows.sort_by(|a, b| a.name.cmp(&b.name)),
        Sort::Usage => rows.sort_by(|a, b| b.used.unwrap_or(-1.0).total_cmp(&a.used.unwrap_or(-1.0))),
        Sort::Memory => rows.sort_by_key(|r| std::cmp::Reverse(r.memory)),
    }
    if cli.json {
        let list: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({"name": r.name, "algorithm": r.algorithm, "rate": r.rate, "interval_ms": r.interval_ms, "mode": r.mode, "usage": r.used, "memory_bytes": r.memory})
            })
            .collect();
        println!("{}", json!(list));
    } else {
        print_rows(&rows);
    }
    Ok(())
}

/// The sliding windows matching `pattern`, at most `limit`. Hashes only; a hash is a
/// limiter when it has a rate and an interval. The scan reads at most ten times the
/// limit of hashes, so a huge keyspace stays bounded.
async fn window_rows(store: &Store, pattern: &str, limit: usize) -> Result<Vec<Row>, Error> {
    let hashes = store
        .scan(pattern, Some("hash"), limit.saturating_mul(10))
        .await?;
    let mut rows = Vec::new();
    for name in hashes {
        if rows.len() >= limit {
            break;
        }
        let Some(config) = read_config(store, &name).await? else {
            continue;
        };
        let value_key = suffix(&name, "value");
        let log_key = suffix(&name, "permits");
        let value: Option<i64> = store
            .short_string(&value_key)
            .await
            .ok()
            .flatten()
            .as_deref()
            .and_then(crate::store::limiter_value);
        let memory = memory_usage(store, &[&name, &value_key, &log_key]).await?;
        let used = match (config.mode, value) {
            (0, Some(v)) if config.rate > 0 => {
                Some(config.rate.saturating_sub(v) as f64 / config.rate as f64)
            }
            _ => None,
        };
        rows.push(Row {
            name,
            algorithm: "window",
            rate: config.rate,
            interval_ms: config.interval_ms,
            mode: config.mode_name(),
            used,
            memory,
        });
    }
    Ok(rows)
}

/// A token bucket of `ls`: its state (the overall key's, or a client's), whether it
/// is per client, and all its keys.
type Bucket = (Option<tokens::State>, bool, Vec<String>);

/// The token buckets matching `pattern` added to `rows`, until `limit` rows.
async fn bucket_rows(store: &Store, pattern: &str, limit: usize, rows: &mut Vec<Row>) -> Result<(), Error> {
    for (name, (state, per_client, keys)) in buckets_matching(store, pattern, limit).await? {
        if rows.len() >= limit {
            break;
        }
        let Some(state) = state else {
            continue;
        };
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let memory = memory_usage(store, &keys).await?;
        rows.push(Row {
            name,
            algorithm: "bucket",
            rate: state.rate,
            interval_ms: state.interval_ms,
            mode: if per_client { "per_client" } else { "overall" },
            used: (!per_client).then(|| 1.0 - state.tokens() as f64 / state.burst as f64),
            memory,
        });
    }
    Ok(())
}

/// Token buckets by limiter name: strings `{NAME}:bucket` (`NAME:bucket` for a NAME
/// with braces), `...:CLIENT_ID` per client; NAME matching the pattern. At most ten
/// times `limit` keys are read.
async fn buckets_matching(
    store: &Store,
    pattern: &str,
    limit: usize,
) -> Result<std::collections::BTreeMap<String, Bucket>, Error> {
    let mut bucket_keys = Vec::new();
    for form in [format!("{{{pattern}}}:bucket*"), format!("{pattern}:bucket*")] {
        if bucket_keys.len() >= limit.saturating_mul(10) {
            break;
        }
        let budget = limit.saturating_mul(10) - bucket_keys.len();
        bucket_keys.extend(store.scan(&form, Some("string"), budget).await?);
    }
    bucket_keys.sort();
    bucket_keys.dedup();
    let now = server_now(store).await?;
    let mut buckets: std::collections::BTreeMap<String, Bucket> = Default::default();
    for key in bucket_keys {
        let Some((name, client)) = tokens::limiter_of(&key) else {
            continue;
        };
        if !tokens::glob_match(pattern, &name) {
            continue;
        }
        let entry = buckets.entry(name).or_default();
        if entry.0.is_none() {
            let raw = store.short_string(&key).await?;
            entry.0 = raw.as_deref().and_then(tokens::State::parse).map(|s| s.at(now));
        }
        entry.1 |= client.is_some();
        entry.2.push(key);
    }
    Ok(buckets)
}

/// `ls`'s table. (Formatted here: one header and one row format, with the name column
/// as wide as the longest name, is what a table crate would be asked for.)
fn print_rows(rows: &[Row]) {
    let width = rows
        .iter()
        .map(|r| shown_width(&r.name))
        .max()
        .unwrap_or(4)
        .max(4);
    println!(
        "{:<width$}  {:<6}  {:>10}  {:>8}  {:<10}  {:>6}  {:>10}",
        "NAME", "KIND", "RATE", "INTERVAL", "MODE", "USAGE", "MEMORY"
    );
    for r in rows {
        println!(
            "{:<width$}  {:<6}  {:>10}  {:>8}  {:<10}  {:>6}  {:>10}",
            shown(&r.name),
            r.algorithm,
            r.rate,
            duration::show_ms(r.interval_ms.max(0) as u64),
            r.mode,
            r.used.map_or("-".to_owned(), |u| format!("{:.0}%", u * 100.0)),
            r.memory
        );
    }
}
