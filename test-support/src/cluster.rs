//! A throwaway Redis Cluster: `redis-server --cluster-enabled yes` processes on free
//! loopback ports, joined with `redis-cli --cluster create`, killed on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<(u16, Option<Child>)>,
    dir: PathBuf,
}

/// A port free for the node and for its cluster bus (port + 10000), below the
/// system's ephemeral ports: none of the connections made before the node listens
/// takes it.
pub fn free_node_port() -> u16 {
    super::fixed_port(Some(10_000))
}

/// Runs `redis-cli` and answers its output; fails the test with how to install it.
pub fn cli(args: &[&str]) -> String {
    let output = Command::new("redis-cli").args(args).stderr(Stdio::null()).output().unwrap_or_else(|e| {
        panic!("cannot run redis-cli ({e}): install it with `apt-get update && apt-get install -y redis-server`")
    });
    String::from_utf8_lossy(&output.stdout).into_owned()
}

impl RedisCluster {
    /// `masters` primaries, each with `replicas` replicas.
    pub fn start(masters: usize, replicas: usize) -> RedisCluster {
        let mut cluster = RedisCluster::empty();
        for _ in 0..masters * (1 + replicas) {
            cluster.spawn_free_node();
        }
        cluster.create(replicas)
    }

    /// [`start`](RedisCluster::start) with `masters` primaries and no replica, the
    /// first on `port` (see [`free_node_port`]) telling clients it is at
    /// `127.0.0.1:<announced>`: a link listening there stands between them and it,
    /// while the nodes reach each other directly.
    pub fn start_announcing(masters: usize, port: u16, announced: u16) -> RedisCluster {
        let mut cluster = RedisCluster::empty();
        cluster.spawn_announced(port, announced);
        for _ in 1..masters {
            cluster.spawn_free_node();
        }
        cluster.create(0)
    }

