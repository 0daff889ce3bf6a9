//! Reading the scripts' answers: decisions, and errors that name their key.

use redis::{RedisError, Value};

use std::time::Duration;

use crate::algorithm::call_time::REORDER_MS;
use crate::backend::{ConfigChange, Outcome, RuleOutcome};
use crate::keys::Keys;
use crate::outcomes::error::{cut, quoted};
use crate::{Error, RateLimiterConfig, RateType};

/// What an integer reply is a multiple of, but for the call's tag; the tags' count
/// (far more than the calls one connection has in flight: the reply of a call this
/// many calls away is the only other with the tag).
pub(super) const CHECK: u64 = 1 << 20;

/// The acquire script's reply as Redis sent it: acquire.lua's table, ending with the
/// call's `tag`, or, for one rule decided at the caller's time (`caller_now`, `None`
/// when the server's clock was used), acquire_plain.lua's integer: the permits left
/// after a grant plus one (no count below [`CHECK`] another command answers is a
/// grant), or minus the wait of a refusal that left no permit, times [`CHECK`], plus
/// the tag. (Without a tag, a caller that sent none: the call's
/// time modulo [`CHECK`], and a table without it.) A reply of another call (a
/// connection out of step) is refused: an integer or a table of another tag, a table
/// decided at another time.
pub(super) fn parse_acquire_reply(
    reply: &Value,
    rules: usize,
    caller_now: Option<u64>,
    tag: Option<u64>,
) -> Option<Outcome> {
    match reply {
        Value::Int(n) if rules == 1 => {
            let at_ms = caller_now?;
            // The permits left plus one or the wait, times 2^20, plus the call's tag:
            // any other integer (a connection out of step handing the call another
            // command's reply, or another call's) is refused.
            let encoded = n.unsigned_abs();
            if encoded % CHECK != tag.unwrap_or(at_ms % CHECK) {
                return None;
            }
            let (granted, left, retry_ms) = if *n >= 0 {
                (true, (encoded / CHECK).checked_sub(1)?, 0)
            } else {
                (false, 0, encoded / CHECK)
            };
            Some(Outcome {
                granted,
                refused: (!granted).then_some(0),
                retry_ms,
                at_ms,
                rules: smallvec::smallvec![RuleOutcome {
                    left,
                    config: ConfigChange::Kept,
                }],
            })
        }
        Value::Array(items) => {
            let numbers = items
                .iter()
                .map(|item| match item {
                    Value::Int(n) => Some(*n),
                    _ => None,
                })
                .collect::<Option<Vec<i64>>>()?;
            let numbers = match tag {
                Some(tag) => match numbers.split_last()? {
                    (&last, rest) if u64::try_from(last) == Ok(tag) => rest,
                    _ => return None,
                },
                None => &numbers[..],
            };
            // Decided at the caller's time, or at most REORDER_MS after it: a reply of
            // another time is another call's (a connection out of step).
            parse_outcome(numbers, rules).filter(|outcome| {
                caller_now.is_none_or(|now| (now..=now.saturating_add(REORDER_MS)).contains(&outcome.at_ms))
            })
        }
        _ => None,
    }
}

