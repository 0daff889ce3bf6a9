//! The Java side of the Redisson tests: a JVM running `interop/redisson`'s driver on a
//! real Redisson, fed orders on its standard input and answering on its standard
//! output (the protocol is described in `Driver.java`).
//!
//! Each JVM is started once per test binary and shared by its tests: orders carry an
//! id, and the driver runs each on a thread of its own, so tests may wait on it at
//! once. A JVM exits when this process does (its standard input closes).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use tokio::sync::oneshot;

/// The Redisson versions driven, each from its own Maven module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// 3.24.3: the version the compatibility notes start from.
    V3,
    /// 4.7.0: the newest Redisson release Maven Central serves.
    V4,
}

impl Version {
    pub fn name(self) -> &'static str {
        match self {
            Version::V3 => "3.24.3",
            Version::V4 => "4.7.0",
        }
    }

    fn module(self) -> &'static str {
        match self {
            Version::V3 => "v3",
            Version::V4 => "v4",
        }
    }

    fn index(self) -> usize {
        match self {
            Version::V3 => 0,
            Version::V4 => 1,
        }
    }
}

fn project() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("interop/redisson")
}

fn jar(version: Version) -> PathBuf {
    project()
        .join(version.module())
        .join("target/redisson-driver.jar")
}

fn newest_source(dir: &Path) -> SystemTime {
    let mut newest = SystemTime::UNIX_EPOCH;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n == "target") {
            continue;
        }
        let time = if path.is_dir() {
            newest_source(&path)
        } else {
            path.metadata().unwrap().modified().unwrap()
        };
        newest = newest.max(time);
    }
    newest
}

/// Builds the driver's jars when one is missing or older than its sources; fails the
/// test, saying how to install them, when `mvn` or `java` is missing.
fn build_once() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let java = Command::new("java").arg("-version").output();
        if !matches!(&java, Ok(out) if out.status.success()) {
            panic!(
                "cannot run `java` ({java:?}): the Redisson tests run Redisson on a JDK 17 or later; \
                 install one with `apt-get update && apt-get install -y openjdk-17-jdk-headless maven`"
            );
        }
        let sources = newest_source(&project());
        let fresh = [Version::V3, Version::V4].iter().all(|&v| {
            jar(v)
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|built| built >= sources)
        });
        if fresh {
            return;
        }
        let pom = project().join("pom.xml");
        let status = Command::new("mvn")
            .args(["-B", "-q", "-f"])
            .arg(&pom)
            .arg("package")
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run `mvn` ({e}) to build the Redisson driver: install Maven with \
                     `apt-get update && apt-get install -y maven openjdk-17-jdk-headless`, or build it \
                     with `mvn -B -q -f interop/redisson/pom.xml package`"
                )
            });
        assert!(
            status.success(),
            "`mvn -B -q -f interop/redisson/pom.xml package` failed ({status}): it needs Maven Central \
             or the dependencies in ~/.m2"
        );
    });
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<String, String>>>>>;

/// One JVM running the driver.
pub struct Jvm {
    pub version: Version,
    stdin: Mutex<ChildStdin>,
    pending: Pending,
    next: AtomicU64,
}

impl Jvm {
    /// JVM `which` (0 or 1) of `version`, started on first use.
    pub fn get(version: Version, which: usize) -> &'static Jvm {
        static JVMS: [[OnceLock<Jvm>; 2]; 2] = [
            [OnceLock::new(), OnceLock::new()],
            [OnceLock::new(), OnceLock::new()],
        ];
        JVMS[version.index()][which].get_or_init(|| Jvm::start(version))
    }

    fn start(version: Version) -> Jvm {
        build_once();
        let mut child = Command::new("java")
            // One JIT tier starts faster; the driver does little work itself.
            .args(["-XX:TieredStopAtLevel=1", "-jar"])
            .arg(jar(version))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start java for Redisson {} ({e})", version.name()));
        let stdout = child.stdout.take().unwrap();
        let pending: Pending = Arc::default();
        let answers = pending.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut parts = line.splitn(3, ' ');
                let (Some(id), Some(status)) = (parts.next(), parts.next()) else {
                    continue;
                };
                let Ok(id) = id.parse::<u64>() else { continue };
                let rest = parts.next().unwrap_or("").to_owned();
                let answer = if status == "OK" { Ok(rest) } else { Err(rest) };
                if let Some(sender) = answers.lock().unwrap().remove(&id) {
                    let _ = sender.send(answer);
                }
            }
            // The JVM is gone: every order still waiting fails.
            answers.lock().unwrap().clear();
        });
        let jvm = Jvm {
            version,
            stdin: Mutex::new(child.stdin.take().unwrap()),
            pending,
            next: AtomicU64::new(1),
        };
        // The child is left running: it exits when this process closes its input.
        std::mem::forget(child);
        jvm
    }

    /// Sends an order without waiting for its answer.
    /// (A JVM that has exited is ignored here: the next order reports it.)
    fn send(&self, order: &str) {
        let _ = self.write(self.next.fetch_add(1, Ordering::Relaxed), order);
    }

    fn write(&self, id: u64, order: &str) -> std::io::Result<()> {
        let mut stdin = self.stdin.lock().unwrap_or_else(|e| e.into_inner());
        writeln!(stdin, "{id} {order}")?;
        stdin.flush()
    }

    /// Runs an order; its answer after `OK`, or the error after `ERR`.
    pub async fn order(&self, order: &str) -> Result<String, String> {
        let (sender, receiver) = oneshot::channel();
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        // Registered before it is sent, so the answer always finds it.
        self.pending.lock().unwrap().insert(id, sender);
        self.write(id, order).unwrap_or_else(|e| {
            panic!(
                "the Redisson {} driver's JVM has exited ({e})",
                self.version.name()
            )
        });
        match tokio::time::timeout(Duration::from_secs(60), receiver).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => panic!(
                "the Redisson {} driver exited during `{order}`",
                self.version.name()
            ),
            Err(_) => panic!(
                "the Redisson {} driver did not answer `{order}` in 60 s",
                self.version.name()
            ),
        }
    }
}

