//! Reading the scripts' answers: decisions, and errors that name their key.

use redis::RedisError;

use super::{ConfigChange, Outcome};
use crate::{Error, LimiterKeys};

/// acquire.lua's reply: granted, refused rule, wait, time, then per rule permits left
/// and what happened to its config.
pub(super) fn parse_outcome(reply: &[i64], rules: usize) -> Option<Outcome> {
    if reply.len() != 4 + 2 * rules {
        return None;
    }
    let granted = reply[0] == 1;
    let refused = usize::try_from(reply[1]).ok()?.checked_sub(1);
    let mut per_rule = Vec::with_capacity(rules);
    for pair in reply[4..].chunks_exact(2) {
        let change = match pair[1] {
            0 => ConfigChange::Kept,
            1 => ConfigChange::Created,
            2 => ConfigChange::Changed,
            _ => return None,
        };
        per_rule.push((u64::try_from(pair[0]).ok()?, change));
    }
    Some(Outcome {
        granted,
        refused,
        retry_ms: u64::try_from(reply[2]).ok()?,
        at_ms: u64::try_from(reply[3]).ok()?,
        rules: per_rule,
    })
}

/// Turns a script's `redlimit:<code>:<rule> <text>` error into an [`Error`] that
/// names the key; other errors pass through as backend failures.
pub(super) fn script_error(err: RedisError, calls: &[&LimiterKeys]) -> Error {
    if err.code() == Some("WRONGTYPE") {
        if let [keys] = calls {
            return Error::WrongType {
                key: keys.config().to_owned(),
                role: "config",
                detail: err.detail().unwrap_or_default().to_owned(),
            };
        }
    }
    let Some(code) = err.code().and_then(|code| code.strip_prefix("redlimit:")) else {
        return Error::Backend { source: err };
    };
    let detail = err.detail().unwrap_or_default();
    // Redis appends " script: <sha>, on @user_script:<line>." to script errors.
    let detail = detail.rfind(" script: ").map_or(detail, |end| &detail[..end]);
    let (kind, rule) = code.split_once(':').unwrap_or((code, "1"));
    let Some(keys) = rule
        .parse::<usize>()
        .ok()
        .and_then(|r| r.checked_sub(1))
        .and_then(|r| calls.get(r))
    else {
        return Error::Backend { source: err };
    };
    let name = keys.config().to_owned();
    match kind {
        "not_initialized" => Error::NotInitialized { name },
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
        "bad_member" => {
            let (role, detail) = detail.split_once(' ').unwrap_or((detail, ""));
            Error::CorruptMember {
                key: key_of(keys, role).1,
                detail: detail.to_owned(),
            }
        }
        _ => Error::Backend { source: err },
    }
}

/// The key a script means by a role name, and the role for messages.
fn key_of(keys: &LimiterKeys, role: &str) -> (&'static str, String) {
    match role {
        "value" => ("value", keys.value()),
        "client_value" => ("value", keys.client_value()),
        "permits" => ("permits", keys.permits()),
        "client_permits" => ("permits", keys.client_permits()),
        _ => ("config", keys.config().to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_replies() {
        let out = parse_outcome(&[0, 2, 150, 9, 3, 0, 0, 2], 2).unwrap();
        assert_eq!(out.at_ms, 9);
        assert!(!out.granted);
        assert_eq!(out.refused, Some(1));
        assert_eq!(out.retry_ms, 150);
        assert_eq!(
            out.rules,
            vec![(3, ConfigChange::Kept), (0, ConfigChange::Changed)]
        );
        assert_eq!(parse_outcome(&[1, 0, 0, 9], 1), None);
    }
}