/// acquire.lua's reply: granted, refused rule, wait, time, then per rule permits left
/// and what happened to its config, then the replaced config of each changed rule.
fn parse_outcome(reply: &[i64], rules: usize) -> Option<Outcome> {
    let head = 4 + 2 * rules;
    if reply.len() < head {
        return None;
    }
    // Granted (1) with no refusing rule (0), or refused (0) by one of the call's
    // rules (1 to `rules`): anything else is not acquire.lua's.
    let (granted, refused) = match (reply[0], usize::try_from(reply[1]).ok()?) {
        (1, 0) => (true, None),
        (0, rule @ 1..) if rule <= rules => (false, Some(rule - 1)),
        _ => return None,
    };
    let mut replaced = reply[head..].chunks_exact(4);
    let mut per_rule = smallvec::SmallVec::with_capacity(rules);
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

/// A reply of a type its command never answers (the Redis client's `ParsingError`:
/// "Incompatible type"), or a script loaded under another SHA1 (a connection out of
/// step hands a command another's reply): a reply that does not fit, as
/// [`Error::UnexpectedReply`]; `None` for other errors (a reply that is not RESP at all
/// among them: another kind of server).
pub(super) fn unfit(err: &RedisError) -> Option<Error> {
    let incompatible =
        std::error::Error::source(err).is_some_and(|source| source.is::<redis::ParsingError>());
    let unfit = incompatible || err.kind() == redis::ErrorKind::UnexpectedReturnType;
    unfit.then(|| Error::UnexpectedReply {
        script: "a redlimit command",
        reply: abbreviated(err.to_string(), 200),
    })
}

/// Turns a script's `redlimit:<code>:<rule> <text>` error into an [`Error`] that
/// names the key; `None` for other errors (the connection's, the server's).
pub(super) fn script_error(err: &RedisError, calls: &[Keys<'_>]) -> Option<Error> {
    let (code, detail) = unwrapped(err.code()?, err.detail().unwrap_or_default());
    if code == "WRONGTYPE" {
        // Which key is only known for single-key commands; acquire.lua's caller
        // finds it out (RedisBackend::wrong_type).
        return Some(Error::WrongType {
            key: calls.first()?.config().to_owned(),
            role: "config",
            detail: detail.to_owned(),
        });
    }
    // A server that does not know the scripts' command (no scripting, or renamed
    // away) will not learn it by itself.
    if code == "ERR" && unknown_command(detail) {
        // Without the arguments the server echoes: a connection's opening `HELLO`
        // carries the password.
        let shown = err.to_string();
        let shown = match shown.find(", with args beginning with") {
            Some(at) => shown[..at].to_owned(),
            None => shown,
        };
        return Some(Error::UnexpectedReply {
            script: "a redlimit script",
            reply: abbreviated(shown, 200),
        });
    }
    let code = code.strip_prefix("redlimit:")?;
    let (kind, rule) = code.split_once(':').unwrap_or((code, "1"));
    let keys = rule
        .parse::<usize>()
        .ok()
        .and_then(|r| r.checked_sub(1))
        .and_then(|r| calls.get(r));
    let known = keys.and_then(|keys| match kind {
        "not_initialized" | "keep_alive_short" | "permits_exceed_rate" | "bad_config" => {
            config_error(kind, keys.config().to_owned(), detail)
        }
        _ => key_error(kind, keys, detail),
    });
    // A code of ours the scripts never raise, or one naming a rule the call does not
    // have: no outage, whoever answered it.
    Some(known.unwrap_or_else(|| Error::UnexpectedReply {
        script: "a redlimit script",
        reply: abbreviated(err.to_string(), 200),
    }))
}

/// Whether `err` is the server's error reply about itself, not about the call: busy
/// with another program's script (`BUSY`), loading its data (`LOADING`), refusing
/// writes (`MISCONF`, `NOREPLICAS`, `MASTERDOWN`, also when a command inside the
/// script met it), or a plain `ERR` that no script's run raised (out of connections,
/// a proxy refusing the command; not an unknown command). Any other code is about the
/// call's keys or slot (`WRONGTYPE`, `TRYAGAIN` while its slot moves, `MOVED`,
/// `CROSSSLOT`, `NOSCRIPT`), and so is any other error a script's run raised (a Lua
/// error).
pub(super) fn about_the_server(err: &RedisError) -> bool {
    let Some(code) = err.code() else {
        return false;
    };
    let detail = err.detail().unwrap_or_default();
    // (a write refused inside a script comes wrapped in the script's error)
    match unwrapped(code, detail).0 {
        "BUSY" | "LOADING" | "MISCONF" | "NOREPLICAS" | "MASTERDOWN" => true,
        // (an unknown command: the scripts' own, a server without them, which
        // `script_error` names)
        "ERR" => !err.to_string().contains("user_script") && !unknown_command(detail),
        _ => false,
    }
}

/// Whether an `ERR` reply's detail says the command is unknown.
fn unknown_command(detail: &str) -> bool {
    detail.to_ascii_lowercase().starts_with("unknown command")
}

/// `shown`, cut to its first `most` bytes (on a character boundary) and `...`.
pub(super) fn abbreviated(shown: String, most: usize) -> String {
    if shown.len() <= most {
        return shown;
    }
    cut(&shown, most)
}

/// A script's error about a limiter's config (`name`): missing, refused or corrupt.
fn config_error(kind: &str, name: String, detail: &str) -> Option<Error> {
    Some(match kind {
        "not_initialized" => Error::NotInitialized { name },
        "keep_alive_short" => Error::InvalidConfig {
            name,
            problem: crate::rules::config::KEEP_ALIVE_SHORT,
        },
        "permits_exceed_rate" => {
            let mut numbers = detail.split(' ').map(|n| n.parse::<u64>().unwrap_or(0));
            let (permits, rate) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
            Error::PermitsExceedRate { name, permits, rate }
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
                value: quoted(value),
            }
        }
        _ => return None,
    })
}

/// A script's error about one of a limiter's keys, named by its role first in
/// `detail` (`<role> <text>`): another program's, of the wrong type, or corrupt.
fn key_error(kind: &str, keys: &Keys<'_>, detail: &str) -> Option<Error> {
    let (role, detail) = detail.split_once(' ').unwrap_or((detail, ""));
    let (role, key) = key_of(keys, role);
    let detail = quoted(detail);
    Some(match kind {
        "wrong_type" => Error::WrongType { key, role, detail },
        "not_limiter" => Error::NotALimiter {
            key,
            role,
            found: detail,
        },
        "bad_value" => Error::CorruptValue { key, value: detail },
        "bad_bucket" => Error::CorruptBucket { key, detail },
        "bad_member" => Error::CorruptMember { key, detail },
        _ => return None,
    })
}

/// An error reply to a script call as its code and detail, the same on every server:
/// the script's own `error('redlimit:<code>:<rule> <text>', 0)` as (`redlimit:<code>:<rule>`,
/// `<text>`), and an error a command inside the script raised (WRONGTYPE, OOM, NOPERM)
/// as that command's. The servers word them:
/// - Redis 7.x and Valkey: `ERR redlimit:<code>:<rule> <text> script: <sha>, on @user_script:<line>.`,
///   and a command's error under its own code, with the same suffix;
/// - Redis 6.2: `ERR Error running script (call to f_<sha>): @user_script:<line>: <error>`,
///   a command's error included;
/// - an error reply (`redis.error_reply`, or a table raised on 7.x): `redlimit:<code>:<rule> <text>`.
///
/// Any other error comes back unchanged: only these exact shapes are unwrapped.
pub(crate) fn unwrapped<'a>(code: &'a str, detail: &'a str) -> (&'a str, &'a str) {
    let mut inner = None;
    if code == "ERR" {
        if let Some(rest) = detail.strip_prefix("Error running script (call to f_") {
            inner = rest.split_once("): @user_script:").and_then(|(sha, rest)| {
                let (line, error) = rest.split_once(": ")?;
                (is_sha(sha) && is_digits(line)).then_some(error)
            });
        } else if detail.starts_with("redlimit:") {
            inner = Some(detail);
        }
    }
    let (code, detail) = match inner.map(command_error) {
        Some(error) => match error.split_once(' ').unwrap_or((error, "")) {
            (code, rest) if is_code(code) => (code, rest),
            _ => ("ERR", error),
        },
        None => (code, detail),
    };
    (code, strip_script_suffix(detail))
}

