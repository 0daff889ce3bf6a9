//! Whether a cluster connection made again may take the old one's place.
//!
//! The cluster's client connects to the nodes it can and serves without the rest. A
//! call to a node it has no connection to goes to another node, whose redirect has
//! the client read the slot map again and connect to every node, every call on the
//! connection waiting meanwhile. A node that refuses connections costs that wait
//! little; one that takes them and answers nothing (silent), or lets them hang,
//! holds every call for a connect timeout, at each try. A connection made again
//! while a node is silent is so put in place only once that node answers on it, or
//! once it reaches a primary the old one does not (a primary that hangs for good
//! beside a node silent on the old connection only: kept, the old one would leave
//! that node's calls undecided for as long as the primary hangs).

use std::collections::HashSet;
use std::time::Duration;

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo, SingleNodeRoutingInfo};
use redis::Value;

use super::connection::Conn;
use super::nodes::{LONGEST_ADDRESS, SLOTS};

/// The most primaries a new connection lacks that are tried for whether they refuse
/// connections (past them, it is not put in place: a slot map naming thousands of
/// nodes is no cluster's), and the most it reaches that are asked on the old one.
const MOST_TRIED: usize = 16;

/// Whether `conn` may take `old`'s place, each step within `timeout`: it reaches
/// every primary its cluster names that does not refuse connections, or a primary
/// `old` does not reach. `Err` says what it lacks. A primary is named as the
/// cluster's client names it, and reached when it answers `PING`; one `conn` lacks is
/// tried with a connection of its own, and passes when the network refuses it.
pub(super) async fn may_replace(conn: &Conn, old: &Conn, timeout: Duration) -> Result<(), String> {
    let (Conn::Cluster(cluster), Conn::Cluster(old)) = (conn, old) else {
        return Ok(());
    };
    let mut cluster = cluster.clone();
    let within = |step: &'static str| move |_| format!("no answer to {step} within the command timeout");
    // Sent to each primary the client has a connection to, each answer kept by address.
    let to_each =
        RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, Some(ResponsePolicy::Special)));
    let answers = tokio::time::timeout(timeout, cluster.route_command(redis::cmd("PING"), to_each))
        .await
        .map_err(within("PING"))?
        .map_err(|err| format!("PING: {:?}", err.kind()))?;
    let answered: HashSet<String> = match &answers {
        Value::Map(answers) => answers
            .iter()
            .filter(|(_, answer)| matches!(answer, Value::SimpleString(pong) if pong == "PONG"))
            .filter_map(|(address, _)| match address {
                Value::BulkString(address) => String::from_utf8(address.clone()).ok(),
                _ => None,
            })
            .collect(),
        _ => HashSet::new(),
    };
    // The map as a node that answered reads it: a host left out is that node's.
    let Some((host, port)) = answered.iter().find_map(|address| split(address)) else {
        return Err("no primary answered PING".to_owned());
    };
    let to_it = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
        host: host.to_owned(),
        port,
    });
    let mut slots = redis::cmd("CLUSTER");
    slots.arg("SLOTS");
    let map = tokio::time::timeout(timeout, cluster.route_command(slots, to_it))
        .await
        .map_err(within("CLUSTER SLOTS"))?
        .map_err(|err| format!("CLUSTER SLOTS: {:?}", err.kind()))?;
    let lacked: Vec<String> = primaries(&map, host)
        .into_iter()
        .filter(|primary| !answered.contains(primary))
        .collect();
    if lacked.len() > MOST_TRIED {
        return Err(format!("{} primaries not connected", lacked.len()));
    }
    let mut tries = tokio::task::JoinSet::new();
    for primary in lacked {
        tries.spawn(async move { (!refused(&primary, timeout).await).then_some(primary) });
    }
    let mut unreached = Vec::new();
    while let Some(tried) = tries.join_next().await {
        // (a try that panicked is a primary not known to refuse)
        unreached.extend(tried.unwrap_or_else(|_| Some("?".to_owned())));
    }
    if unreached.is_empty() || reaches_one_more(&answered, old, timeout).await {
        return Ok(());
    }
    unreached.sort();
    Err(format!("not connected to {}", unreached.join(", ")))
}

/// Whether the network refuses a connection to `address` within `timeout`: at once,
/// as it would the cluster client's.
async fn refused(address: &str, timeout: Duration) -> bool {
    use std::io::ErrorKind::{ConnectionRefused, HostUnreachable, NetworkUnreachable};

    let Some((host, port)) = split(address) else {
        return false;
    };
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port))).await {
        Ok(Err(err)) => matches!(
            err.kind(),
            ConnectionRefused | HostUnreachable | NetworkUnreachable
        ),
        _ => false,
    }
}

