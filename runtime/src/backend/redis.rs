//! The Redis backend: one script call per operation, EVALSHA with reload on NOSCRIPT.

use std::future::Future;
use std::time::Duration;

use once_cell::sync::Lazy;
use redis::{RedisError, Script};

use super::connection::Conn;
use super::{Call, ConfigChange, Outcome};
use crate::{member, Error, LimiterKeys, RateLimiterConfig};

struct Scripts {
    acquire: Script,
    try_set_rate: Script,
    set_rate: Script,
    update_rate: Script,
    keep_alive: Script,
    expire: Script,
    refund: Script,
}

static SCRIPTS: Lazy<Scripts> = Lazy::new(|| Scripts {
    acquire: Script::new(include_str!("../../../lua/acquire.lua")),
    try_set_rate: Script::new(include_str!("../../../lua/try_set_rate.lua")),
    set_rate: Script::new(include_str!("../../../lua/set_rate.lua")),
    update_rate: Script::new(include_str!("../../../lua/update_rate.lua")),
    keep_alive: Script::new(include_str!("../../../lua/keep_alive.lua")),
    expire: Script::new(include_str!("../../../lua/expire.lua")),
    refund: Script::new(include_str!("../../../lua/refund.lua")),
});

/// Attempts at refunding a timed-out grant, and the pause before each retry.
const REFUND_ATTEMPTS: u32 = 3;
const REFUND_BACKOFF: Duration = Duration::from_millis(500);

pub(crate) struct RedisBackend {
    conn: Conn,
    pub(super) timeout: Duration,
    /// Decide at the server's clock (TIME in the scripts) rather than the caller's.
    server_time: bool,
}

impl RedisBackend {
    pub fn new(conn: Conn, timeout: Duration, server_time: bool) -> Self {
        RedisBackend {
            conn,
            timeout,
            server_time,
        }
    }

    /// The scripts' time argument: the caller's clock, or empty for the server's.
    fn now_arg(&self, now: u64) -> String {
        if self.server_time {
            String::new()
        } else {
            now.to_string()
        }
    }

