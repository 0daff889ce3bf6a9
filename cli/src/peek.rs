//! Whether N permits would be granted now, and when they would be if not, computed
//! from a limiter's stored state (a window's value and log, a bucket's tokens).
//! Read-only: nothing is taken or released.

use redlimit_runtime::algorithm::call_time::settle_time;
use redlimit_runtime::algorithm::window::{self, Log};
use redlimit_runtime::keys::suffix;
use redlimit_runtime::member::decode_permits;
use redlimit_runtime::Error;

use crate::inspect::{read_config, token_keys, Config};
use crate::shown::shown;
use crate::store::{server_now, unread_value, value_for_call, Store};
use crate::words::{count, not_found, per_client};

/// Whether `permits` would be granted now, read from the stored state (nothing is
/// taken or released), and when they would be when not.
#[derive(Debug, Clone)]
pub struct Peek {
    pub allowed: bool,
    pub available: i64,
    /// `None` when allowed, or when no wait helps (more than the rate).
    pub retry_after_ms: Option<i64>,
}

/// [`peek`] of a token bucket: the whole tokens it holds now, and the exact wait.
async fn peek_tokens(store: &Store, name: &str, permits: u64) -> Result<Result<Peek, String>, Error> {
    let now = server_now(store).await?;
    let (found, clients) = token_keys(store, name, now, 0).await?;
    let Some(bucket) = found.first() else {
        return Ok(Err(if clients > 0 {
            per_client(name)
        } else {
            not_found(name)
        }));
    };
    let Some(state) = bucket.state else {
        return Ok(Err(format!(
            "`{}` is not a token bucket's state: `inspect {name}` shows what it holds",
            bucket.key.key
        )));
    };
    let wait = state.wait_for(permits);
    Ok(Ok(Peek {
        allowed: wait == Some(0),
        available: state.tokens(),
        retry_after_ms: wait.filter(|w| *w > 0),
    }))
}

pub async fn peek(store: &Store, name: &str, permits: u64) -> Result<Result<Peek, String>, Error> {
    let Some(config) = read_config(store, name).await? else {
        return peek_tokens(store, name, permits).await;
    };
    if config.mode == 1 {
        return Ok(Err(per_client(name)));
    }
    let now = server_now(store).await?;
    let (value_key, log_key) = (suffix(name, "value"), suffix(name, "permits"));
    let read = match read_window(store, name, &config, &value_key, &log_key).await? {
        Ok(read) => read,
        Err(problem) => return Ok(Err(problem)),
    };
    let permits = i64::try_from(permits).unwrap_or(i64::MAX);
    if permits > config.rate {
        return Ok(Err(format!(
            "{permits} permits are more than `{}`'s rate of {}: a call of them fails",
            shown(name),
            config.rate
        )));
    }
    Ok(Ok(next_call(&read.1, read.0, &config, now, permits)))
}

