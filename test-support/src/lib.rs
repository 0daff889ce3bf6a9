//! What redlimit's integration tests, the CLI's tests and the benchmarks share: a
//! throwaway `redis-server` on a free loopback port (failing, never skipping, when the
//! binary is missing), clusters and sentinels of them, a MONITOR reader, a capturing
//! tracing subscriber, a TCP link that delays what it carries and, with `axum`, a plain HTTP client and server.

pub mod binary;
pub mod capture;
pub mod cluster;
pub mod coinciding;
#[cfg(feature = "axum")]
pub mod http;
pub mod link;
pub mod lying;
pub mod monitor;
pub mod sentinel;

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A permits-log member as Redisson's `struct.pack('Bc0I', len, id, permits)` makes it.
pub fn redisson_member(id: &[u8], permits: u32) -> Vec<u8> {
    let mut member = vec![id.len() as u8];
    member.extend_from_slice(id);
    member.extend_from_slice(&permits.to_le_bytes());
    member
}

/// A `redis-server` owned by one test: no persistence, killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    pub port: u16,
}

impl RedisServer {
    /// Starts a server; fails the test (never skips it) when the binary is missing.
    /// A port another server took in the meantime is given up for the next one.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a server with `extra` arguments (`--requirepass`, say).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        for _ in 0..5 {
            let port = free_port();
            let mut args = server_args(port);
            args.extend(extra.iter().map(|a| a.to_string()));
            let mut child = spawn_redis(&args);
            if wait_for_port_or_exit(port, &mut child) {
                return RedisServer { child, port };
            }
        }
        panic!("redis-server could not listen on a free port in 5 attempts");
    }

    /// Starts a server on `port` (used to restart one on the same address).
    pub fn start_on(port: u16) -> RedisServer {
        let mut child = spawn_redis(&server_args(port));
        assert!(
            wait_for_port_or_exit(port, &mut child),
            "redis-server could not listen on port {port}"
        );
        RedisServer { child, port }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A client on this server deciding at `clock`, and a plain connection.
    pub async fn clocked_client(
        &self,
        clock: &redlimit::ManualClock,
    ) -> (redlimit::Client, redis::aio::MultiplexedConnection) {
        let client = redlimit::Client::builder()
            .clock(clock.clone())
            .connect(&self.url())
            .await
            .unwrap();
        (client, self.raw().await)
    }

    /// A plain redis-rs connection, for reading and writing keys the way other
    /// clients (Redisson) do.
    pub async fn raw(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// Freezes the server (SIGSTOP): connections stay open but nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill(1) is needed to pause and resume redis-server");
        assert!(status.success(), "kill {signal} failed");
    }

    /// Stops the server and waits until the process is gone.
    pub fn stop(mut self) -> u16 {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.port
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the server binary (`binary::redis_server`) with `args`; fails the test
/// (never skips it) when the binary is missing, saying how to install it.
pub fn spawn_redis<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Child {
    binary::redis_server_command()
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{}", binary::cannot_start(&e)))
}

/// A server's arguments: loopback `port`, nothing persisted, and a working directory
/// of its own. (A master serving a replica writes an RDB file for the full sync where
/// replication is not diskless, Redis 6.2's default; in the shared working directory a
/// later server would load it at start, with another test's keys.)
pub fn server_args(port: u16) -> Vec<String> {
    static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("redlimit-redis-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a working directory for redis-server");
    [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        &dir.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// How long a server started on a loaded machine may take to listen: the server
/// matrix runs two suites side by side on two cores, each starting clusters.
const LISTEN_WITHIN: Duration = Duration::from_secs(30);

/// Waits until `child` accepts connections on `port`; false when it exited first
/// (the port was taken).
pub fn wait_for_port_or_exit(port: u16, child: &mut Child) -> bool {
    let deadline = Instant::now() + LISTEN_WITHIN;
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        if answers_like_redis(port) {
            // Ours, not another server's (a suite running beside this one may have
            // taken the port, our server not yet gone): its process id, where the
            // server tells it (not before AUTH), and still running.
            let ours = process_id_at(port).is_none_or(|id| id == child.id());
            return ours && matches!(child.try_wait(), Ok(None));
        }
        assert!(
            Instant::now() < deadline,
            "redis-server did not listen on port {port} within {LISTEN_WITHIN:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until something accepts connections on the loopback `port`.
pub fn wait_for_port(port: u16) {
    let deadline = Instant::now() + LISTEN_WITHIN;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "redis-server did not listen on port {port} within {LISTEN_WITHIN:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether a server on the loopback `port` answers a PING as Redis does (`+PONG`, or
/// `-NOAUTH` with a password). A bare successful connect is not enough: retried
/// connects to a port in the ephemeral range can connect a socket to itself, which
/// then echoes the PING back.
fn answers_like_redis(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut first = [0u8; 1];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut first).is_ok()
        && (first[0] == b'+' || first[0] == b'-')
}

/// The process id the server on the loopback `port` gives in `INFO server`; `None`
/// when it tells none (a password it wants first).
fn process_id_at(port: u16) -> Option<u32> {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    stream.write_all(b"INFO server\r\n").ok()?;
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    while reply.len() < 64 * 1024 {
        let n = stream.read(&mut chunk).ok().filter(|&n| n > 0)?;
        reply.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&reply);
        if text.starts_with('-') {
            return None;
        }
        if let Some(rest) = text.split("process_id:").nth(1) {
            if let Some((id, _)) = rest.split_once("\r\n") {
                return id.trim().parse().ok();
            }
        }
    }
    None
}

/// The ports handed out in this process.
static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());

/// Whether `port` was not handed out in this process before; it is now.
fn claim(port: u16) -> bool {
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let free = !given.contains(&port);
    if free {
        given.push(port);
    }
    free
}

/// A loopback port nothing listens on, never handed out twice in this process (tests
/// run in parallel threads, and the system may give two of them the same free port).
pub fn free_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if claim(port) {
            return port;
        }
    }
}

/// A loopback port nothing listens on below the system's range for ephemeral ports
/// (32768 and up): one that no connection made meanwhile takes as its local port, and
/// no `bind` to port 0, while its server starts (a test's thousands of connections
/// made that likely). With `beside`, `port + beside` is free too.
pub fn fixed_port(beside: Option<u16>) -> u16 {
    use rand::RngExt;
    let mut rng = rand::rng();
    loop {
        let port = rng.random_range(10_000..22_000);
        let free = |port: u16| TcpListener::bind(("127.0.0.1", port)).is_ok();
        if free(port) && beside.is_none_or(|b| free(port + b)) && claim(port) {
            return port;
        }
    }
}
