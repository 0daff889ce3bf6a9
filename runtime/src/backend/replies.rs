//! Reading the scripts' answers: decisions, and errors that name their key.

use redis::RedisError;

use std::time::Duration;

use super::{ConfigChange, Outcome, RuleOutcome};
use crate::{Error, LimiterKeys, RateLimiterConfig, RateType};

/// acquire.lua's reply: granted, refused rule, wait, time, then per rule permits left
/// and what happened to its config, then the replaced config of each changed rule.
pub(super) fn parse_outcome(reply: &[i64], rules: usize) -> Option<Outcome> {
    let head = 4 + 2 * rules;
    if reply.len() < head {
        return None;
    }
    let granted = reply[0] == 1;
    let refused = usize::try_from(reply[1]).ok()?.checked_sub(1);
    let mut replaced = reply[head..].chunks_exact(4);
    let mut per_rule = Vec::with_capacity(rules);
    for pair in reply[4..head].chunks_exact(2) {
        let change = match pair[1] {
            0 => ConfigChange::Kept,
            1 => ConfigChange::Created,
            2 => ConfigChange::Changed(replaced_config(replaced.next()?)?),
            _ => return None,
        };
        per_rule.push(RuleOutcome {
            left: u64::try_from(pair[0]).ok()?,
            config: change,
        });
    }
    if replaced.next().is_some() || !replaced.remainder().is_empty() {
        return None;
    }
    Some(Outcome {
        granted,
        refused,
        retry_ms: u64::try_from(reply[2]).ok()?,
        at_ms: u64::try_from(reply[3]).ok()?,
        rules: per_rule,
    })
}

fn replaced_config(fields: &[i64]) -> Option<RateLimiterConfig> {
    let [rate, interval, kind, keep] = *fields else {
        return None;
    };
    // A token bucket's (type 2 or 3) fourth field is its burst, not a keep-alive.
    let rate_type = match kind {
        0 | 2 => RateType::Overall,
        1 | 3 => RateType::PerClient,
        _ => return None,
    };
    let keep = if kind >= 2 { 0 } else { keep };
    let ms = |n: i64| u64::try_from(n).ok().map(Duration::from_millis);
    Some(RateLimiterConfig {
        rate_type,
        rate: u64::try_from(rate).ok()?,
        interval: ms(interval)?,
        keep_alive: ms(keep).filter(|k| !k.is_zero()),
    })
}

/// Turns a script's `redlimit:<code>:<rule> <text>` error into an [`Error`] that
/// names the key; `None` for other errors (the connection's, the server's).
pub(super) fn script_error(err: &RedisError, calls: &[&LimiterKeys]) -> Option<Error> {
    if err.code() == Some("WRONGTYPE") {
        // Which key is only known for single-key commands; acquire.lua's caller
        // finds it out (RedisBackend::wrong_type).
        return Some(Error::WrongType {
            key: calls.first()?.config().to_owned(),
            role: "config",
            detail: err.detail().unwrap_or_default().to_owned(),
        });
    }
    let code = err.code()?.strip_prefix("redlimit:")?;
    let detail = err.detail().unwrap_or_default();
    // Redis appends " script: <sha>, on @user_script:<line>." to script errors.
    let detail = detail.rfind(" script: ").map_or(detail, |end| &detail[..end]);
    let (kind, rule) = code.split_once(':').unwrap_or((code, "1"));
    let keys = rule
        .parse::<usize>()
        .ok()
        .and_then(|r| r.checked_sub(1))
        .and_then(|r| calls.get(r))?;
    let name = keys.config().to_owned();
    Some(match kind {
        "not_initialized" => Error::NotInitialized { name },
        "keep_alive_short" => Error::InvalidConfig {
            name,
            problem: crate::config::KEEP_ALIVE_SHORT,
        },
        "permits_exceed_rate" => {
            let mut numbers = detail.split(' ').map(|n| n.parse::<u64>().unwrap_or(0));
            let (permits, rate) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
            Error::PermitsExceedRate { name, permits, rate }
        }
        "wrong_type" => {
            let (role, detail) = detail.split_once(' ').unwrap_or((detail, ""));
            let (role, key) = key_of(keys, role);
            Error::WrongType {
                key,
                role,
                detail: detail.to_owned(),
            }
        }
        "bad_config" => {
            let (field, value) = detail.split_once('=').unwrap_or((detail, ""));
            let field = match field {
                "rate" => "rate",
                "interval" => "interval",
                "type" => "type",
                _ => "keepAliveTime",
            };
            Error::CorruptConfig {
                key: name,
                field,
                value: value.to_owned(),
            }
        }
        "bad_value" => {
            let (role, value) = detail.split_once(' ').unwrap_or((detail, ""));
            Error::CorruptValue {
                key: key_of(keys, role).1,
                value: value.to_owned(),
            }
        }
        "bad_bucket" => {
            let (role, detail) = detail.split_once(' ').unwrap_or((detail, ""));
            Error::CorruptBucket {
                key: key_of(keys, role).1,
                detail: detail.to_owned(),
            }
        }
        "bad_member" => {
            let (role, detail) = detail.split_once(' ').unwrap_or((detail, ""));
            Error::CorruptMember {
                key: key_of(keys, role).1,
                detail: detail.to_owned(),
            }
        }
        _ => return None,
    })
}

/// The key a script means by a role name, and the role for messages.
fn key_of(keys: &LimiterKeys, role: &str) -> (&'static str, String) {
    match role {
        "value" => ("value", keys.value()),
        "client_value" => ("value", keys.client_value()),
        "permits" => ("permits", keys.permits()),
        "client_permits" => ("permits", keys.client_permits()),
        "bucket" => ("bucket", keys.bucket()),
        "client_bucket" => ("bucket", keys.client_bucket()),
        _ => ("config", keys.config().to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_replies() {
        let out = parse_outcome(&[0, 2, 150, 9, 3, 0, 0, 2, 5, 1000, 1, 0], 2).unwrap();
        assert_eq!(out.at_ms, 9);
        assert!(!out.granted);
        assert_eq!(out.refused, Some(1));
        assert_eq!(out.retry_ms, 150);
        let old = RateLimiterConfig::new(RateType::PerClient, 5, Duration::from_secs(1));
        assert_eq!(
            out.rules,
            vec![
                RuleOutcome {
                    left: 3,
                    config: ConfigChange::Kept
                },
                RuleOutcome {
                    left: 0,
                    config: ConfigChange::Changed(old)
                }
            ]
        );
        assert_eq!(parse_outcome(&[1, 0, 0, 9], 1), None);
        assert_eq!(
            parse_outcome(&[0, 2, 150, 9, 3, 0, 0, 2], 2),
            None,
            "the replaced config is missing"
        );
        assert_eq!(parse_outcome(&[1, 0, 0, 9, 3, 0, 7], 1), None, "a stray value");
    }
}