/// A window's value and log as a call reads them (value_for_call, grant), read as one
/// moment holds them ([`Store::window`]); `Err` with what to say when a call fails on
/// them, or when they are past what this tool counts as the scripts do.
pub async fn read_window(
    store: &Store,
    name: &str,
    config: &Config,
    value_key: &str,
    log_key: &str,
) -> Result<Result<(Option<i64>, Log), String>, Error> {
    let see = |what: String| {
        Ok(Err(format!(
            "{what} (`inspect {}` shows what is wrong)",
            shown(name)
        )))
    };
    if let Some(problem) = &config.call_refuses {
        return see(format!(
            "`{}` is a config every call refuses: {problem}",
            shown(name)
        ));
    }
    if config.rate > 1 << 52 || config.interval_ms > 1 << 52 {
        return see(format!(
            "`{}` has a rate or interval past 2^52, where the scripts' doubles round: what a call finds is not said here",
            shown(name)
        ));
    }
    let kinds: (String, String) = store.types(value_key, log_key).await?;
    for (key, kind, expected) in [(value_key, &kinds.0, "string"), (log_key, &kinds.1, "zset")] {
        if kind != "none" && kind != expected {
            return see(format!(
                "`{}` is a {kind}, not a {expected}: every call of the limiter fails on it",
                shown(key)
            ));
        }
    }
    let window = store.window(value_key, log_key).await?;
    if window.changed {
        return see(format!(
            "`{}` changed while its {} entries were read (calls landed between the reads): what a call finds is not said here; ask again",
            shown(log_key),
            window.log.len()
        ));
    }
    let value = match window.value {
        None => None,
        Some(text) => match value_for_call(&text) {
            Some(value) => Some(value),
            None => {
                return see(format!(
                    "`{}` holds {text:?}, {}",
                    shown(value_key),
                    unread_value(&text)
                ))
            }
        },
    };
    let mut log = Log::new();
    let (mut undecodable, mut untimed) = (0u64, 0u64);
    for (member, score) in &window.log {
        match (decode_permits(member), timed(*score)) {
            (None, _) => undecodable += 1,
            (_, None) => untimed += 1,
            (Some(permits), Some(score)) => log.push_back((score, permits, 0)),
        }
    }
    if undecodable > 0 {
        return see(format!(
            "`{}` holds {} (a call that reads one fails)",
            shown(log_key),
            count(
                undecodable,
                "member that does not decode",
                "members that do not decode"
            )
        ));
    }
    if untimed > 0 || log.iter().map(|&(_, p, _)| u64::from(p)).sum::<u64>() > 1 << 52 {
        return see(format!(
            "`{}` holds scores that are no time in ms, or more permits than 2^52, which no limiter writes: what a call finds is not said here",
            shown(log_key)
        ));
    }
    Ok(Ok((value, log)))
}

/// A log score as the scripts write one, a whole ms from 0 to 2^52 (the year 144 683);
/// `None` for any other (a fraction, a negative, an infinite one, or one whose sum with
/// an interval the scripts' doubles round), which no limiter writes and whose
/// arithmetic in those doubles this tool does not follow.
fn timed(score: f64) -> Option<u64> {
    (score.fract() == 0.0 && (0.0..=MAX_EXACT / 2.0).contains(&score)).then_some(score as u64)
}

/// 2^53: the scripts' doubles count exactly up to here.
const MAX_EXACT: f64 = 9_007_199_254_740_992.0;

/// What a call of `permits` finds in a sliding window's `value` and `log` at `now`
/// (as [`read_window`] reads them): the scripts' steps, in the Rust twin
/// they are held equal to (the in-process backend's), writing nothing.
pub fn next_call(log: &Log, value: Option<i64>, config: &Config, now: i64, permits: i64) -> Peek {
    let (rate, interval) = (config.rate, config.interval_ms);
    // settle_time: a grant up to REORDER_MS ahead of the clock moves the call's time to it
    let now = u64::try_from(now).unwrap_or(0);
    let newest = log.back().map_or(now, |&(score, _, _)| score.max(now));
    let now = settle_time(newest, now) as i64;
    let (skip, released) = window::stale(log, now - interval);
    let live = log.iter().skip(skip).map(|&(_, p, _)| i64::from(p)).sum::<i64>();
    let (mut available, _) = window::plan_value(value, false, released, live, rate);
    let mut retry_after_ms = None;
    if let Some(need) = window::lacking(available, 0, permits) {
        retry_after_ms = window::wait_for(log, skip, need, interval, now, 0);
        if retry_after_ms.is_none() {
            // Value and log disagree (permits lost): the log is the authority.
            available = rate - live;
            retry_after_ms = window::lacking(available, 0, permits)
                .map(|need| window::wait_for(log, skip, need, interval, now, 0).unwrap_or(interval));
        }
    }
    Peek {
        allowed: retry_after_ms.is_none(),
        available,
        retry_after_ms,
    }
}
