//! `watch`: a limiter followed at every refresh, at the server's time: what was
//! granted or spent, the refusals processes reported, what is left.

use std::io::Write;
use std::time::Duration;

use redlimit_runtime::keys::suffix;
use redlimit_runtime::Error;
use serde_json::json;

use crate::args::Cli;
use crate::duration;
use crate::inspect::{read_config, token_keys, Config};
use crate::store::{server_now, Store};
use crate::tokens;
use crate::words::{not_found, per_client};
use crate::{Failure, Outcome};

/// Refusals of a limiter that processes reported for some seconds, and whether that
/// count is complete.
#[derive(Debug, Clone, Copy)]
struct Refused {
    count: u64,
    /// False when a second's reports went past a process's budget of limiters (its
    /// other refusals counted under their rule, `rule:<name>` fields): some of this
    /// limiter's may be among those.
    complete: bool,
}

impl Refused {
    /// The count as `watch` shows it: `12+` when incomplete.
    fn shown(&self) -> String {
        match self.complete {
            true => self.count.to_string(),
            false => format!("{}+", self.count),
        }
    }
}

/// Refusals of the limiter `name` that processes reported for the seconds in
/// `(after, through]`.
async fn reported_refusals(
    store: &Store,
    prefix: &str,
    name: &str,
    after: i64,
    through: i64,
) -> Result<Refused, Error> {
    let mut conn = store.conn.clone();
    let mut refused = Refused {
        count: 0,
        complete: true,
    };
    for second in after + 1..=through {
        let key = format!("{prefix}{}:refused:{second}", redlimit_runtime::LIBRARY_SEGMENT);
        let (count, fields): (Option<u64>, Vec<String>) = redis::pipe()
            .hget(&key, name)
            .hkeys(&key)
            .query_async(&mut conn)
            .await
            .map_err(|e| store.fail(e))?;
        refused.count += count.unwrap_or(0);
        refused.complete &= !fields.iter().any(|f| f.starts_with("rule:"));
    }
    Ok(refused)
}

/// Processes report each second's refusals within about a second: `watch` reads the
/// seconds that ended this long ago.
const REPORT_LAG_S: i64 = 2;

/// What `watch` follows: a sliding window (its config) or a token bucket.
enum Watched {
    Window(Config),
    Bucket(tokens::State),
}

/// A token bucket's state now; a missing key is a full, cold bucket of `last`'s config.
async fn bucket_now(
    store: &Store,
    key: &str,
    now: i64,
    last: &tokens::State,
) -> Result<tokens::State, Error> {
    let raw = store.short_string(key).await?;
    Ok(match raw.as_deref().and_then(tokens::State::parse) {
        Some(state) => state.at(now),
        None => tokens::State {
            units: last.burst * last.interval_ms,
            cold: last.warmup_ms * last.rate,
            at_ms: now,
            ..*last
        },
    })
}

pub async fn watch(
    cli: &Cli,
    url: &str,
    name: &str,
    every: Duration,
    count: Option<u64>,
    prefix: &str,
) -> Outcome {
    let store = Store::open(url).await?;
    let mut since = server_now(&store).await?;
    let mut watched = watched(&store, name, since).await?;
    // Refusals from the second watching started on.
    let mut reported_through = since / 1000 - 1;
    if !cli.json {
        print_watch_header(&watched);
    }
    let mut done = 0;
    while count.is_none_or(|c| done < c) {
        tokio::time::sleep(every).await;
        let now = server_now(&store).await?;
        let through = now / 1000 - REPORT_LAG_S;
        let refused = reported_refusals(&store, prefix, name, reported_through, through).await?;
        reported_through = reported_through.max(through);
        let tick = Tick {
            since,
            now,
            elapsed: (now - since).max(1) as f64 / 1000.0,
            refused,
        };
        match &mut watched {
            Watched::Window(config) => window_tick(cli, &store, name, config, &tick).await?,
            Watched::Bucket(last) => *last = bucket_tick(cli, &store, name, last, &tick).await?,
        }
        let _ = std::io::stdout().flush();
        since = now;
        done += 1;
    }
    Ok(())
}

