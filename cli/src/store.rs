//! The Redis the CLI talks to: one node or a cluster, raw commands for reading state
//! as it is stored, and SCAN over every primary.

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, RedisFuture, Value};

/// A connection to one node or to a cluster (commands on one key are routed to it).
#[derive(Clone)]
pub enum Conn {
    Node(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Node(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Node(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Node(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Where the CLI reads: the routed connection, and one connection per primary for SCAN.
pub struct Store {
    pub conn: Conn,
    primaries: Vec<MultiplexedConnection>,
}

impl Store {
    pub async fn open(url: &str) -> Result<Store, String> {
        match redlimit_runtime::cluster_nodes(url) {
            Some(nodes) => {
                let nodes = nodes.map_err(|e| e.to_string())?;
                let client = redis::cluster::ClusterClient::new(nodes.clone()).map_err(|e| e.to_string())?;
                let conn = client.get_async_connection().await.map_err(|e| e.to_string())?;
                let primaries = primaries(&nodes[0]).await?;
                Ok(Store {
                    conn: Conn::Cluster(conn),
                    primaries,
                })
            }
            None => {
                let client = redis::Client::open(url).map_err(|e| e.to_string())?;
                let conn = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(Store {
                    conn: Conn::Node(conn.clone()),
                    primaries: vec![conn],
                })
            }
        }
    }

    /// Every key matching `pattern` (and of `kind`, when given) on every primary, at
    /// most `limit` of them.
    pub async fn scan(&self, pattern: &str, kind: Option<&str>, limit: usize) -> Result<Vec<String>, String> {
        let mut found = Vec::new();
        for node in &self.primaries {
            let mut node = node.clone();
            let mut cursor: u64 = 0;
            loop {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(1000);
                if let Some(kind) = kind {
                    cmd.arg("TYPE").arg(kind);
                }
                let (next, keys): (u64, Vec<String>) =
                    cmd.query_async(&mut node).await.map_err(|e| e.to_string())?;
                found.extend(keys);
                if found.len() >= limit {
                    found.truncate(limit);
                    return Ok(found);
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        Ok(found)
    }
}

/// The primaries of the cluster `node` belongs to, from `CLUSTER NODES`.
async fn primaries(node: &str) -> Result<Vec<MultiplexedConnection>, String> {
    let client = redis::Client::open(node).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    let mut primaries = Vec::new();
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 3 || !fields[2].split(',').any(|f| f == "master") || fields[2].contains("fail") {
            continue;
        }
        // ip:port@cport[,hostname]
        let addr = fields[1].split('@').next().unwrap_or_default();
        let Some((host, port)) = addr.rsplit_once(':') else {
            continue;
        };
        let port: u16 = port
            .parse()
            .map_err(|_| format!("CLUSTER NODES lists `{addr}`"))?;
        let info = client.get_connection_info().clone();
        let at = match info.addr().clone() {
            redis::ConnectionAddr::TcpTls {
                insecure, tls_params, ..
            } => redis::ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure,
                tls_params,
            },
            _ => redis::ConnectionAddr::Tcp(host.to_owned(), port),
        };
        let primary = redis::Client::open(info.set_addr(at)).map_err(|e| e.to_string())?;
        primaries.push(
            primary
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    Ok(primaries)
}