    /// Runs one request under the command timeout; script errors name their key.
    async fn run<T, F>(&self, calls: &[&LimiterKeys], request: impl FnOnce(Conn) -> F) -> Result<T, Error>
    where
        F: Future<Output = Result<T, RedisError>>,
    {
        match tokio::time::timeout(self.timeout, request(self.conn.clone())).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) if err.is_timeout() => Err(Error::Timeout { after: self.timeout }),
            Ok(Err(err)) => Err(script_error(err, calls)),
            Err(_) => Err(Error::Timeout { after: self.timeout }),
        }
    }

    pub async fn acquire(&self, calls: &[Call<'_>], now: u64) -> Result<Outcome, Error> {
        if matches!(self.conn, Conn::Cluster(_)) && !super::cross_slot::one_slot(calls) {
            return self.acquire_across_slots(calls, now).await;
        }
        Ok(self.acquire_group(calls, now).await?.0)
    }

    /// Decides rules whose keys share one slot in one script call; answers the log
    /// members it sent, for compensation.
    pub(super) async fn acquire_group(
        &self,
        calls: &[Call<'_>],
        now: u64,
    ) -> Result<(Outcome, Vec<[u8; member::MEMBER_LEN]>), Error> {
        let members: Vec<[u8; member::MEMBER_LEN]> = calls
            .iter()
            .map(|call| member::new_member(u32::try_from(call.permits).unwrap_or(u32::MAX)))
            .collect();
        let mut invocation = SCRIPTS.acquire.prepare_invoke();
        invocation.arg(self.now_arg(now));
        for (call, member) in calls.iter().zip(&members) {
            for key in call.keys.all() {
                invocation.key(key);
            }
            invocation.arg(call.permits).arg(&member[..]);
            match call.rule {
                Some(rule) => invocation
                    .arg("1")
                    .arg(rule.rate)
                    .arg(rule.interval_ms())
                    .arg(rule.rate_type.as_redis())
                    .arg(rule.keep_alive_ms()),
                None => invocation.arg("0").arg("").arg("").arg("").arg(""),
            };
        }
        let keys: Vec<&LimiterKeys> = calls.iter().map(|c| c.keys).collect();
        let reply: Result<Vec<i64>, Error> = self
            .run(&keys, |mut conn| async move {
                invocation.invoke_async(&mut conn).await
            })
            .await;
        let reply = match reply {
            Ok(reply) => reply,
            Err(err) => {
                let probe = calls.iter().all(|c| c.permits == 0);
                if !probe && may_have_run(&err) {
                    self.spawn_refund(calls, members);
                }
                return Err(err);
            }
        };
        let outcome = parse_outcome(&reply, calls.len()).ok_or_else(|| Error::Backend {
            source: RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "acquire.lua answered an unexpected reply",
                format!("{reply:?}"),
            )),
        })?;
        Ok((outcome, members))
    }

    /// Gives back the grants of `members` (one per call) where they are in a log;
    /// answers how many were.
    pub(super) async fn refund(
        &self,
        calls: &[Call<'_>],
        members: &[[u8; member::MEMBER_LEN]],
    ) -> Result<i64, Error> {
        let keys = refund_keys(calls);
        let all: Vec<&LimiterKeys> = calls.iter().map(|c| c.keys).collect();
        self.run(&all, |mut conn| async move {
            let mut invocation = SCRIPTS.refund.prepare_invoke();
            invocation.key(&keys[..]);
            for member in members {
                invocation.arg(&member[..]);
            }
            invocation.invoke_async(&mut conn).await
        })
        .await
    }

    /// A call that failed after it was sent may still run (a hung server answers
    /// later): its grants would spend permits no caller uses. Refund them in the
    /// background, on the same connection so the refund runs after the call.
    pub(super) fn spawn_refund(&self, calls: &[Call<'_>], members: Vec<[u8; member::MEMBER_LEN]>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let keys = refund_keys(calls);
        let conn = self.conn.clone();
        let timeout = self.timeout;
        runtime.spawn(async move {
            for attempt in 0..REFUND_ATTEMPTS {
                let mut conn = conn.clone();
                let mut invocation = SCRIPTS.refund.prepare_invoke();
                invocation.key(&keys[..]);
                for member in &members {
                    invocation.arg(&member[..]);
                }
                // Sent before the timeout can drop it: the connection writes it in order.
                let refund = invocation.invoke_async::<i64>(&mut conn);
                // All refunded: done. None: the call may not have run yet (it was
                // sent on a connection since replaced), so look again later.
                if let Ok(Ok(refunded)) = tokio::time::timeout(timeout * 4, refund).await {
                    if refunded as usize >= members.len() {
                        return;
                    }
                }
                tokio::time::sleep(REFUND_BACKOFF * (attempt + 1)).await;
            }
            tracing::debug!(
                "grants of a timed-out rate limiter call were not all found to refund; \
                 any that ran return to the limiter when they leave the window"
            );
        });
    }

    pub async fn try_set_rate(
        &self,
        keys: &LimiterKeys,
        config: &RateLimiterConfig,
        _now: u64,
    ) -> Result<bool, Error> {
        let written: i64 = self
            .run(&[keys], |mut conn| async move {
                config_args(&SCRIPTS.try_set_rate, keys, config)
                    .invoke_async(&mut conn)
                    .await
            })
            .await?;
        Ok(written == 1)
    }

    pub async fn set_rate(
        &self,
        keys: &LimiterKeys,
        config: &RateLimiterConfig,
        _now: u64,
    ) -> Result<(), Error> {
        self.run(&[keys], |mut conn| async move {
            config_args(&SCRIPTS.set_rate, keys, config)
                .invoke_async::<i64>(&mut conn)
                .await
        })
        .await?;
        Ok(())
    }

    pub async fn update_rate(
        &self,
        keys: &LimiterKeys,
        config: &RateLimiterConfig,
        now: u64,
    ) -> Result<(), Error> {
        self.run(&[keys], |mut conn| async move {
            config_args(&SCRIPTS.update_rate, keys, config)
                .arg(self.now_arg(now))
                .invoke_async::<i64>(&mut conn)
                .await
        })
        .await?;
        Ok(())
    }

    pub async fn config(&self, keys: &LimiterKeys, _now: u64) -> Result<Option<RateLimiterConfig>, Error> {
        let fields: Vec<(Vec<u8>, Vec<u8>)> = self
            .run(&[keys], |mut conn| async move {
                redis::cmd("HGETALL")
                    .arg(keys.config())
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        let fields: Vec<(String, String)> = fields
            .into_iter()
            .map(|(f, v)| {
                (
                    String::from_utf8_lossy(&f).into_owned(),
                    String::from_utf8_lossy(&v).into_owned(),
                )
            })
            .collect();
        RateLimiterConfig::from_fields(
            keys.config(),
            fields.iter().map(|(f, v)| (f.as_str(), v.as_str())),
        )
    }

    pub async fn keep_alive(&self, keys: &LimiterKeys, keep_ms: u64, _now: u64) -> Result<(), Error> {
        self.run(&[keys], |mut conn| async move {
            let mut invocation = SCRIPTS.keep_alive.prepare_invoke();
            invocation.key(&keys.all()[..]).arg(keep_ms);
            invocation.invoke_async::<i64>(&mut conn).await
        })
        .await?;
        Ok(())
    }

    pub async fn expire(&self, keys: &LimiterKeys, ttl_ms: u64, _now: u64) -> Result<bool, Error> {
        let set: i64 = self
            .run(&[keys], |mut conn| async move {
                let mut invocation = SCRIPTS.expire.prepare_invoke();
                invocation.key(&keys.all()[..]).arg(ttl_ms);
                invocation.invoke_async(&mut conn).await
            })
            .await?;
        Ok(set == 1)
    }

    pub async fn delete(&self, keys: &LimiterKeys, _now: u64) -> Result<bool, Error> {
        let deleted: i64 = self
            .run(&[keys], |mut conn| async move {
                redis::cmd("DEL")
                    .arg(&keys.all()[..])
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        Ok(deleted > 0)
    }

    pub async fn is_exists(&self, keys: &LimiterKeys, _now: u64) -> Result<bool, Error> {
        let exists: i64 = self
            .run(&[keys], |mut conn| async move {
                redis::cmd("EXISTS")
                    .arg(keys.config())
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        Ok(exists == 1)
    }
}

/// refund.lua's keys: value, client value, permits, client permits of each call.
fn refund_keys(calls: &[Call<'_>]) -> Vec<String> {
    calls
        .iter()
        .flat_map(|call| {
            let k = call.keys;
            [k.value(), k.client_value(), k.permits(), k.client_permits()]
        })
        .collect()
}

/// Whether a failed call may have reached Redis and run there.
fn may_have_run(err: &Error) -> bool {
    match err {
        Error::Timeout { .. } => true,
        Error::Backend { source } => source.is_timeout() || source.is_connection_dropped(),
        _ => false,
    }
}

fn config_args<'a>(
    script: &'a Script,
    keys: &LimiterKeys,
    config: &RateLimiterConfig,
) -> redis::ScriptInvocation<'a> {
    let mut invocation = script.prepare_invoke();
    invocation
        .key(&keys.all()[..])
        .arg(config.rate)
        .arg(config.interval_ms())
        .arg(config.rate_type.as_redis())
        .arg(config.keep_alive_ms());
    invocation
}

fn parse_outcome(reply: &[i64], rules: usize) -> Option<Outcome> {
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
fn script_error(err: RedisError, calls: &[&LimiterKeys]) -> Error {
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