    /// The nodes started made one cluster, `replicas` to a primary.
    fn create(self, replicas: usize) -> RedisCluster {
        let cluster = self;
        for &(port, _) in &cluster.nodes {
            super::wait_for_port(port);
        }
        let addresses: Vec<String> = cluster
            .nodes
            .iter()
            .map(|(p, _)| format!("127.0.0.1:{p}"))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addresses.iter().map(String::as_str));
        let replicas = replicas.to_string();
        args.extend(["--cluster-replicas", &replicas, "--cluster-yes"]);
        cli(&args);
        cluster.wait_until_ok();
        cluster
    }

    /// One primary serving every slot on `port` (see [`free_node_port`]), which tells
    /// clients it is at `127.0.0.1:<announced>`: a link or a proxy listening there
    /// stands between them and it, for the topology read and for every command.
    pub fn one_node(port: u16, announced: u16) -> RedisCluster {
        let mut cluster = RedisCluster::empty();
        cluster.spawn_announced(port, announced);
        super::wait_for_port(port);
        let slots: Vec<String> = (0..16_384).map(|slot| slot.to_string()).collect();
        let port = port.to_string();
        let mut args = vec!["-p", &port, "cluster", "addslots"];
        args.extend(slots.iter().map(String::as_str));
        cli(&args);
        cluster.wait_until_ok();
        cluster
    }

    /// No node yet, and a working directory of its own.
    fn empty() -> RedisCluster {
        let dir = std::env::temp_dir().join(format!(
            "redlimit-cluster-{}-{}",
            std::process::id(),
            free_node_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        RedisCluster {
            nodes: Vec::new(),
            dir,
        }
    }

    /// A node on `port` that tells clients it is at `127.0.0.1:<announced>` (its bus
    /// where it is).
    fn spawn_announced(&mut self, port: u16, announced: u16) {
        let (announced, bus) = (announced.to_string(), (port + 10_000).to_string());
        let listens = self.spawn_node(
            port,
            &[
                "--cluster-announce-ip",
                "127.0.0.1",
                "--cluster-announce-port",
                &announced,
                "--cluster-announce-bus-port",
                &bus,
            ],
        );
        assert!(
            listens,
            "a cluster node could not listen on port {port}: another process took it after it was found free"
        );
    }

    /// A node on a free port (see [`free_node_port`]), another one tried when a
    /// process running beside this one (the server matrix runs two suites at once)
    /// took the port first.
    fn spawn_free_node(&mut self) {
        for _ in 0..5 {
            if self.spawn_node(free_node_port(), &[]) {
                return;
            }
        }
        panic!("a cluster node could not listen on a free port in 5 attempts");
    }

    /// A node on `port`, with `extra` arguments, in a folder of its own: false, and
    /// no node kept, when the server answering on `port` is not it (the port was
    /// taken between being found free and the node's start; the node exits, or has
    /// not yet).
    fn spawn_node(&mut self, port: u16, extra: &[&str]) -> bool {
        let node_dir = self.dir.join(port.to_string());
        std::fs::create_dir_all(&node_dir).unwrap();
        let port_arg = port.to_string();
        let mut args = vec![
            "--port",
            &port_arg,
            "--bind",
            "127.0.0.1",
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "1000",
            "--repl-diskless-sync-delay",
            "0",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            node_dir.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let mut child = super::spawn_redis(&args);
        if !super::wait_for_port_or_exit(port, &mut child) {
            let _ = child.kill();
            let _ = child.wait();
            return false;
        }
        self.nodes.push((port, Some(child)));
        true
    }

    /// Waits until every live node reports the cluster healthy and all slots covered
    /// (up to 60 s: two server suites run side by side on two cores, and a replica's
    /// first sync then takes its time).
    pub fn wait_until_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let unwell: Vec<String> = self
                .live_ports()
                .iter()
                .filter_map(|port| {
                    let port = port.to_string();
                    let info = cli(&["-p", &port, "cluster", "info"]);
                    let replication = cli(&["-p", &port, "info", "replication"]);
                    // A replica must have synchronised, or it cannot take over.
                    let synced =
                        !replication.contains("role:slave") || replication.contains("master_link_status:up");
                    let ok = info.contains("cluster_state:ok")
                        && info.contains("cluster_slots_ok:16384")
                        && synced;
                    (!ok).then(|| {
                        format!(
                            "node {port}: replica synced {synced}, {}",
                            info.lines().take(3).collect::<Vec<_>>().join(" ")
                        )
                    })
                })
                .collect();
            if unwell.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not become healthy in 60 s: {unwell:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|(_, c)| c.is_some())
            .map(|(p, _)| *p)
            .collect()
    }

    /// The node URLs, for `Client::connect_cluster`.
    pub fn urls(&self) -> Vec<String> {
        self.live_ports()
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}/"))
            .collect()
    }

    /// The `redis+cluster://` URL of the live nodes.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .live_ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}/", hosts.join(","))
    }

    /// `CLUSTER KEYSLOT` of a key, as the server computes it.
    pub fn keyslot(&self, key: &str) -> u16 {
        let port = self.live_ports()[0].to_string();
        cli(&["-p", &port, "cluster", "keyslot", key])
            .trim()
            .parse()
            .unwrap()
    }

    /// (port, node id) of the primary serving `slot`.
    pub fn primary_of(&self, slot: u16) -> (u16, String) {
        self.try_primary_of(slot)
            .unwrap_or_else(|| panic!("no primary serves slot {slot}"))
    }

    /// The primary serving `slot`, if a healthy one does.
    pub fn try_primary_of(&self, slot: u16) -> Option<(u16, String)> {
        let port = self.live_ports()[0].to_string();
        for line in cli(&["-p", &port, "cluster", "nodes"]).lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            if !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            for range in &fields[8..] {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(lo), Ok(hi)) = (lo.parse::<u16>(), hi.parse::<u16>()) {
                    if (lo..=hi).contains(&slot) {
                        let node_port = fields[1].split(['@', ':']).nth(1).unwrap().parse().unwrap();
                        return Some((node_port, fields[0].to_owned()));
                    }
                }
            }
        }
        None
    }

    /// The ids of the primaries.
    pub fn primaries(&self) -> Vec<(u16, String)> {
        let port = self.live_ports()[0].to_string();
        cli(&["-p", &port, "cluster", "nodes"])
            .lines()
            .map(|line| line.split(' ').collect::<Vec<_>>())
            .filter(|f| f[2].contains("master") && !f[2].contains("fail") && f.len() > 8)
            .map(|f| {
                (
                    f[1].split(['@', ':']).nth(1).unwrap().parse().unwrap(),
                    f[0].to_owned(),
                )
            })
            .collect()
    }

    /// Kills one node (SIGKILL), as a crash.
    pub fn kill(&mut self, port: u16) {
        for (p, child) in &mut self.nodes {
            if *p == port {
                if let Some(mut child) = child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
    }

    /// Sum of a command's calls over the live nodes (`INFO commandstats`).
    pub fn command_calls(&self, command: &str) -> u64 {
        self.live_ports()
            .iter()
            .map(|port| {
                let stats = cli(&["-p", &port.to_string(), "info", "commandstats"]);
                stats
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
                    .map_or(0, |rest| rest.split(',').next().unwrap().trim().parse().unwrap())
            })
            .sum()
    }

    /// `CONFIG RESETSTAT` on every live node.
    pub fn reset_stats(&self) {
        for port in self.live_ports() {
            cli(&["-p", &port.to_string(), "config", "resetstat"]);
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for (_, child) in &mut self.nodes {
            if let Some(mut child) = child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::RedisCluster;
    use crate::RedisServer;

    /// A node whose port another server holds is not kept: its start failed (or the
    /// server answering there is the other one), so a cluster is not made of it.
    #[test]
    fn a_node_on_a_port_another_server_holds_is_not_kept() {
        let other = RedisServer::start();
        let mut cluster = RedisCluster::empty();
        assert!(!cluster.spawn_node(other.port, &[]));
        assert!(cluster.nodes.is_empty());
        let port = super::free_node_port();
        assert!(cluster.spawn_node(port, &[]));
        assert_eq!(cluster.nodes.len(), 1);
    }
}
