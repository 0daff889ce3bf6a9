//! The Redis backend: one script call per operation, EVALSHA with reload on NOSCRIPT.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use once_cell::sync::Lazy;
use redis::{RedisError, Script};

pub(crate) mod connection;
pub(crate) mod cross_slot;
pub(crate) mod failure;
mod layout;
mod replies;
pub(crate) mod scripts;
pub(crate) mod sentinel;
pub(crate) mod server;
pub(crate) mod target;
#[cfg(feature = "tls")]
pub(crate) mod tls;

use super::{Call, Configure, Outcome};
use crate::keys::Keys;
use crate::{member, Error, LimiterKeys, RateLimiterConfig, RateType};
use connection::Conn;
use failure::classify;
use replies::{parse_acquire_reply, script_error};
use server::{Eviction, Health};
use target::Target;

struct Scripts {
    acquire: Script,
    try_set_rate: Script,
    configure: Script,
    release: Script,
    keep_alive: Script,
    expire: Script,
    refund: Script,
    tokens: Script,
    refund_tokens: Script,
    reset: Script,
    give_back: Script,
}

static SCRIPTS: Lazy<Scripts> = Lazy::new(|| Scripts {
    acquire: Script::new(scripts::ACQUIRE.source),
    try_set_rate: Script::new(scripts::TRY_SET_RATE.source),
    configure: Script::new(scripts::CONFIGURE.source),
    release: Script::new(scripts::RELEASE.source),
    keep_alive: Script::new(scripts::KEEP_ALIVE.source),
    expire: Script::new(scripts::EXPIRE.source),
    refund: Script::new(scripts::REFUND.source),
    tokens: Script::new(scripts::TOKENS.source),
    refund_tokens: Script::new(scripts::REFUND_TOKENS.source),
    reset: Script::new(scripts::RESET.source),
    give_back: Script::new(scripts::GIVE_BACK.source),
});

/// Attempts at refunding a timed-out grant, and the pause before each retry.
/// Entries the stream of limiters reset keeps, about (`XADD ... MAXLEN ~`): a second's
/// resets, many times over, for processes that read it every second.
pub(crate) const RESETS_KEPT: usize = 1_000;

/// Entries of the stream of limiters reset: (id, fields), the fields as bytes (one
/// that is not UTF-8 names no limiter, but must not fail the reading).
pub(crate) type ResetEntries = Vec<(String, Vec<(Vec<u8>, Vec<u8>)>)>;

const REFUND_ATTEMPTS: u32 = 3;
const REFUND_BACKOFF: Duration = Duration::from_millis(500);

/// What [`ClientBuilder::wait_for_replicas`] asks: a grant is answered once this many
/// replicas have it, waiting at most `timeout` for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Replicas {
    pub count: u32,
    pub timeout: Duration,
}

pub(crate) struct RedisBackend {
    conn: Conn,
    timeout: Duration,
    /// Decide at the server's clock (TIME in the scripts) rather than the caller's.
    server_time: bool,
    /// The server as errors name it, and the passwords to keep out of them.
    target: Target,
    /// Whether a command was answered since the connection was made or last lost:
    /// a timeout before that went to connecting, and says so.
    answered: AtomicBool,
    /// The server's version, eviction policy and the connection's name, checked about
    /// once a minute off the deciding path.
    health: std::sync::Arc<Health>,
    /// Grants answered once this many replicas have them (`WAIT` after the script).
    replicas: Option<Replicas>,
}

impl RedisBackend {
    /// `connected`: a connection answered already (a client that connected eagerly),
    /// so a first timeout is the command's, not the connecting's.
    pub fn new(conn: Conn, timeout: Duration, server_time: bool, target: Target, connected: bool) -> Self {
        RedisBackend {
            conn,
            timeout,
            server_time,
            target,
            answered: AtomicBool::new(connected),
            // An eager connect read the version already.
            health: std::sync::Arc::new(Health::new(connected)),
            replicas: None,
        }
    }

    /// Answers grants once `replicas` replicas have them.
    pub(crate) fn wait_for_replicas(mut self, replicas: Option<Replicas>) -> Self {
        self.replicas = replicas;
        self
    }

