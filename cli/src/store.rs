//! The Redis the CLI talks to: one node or a cluster, raw commands for reading state
//! as it is stored, and SCAN over every primary. Connections are made by the runtime,
//! as a client makes its own, so that every command names a failure the same way.

use std::time::Duration;

use redis::RedisError;
use redlimit_runtime::{Client, ClientBuilder, Error, RawConnection};

/// The longest connecting may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest one command may take: an operator's SCAN of a large keyspace is not a
/// request's decision.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// The settings every command connects with.
pub fn builder() -> ClientBuilder {
    Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .command_timeout(COMMAND_TIMEOUT)
}

/// Where the CLI reads: the routed connection, and one connection per primary for SCAN.
pub struct Store {
    pub conn: RawConnection,
    primaries: Vec<RawConnection>,
}

impl Store {
    pub async fn open(url: &str) -> Result<Store, Error> {
        let conn = builder().connect_raw(url).await?;
        let primaries = match redlimit_runtime::cluster_nodes(url) {
            Some(nodes) => primaries(&conn, &nodes?[0]).await?,
            None => vec![conn.clone()],
        };
        Ok(Store { conn, primaries })
    }

    /// The error a client would answer for `err`, a failure of a command sent here.
    pub fn fail(&self, err: RedisError) -> Error {
        self.conn.error(&err)
    }

    /// Every key matching `pattern` (and of `kind`, when given) on every primary, at
    /// most `limit` of them.
    pub async fn scan(&self, pattern: &str, kind: Option<&str>, limit: usize) -> Result<Vec<String>, Error> {
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
                    cmd.query_async(&mut node).await.map_err(|e| node.error(&e))?;
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

/// The primaries of the cluster, from `CLUSTER NODES`, each connected to through
/// `node`'s URL with its host and port replaced (its credentials and TLS kept).
async fn primaries(cluster: &RawConnection, node: &str) -> Result<Vec<RawConnection>, Error> {
    let mut conn = cluster.clone();
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut conn)
        .await
        .map_err(|e| cluster.error(&e))?;
    let mut primaries = Vec::new();
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 3 || !fields[2].split(',').any(|f| f == "master") || fields[2].contains("fail") {
            continue;
        }
        // ip:port@cport[,hostname]
        let addr = fields[1].split('@').next().unwrap_or_default();
        if addr
            .rsplit_once(':')
            .is_none_or(|(_, port)| port.parse::<u16>().is_err())
        {
            continue;
        }
        primaries.push(builder().connect_raw(&with_address(node, addr)).await?);
    }
    Ok(primaries)
}

/// `scheme://[auth@]host:port/[#fragment]` (a node URL as `cluster_nodes` makes it)
/// with `host:port` replaced by `addr`.
fn with_address(node: &str, addr: &str) -> String {
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
}
