//! What the server is: its name and version (refused when older than the scripts
//! need), and whether its eviction policy can remove limiter keys.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

use redis::aio::ConnectionLike;
use redis::{RedisError, Value};

use super::failure::{no_cluster, NOT_A_CLUSTER_NODE};
use crate::Error;

/// The oldest Redis the scripts are run against in CI (6.2.14 there).
pub(crate) const OLDEST_REDIS: Version = Version(6, 2, 0);
/// The oldest Valkey (its first release, 7.2, reports redis_version 7.2.4).
pub(crate) const OLDEST_VALKEY: Version = Version(7, 2, 0);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Version(pub u32, pub u32, pub u32);

impl Version {
    /// `7.0.15` (a missing patch or minor reads as 0); `None` when it is not a version.
    fn parse(text: &str) -> Option<Version> {
        let mut parts = text.trim().split('.');
        let mut next = || -> Option<u32> {
            match parts.next() {
                None => Some(0),
                Some(p) => p.parse().ok(),
            }
        };
        let v = Version(next()?, next()?, next()?);
        Some(v)
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// A server's product and version, as INFO server or HELLO report them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Server {
    pub product: &'static str,
    pub version: Version,
}

impl Server {
    fn oldest(&self) -> Version {
        if self.product == "Valkey" {
            OLDEST_VALKEY
        } else {
            OLDEST_REDIS
        }
    }
}

/// The server an `INFO server` text describes: Valkey by `valkey_version` (it reports
/// a `redis_version` too, the Redis it is compatible with), else Redis.
fn from_info(text: &str) -> Option<Server> {
    let field = |name: &str| {
        text.lines()
            .find_map(|line| line.trim_end().strip_prefix(name)?.strip_prefix(':'))
    };
    if let Some(v) = field("valkey_version") {
        return Some(Server {
            product: "Valkey",
            version: Version::parse(v)?,
        });
    }
    Some(Server {
        product: "Redis",
        version: Version::parse(field("redis_version")?)?,
    })
}

/// The server HELLO's reply (`server`, `version`, ... as a map or a flat array) names.
fn from_hello(reply: &Value) -> Option<Server> {
    let pairs: Vec<(&Value, &Value)> = match reply {
        Value::Map(map) => map.iter().map(|(k, v)| (k, v)).collect(),
        Value::Array(items) => items.chunks_exact(2).map(|p| (&p[0], &p[1])).collect(),
        _ => return None,
    };
    let field = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| text_of(k).as_deref() == Some(name))
            .and_then(|(_, v)| text_of(v))
    };
    let product = match field("server")?.as_str() {
        "valkey" => "Valkey",
        _ => "Redis",
    };
    Some(Server {
        product,
        version: Version::parse(&field("version")?)?,
    })
}

