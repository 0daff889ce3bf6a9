//! A throwaway Redis behind Sentinel: one master, one replica and three sentinels on
//! free loopback ports, with passwords on the master and on the sentinels, killed on
//! drop. [`RedisSentinel::start_tls`] runs the same set speaking only TLS.

use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use super::cluster::cli;

/// The master's password (and the replica's, which must take over).
pub const MASTER_PASSWORD: &str = "m-secret-4f1";
/// The sentinels' own password.
pub const SENTINEL_PASSWORD: &str = "s-secret-9c2";
/// The name the sentinels monitor the master by.
pub const MASTER_NAME: &str = "mymaster";

#[derive(Debug)]
pub struct RedisSentinel {
    /// Master first, then the replica; `None` once killed.
    nodes: Vec<(u16, Option<Child>)>,
    sentinels: Vec<(u16, Child)>,
    dir: PathBuf,
    tls: Option<Tls>,
}

/// A set that speaks only TLS: every node and sentinel has `port 0` and a `tls-port`,
/// and replicates and talks to the others over TLS.
#[derive(Clone, Debug)]
pub struct Tls {
    /// The servers' TLS settings (`tls-cert-file`, `tls-key-file`, `tls-ca-cert-file`,
    /// `tls-auth-clients`), as names and values.
    pub settings: Vec<(String, String)>,
    /// The CA file redis-cli trusts.
    pub ca_file: String,
}

impl Tls {
    fn lines(&self) -> String {
        let mut lines = String::from("tls-replication yes\n");
        for (name, value) in &self.settings {
            lines.push_str(&format!("{name} {value}\n"));
        }
        lines
    }

    fn args(&self, port: u16) -> Vec<String> {
        let mut args: Vec<String> = [
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-replication",
            "yes",
        ]
        .map(String::from)
        .to_vec();
        for (name, value) in &self.settings {
            args.extend([format!("--{name}"), value.clone()]);
        }
        args
    }
}

impl RedisSentinel {
    /// Starts the master, its replica and three sentinels, and waits until the replica
    /// is in sync and every sentinel knows the replica and the two other sentinels.
    pub fn start() -> RedisSentinel {
        RedisSentinel::start_with(None)
    }

    /// As [`start`](RedisSentinel::start), every port a TLS port (the plain ports 0).
    pub fn start_tls(tls: Tls) -> RedisSentinel {
        RedisSentinel::start_with(Some(tls))
    }

    fn start_with(tls: Option<Tls>) -> RedisSentinel {
        let dir = std::env::temp_dir().join(format!(
            "redlimit-sentinel-{}-{}",
            std::process::id(),
            super::free_port()
        ));
        // Each node's files (a replica's copy of the data) in a folder of its own.
        let (master_dir, replica_dir) = (dir.join("master"), dir.join("replica"));
        std::fs::create_dir_all(&master_dir).unwrap();
        std::fs::create_dir_all(&replica_dir).unwrap();
        let master = data_node(&master_dir, &[], tls.as_ref());
        let master_port = master.0;
        let replica = data_node(
            &replica_dir,
            &["--replicaof", "127.0.0.1", &master_port.to_string()],
            tls.as_ref(),
        );
        let mut set = RedisSentinel {
            nodes: vec![(master.0, Some(master.1)), (replica.0, Some(replica.1))],
            sentinels: Vec::new(),
            dir,
            tls,
        };
        for _ in 0..3 {
            let sentinel = (0..5)
                .find_map(|_| set.start_sentinel(master_port))
                .expect("a sentinel could not listen on a free port in 5 attempts");
            set.sentinels.push(sentinel);
        }
        set.wait_until_ready();
        set
    }

