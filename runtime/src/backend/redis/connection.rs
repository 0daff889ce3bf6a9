//! One connection type over a standalone server or a cluster.

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
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
    /// A connection to one server, or through Sentinel, whose every command is sent
    /// from a task of `runtime`, one that lasts (the client's own while it is a
    /// multi-thread runtime that runs, else the library's): made again there once a
    /// caller on another runtime found it lost, or the client's runtime had ended, so
    /// that its tasks, and its connecting again after a loss, run on that runtime and
    /// not on a caller's, which may end right after its call.
    Carried(Box<Conn>, tokio::runtime::Handle),
}

/// The error of a command whose task on the runtime carrying the connection ended
/// unanswered.
fn carrier_gone() -> redis::RedisError {
    std::io::Error::other("the runtime carrying the connection ended before the command was answered").into()
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(conn) => conn.req_packed_command(cmd),
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
            Conn::Sentinel(conn) => conn.req_packed_command(cmd),
            Conn::Carried(conn, runtime) => {
                let (mut conn, cmd) = ((**conn).clone(), cmd.clone());
                let sent = runtime.spawn(async move { conn.req_packed_command(&cmd).await });
                Box::pin(async move { sent.await.unwrap_or_else(|_| Err(carrier_gone())) })
            }
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
            Conn::Carried(conn, runtime) => {
                let (mut conn, pipeline) = ((**conn).clone(), pipeline.clone());
                let sent =
                    runtime.spawn(async move { conn.req_packed_commands(&pipeline, offset, count).await });
                Box::pin(async move { sent.await.unwrap_or_else(|_| Err(carrier_gone())) })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(conn) => conn.get_db(),
            Conn::Cluster(conn) => conn.get_db(),
            Conn::Sentinel(conn) => conn.get_db(),
            Conn::Carried(conn, _) => conn.get_db(),
        }
    }
}

/// How a client's connection is made again when a reply shows it out of step with
/// its commands (each command handed a reply not its own): the connection's own
/// reconnecting does not, as nothing failed on it.
pub(crate) enum Remake {
    /// A new connection to the one server, made at its next command.
    Single(Box<(redis::Client, ConnectionManagerConfig)>),
    /// A new connection to the cluster (its topology read again from the URL's nodes,
    /// each node connected anew), made in the background: the old one serves until
    /// it is made and reaches the primaries it must (see `reach`), and stays if it
    /// cannot be (the URL's nodes unreachable: the old one still knows the others).
    /// The third field is the connect timeout.
    Cluster(
        Box<(
            redis::cluster::ClusterClient,
            redis::cluster::ClusterConfig,
            Duration,
        )>,
    ),
    /// The master's connection forgotten: the next command has the sentinels asked
    /// for the master and connects to it.
    Sentinel,
}

impl Remake {
    /// `conn` made again now: `None` when it cannot be (the new connection could not
    /// be set up), or when it is made in the background (a cluster's, see
    /// [`cluster`](Remake::cluster)).
    pub(crate) fn remade(&self, conn: &Conn) -> Option<Conn> {
        match (self, conn) {
            (Remake::Single(made), Conn::Single(_)) => {
                let (client, config) = &**made;
                ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
                    .ok()
                    .map(Conn::Single)
            }
            (_, Conn::Carried(conn, runtime)) => {
                // (made on its runtime: the tasks it starts are that runtime's)
                let _entered = runtime.enter();
                let remade = self.remade(conn)?;
                Some(Conn::Carried(Box::new(remade), runtime.clone()))
            }
            (Remake::Sentinel, Conn::Sentinel(sentinel)) => {
                sentinel.forget_master();
                Some(conn.clone())
            }
            _ => None,
        }
    }

    /// `conn` made again to send every command from a task of `runtime`, where this
    /// is called: `None` for a cluster's (see [`cluster_pending`](Remake::cluster_pending)),
    /// or when it cannot be made. Through Sentinel, the connections it kept are
    /// forgotten, and its listener starts again there.
    pub(crate) fn carried(&self, conn: &Conn, runtime: tokio::runtime::Handle) -> Option<Conn> {
        let conn = match (self, conn) {
            // (carried by a runtime that has ended: carried anew)
            (_, Conn::Carried(conn, _)) => return self.carried(conn, runtime),
            (Remake::Single(_), Conn::Single(_)) => self.remade(conn)?,
            (Remake::Sentinel, Conn::Sentinel(sentinel)) => {
                sentinel.carried_to(&runtime);
                conn.clone()
            }
            _ => return None,
        };
        Some(Conn::Carried(Box::new(conn), runtime))
    }