fn text_of(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// Every node's text of a reply: one server's, or a cluster's map of node to text.
fn texts_of(value: &Value) -> Vec<String> {
    match value {
        Value::Map(map) => map.iter().filter_map(|(_, v)| text_of(v)).collect(),
        other => text_of(other).into_iter().collect(),
    }
}

/// Reads which server this is (every node of a cluster; the oldest is answered) by
/// `INFO server`, or by `HELLO` where INFO is forbidden (an ACL user without
/// `+info`, a managed service that renamed it).
pub(crate) async fn read_server(conn: &mut impl ConnectionLike) -> Result<Server, ServerProblem> {
    let info: Result<Value, RedisError> = redis::cmd("INFO").arg("server").query_async(conn).await;
    let found = match info {
        Ok(reply) => texts_of(&reply)
            .iter()
            .map(|text| from_info(text))
            .collect::<Option<Vec<Server>>>()
            .filter(|all| !all.is_empty()),
        Err(err) if !refused_command(&err) => return Err(ServerProblem::Redis(err)),
        Err(info_err) => {
            let hello: Result<Value, RedisError> = redis::cmd("HELLO").query_async(conn).await;
            match hello {
                Ok(reply) => from_hello(&reply).map(|s| vec![s]),
                Err(err) if !refused_command(&err) => return Err(ServerProblem::Redis(err)),
                Err(hello_err) => {
                    return Err(ServerProblem::Unknown(format!(
                        "INFO server answered `{info_err}` and HELLO `{hello_err}`"
                    )))
                }
            }
        }
    };
    let Some(mut servers) = found else {
        return Err(ServerProblem::Unknown(
            "INFO server and HELLO named no redis_version / valkey_version".to_owned(),
        ));
    };
    servers.sort_by_key(|s| s.version);
    let server = servers.swap_remove(0);
    if server.version < server.oldest() {
        return Err(ServerProblem::TooOld(server));
    }
    Ok(server)
}

/// Whether the server answered that it will not run the command (unknown, renamed or
/// forbidden by the ACL: `ERR`, `NOPERM`), as opposed to failing otherwise (the
/// connection, the credentials, loading...), which says nothing of its version.
fn refused_command(err: &RedisError) -> bool {
    match err.code() {
        Some("NOPERM") => true,
        // `unknown command 'INFO'`: renamed away. Any other ERR (a failed SELECT while
        // connecting, say) is the connection's.
        Some("ERR") => err
            .detail()
            .is_some_and(|d| d.to_ascii_lowercase().starts_with("unknown command")),
        _ => false,
    }
}

/// Why a server is not used.
#[derive(Debug)]
pub(crate) enum ServerProblem {
    /// The connection failed while asking.
    Redis(RedisError),
    /// Older than the scripts need.
    TooOld(Server),
    /// It would not say what it is.
    Unknown(String),
}

impl ServerProblem {
    /// What the server was found to be, for an unsupported one.
    fn found(&self) -> Option<String> {
        match self {
            ServerProblem::Redis(_) => None,
            ServerProblem::TooOld(server) => Some(format!("{} {}", server.product, server.version)),
            ServerProblem::Unknown(detail) => {
                Some(format!("a server that does not report its version ({detail})"))
            }
        }
    }

    pub(crate) fn into_error(self, target: &str, classify: impl FnOnce(&RedisError) -> Error) -> Error {
        match (self.found(), self) {
            (Some(found), _) => Error::UnsupportedServer {
                target: target.to_owned(),
                found,
            },
            (None, ServerProblem::Redis(err)) => classify(&err),
            (None, _) => unreachable!("only a connection failure has nothing found"),
        }
    }
}

/// The text naming the oldest servers supported, for the error message.
pub(crate) fn needed() -> String {
    format!("Redis {OLDEST_REDIS} or later, or Valkey {OLDEST_VALKEY} or later")
}

/// How the server may drop keys when it is full: `maxmemory-policy` and `maxmemory`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    /// `noeviction`, `allkeys-lru`, `volatile-ttl`, ...
    pub policy: String,
    /// Bytes; 0 is no limit (nothing is ever evicted).
    pub maxmemory: u64,
}

impl Eviction {
    /// Whether the policy can evict a limiter's keys: every `allkeys-*` policy, and
    /// every `volatile-*` one (the keys carry TTLs), once a `maxmemory` is set.
    pub fn can_evict(&self) -> bool {
        self.maxmemory > 0 && (self.policy.starts_with("allkeys-") || self.policy.starts_with("volatile-"))
    }

    /// What an operator is told when [`can_evict`](Self::can_evict).
    pub fn warning(&self, target: &str) -> String {
        format!(
            "Redis at `{target}` can evict rate limiter keys (maxmemory-policy {}, maxmemory {} bytes): \
             an evicted key forgets its grants, so that limit starts again from a full window; \
             set maxmemory-policy noeviction (see RELIABILITY.md, \"When Redis loses data\")",
            self.policy, self.maxmemory
        )
    }
}

/// Reads the eviction policy with `CONFIG GET maxmemory*` (one pattern: Redis 6.2
/// takes no more), or `INFO memory` where CONFIG is forbidden (managed services, ACL
/// users without `+config`). `Ok(None)`: neither said (a server without them).
pub async fn read_eviction(conn: &mut impl ConnectionLike) -> Result<Option<Eviction>, RedisError> {
    let config: Result<Value, RedisError> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory*")
        .query_async(conn)
        .await;
    match config {
        Ok(reply) => {
            if let Some(found) = from_config(&reply) {
                return Ok(Some(found));
            }
        }
        Err(err) if err.is_io_error() || err.is_timeout() => return Err(err),
        Err(_) => {}
    }
    let info: Value = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    // A cluster answers every node's: the first that can evict, else the first.
    let all: Vec<Eviction> = texts_of(&info)
        .iter()
        .filter_map(|t| from_info_memory(t))
        .collect();
    Ok(all.iter().find(|e| e.can_evict()).or(all.first()).cloned())
}