    /// A sentinel of the set, monitoring the master on `master_port`, on a free port;
    /// `None` when the port was taken first (a suite running beside this one starts
    /// servers of its own), what answered there being another server.
    fn start_sentinel(&self, master_port: u16) -> Option<(u16, Child)> {
        let port = super::free_port();
        let conf = self.dir.join(format!("sentinel-{port}.conf"));
        let listen = match &self.tls {
            None => format!("port {port}\n"),
            Some(tls) => format!("port 0\ntls-port {port}\n{}", tls.lines()),
        };
        std::fs::write(
            &conf,
            format!(
                "{listen}bind 127.0.0.1\ndir {dir}\nrequirepass {SENTINEL_PASSWORD}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
                 sentinel auth-pass {MASTER_NAME} {MASTER_PASSWORD}\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                 sentinel failover-timeout {MASTER_NAME} 10000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                dir = self.dir.display()
            ),
        )
        .unwrap();
        let mut child = super::spawn_redis(&[conf.to_str().unwrap(), "--sentinel"]);
        super::wait_for_port(port);
        // Ours: the process answering there with the sentinels' password is this one.
        let info = self.sentinel_cli(port, &["info", "server"]);
        let id = info
            .lines()
            .find_map(|line| line.trim().strip_prefix("process_id:"))
            .and_then(|id| id.parse::<u32>().ok());
        if id == Some(child.id()) && matches!(child.try_wait(), Ok(None)) {
            return Some((port, child));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// `redis+sentinel://` (`rediss+sentinel://` for a TLS set) with both passwords,
    /// listing the three sentinels.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(port, _)| format!("127.0.0.1:{port}"))
            .collect();
        let scheme = if self.tls.is_some() { "rediss" } else { "redis" };
        format!(
            "{scheme}+sentinel://:{MASTER_PASSWORD}@{}/{MASTER_NAME}?sentinel_password={SENTINEL_PASSWORD}",
            hosts.join(",")
        )
    }

    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|(port, _)| *port).collect()
    }

    /// The master's port, as the last sentinel names it now.
    pub fn master_port(&self) -> u16 {
        let port = self.sentinels[2].0;
        let reply = self.sentinel_cli(port, &["sentinel", "get-master-addr-by-name", MASTER_NAME]);
        reply
            .lines()
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
            .expect("a master address")
    }

    /// Ports of the master and the replica as started.
    pub fn data_ports(&self) -> (u16, u16) {
        (self.nodes[0].0, self.nodes[1].0)
    }

    /// Kills the node on `port` (SIGKILL), as a crash.
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

    /// Freezes (`-STOP`) or thaws (`-CONT`) the data node on `port`.
    pub fn signal(&self, port: u16, signal: &str) {
        let child = self
            .nodes
            .iter()
            .find(|(p, _)| *p == port)
            .and_then(|(_, child)| child.as_ref())
            .expect("a live node on that port");
        let status = std::process::Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .expect("kill(1) is needed to pause and resume redis-server");
        assert!(status.success(), "kill {signal} failed");
    }

    /// Freezes (`-STOP`) or thaws (`-CONT`) the sentinel listed first in the URL.
    pub fn signal_first_sentinel(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([signal, &self.sentinels[0].1.id().to_string()])
            .status()
            .expect("kill(1) is needed to pause and resume redis-server");
        assert!(status.success(), "kill {signal} failed");
    }

    /// Runs a command on a data node (with the master's password).
    pub fn node_cli(&self, port: u16, args: &[&str]) -> String {
        let port = port.to_string();
        let mut all = vec!["-p", &port, "-a", MASTER_PASSWORD, "--no-auth-warning"];
        all.extend(self.cli_tls());
        all.extend_from_slice(args);
        cli(&all)
    }

    /// Runs a command on the sentinel on `port` (with the sentinels' password), over
    /// TLS for a TLS set.
    pub fn sentinel_cli(&self, port: u16, args: &[&str]) -> String {
        let mut all = self.cli_tls();
        all.extend_from_slice(args);
        sentinel_cli(port, &all)
    }

    /// Asks the sentinel on `port` (over TLS for a TLS set) for a failover of the set,
    /// once the replica has received all the master has written: a forced failover
    /// promotes the replica as it is, and what it had not received (a limiter's config
    /// written just before, with diskless replication streamed only after the replica's
    /// next acknowledgement, up to a second on a loaded machine) is lost. Again while
    /// the sentinel answers anything but `OK` (`NOGOODSLAVE` while its view of the
    /// replica is stale, which the suites running side by side on two cores make
    /// seconds old), for up to 30 s; panics with its last answer.
    pub fn failover(&self, port: u16) {
        let (first, second) = self.data_ports();
        let master = self.master_port();
        let replica = if master == first { second } else { first };
        assert!(
            self.caught_up(master, replica),
            "the replica (port {replica}) did not receive what the master (port {master}) \
             has within 5 s"
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let reply = self.sentinel_cli(port, &["sentinel", "failover", MASTER_NAME]);
            if reply.trim() == "OK" {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no failover within 30 s: the sentinel said {reply:?}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Whether the node on `replica` receives, within 5 s, all that the node on
    /// `master` has written when this is called (their replication offsets). (`WAIT`
    /// would not do: on Valkey 8, on a connection that wrote nothing, it answers at
    /// once, the replica's acknowledgement or not.)
    pub fn caught_up(&self, master: u16, replica: u16) -> bool {
        let offset = |port| -> Option<u64> {
            let info = self.node_cli(port, &["info", "replication"]);
            info.lines()
                .find_map(|line| line.trim().strip_prefix("master_repl_offset:")?.parse().ok())
        };
        let Some(written) = offset(master) else {
            return false;
        };
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(5) {
            if offset(replica).is_some_and(|received| received >= written) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    fn cli_tls(&self) -> Vec<&str> {
        match &self.tls {
            None => Vec::new(),
            Some(tls) => vec!["--tls", "--cacert", &tls.ca_file],
        }
    }

    /// Waits (up to 60 s: a sentinel learns of a replica from the master's INFO, every
    /// 10 s, and the suites run side by side on two cores) until the replica is in sync
    /// and every sentinel knows the replica and the two others; else panics with what
    /// each said last.
    fn wait_until_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let replica = self.nodes[1].0;
        loop {
            let link = self.node_cli(replica, &["info", "replication"]);
            let synced = link.contains("master_link_status:up");
            let seen: Vec<Seen> = self
                .sentinels
                .iter()
                .map(|(port, _)| {
                    let master = self.sentinel_cli(*port, &["sentinel", "master", MASTER_NAME]);
                    let got = |name| field(&master, name).map(str::to_owned);
                    Seen {
                        sentinel: *port,
                        master: got("port"),
                        replicas: got("num-slaves"),
                        others: got("num-other-sentinels"),
                    }
                })
                .collect();
            let known = seen
                .iter()
                .all(|s| s.replicas.as_deref() == Some("1") && s.others.as_deref() == Some("2"));
            if synced && known {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinels did not see the replica and each other within 60 s: the replica \
                 (port {replica}) in sync: {synced}; the master started on {}; each sentinel \
                 saw: {seen:?}",
                self.nodes[0].0
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// What one sentinel said of the master it monitors, while the set starts.
#[derive(Debug)]
#[allow(dead_code)] // read through Debug, in the message of a set that did not start
struct Seen {
    sentinel: u16,
    master: Option<String>,
    replicas: Option<String>,
    others: Option<String>,
}

/// A master or replica with the master's password, no persistence.
fn data_node(dir: &std::path::Path, extra: &[&str], tls: Option<&Tls>) -> (u16, Child) {
    for _ in 0..5 {
        let port = super::free_port();
        let mut args = super::server_args(port);
        args.extend(["--requirepass", MASTER_PASSWORD, "--masterauth", MASTER_PASSWORD].map(String::from));
        args.extend(["--dir".to_owned(), dir.display().to_string()]);
        args.extend(extra.iter().map(|a| a.to_string()));
        if let Some(tls) = tls {
            // Later options win: the plain port becomes 0.
            args.extend(tls.args(port));
            let mut child = super::spawn_redis(&args);
            // A plain PING cannot ask a TLS port; a server that lost the port exits.
            super::wait_for_port(port);
            if matches!(child.try_wait(), Ok(None)) {
                return (port, child);
            }
            continue;
        }
        let mut child = super::spawn_redis(&args);
        if super::wait_for_port_or_exit(port, &mut child) {
            return (port, child);
        }
    }
    panic!("redis-server could not listen on a free port in 5 attempts");
}

/// Runs a command on a sentinel (with the sentinels' password).
pub fn sentinel_cli(port: u16, args: &[&str]) -> String {
    let port = port.to_string();
    let mut all = vec!["-p", &port, "-a", SENTINEL_PASSWORD, "--no-auth-warning"];
    all.extend_from_slice(args);
    cli(&all)
}

/// A field of `SENTINEL MASTER`'s reply as redis-cli prints it (name and value on
/// alternate lines).
fn field<'a>(reply: &'a str, name: &str) -> Option<&'a str> {
    let mut lines = reply.lines().map(str::trim);
    while let Some(line) = lines.next() {
        if line == name {
            return lines.next();
        }
    }
    None
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        for (_, child) in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
        for (_, child) in &mut self.nodes {
            if let Some(mut child) = child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
