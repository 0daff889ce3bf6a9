//! One connection type over a standalone server or a cluster.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use std::time::Duration;

use crate::backend::redis::failure::classify;
use crate::backend::redis::sentinel::SentinelConn;
use crate::backend::redis::target::Target;
use crate::Error;

/// A reconnecting connection to one server, or a connection to a Redis Cluster that
/// follows MOVED/ASK redirects and topology changes by itself. Cheap to clone.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    /// The master Sentinel names, found again after a failover.
    Sentinel(SentinelConn),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(conn) => conn.req_packed_command(cmd),
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
            Conn::Sentinel(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(conn) => conn.get_db(),
            Conn::Cluster(conn) => conn.get_db(),
            Conn::Sentinel(conn) => conn.get_db(),
        }
    }
}

/// A connection for raw commands, made by [`ClientBuilder::connect_raw`] as a client
/// makes its own; its failures are named as the client's are.
///
/// [`ClientBuilder::connect_raw`]: crate::ClientBuilder::connect_raw
#[derive(Clone)]
pub struct RawConnection {
    conn: Conn,
    target: Target,
    command_timeout: Duration,
}

impl RawConnection {
    pub(crate) fn new(conn: Conn, target: Target, command_timeout: Duration) -> RawConnection {
        RawConnection {
            conn,
            target,
            command_timeout,
        }
    }

    /// The [`Error`] a client would answer for `err`, a failure of a command sent on
    /// this connection (passwords removed).
    pub fn error(&self, err: &redis::RedisError) -> Error {
        classify(err, &self.target, self.command_timeout, false)
    }

    /// Where it is connected, password hidden.
    pub fn shown(&self) -> &str {
        self.target.shown()
    }
}

impl std::fmt::Debug for RawConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawConnection")
            .field("target", &self.target)
            .finish()
    }
}

impl ConnectionLike for RawConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.conn.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.conn.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

/// The node URLs of `redis+cluster://[user:password@]host:port,host:port[/]`
/// (`rediss+cluster://` for TLS, fragments such as `#insecure` kept), or `None` when
/// `url` is not a cluster URL.
pub fn cluster_nodes(url: &str) -> Option<Result<Vec<String>, Error>> {
    let (scheme, rest) = match url.strip_prefix("redis+cluster://") {
        Some(rest) => ("redis", rest),
        None => ("rediss", url.strip_prefix("rediss+cluster://")?),
    };
    let (rest, fragment) = match rest.find('#') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, ""),
    };
    let rest = rest.trim_end_matches('/');
    let (auth, hosts) = match rest.rfind('@') {
        Some(at) => (&rest[..=at], &rest[at + 1..]),
        None => ("", rest),
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|host| format!("{scheme}://{auth}{host}/{fragment}"))
        .collect();
    if nodes.is_empty() {
        return Some(Err(Error::InvalidUrl {
            url: crate::backend::redis::target::Target::new(url).shown().to_owned(),
            detail: "no node listed".to_owned(),
        }));
    }
    Some(Ok(nodes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls() {
        assert!(cluster_nodes("redis://h:1/").is_none());
        assert_eq!(
            cluster_nodes("redis+cluster://a:7000,b:7001/").unwrap().unwrap(),
            ["redis://a:7000/", "redis://b:7001/"]
        );
        assert_eq!(
            cluster_nodes("redis+cluster://u:p@a:7000,b:7001")
                .unwrap()
                .unwrap(),
            ["redis://u:p@a:7000/", "redis://u:p@b:7001/"]
        );
        assert_eq!(
            cluster_nodes("rediss+cluster://a:7000,b:7001/#insecure")
                .unwrap()
                .unwrap(),
            ["rediss://a:7000/#insecure", "rediss://b:7001/#insecure"]
        );
        let err = cluster_nodes("redis+cluster://:secret@/").unwrap().unwrap_err();
        assert!(!format!("{err} {err:?}").contains("secret"), "{err:?}");
    }
}