fn from_config(reply: &Value) -> Option<Eviction> {
    let pairs: Vec<(String, String)> = match reply {
        Value::Map(map) => map
            .iter()
            .filter_map(|(k, v)| Some((text_of(k)?, text_of(v)?)))
            .collect(),
        Value::Array(items) => items
            .chunks_exact(2)
            .filter_map(|p| Some((text_of(&p[0])?, text_of(&p[1])?)))
            .collect(),
        _ => return None,
    };
    let field = |name: &str| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    Some(Eviction {
        policy: field("maxmemory-policy")?,
        maxmemory: field("maxmemory")?.parse().ok()?,
    })
}

fn from_info_memory(text: &str) -> Option<Eviction> {
    let field = |name: &str| {
        text.lines()
            .find_map(|line| line.trim_end().strip_prefix(name)?.strip_prefix(':'))
    };
    Some(Eviction {
        policy: field("maxmemory_policy")?.to_owned(),
        maxmemory: field("maxmemory")?.parse().ok()?,
    })
}

/// What the client knows of its server, checked on connect and then about once a
/// minute from the deciding path (in a task of its own, never on a call's way):
/// the eviction policy, the connection's name, and, for a client that connected
/// lazily, the version.
#[derive(Default)]
pub(crate) struct Health {
    /// Client-clock ms at which the next check is due; 0: at the next decision.
    next_check: AtomicU64,
    running: AtomicBool,
    /// Whether the last policy read could evict (the warning is logged on the change).
    evicting: AtomicBool,
    /// Whether the version was read (eager connect reads it before the client exists).
    version_known: AtomicBool,
    /// Why every call is refused: [`SERVES`], or a lazily connected client's server
    /// found older than supported ([`TOO_OLD`], for good) or, for a cluster URL, no
    /// cluster node ([`NO_CLUSTER`], until a check finds one).
    refused: AtomicU8,
    found: std::sync::OnceLock<String>,
    /// Whether a check asks the server if it is a cluster node: a client that
    /// connected to a cluster lazily (one connected now was found one, or refused).
    checks_cluster: bool,
    /// Checks whose question found no answer (a silence, a busy server, the command
    /// refused), each followed by another a [`ASK_AGAIN_MS`] later, up to
    /// [`ASK_AGAIN`] of them.
    unanswered: AtomicU8,
    /// Client-clock ms at which the last check began.
    began: AtomicU64,
}

/// How soon a check is made again after one whose question found no answer.
const ASK_AGAIN_MS: u64 = 1_000;

/// How many checks in a row whose question found no answer are each followed by
/// another soon; then the check waits its [`CHECK_EVERY_MS`] again.
const ASK_AGAIN: u8 = 30;

/// [`Health::refused`]'s states.
const SERVES: u8 = 0;
const TOO_OLD: u8 = 1;
const NO_CLUSTER: u8 = 2;

/// How often the policy is read again.
pub(crate) const CHECK_EVERY_MS: u64 = 60_000;

/// The name connections announce (`CLIENT SETNAME`), shown by `CLIENT LIST`.
pub const CONNECTION_NAME: &str = "redlimit";

impl Health {
    /// `connected`: connected now, not lazily; `cluster`: to a Redis Cluster.
    pub(crate) fn new(connected: bool, cluster: bool) -> Health {
        let health = Health {
            checks_cluster: cluster && !connected,
            ..Health::default()
        };
        health.version_known.store(connected, Ordering::Relaxed);
        health
    }

    /// Whether a check is due at `now` (client-clock ms): a relaxed load and a compare.
    #[inline]
    pub(crate) fn due(&self, now: u64) -> bool {
        let next = self.next_check.load(Ordering::Relaxed);
        // A clock set back by more than a period checks again too.
        now >= next || next > now.saturating_add(2 * CHECK_EVERY_MS)
    }

    /// The next decision checks again (a connection was lost and is made anew: name it).
    pub(crate) fn check_soon(&self) {
        self.next_check.store(0, Ordering::Relaxed);
    }

    /// Takes the check at `now`; false when another is running.
    pub(crate) fn begin(&self, now: u64) -> bool {
        if self.running.swap(true, Ordering::Acquire) {
            return false;
        }
        self.next_check
            .store(now.saturating_add(CHECK_EVERY_MS), Ordering::Relaxed);
        self.began.store(now, Ordering::Relaxed);
        true
    }