    /// Notes the eviction policy a connect read.
    pub fn record_eviction(&self, eviction: &Eviction) {
        self.health.record_eviction(eviction, self.target.shown());
    }

    /// Checks the server in a task of its own when a check is due at `now`.
    #[inline]
    fn maybe_check(&self, now: u64) {
        if self.health.due(now) {
            self.spawn_check(now);
        }
    }

    #[cold]
    fn spawn_check(&self, now: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !self.health.begin(now) {
            return;
        }
        let health = self.health.clone();
        let mut conn = self.conn.clone();
        let target = self.target.shown().to_owned();
        let timeout = self.timeout * 4;
        runtime.spawn(async move {
            let _ = tokio::time::timeout(timeout, health.check(&mut conn, &target)).await;
            health.end();
        });
    }

    /// The scripts' time argument: the caller's clock, or empty for the server's.
    fn now_arg(&self, now: u64) -> Arg<'static> {
        match self.server_time {
            false => Arg::Int(now),
            true => Arg::Text(""),
        }
    }

    /// Runs one request under the command timeout; script errors name their key.
    async fn run<T, F>(&self, calls: &[Keys<'_>], request: impl FnOnce(Conn) -> F) -> Result<T, Error>
    where
        F: Future<Output = Result<T, RedisError>>,
    {
        if let Some(refusal) = self.health.refusal(self.target.shown()) {
            return Err(refusal);
        }
        match tokio::time::timeout(self.timeout, request(self.conn.clone())).await {
            Ok(Ok(value)) => {
                if !self.answered.load(Ordering::Relaxed) {
                    self.answered.store(true, Ordering::Relaxed);
                }
                Ok(value)
            }
            Ok(Err(err)) => {
                let connecting = !self.answered.load(Ordering::Relaxed);
                // A lost connection (not a slow answer) is made again before the
                // next command can be answered.
                if err.is_io_error() && !err.is_timeout() {
                    self.answered.store(false, Ordering::Relaxed);
                    // The new connection is named, and the server looked at, again.
                    self.health.check_soon();
                }
                Err(script_error(&err, calls)
                    .unwrap_or_else(|| classify(&err, &self.target, self.timeout, connecting)))
            }
            Err(_) => Err(Error::Timeout {
                after: self.timeout,
                connecting: !self.answered.load(Ordering::Relaxed),
            }),
        }
    }

    /// Whether this is a Redis Cluster (rules may then lie in several slots).
    pub fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }

    /// Decides rules whose keys share one slot, in one script call.
    pub async fn acquire(&self, calls: &[Call<'_>], now: u64) -> Result<Outcome, Error> {
        Ok(self.acquire_group(calls, now).await?.0)
    }

    /// Decides rules whose keys share one slot in one script call; answers the log
    /// members it sent, for compensation.
    pub(crate) async fn acquire_group(
        &self,
        calls: &[Call<'_>],
        now: u64,
    ) -> Result<(Outcome, Vec<[u8; member::MEMBER_LEN]>), Error> {
        self.maybe_check(now);
        let members: Vec<[u8; member::MEMBER_LEN]> = calls
            .iter()
            .map(|call| member::new_member(u32::try_from(call.permits).unwrap_or(u32::MAX)))
            .collect();
        let only_buckets = calls.iter().all(|c| c.bucket.is_some() && c.rule.is_some());
        let script = if only_buckets {
            &SCRIPTS.tokens
        } else {
            &SCRIPTS.acquire
        };
        let cmd = self.acquire_command(script, calls, &members, only_buckets, now);
        let keys: Vec<Keys<'_>> = calls.iter().map(|c| c.keys).collect();
        let probe = calls.iter().all(|c| c.permits == 0);
        let replicas = self.replicas.filter(|_| !probe);
        // A token bucket's grant is not in any log: nothing to take back.
        let refundable = !(probe || only_buckets);
        let cancelled = RefundIfDropped {
            backend: self,
            calls,
            members: &members,
            armed: refundable,
        };
        let reply: Result<(redis::Value, u64), Error> = self
            .run(&keys, |mut conn| async move {
                match replicas {
                    None => eval_sha(script, &cmd, &mut conn).await.map(|reply| (reply, 0)),
                    Some(replicas) => eval_sha_replicated(script, &cmd, replicas, &mut conn).await,
                }
            })
            .await;
        cancelled.disarm();
        let (reply, acknowledged) = match reply {
            Ok(reply) => reply,
            Err(guess @ Error::WrongType { .. }) => return Err(self.wrong_type(calls, guess).await),
            Err(err) => {
                if refundable && may_have_run(&err) {
                    self.spawn_refund(calls, members);
                }
                return Err(err);
            }
        };
        let outcome = self.read_outcome(&reply, calls.len(), now, only_buckets)?;
        if let Some(replicas) = replicas {
            if outcome.granted && acknowledged < u64::from(replicas.count) {
                return Err(Error::NotReplicated {
                    target: self.target.shown().to_owned(),
                    wanted: replicas.count,
                    acknowledged,
                    after: replicas.timeout,
                });
            }
        }
        Ok((outcome, members))
    }

    /// The EVALSHA of the acquire script (`layout::acquire`) or, when every rule is a
    /// token bucket, of the tokens script (`layout::tokens`), written straight into
    /// one command: every key, then every argument, into buffers allocated once
    /// (growing them argument by argument cost more than building the rest).
    fn acquire_command(
        &self,
        script: &Script,
        calls: &[Call<'_>],
        members: &[[u8; member::MEMBER_LEN]],
        only_buckets: bool,
        now: u64,
    ) -> redis::Cmd {
        let mut cmd = redis::Cmd::with_capacity(
            4 + 12 * calls.len(),
            64 + calls.iter().map(|c| c.keys.all_len() + 112).sum::<usize>(),
        );
        cmd.arg("EVALSHA");
        cmd.arg(script.get_hash()).arg(if only_buckets {
            layout::tokens::KEYS_PER_RULE * calls.len()
        } else {
            layout::acquire::KEYS_PER_RULE * calls.len()
        });
        for call in calls {
            match (call.bucket, call.rule) {
                (_, Some(rule)) if only_buckets => cmd.arg(bucket_key(call, rule)),
                // A token bucket in acquire.lua: its two bucket keys in the value keys' places.
                (Some(_), Some(_)) => cmd.arg(&bucket_keys(call)[..]),
                _ => cmd.arg(call.keys),
            };
        }
        cmd.arg(self.now_arg(now));
        for (call, member) in calls.iter().zip(members) {
            match (call.bucket, call.rule) {
                (Some(shape), Some(rule)) if only_buckets => cmd.arg(&tokens_args(call, rule, shape)[..]),
                _ => cmd.arg(&acquire_args(call, member)[..]),
            };
        }
        cmd
    }

    /// The acquire or tokens script's reply as an outcome (`calls` rules decided at
    /// `now`, the caller's clock).
    fn read_outcome(
        &self,
        reply: &redis::Value,
        calls: usize,
        now: u64,
        only_buckets: bool,
    ) -> Result<Outcome, Error> {
        let caller_now = (!self.server_time).then_some(now);
        parse_acquire_reply(reply, calls, caller_now).ok_or_else(|| {
            let mut shown = format!("{reply:?}");
            if shown.len() > 200 {
                let mut end = 200;
                while !shown.is_char_boundary(end) {
                    end -= 1;
                }
                shown.truncate(end);
                shown.push_str("...");
            }
            Error::UnexpectedReply {
                script: if only_buckets { "tokens.lua" } else { "acquire.lua" },
                reply: shown,
            }
        })
    }

    /// acquire.lua reads with plain commands, so a key of the wrong type fails with
    /// Redis's WRONGTYPE, which does not say which key: look at each (an error path
    /// only) and name the first that holds the wrong type, else keep `guess`.
    async fn wrong_type(&self, calls: &[Call<'_>], guess: Error) -> Error {
        for call in calls {
            let k = call.keys;
            let expected: Vec<(String, &str, &'static str)> = if call.bucket.is_some() {
                vec![
                    (k.bucket(), "string", "bucket"),
                    (k.client_bucket(), "string", "bucket"),
                ]
            } else {
                vec![
                    (k.config().to_owned(), "hash", "config"),
                    (k.value(), "string", "value"),
                    (k.client_value(), "string", "value"),
                    (k.permits(), "zset", "permits"),
                    (k.client_permits(), "zset", "permits"),
                ]
            };
            for (key, kind, role) in expected {
                let found: Result<String, Error> = self
                    .run(&[k], |mut conn| {
                        let key = key.clone();
                        async move { redis::cmd("TYPE").arg(key).query_async(&mut conn).await }
                    })
                    .await;
                match found {
                    Ok(found) if found != kind && found != "none" => {
                        return Error::WrongType {
                            key,
                            role,
                            detail: format!("holds a {found}"),
                        }
                    }
                    Ok(_) => {}
                    Err(_) => return guess,
                }
            }
        }
        guess
    }

    /// Gives back the grants of `members` (one per call) where they are in a log;
    /// answers how many were.
    pub(crate) async fn refund(
        &self,
        calls: &[Call<'_>],
        members: &[[u8; member::MEMBER_LEN]],
    ) -> Result<i64, Error> {
        let keys = refund_keys(calls);
        let all: Vec<Keys<'_>> = calls.iter().map(|c| c.keys).collect();
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
    pub(crate) fn spawn_refund(&self, calls: &[Call<'_>], members: Vec<[u8; member::MEMBER_LEN]>) {
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
            .run(&[keys.borrowed()], |mut conn| async move {
                let mut invocation = SCRIPTS.try_set_rate.prepare_invoke();
                let args = &config_args(config)[..layout::config::TRY_SET_RATE.args.len()];
                invocation.key(&keys.all()[..]).arg(args);
                invocation.invoke_async(&mut conn).await
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
                invocation.invoke_async(&mut conn).await
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
            invocation.invoke_async::<i64>(&mut conn).await
        })
        .await?;
        Ok(())
    }

    /// Gives back what a batch taken under `member` did not use (`used` of its permits
    /// were), see `lua/give_back.lua`: in a task of its own, off the caller's path (or
    /// not at all outside a Tokio runtime). A give-back that fails or never runs leaves
    /// the permits counted until they leave the window: stricter, never looser.
    pub(crate) fn spawn_give_back(&self, keys: LimiterKeys, member: [u8; member::MEMBER_LEN], used: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (mut conn, timeout) = (self.conn.clone(), self.timeout);
        runtime.spawn(async move { give_back(&mut conn, timeout, &keys, member, used).await });
    }

    /// [`spawn_give_back`](RedisBackend::spawn_give_back) on the caller's path: done (or
    /// failed, within the command timeout) when it returns.
    pub(crate) async fn give_back(&self, keys: &LimiterKeys, member: [u8; member::MEMBER_LEN], used: u64) {
        give_back(&mut self.conn.clone(), self.timeout, keys, member, used).await;
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

    /// Gives the token-bucket calls among `calls` back the tokens they took, once (a
    /// retried refund could give them twice): for grants a later slot's refusal undoes.
    pub(crate) async fn refund_tokens(&self, calls: &[Call<'_>]) -> Result<(), Error> {
        let mut invocation = SCRIPTS.refund_tokens.prepare_invoke();
        let mut any = false;
        for call in calls {
            let (Some(_), Some(rule)) = (call.bucket, call.rule) else {
                continue;
            };
            let key = match rule.rate_type {
                RateType::Overall => call.keys.bucket(),
                RateType::PerClient => call.keys.client_bucket(),
            };
            invocation.key(key).arg(call.permits * rule.interval_ms());
            any = true;
        }
        if !any {
            return Ok(());
        }
        let keys: Vec<Keys<'_>> = calls.iter().map(|c| c.keys).collect();
        self.run(&keys, |mut conn| async move {
            invocation.invoke_async::<u64>(&mut conn).await.map(|_| ())
        })
        .await
    }

    pub async fn delete_bucket(&self, keys: &LimiterKeys, mode: RateType, _now: u64) -> Result<bool, Error> {
        let key = match mode {
            RateType::Overall => keys.bucket(),
            RateType::PerClient => keys.client_bucket(),
        };
        let keys_and_roles = [(key, "bucket")];
        self.run(&[keys.borrowed()], |mut conn| async move {
            delete_limiter_keys(&mut conn, &keys_and_roles).await
        })
        .await?
        .map(|n| n > 0)
    }

    /// Every field of the hash `key` (the rate overrides).
    pub async fn read_hash(&self, key: &str) -> Result<Vec<(String, String)>, Error> {
        self.run(&[], |mut conn| async move {
            redis::cmd("HGETALL").arg(key).query_async(&mut conn).await
        })
        .await
    }

    /// Sets (`Some`) or deletes (`None`) one field of the hash `key`; true when the
    /// field existed before a delete.
    pub async fn write_hash(&self, key: &str, field: &str, value: Option<&str>) -> Result<bool, Error> {
        self.run(&[], |mut conn| async move {
            match value {
                Some(value) => redis::cmd("HSET")
                    .arg(key)
                    .arg(field)
                    .arg(value)
                    .query_async::<u64>(&mut conn)
                    .await
                    .map(|_| true),
                None => redis::cmd("HDEL")
                    .arg(key)
                    .arg(field)
                    .query_async::<u64>(&mut conn)
                    .await
                    .map(|n| n > 0),
            }
        })
        .await
    }

    /// Appends `name` to the stream `key` of limiters reset, which keeps about its
    /// last [`RESETS_KEPT`] entries.
    pub async fn append_reset(&self, key: &str, name: &str) -> Result<(), Error> {
        self.run(&[], |mut conn| async move {
            redis::cmd("XADD")
                .arg(key)
                .arg("MAXLEN")
                .arg("~")
                .arg(RESETS_KEPT)
                .arg("*")
                .arg("name")
                .arg(name)
                .query_async::<String>(&mut conn)
                .await
                .map(|_| ())
        })
        .await
    }

    /// The stream `key` of limiters reset: its oldest entry's id and the entries from
    /// `from` on (at most [`RESETS_KEPT`] + 1 000, however many were appended), as
    /// (id, fields).
    pub async fn read_resets(&self, key: &str, from: &str) -> Result<(Option<String>, ResetEntries), Error> {
        self.run(&[], |mut conn| async move {
            let (oldest, entries): (ResetEntries, ResetEntries) = redis::pipe()
                .cmd("XRANGE")
                .arg(key)
                .arg("-")
                .arg("+")
                .arg("COUNT")
                .arg(1)
                .cmd("XRANGE")
                .arg(key)
                .arg(from)
                .arg("+")
                .arg("COUNT")
                .arg(RESETS_KEPT + 1_000)
                .query_async(&mut conn)
                .await?;
            Ok((oldest.into_iter().next().map(|(id, _)| id), entries))
        })
        .await
    }

    /// Adds `counts` to the fields of the hash `key`, and gives it `ttl_ms`.
    pub async fn add_counts(&self, key: &str, counts: &[(String, u64)], ttl_ms: u64) -> Result<(), Error> {
        self.run(&[], |mut conn| async move {
            let mut pipe = redis::pipe();
            for (field, count) in counts {
                pipe.cmd("HINCRBY").arg(key).arg(field).arg(*count).ignore();
            }
            pipe.cmd("PEXPIRE").arg(key).arg(ttl_ms).ignore();
            pipe.query_async::<()>(&mut conn).await
        })
        .await
    }

    pub async fn keep_alive(&self, keys: &LimiterKeys, keep_ms: u64, _now: u64) -> Result<(), Error> {
        self.run(&[keys.borrowed()], |mut conn| async move {
            let mut invocation = SCRIPTS.keep_alive.prepare_invoke();
            invocation.key(&keys.all()[..]).arg(keep_ms);
            invocation.invoke_async::<i64>(&mut conn).await
        })
        .await?;
        Ok(())
    }

    pub async fn expire(&self, keys: &LimiterKeys, ttl_ms: u64, _now: u64) -> Result<bool, Error> {
        let set: i64 = self
            .run(&[keys.borrowed()], |mut conn| async move {
                let mut invocation = SCRIPTS.expire.prepare_invoke();
                invocation.key(&keys.all()[..]).arg(ttl_ms);
                invocation.invoke_async(&mut conn).await
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
        self.run(&[keys.borrowed()], |mut conn| async move {
            delete_limiter_keys(&mut conn, &keys_and_roles).await
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

/// One give-back (`lua/give_back.lua`), within `timeout`; a failure is logged at debug
/// level only (the permits return when they leave the window).
async fn give_back(
    conn: &mut Conn,
    timeout: Duration,
    keys: &LimiterKeys,
    member: [u8; member::MEMBER_LEN],
    used: u64,
) {
    let mut args = [Arg::Text(""); layout::limiter::GIVE_BACK.args.len()];
    args[layout::limiter::GIVE_BACK_MEMBER] = Arg::Bytes(&member[..]);
    args[layout::limiter::GIVE_BACK_USED] = Arg::Int(used);
    let mut invocation = SCRIPTS.give_back.prepare_invoke();
    invocation.key(&keys.all()[..]).arg(&args[..]);
    let given = tokio::time::timeout(timeout, invocation.invoke_async::<u64>(conn)).await;
    if !matches!(given, Ok(Ok(_))) {
        tracing::debug!(
            "a batch's unused permits were not given back; they return to the limiter when \
             they leave the window"
        );
    }
}

/// One argument of a script, written as Redis receives it (no allocation).
#[derive(Clone, Copy)]
enum Arg<'a> {
    Int(u64),
    Bytes(&'a [u8]),
    Text(&'static str),
}

impl redis::ToRedisArgs for Arg<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        match *self {
            Arg::Int(n) => n.write_redis_args(out),
            Arg::Bytes(bytes) => out.write_arg(bytes),
            Arg::Text(text) => out.write_arg(text.as_bytes()),
        }
    }
}

/// tokens.lua's key for one rule: its bucket, overall or per client.
fn bucket_key(call: &Call<'_>, rule: &RateLimiterConfig) -> String {
    match rule.rate_type {
        RateType::Overall => call.keys.bucket(),
        RateType::PerClient => call.keys.client_bucket(),
    }
}

/// acquire.lua's keys for a token-bucket rule: the limiter's, with its buckets in the
/// value keys' places.
fn bucket_keys(call: &Call<'_>) -> [String; layout::acquire::KEYS_PER_RULE] {
    use layout::acquire::{BUCKET, CLIENT_BUCKET, CLIENT_PERMITS_KEY, CONFIG, PERMITS_KEY};
    let k = call.keys;
    let mut keys: [String; layout::acquire::KEYS_PER_RULE] = Default::default();
    keys[CONFIG] = k.config().to_owned();
    keys[BUCKET] = k.bucket();
    keys[CLIENT_BUCKET] = k.client_bucket();
    keys[PERMITS_KEY] = k.permits();
    keys[CLIENT_PERMITS_KEY] = k.client_permits();
    keys
}

/// acquire.lua's arguments for one rule.
fn acquire_args<'a>(call: &Call<'_>, member: &'a [u8]) -> [Arg<'a>; layout::acquire::ARGS_PER_RULE] {
    use layout::acquire::*;
    let mut args = [Arg::Text(""); ARGS_PER_RULE];
    args[PERMITS] = Arg::Int(call.permits);
    args[MEMBER] = Arg::Bytes(member);
    match (call.bucket, call.rule) {
        (Some(shape), Some(rule)) => {
            args[WARMUP] = Arg::Int(shape.warmup_ms);
            args[RATE] = Arg::Int(rule.rate);
            args[INTERVAL] = Arg::Int(rule.interval_ms());
            args[TYPE] = Arg::Text(bucket_kind(rule.rate_type));
            args[BURST] = Arg::Int(shape.burst);
        }
        (None, Some(rule)) => {
            args[OWNS] = Arg::Text("1");
            args[RATE] = Arg::Int(rule.rate);
            args[INTERVAL] = Arg::Int(rule.interval_ms());
            args[TYPE] = Arg::Text(rule.rate_type.as_redis());
            args[KEEP_ALIVE] = Arg::Int(rule.keep_alive_ms());
        }
        // the stored config, used as it is: the config's arguments are not read
        (_, None) => args[OWNS] = Arg::Text("0"),
    }
    args
}

/// tokens.lua's arguments for one rule.
fn tokens_args(
    call: &Call<'_>,
    rule: &RateLimiterConfig,
    shape: crate::BucketShape,
) -> [Arg<'static>; layout::tokens::ARGS_PER_RULE] {
    use layout::tokens::*;
    let mut args = [Arg::Text(""); ARGS_PER_RULE];
    args[PERMITS] = Arg::Int(call.permits);
    args[RATE] = Arg::Int(rule.rate);
    args[INTERVAL] = Arg::Int(rule.interval_ms());
    args[BURST] = Arg::Int(shape.burst);
    args[WARMUP] = Arg::Int(shape.warmup_ms);
    args[TYPE] = Arg::Text(bucket_kind(rule.rate_type));
    args
}

/// A token bucket's type in the scripts' arguments: "2" overall, "3" per client.
fn bucket_kind(mode: RateType) -> &'static str {
    match mode {
        RateType::Overall => "2",
        RateType::PerClient => "3",
    }
}

/// Runs `cmd`, an EVALSHA of `script`; on NOSCRIPT (a restarted or flushed server)
/// loads the script and runs it again, as redis-rs's ScriptInvocation does. The
/// command is built by hand because a ScriptInvocation keeps every key and argument
/// in a vector of its own and copies them into the command on every call.
async fn eval_sha<T: redis::FromRedisValue>(
    script: &Script,
    cmd: &redis::Cmd,
    conn: &mut Conn,
) -> redis::RedisResult<T> {
    match cmd.query_async(conn).await {
        Err(err) if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.prepare_invoke().load_async(conn).await?;
            cmd.query_async(conn).await
        }
        other => other,
    }
}

/// The script, then `WAIT replicas timeout` in the same round trip (a pipeline):
/// its reply, and how many replicas acknowledged what it wrote.
async fn eval_sha_replicated(
    script: &Script,
    cmd: &redis::Cmd,
    replicas: Replicas,
    conn: &mut Conn,
) -> redis::RedisResult<(redis::Value, u64)> {
    let mut pipe = redis::pipe();
    let timeout_ms = u64::try_from(replicas.timeout.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    pipe.add_command(cmd.clone())
        .add_command(redis::cmd("WAIT").arg(replicas.count).arg(timeout_ms).clone());
    match pipe.query_async(conn).await {
        Err(err) if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.prepare_invoke().load_async(conn).await?;
            pipe.query_async(conn).await
        }
        other => other,
    }
}

/// refund.lua's keys: value, client value, permits, client permits of each call.
fn refund_keys(calls: &[Call<'_>]) -> Vec<String> {
    use layout::refunds::{CLIENT_PERMITS, CLIENT_VALUE, PERMITS, REFUND, VALUE};
    calls
        .iter()
        .flat_map(|call| {
            let k = call.keys;
            let mut keys: [String; REFUND.rule_keys.len()] = Default::default();
            keys[VALUE] = k.value();
            keys[CLIENT_VALUE] = k.client_value();
            keys[PERMITS] = k.permits();
            keys[CLIENT_PERMITS] = k.client_permits();
            keys
        })
        .collect()
}

/// Refunds a call's grants when its future is dropped while its script is on its way
/// (the caller's own timeout, a `select!`, a reset HTTP/2 stream): the script may have
/// run, and nobody will use what it granted.
struct RefundIfDropped<'a, 'c> {
    backend: &'a RedisBackend,
    calls: &'a [Call<'c>],
    members: &'a [[u8; member::MEMBER_LEN]],
    armed: bool,
}

impl RefundIfDropped<'_, '_> {
    /// The reply came (or the call failed, which refunds on its own terms).
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for RefundIfDropped<'_, '_> {
    fn drop(&mut self) {
        if self.armed {
            self.backend.spawn_refund(self.calls, self.members.to_vec());
        }
    }
}

/// Whether a failed call may have reached Redis and run there.
fn may_have_run(err: &Error) -> bool {
    match err {
        // A connection lost after the call was written: it may have run.
        Error::Timeout { .. } | Error::Unreachable { .. } => true,
        _ => false,
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
