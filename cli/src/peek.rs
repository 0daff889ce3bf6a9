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
    // The value first, then the log: a grant made while the log is read moves what
    // left the window into the value, where it is not counted twice.
    let value_key = suffix(name, "value");
    let value = match store.short_string(&value_key).await? {
        None => None,
        Some(text) => match value_for_call(&text) {
            Some(value) => Some(value),
            None => {
                return Ok(Err(format!(
                    "`{}` holds {:?}, {} (`inspect {}` shows what is wrong)",
                    shown(&value_key),
                    text,
                    unread_value(&text),
                    shown(name)
                )))
            }
        },
    };
    let log_key = suffix(name, "permits");
    let mut log = Log::new();
    let mut unread = 0u64;
    store
        .each_in_log(&log_key, |member, score| match grant(member, score) {
            Some(grant) => log.push_back(grant),
            None => unread += 1,
        })
        .await?;
    if unread > 0 {
        return Ok(Err(format!(
            "`{}` holds {} (`inspect {}` shows what is wrong)",
            shown(&log_key),
            count(
                unread,
                "member that does not decode (a call fails on it) or a score that is no time",
                "members that do not decode (a call fails on them) or scores that are no time"
            ),
            shown(name)
        )));
    }
    if let Some(problem) = config_refused(&config) {
        return Ok(Err(format!("`{}`: {problem}", shown(name))));
    }
    let permits = i64::try_from(permits).unwrap_or(i64::MAX);
    if permits > config.rate {
        return Ok(Err(format!(
            "{permits} permits are more than `{}`'s rate of {}: a call of them fails",
            shown(name),
            config.rate
        )));
    }
    Ok(Ok(next_call(&log, value, &config, now, permits)))
}

/// A log member and its score as a call reads them: `(score, permits)`, a score
/// before 1970 as 0 and a fraction of a ms as the next ms (each leaves the window when
/// a call finds it left); `None` for a member that does not decode, which fails a
/// call, or a score this tool does not count from (infinite, where a call's wait is
/// no number its reply holds, or past 2^62 ms).
pub fn grant(member: &[u8], score: f64) -> Option<(u64, u32)> {
    let permits = decode_permits(member)?;
    (score.is_finite() && score <= (1u64 << 62) as f64).then_some((score.ceil().max(0.0) as u64, permits))
}

/// Why a call refuses the stored config, as the scripts check it; `None` when it
/// does not.
pub fn config_refused(config: &Config) -> Option<String> {
    let exact = 1..=MAX_EXACT as i64;
    if !exact.contains(&config.rate)
        || !exact.contains(&config.interval_ms)
        || !(0..=1).contains(&config.mode)
    {
        return Some(format!(
            "a config every call refuses (rate {}, interval {} ms, type {}: rate and interval 1 to 2^53, type 0 or 1)",
            config.rate, config.interval_ms, config.mode
        ));
    }
    None
}

/// 2^53: the scripts' doubles count exactly up to here.
const MAX_EXACT: f64 = 9_007_199_254_740_992.0;

/// What a call of `permits` finds in a sliding window's `value` and `log` at `now`
/// (its config as [`config_refused`] accepts it): the scripts' steps, in the Rust twin
/// they are held equal to (the in-process backend's), writing nothing.
pub fn next_call(log: &Log, value: Option<i64>, config: &Config, now: i64, permits: i64) -> Peek {
    let (rate, interval) = (config.rate, config.interval_ms);
    // settle_time: a grant up to REORDER_MS ahead of the clock moves the call's time to it
    let now = u64::try_from(now).unwrap_or(0);
    let newest = log.back().map_or(now, |&(score, _)| score.max(now));
    let now = settle_time(newest, now) as i64;
    let (skip, released) = window::stale(log, now - interval);
    let live = log.iter().skip(skip).map(|&(_, p)| i64::from(p)).sum::<i64>();
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