    /// A new cluster connection, connected: `None` when `self` is not a cluster's;
    /// the connecting's error, or `None` when it took more than the connect timeout.
    pub(crate) async fn cluster(&self) -> Option<Result<Conn, Option<redis::RedisError>>> {
        self.cluster_within(|connect| connect).await
    }

    /// [`cluster`](Remake::cluster), given as long as `within` makes of the connect
    /// timeout (`None` past it).
    pub(crate) async fn cluster_within(
        &self,
        within: impl FnOnce(Duration) -> Duration,
    ) -> Option<Result<Conn, Option<redis::RedisError>>> {
        let Remake::Cluster(made) = self else {
            return None;
        };
        let (client, config, connect_timeout) = &**made;
        let connect = client.get_async_connection_with_config(config.clone());
        Some(
            match tokio::time::timeout(within(*connect_timeout), connect).await {
                Ok(Ok(conn)) => Ok(Conn::Cluster(conn)),
                Ok(Err(err)) => Err(Some(err)),
                Err(_) => Err(None),
            },
        )
    }

    /// A new cluster connection made on first use (each command until then tries
    /// the URL's nodes): `None` when `self` is not a cluster's.
    pub(crate) fn cluster_pending(&self) -> Option<Conn> {
        let Remake::Cluster(made) = self else {
            return None;
        };
        let (client, config, _) = &**made;
        Some(Conn::Cluster(
            client.get_pending_async_connection_with_config(config.clone()),
        ))
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

/// The `ip:port` of each primary in a `CLUSTER NODES` reply that is not marked
/// failing (`fail` or `fail?`); lines that do not read as a node are left out.
pub(crate) fn primary_addresses(reply: &str) -> Vec<&str> {
    let mut addresses = Vec::new();
    for line in reply.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 3 || !fields[2].split(',').any(|f| f == "master") || fields[2].contains("fail") {
            continue;
        }
        // ip:port@cport[,hostname]
        let addr = fields[1].split('@').next().unwrap_or_default();
        if addr
            .rsplit_once(':')
            .is_some_and(|(_, port)| port.parse::<u16>().is_ok())
        {
            addresses.push(addr);
        }
    }
    addresses
}

/// `scheme://[auth@]host:port/[#fragment]` (a node URL as [`cluster_nodes`] makes it)
/// with `host:port` replaced by `addr`, the credentials and TLS kept.
pub(crate) fn with_address(node: &str, addr: &str) -> String {
    let start = node
        .rfind('@')
        .map(|at| at + 1)
        .or_else(|| node.find("://").map(|s| s + 3));
    let Some(start) = start else {
        return node.to_owned();
    };
    let end = node[start..].find('/').map_or(node.len(), |e| start + e);
    format!("{}{addr}{}", &node[..start], &node[end..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_urls_keep_all_but_the_address() {
        assert_eq!(
            with_address("redis://:p@ss@a:1/", "10.0.0.2:7001"),
            "redis://:p@ss@10.0.0.2:7001/"
        );
        assert_eq!(
            with_address("rediss://a:1/#insecure", "b:2"),
            "rediss://b:2/#insecure"
        );
    }

    #[test]
    fn primaries_of_a_cluster_nodes_reply() {
        let reply = "\
a1 10.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b2 10.0.0.2:7001@17001,node-b master - 0 0 2 connected 5461-10922
c3 10.0.0.3:7002@17002 master,fail - 0 0 3 disconnected
d4 10.0.0.4:7003@17003 master,fail? - 0 0 4 connected 10923-16383
e5 10.0.0.5:7004@17004 slave a1 0 0 1 connected
short line
";
        assert_eq!(primary_addresses(reply), ["10.0.0.1:7000", "10.0.0.2:7001"]);
    }

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
