//! A limiter's script calls besides deciding: its config written and read, permits
//! released, keep-alive, TTL, existence, and its keys deleted (checked to be a
//! limiter's first).

use super::{layout, Arg, RedisBackend, SCRIPTS};
use crate::backend::Configure;
use crate::{Error, LimiterKeys, RateLimiterConfig, RateType};

impl RedisBackend {
    pub async fn try_set_rate(
        &self,
        keys: &LimiterKeys,
        config: &RateLimiterConfig,
        _now: u64,
    ) -> Result<bool, Error> {
        let written: i64 = self
            .run(&[keys.borrowed()], |mut conn| async move {
                let mut invocation = SCRIPTS.try_set_rate.prepare_invoke();
                let args = &config_args(config)[..layout::config::TRY_SET_RATE.args.len()];
                invocation.key(&keys.all()[..]).arg(args);
                invocation.invoke(&mut conn, self.slot_map()).await
            })
            .await?;
        Ok(written == 1)
    }

    pub async fn configure(
        &self,
        keys: &LimiterKeys,
        config: &RateLimiterConfig,
        how: Configure,
        now: u64,
    ) -> Result<bool, Error> {
        let flag = |on: bool| Arg::Text(if on { "1" } else { "0" });
        let mut args = config_args(config);
        args[layout::config::NOW] = self.now_arg(now);
        args[layout::config::KEEP_WINDOW] = flag(how.keep_state);
        args[layout::config::REQUIRE_EXISTS] = flag(how.require_exists);
        let written: i64 = self
            .run(&[keys.borrowed()], |mut conn| async move {
                let mut invocation = SCRIPTS.configure.prepare_invoke();
                invocation.key(&keys.all()[..]).arg(&args[..]);
                invocation.invoke(&mut conn, self.slot_map()).await
            })
            .await?;
        Ok(written == 1)
    }

    pub async fn release(&self, keys: &LimiterKeys, permits: u64, now: u64) -> Result<(), Error> {
        self.run(&[keys.borrowed()], |mut conn| async move {
            let mut invocation = SCRIPTS.release.prepare_invoke();
            let mut args = [Arg::Text(""); layout::limiter::RELEASE.args.len()];
            args[layout::limiter::RELEASE_PERMITS] = Arg::Int(permits);
            args[layout::limiter::RELEASE_NOW] = self.now_arg(now);
            invocation.key(&keys.all()[..]).arg(&args[..]);
            invocation.invoke::<i64>(&mut conn, self.slot_map()).await
        })
        .await?;
        Ok(())
    }