/// Whether a primary in `answered` (by the new connection) does not answer `PING`
/// on `old` within `timeout`, asking at most [`MOST_TRIED`] of them.
async fn reaches_one_more(answered: &HashSet<String>, old: &ClusterConnection, timeout: Duration) -> bool {
    let mut asks = tokio::task::JoinSet::new();
    for address in answered.iter().take(MOST_TRIED) {
        let Some((host, port)) = split(address) else {
            continue;
        };
        let to_it = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
            host: host.to_owned(),
            port,
        });
        let mut old = old.clone();
        asks.spawn(async move {
            let ping = old.route_command(redis::cmd("PING"), to_it);
            matches!(
                tokio::time::timeout(timeout, ping).await,
                Ok(Ok(Value::SimpleString(pong))) if pong == "PONG"
            )
        });
    }
    while let Some(asked) = asks.join_next().await {
        if !asked.unwrap_or(true) {
            return true;
        }
    }
    false
}

/// `host:port` split at its last colon.
fn split(address: &str) -> Option<(&str, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    Some((host, port.parse().ok()?))
}

/// The primaries a `CLUSTER SLOTS` reply names, as the cluster's client names them:
/// a host left out (empty or null) or given as `0.0.0.0` or `::` is the answering
/// node's (`answering`), and a node whose host is `?` is unknown, the range's next
/// node standing in for it.
fn primaries(reply: &Value, answering: &str) -> HashSet<String> {
    let Value::Array(entries) = reply else {
        return HashSet::new();
    };
    entries
        .iter()
        .take(SLOTS)
        .filter_map(|entry| {
            let Value::Array(fields) = entry else {
                return None;
            };
            if fields.len() < 3 || !matches!((&fields[0], &fields[1]), (Value::Int(_), Value::Int(_))) {
                return None;
            }
            fields[2..].iter().find_map(|node| address(node, answering))
        })
        .filter(|address| address.len() <= LONGEST_ADDRESS)
        .collect()
}

/// A node's address in a `CLUSTER SLOTS` range, as [`primaries`] names it.
fn address(node: &Value, answering: &str) -> Option<String> {
    let Value::Array(node) = node else {
        return None;
    };
    let host = match node.first()? {
        Value::BulkString(host) => String::from_utf8_lossy(host),
        Value::Nil => "".into(),
        _ => return None,
    };
    let host = match &*host {
        "" | "0.0.0.0" | "::" => answering,
        "?" => return None,
        host => host,
    };
    let Value::Int(port) = node.get(1)? else {
        return None;
    };
    // (a port past 65 535 as the cluster's client reads it)
    Some(format!("{host}:{}", *port as u16))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: Option<&str>, port: i64) -> Value {
        Value::Array(vec![
            host.map_or(Value::Nil, |host| Value::BulkString(host.as_bytes().to_vec())),
            Value::Int(port),
        ])
    }

    fn range(start: i64, end: i64, nodes: Vec<Value>) -> Value {
        let mut fields = vec![Value::Int(start), Value::Int(end)];
        fields.extend(nodes);
        Value::Array(fields)
    }

    /// Hosts left out or wildcards are the answering node's, `?` gives way to the
    /// range's next node, and replicas are no primaries.
    #[test]
    fn primaries_are_named_as_the_cluster_client_names_them() {
        let reply = Value::Array(vec![
            range(
                0,
                99,
                vec![node(Some("10.0.0.1"), 7000), node(Some("10.0.0.9"), 7009)],
            ),
            range(100, 199, vec![node(Some(""), 7001)]),
            range(200, 299, vec![node(None, 7002)]),
            range(300, 399, vec![node(Some("0.0.0.0"), 7003)]),
            range(400, 499, vec![node(Some("::"), 7004)]),
            range(
                500,
                599,
                vec![node(Some("?"), 7005), node(Some("10.0.0.6"), 7006)],
            ),
            range(600, 699, vec![node(Some("?"), 7007)]),
            Value::Int(3),
            range(700, 799, vec![node(Some("10.0.0.1"), 7000)]),
        ]);
        let named = primaries(&reply, "answering.host");
        let mut named: Vec<_> = named.into_iter().collect();
        named.sort();
        assert_eq!(
            named,
            [
                "10.0.0.1:7000",
                "10.0.0.6:7006",
                "answering.host:7001",
                "answering.host:7002",
                "answering.host:7003",
                "answering.host:7004",
            ]
        );
    }

    /// A reply of another shape names no primary; addresses past the longest kept
    /// are left out.
    #[test]
    fn replies_out_of_shape_name_none() {
        assert!(primaries(&Value::Int(1), "h").is_empty());
        let long = "h".repeat(LONGEST_ADDRESS);
        let reply = Value::Array(vec![
            range(0, 1, vec![node(Some(&long), 7000)]),
            Value::Array(vec![Value::Int(0), Value::Int(1)]),
            Value::Array(vec![
                Value::SimpleString("0".into()),
                Value::Int(1),
                node(Some("h"), 1),
            ]),
        ]);
        assert!(primaries(&reply, "h").is_empty());
    }

    #[test]
    fn addresses_split_at_their_last_colon() {
        assert_eq!(split("10.0.0.1:7000"), Some(("10.0.0.1", 7000)));
        assert_eq!(split("::1:7000"), Some(("::1", 7000)));
        assert_eq!(split("host"), None);
        assert_eq!(split("host:port"), None);
    }
}