/// What `name` is: a sliding window (its config) or a token bucket (its state at `now`).
async fn watched(store: &Store, name: &str, now: i64) -> Result<Watched, Failure> {
    if let Some(config) = read_config(store, name).await? {
        return Ok(Watched::Window(config));
    }
    let (found, clients) = token_keys(store, name, now, 0).await?;
    match found.first().and_then(|f| f.state) {
        Some(state) => Ok(Watched::Bucket(state)),
        None if clients > 0 => Err(Failure::No(per_client(name))),
        None => Err(Failure::No(not_found(name))),
    }
}

fn print_watch_header(watched: &Watched) {
    match watched {
        Watched::Window(_) => println!(
            "{:<16}  {:>10}  {:>10}  {:>10}  {:>10}",
            "TIME (UTC)", "GRANTED/s", "REFUSED", "AVAILABLE", "IN WINDOW"
        ),
        Watched::Bucket(_) => println!(
            "{:<16}  {:>10}  {:>10}  {:>10}  {:>10}",
            "TIME (UTC)", "TOKENS/s", "REFUSED", "TOKENS", "FULL IN"
        ),
    }
}

/// One refresh of `watch`: the period `(since, now]`, in seconds, and the refusals
/// processes reported for it.
struct Tick {
    since: i64,
    now: i64,
    elapsed: f64,
    refused: Refused,
}

/// A window's line: permits granted in the period, available, in the window.
async fn window_tick(cli: &Cli, store: &Store, name: &str, config: &Config, tick: &Tick) -> Outcome {
    let (now, refused) = (tick.now, tick.refused);
    let log_key = suffix(name, "permits");
    // The log read in ranges (as `inspect` reads it), once a tick: what was granted
    // since the last tick, and what the window holds.
    let since = now.saturating_sub(config.interval_ms);
    let (mut granted, mut in_window) = (0u64, 0u64);
    store
        .each_in_log(&log_key, |member, score| {
            let Some(permits) = redlimit_runtime::member::decode_permits(member) else {
                return;
            };
            let at = score as i64;
            if at > tick.since && at <= now {
                granted += u64::from(permits);
            }
            if at > since {
                in_window += u64::from(permits);
            }
        })
        .await?;
    let value = store.short_string(&suffix(name, "value")).await?;
    let value: Option<i64> = value.as_deref().and_then(crate::store::limiter_value);
    let per_second = granted as f64 / tick.elapsed;
    if cli.json {
        println!(
            "{}",
            json!({"time_ms": now, "time": duration::show_utc(now), "granted": granted, "granted_per_second": per_second, "refused": refused.count, "refused_complete": refused.complete, "available": value, "permits_in_window": in_window})
        );
    } else {
        println!(
            "{:<16}  {:>10.1}  {:>10}  {:>10}  {:>10}",
            duration::show_time_of_day(now),
            per_second,
            refused.shown(),
            value.map_or("-".to_owned(), |v| v.to_string()),
            in_window
        );
    }
    Ok(())
}

/// A token bucket's line: tokens spent in the period, tokens, time until full. The
/// bucket's state now is returned, the next period's start.
async fn bucket_tick(
    cli: &Cli,
    store: &Store,
    name: &str,
    last: &tokens::State,
    tick: &Tick,
) -> Result<tokens::State, Failure> {
    let (now, refused) = (tick.now, tick.refused);
    let state = bucket_now(store, &suffix(name, "bucket"), now, last).await?;
    // What the period took: the last state refilled to now, less what is
    // there (a warm-up's extra cost included), in tokens.
    let spent = if (state.rate, state.interval_ms, state.burst) == (last.rate, last.interval_ms, last.burst) {
        ((last.at(now).units - state.units).max(0) as f64) / state.interval_ms as f64
    } else {
        0.0
    };
    let per_second = spent / tick.elapsed;
    if cli.json {
        println!(
            "{}",
            json!({"time_ms": now, "time": duration::show_utc(now), "tokens_spent": spent, "tokens_per_second": per_second, "refused": refused.count, "refused_complete": refused.complete, "tokens": state.tokens(), "full_in_ms": state.full_in_ms(), "coldness": state.coldness()})
        );
    } else {
        println!(
            "{:<16}  {:>10.1}  {:>10}  {:>10}  {:>10}",
            duration::show_time_of_day(now),
            per_second,
            refused.shown(),
            state.tokens(),
            duration::show_secs(state.full_in_ms())
        );
    }
    Ok(state)
}