/// A Redisson client (a `RedissonClient` in the JVM), closed when dropped.
pub struct Java {
    pub jvm: &'static Jvm,
    name: String,
    /// Its id, the `CLIENT_ID` of its per-client keys.
    pub id: String,
}

impl Java {
    /// A Redisson client on one server, in the first JVM of `version`.
    pub async fn connect(version: Version, url: &str) -> Java {
        Java::connect_in(Jvm::get(version, 0), "connect", url).await
    }

    /// A Redisson client on one server, in JVM `which` of `version`.
    pub async fn connect_in_jvm(version: Version, which: usize, url: &str) -> Java {
        Java::connect_in(Jvm::get(version, which), "connect", url).await
    }

    /// Redisson's cluster client on `nodes` (`redis://host:port` each).
    pub async fn cluster(version: Version, nodes: &[String]) -> Java {
        let nodes: Vec<String> = nodes.iter().map(|n| n.trim_end_matches('/').to_owned()).collect();
        Java::connect_in(Jvm::get(version, 0), "cluster", &nodes.join(",")).await
    }

    async fn connect_in(jvm: &'static Jvm, how: &str, url: &str) -> Java {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!("c{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let url = url.trim_end_matches('/');
        let id = jvm
            .order(&format!("{how} {name} {url}"))
            .await
            .unwrap_or_else(|e| panic!("Redisson {} could not connect to {url}: {e}", jvm.version.name()));
        Java { jvm, name, id }
    }

    pub fn version(&self) -> Version {
        self.jvm.version
    }

    /// `OPERATION NAME ARGS...` on this client: the answer, or Redisson's error.
    pub async fn call(
        &self,
        op: &str,
        limiter: &str,
        args: &[&dyn std::fmt::Display],
    ) -> Result<String, String> {
        let mut order = format!("{op} {} {limiter}", self.name);
        for arg in args {
            order.push_str(&format!(" {arg}"));
        }
        self.jvm.order(&order).await
    }

    /// As [`call`](Self::call), failing the test on an error.
    pub async fn ok(&self, op: &str, limiter: &str, args: &[&dyn std::fmt::Display]) -> String {
        self.call(op, limiter, args)
            .await
            .unwrap_or_else(|e| panic!("Redisson {} {op} on {limiter} failed: {e}", self.version().name()))
    }

    /// As [`call`](Self::call), answering Redisson's error and failing the test when
    /// the call succeeded.
    pub async fn err(&self, op: &str, limiter: &str, args: &[&dyn std::fmt::Display]) -> String {
        match self.call(op, limiter, args).await {
            Ok(answer) => panic!(
                "Redisson {} {op} on {limiter} answered {answer:?}, an error was expected",
                self.version().name()
            ),
            Err(e) => e,
        }
    }

    pub async fn try_acquire(&self, limiter: &str, permits: u64) -> bool {
        self.ok("tryAcquire", limiter, &[&permits]).await.parse().unwrap()
    }

    pub async fn available(&self, limiter: &str) -> i64 {
        self.ok("available", limiter, &[]).await.parse().unwrap()
    }

    /// `getConfig()`: (mode, rate, interval in ms).
    pub async fn config(&self, limiter: &str) -> (String, u64, u64) {
        let answer = self.ok("getConfig", limiter, &[]).await;
        let words: Vec<&str> = answer.split(' ').collect();
        (
            words[0].to_owned(),
            words[1].parse().unwrap(),
            words[2].parse().unwrap(),
        )
    }

    pub async fn boolean(&self, op: &str, limiter: &str, args: &[&dyn std::fmt::Display]) -> bool {
        self.ok(op, limiter, args).await.parse().unwrap()
    }
}

impl Drop for Java {
    fn drop(&mut self) {
        self.jvm.send(&format!("close {}", self.name));
    }
}
