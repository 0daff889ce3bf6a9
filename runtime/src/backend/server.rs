//! What the server is: its name and version (refused when older than the scripts
//! need), and whether its eviction policy can remove limiter keys.

use redis::aio::ConnectionLike;
use redis::{RedisError, Value};

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
        Err(err) if err.is_io_error() || err.is_timeout() => return Err(ServerProblem::Redis(err)),
        Err(info_err) => {
            let hello: Result<Value, RedisError> = redis::cmd("HELLO").query_async(conn).await;
            match hello {
                Ok(reply) => from_hello(&reply).map(|s| vec![s]),
                Err(err) if err.is_io_error() || err.is_timeout() => return Err(ServerProblem::Redis(err)),
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
    pub(crate) fn into_error(self, target: &str, classify: impl FnOnce(&RedisError) -> Error) -> Error {
        match self {
            ServerProblem::Redis(err) => classify(&err),
            ServerProblem::TooOld(server) => Error::UnsupportedServer {
                target: target.to_owned(),
                found: format!("{} {}", server.product, server.version),
            },
            ServerProblem::Unknown(detail) => Error::UnsupportedServer {
                target: target.to_owned(),
                found: format!("a server that does not report its version ({detail})"),
            },
        }
    }
}

/// The text naming the oldest servers supported, for the error message.
pub(crate) fn needed() -> String {
    format!("Redis {OLDEST_REDIS} or later, or Valkey {OLDEST_VALKEY} or later")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_of_each_server() {
        let redis62 = "# Server\r\nredis_version:6.2.14\r\nredis_git_sha1:40305114\r\n";
        assert_eq!(
            from_info(redis62),
            Some(Server {
                product: "Redis",
                version: Version(6, 2, 14)
            })
        );
        let valkey = "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.8\r\n";
        assert_eq!(
            from_info(valkey),
            Some(Server {
                product: "Valkey",
                version: Version(8, 1, 8)
            })
        );
        assert_eq!(from_info("# Server\r\nos:Linux\r\n"), None);
        assert_eq!(from_info("redis_version:banana\r\n"), None);
        assert!(Version(6, 0, 20) < OLDEST_REDIS && Version(6, 2, 0) >= OLDEST_REDIS);
        assert!(Version(10, 0, 0) > Version(7, 4, 2), "numbers compare as numbers");
        let hello = Value::Array(
            ["server", "valkey", "version", "8.1.8", "proto"]
                .iter()
                .map(|s| Value::BulkString(s.as_bytes().to_vec()))
                .chain([Value::Int(2)])
                .collect(),
        );
        assert_eq!(
            from_hello(&hello),
            Some(Server {
                product: "Valkey",
                version: Version(8, 1, 8)
            })
        );
    }
}