/// A command's error inside a script as Redis 6.2 words it (`@user_script: 1: -OOM ...`)
/// without that prefix.
fn command_error(error: &str) -> &str {
    let Some(rest) = error.strip_prefix("@user_script: ") else {
        return error;
    };
    match rest.split_once(": ") {
        Some((line, rest)) if is_digits(line) => rest.strip_prefix('-').unwrap_or(rest),
        _ => error,
    }
}

/// An error code: `WRONGTYPE`, `OOM`, `NOPERM`, or the scripts' `redlimit:<code>:<rule>`.
fn is_code(word: &str) -> bool {
    word.starts_with("redlimit:") || (!word.is_empty() && word.bytes().all(|b| b.is_ascii_uppercase()))
}

fn is_sha(text: &str) -> bool {
    text.len() == 40 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

fn is_digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// The message without the ` script: <sha>, on @user_script:<line>.` Redis 7.x and
/// Valkey append to a script's error; unchanged when it does not end so.
fn strip_script_suffix(message: &str) -> &str {
    let Some(at) = message.rfind(" script: ") else {
        return message;
    };
    let tail = &message[at + " script: ".len()..];
    let suffix_ok = tail
        .split_once(", on @user_script:")
        .and_then(|(sha, line)| Some((sha, line.strip_suffix('.')?)))
        .is_some_and(|(sha, line)| is_sha(sha) && is_digits(line));
    if suffix_ok {
        &message[..at]
    } else {
        message
    }
}

/// The key a script means by a role name, and the role for messages.
fn key_of(keys: &Keys<'_>, role: &str) -> (&'static str, String) {
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
mod tests;