    /// The error every call answers once the server was found older than supported,
    /// or, for a cluster URL, no cluster node.
    #[inline]
    pub(crate) fn refusal(&self, target: &str) -> Option<Error> {
        match self.refused.load(Ordering::Relaxed) {
            SERVES => None,
            NO_CLUSTER => Some(Error::WrongServer {
                target: target.to_owned(),
                detail: NOT_A_CLUSTER_NODE.to_owned(),
            }),
            _ => Some(Error::UnsupportedServer {
                target: target.to_owned(),
                found: self.found.get().cloned().unwrap_or_default(),
            }),
        }
    }

    /// Notes a policy read: logs one warning when it newly can evict, and sets the
    /// `redlimit_redis_evictable{server}` gauge (1: keys can be evicted, 0: they
    /// cannot), `server` being the client's URL with its password hidden (one series
    /// per client a process makes).
    pub(crate) fn record_eviction(&self, eviction: &Eviction, target: &str) {
        let evicting = eviction.can_evict();
        #[cfg(feature = "metrics")]
        metrics::gauge!("redlimit_redis_evictable", "server" => target.to_owned()).set(if evicting {
            1.0
        } else {
            0.0
        });
        if self.evicting.swap(evicting, Ordering::Relaxed) != evicting && evicting {
            tracing::warn!(
                policy = %eviction.policy,
                maxmemory = eviction.maxmemory,
                "{}",
                eviction.warning(target)
            );
        }
    }

    /// One check on `conn`: names the connection, reads the version when not yet
    /// known and the eviction policy. Failures are left to the calls to report; a
    /// connection that cannot be made ends the check (each command after would try
    /// one of its own).
    pub(crate) async fn check(&self, conn: &mut impl ConnectionLike, target: &str) {
        // First: a lazy cluster connection to a single server answers this at once,
        // where the commands below, sent to every node, find none (and time out
        // behind a few milliseconds of network).
        if self.checks_cluster {
            self.check_cluster(conn).await;
        }
        let named: Result<(), RedisError> = redis::cmd("CLIENT")
            .arg("SETNAME")
            .arg(CONNECTION_NAME)
            .query_async(conn)
            .await;
        if named.is_err_and(|err| err.is_io_error()) {
            return;
        }
        if !self.version_known.load(Ordering::Relaxed) {
            match read_server(conn).await {
                Ok(_) => self.version_known.store(true, Ordering::Relaxed),
                Err(ServerProblem::Redis(_)) => {}
                Err(problem) => {
                    let found = problem.found().unwrap_or_default();
                    tracing::error!("Redis at `{target}` is {found}, and redlimit needs {}", needed());
                    let _ = self.found.set(found);
                    self.refused.store(TOO_OLD, Ordering::Relaxed);
                    self.version_known.store(true, Ordering::Relaxed);
                }
            }
        }
        if let Ok(Some(eviction)) = read_eviction(conn).await {
            self.record_eviction(&eviction, target);
        }
    }

    /// Whether the server is a cluster node: a lazy client's cluster connection to a
    /// single server serves the calls whose scripts the server holds (its slot map
    /// empty, it sends each where it can), so no call of it need fail to say so.
    async fn check_cluster(&self, conn: &mut impl ConnectionLike) {
        let id: Result<Value, RedisError> = redis::cmd("CLUSTER").arg("MYID").query_async(conn).await;
        let (from, to) = match id {
            Err(err) if no_cluster(&err.to_string()) => (SERVES, NO_CLUSTER),
            Ok(Value::BulkString(_) | Value::SimpleString(_)) => (NO_CLUSTER, SERVES),
            // No answer: asked again soon, a few times, so that a server silent or
            // busy at the first check is not served for a minute.
            _ => {
                // (one check at a time: no other writes it meanwhile)
                let unanswered = self.unanswered.load(Ordering::Relaxed);
                if unanswered < ASK_AGAIN {
                    self.unanswered.store(unanswered + 1, Ordering::Relaxed);
                    let began = self.began.load(Ordering::Relaxed);
                    self.next_check
                        .store(began.saturating_add(ASK_AGAIN_MS), Ordering::Relaxed);
                }
                return;
            }
        };
        self.unanswered.store(0, Ordering::Relaxed);
        if self
            .refused
            .compare_exchange(from, to, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
            && to == NO_CLUSTER
        {
            tracing::error!("{NOT_A_CLUSTER_NODE}");
        }
    }

    pub(crate) fn end(&self) {
        self.running.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests;