    pub async fn config(&self, keys: &LimiterKeys, _now: u64) -> Result<Option<RateLimiterConfig>, Error> {
        let fields: Vec<(Vec<u8>, Vec<u8>)> = self
            .run(&[keys.borrowed()], |mut conn| async move {
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

    pub async fn delete_bucket(&self, keys: &LimiterKeys, mode: RateType, _now: u64) -> Result<bool, Error> {
        let key = match mode {
            RateType::Overall => keys.bucket(),
            RateType::PerClient => keys.client_bucket(),
        };
        let keys_and_roles = [(key, "bucket")];
        let keys_and_roles = &keys_and_roles[..];
        self.run(&[keys.borrowed()], |mut conn| async move {
            delete_limiter_keys(&mut conn, keys_and_roles).await
        })
        .await?
        .map(|n| n > 0)
    }

    pub async fn keep_alive(&self, keys: &LimiterKeys, keep_ms: u64, _now: u64) -> Result<(), Error> {
        self.run(&[keys.borrowed()], |mut conn| async move {
            let mut invocation = SCRIPTS.keep_alive.prepare_invoke();
            invocation.key(&keys.all()[..]).arg(keep_ms);
            invocation.invoke::<i64>(&mut conn, self.slot_map()).await
        })
        .await?;
        Ok(())
    }

    pub async fn expire(&self, keys: &LimiterKeys, ttl_ms: u64, _now: u64) -> Result<bool, Error> {
        let set: i64 = self
            .run(&[keys.borrowed()], |mut conn| async move {
                let mut invocation = SCRIPTS.expire.prepare_invoke();
                invocation.key(&keys.all()[..]).arg(ttl_ms);
                invocation.invoke(&mut conn, self.slot_map()).await
            })
            .await?;
        Ok(set == 1)
    }

    pub async fn delete(&self, keys: &LimiterKeys, _now: u64) -> Result<bool, Error> {
        let [config, value, client_value, permits, client_permits] = keys.all();
        let keys_and_roles = [
            (config, "config"),
            (value, "value"),
            (client_value, "value"),
            (permits, "permits"),
            (client_permits, "permits"),
        ];
        let keys_and_roles = &keys_and_roles[..];
        self.run(&[keys.borrowed()], |mut conn| async move {
            delete_limiter_keys(&mut conn, keys_and_roles).await
        })
        .await?
        .map(|n| n > 0)
    }

    pub async fn is_exists(&self, keys: &LimiterKeys, _now: u64) -> Result<bool, Error> {
        let exists: i64 = self
            .run(&[keys.borrowed()], |mut conn| async move {
                redis::cmd("EXISTS")
                    .arg(keys.config())
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        Ok(exists == 1)
    }
}

/// Deletes `keys`, each given with its role (`"config"`, `"value"`, `"permits"` or
/// `"bucket"`), in one script call, when every one is missing or holds what a limiter
/// keeps there (a config hash with rate, interval and type, an integer, a sorted set,
/// a token bucket's state); answers how many were deleted, or [`Error::NotALimiter`]
/// naming the first key that holds something else, having deleted nothing. The keys
/// must share one cluster slot, as a limiter's do. (The `redlimit` CLI's reset.)
#[doc(hidden)]
pub async fn delete_limiter_keys<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    keys: &[(String, &'static str)],
) -> redis::RedisResult<Result<u64, Error>> {
    if keys.is_empty() {
        return Ok(Ok(0));
    }
    let mut invocation = SCRIPTS.reset.prepare_invoke();
    for (key, _) in keys {
        invocation.key(key);
    }
    for (_, role) in keys {
        invocation.arg(*role);
    }
    let reply: redis::Value = invocation.invoke_async(conn).await?;
    let refused = |index: &redis::Value, found: &redis::Value| {
        let index = match index {
            redis::Value::Int(i) => usize::try_from(*i).ok()?.checked_sub(1)?,
            _ => return None,
        };
        let found = match found {
            redis::Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            redis::Value::SimpleString(text) => text.clone(),
            _ => return None,
        };
        let (key, role) = keys.get(index)?;
        Some(Error::NotALimiter {
            key: key.clone(),
            role,
            found,
        })
    };
    Ok(match &reply {
        redis::Value::Int(n) => Ok(u64::try_from(*n).unwrap_or(0)),
        redis::Value::Array(items) if items.len() == 2 => {
            Err(refused(&items[0], &items[1]).unwrap_or_else(|| unexpected_reset(&reply)))
        }
        _ => Err(unexpected_reset(&reply)),
    })
}

fn unexpected_reset(reply: &redis::Value) -> Error {
    Error::UnexpectedReply {
        script: "reset.lua",
        reply: format!("{reply:?}"),
    }
}

/// try_set_rate.lua's arguments, and the first of configure.lua's (the others empty).
fn config_args(config: &RateLimiterConfig) -> [Arg<'static>; layout::config::CONFIGURE.args.len()] {
    use layout::config::{INTERVAL, KEEP_ALIVE, RATE, TYPE};
    let mut args = [Arg::Text(""); layout::config::CONFIGURE.args.len()];
    args[RATE] = Arg::Int(config.rate);
    args[INTERVAL] = Arg::Int(config.interval_ms());
    args[TYPE] = Arg::Text(config.rate_type.as_redis());
    args[KEEP_ALIVE] = Arg::Int(config.keep_alive_ms());
    args
}
