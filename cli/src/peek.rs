//! Whether N permits would be granted now, and when they would be if not, computed
//! from a limiter's stored state (a window's value and log, a bucket's tokens).
//! Read-only: nothing is taken or released.

use redlimit_runtime::keys::suffix;
use redlimit_runtime::member::decode_permits;
use redlimit_runtime::Error;

use crate::inspect::{read_config, token_keys};
use crate::shown::shown;
use crate::store::{server_now, unread_value, value_for_call, Store};
use crate::words::{not_found, per_client};

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
    let mut grants: Vec<(i64, i64)> = Vec::new();
    store
        .each_in_log(&log_key, |member, score| {
            if let Some(permits) = decode_permits(member) {
                grants.push((score as i64, i64::from(permits)));
            }
        })
        .await?;
    let in_window = |t: i64| t > now.saturating_sub(config.interval_ms);
    let expired: i64 = grants
        .iter()
        .filter(|(t, _)| !in_window(*t))
        .map(|(_, p)| p)
        .sum();
    let held: i64 = grants.iter().filter(|(t, _)| in_window(*t)).map(|(_, p)| p).sum();
    // As the next call would find it: a missing value rebuilt from the log; what left
    // the window given back, or the value rebuilt from the log when that would pass
    // the rate (one inflated by hand, or read before a grant released more; above the
    // rate with nothing released too); else the value as it is.
    let room = config.rate.saturating_sub(held);
    let mut available = match value {
        None => room,
        Some(v) if v.saturating_add(expired) > config.rate => room,
        Some(v) => v.saturating_add(expired),
    };
    let permits = permits as i64;
    let mut window: Vec<&(i64, i64)> = grants.iter().filter(|(t, _)| in_window(*t)).collect();
    window.sort();
    // When the grants in the window will have given back enough for `permits` on top
    // of `available`: `None` when they hold too few.
    let wait_for = |available: i64| {
        let mut returned = 0i64;
        window.iter().find_map(|(t, p)| {
            returned = returned.saturating_add(*p);
            (available.saturating_add(returned) >= permits)
                .then(|| t.saturating_add(config.interval_ms).saturating_sub(now))
        })
    };
    let mut retry_after_ms = None;
    if available < permits && permits <= config.rate {
        retry_after_ms = wait_for(available);
        if retry_after_ms.is_none() {
            // A debt deeper than the log holds (permits lost): as the call does, the
            // value is rebuilt from the log, the authority.
            available = room;
            retry_after_ms = (available < permits).then(|| wait_for(available).unwrap_or(config.interval_ms));
        }
    }
    Ok(Ok(Peek {
        allowed: available >= permits,
        available,
        retry_after_ms,
    }))
}
