//! `rediss://` (cargo feature `tls`) against redis-server's own TLS port, with
//! certificates made for the test by `openssl`: a CA given to the builder, a client
//! certificate, `#insecure`, lazy clients, `REDIS_URL`, a TLS cluster, Sentinel over
//! TLS (`rediss+sentinel://`, failovers included), and the error when the server's
//! certificate is not trusted.
#![cfg(feature = "tls")]

use redlimit_test_support as support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redlimit::{Client, Error, Rule};
use support::cluster::{cli, free_node_port};
use support::sentinel::{RedisSentinel, MASTER_PASSWORD, SENTINEL_PASSWORD};
use support::{free_port, spawn_redis, wait_for_port};

/// A CA, a server certificate for 127.0.0.1 and a client certificate, in a temp dir.
struct Certs {
    dir: PathBuf,
}

impl Certs {
    fn make() -> Certs {
        let dir = std::env::temp_dir().join(format!("redlimit-tls-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).unwrap();
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        openssl(
            &dir,
            &[
                &["req", "-x509"],
                &ec[..],
                &[
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.crt",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=redlimit test CA",
                    "-addext",
                    "basicConstraints=critical,CA:TRUE",
                    "-addext",
                    "keyUsage=critical,keyCertSign,cRLSign",
                ],
            ],
        );
        for (name, usage) in [("server", "serverAuth,clientAuth"), ("client", "clientAuth")] {
            let (key, csr, crt, ext) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("{name}.ext"),
            );
            std::fs::write(
                dir.join(&ext),
                format!(
                    "basicConstraints=CA:FALSE\nextendedKeyUsage={usage}\n\
                     subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                ),
            )
            .unwrap();
            openssl(
                &dir,
                &[
                    &["req"],
                    &ec[..],
                    &["-keyout", &key, "-out", &csr, "-subj", "/CN=127.0.0.1"],
                ],
            );
            openssl(
                &dir,
                &[&[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-out",
                    &crt,
                    "-days",
                    "2",
                    "-extfile",
                    &ext,
                ]],
            );
        }
        Certs { dir }
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).to_str().unwrap().to_owned()
    }

    fn read(&self, file: &str) -> Vec<u8> {
        std::fs::read(self.dir.join(file)).unwrap()
    }

    /// The TLS settings of a Sentinel set that speaks only TLS (no client certificates).
    fn sentinel_tls(&self) -> support::sentinel::Tls {
        require_tls();
        support::sentinel::Tls {
            settings: [
                ("tls-cert-file", self.path("server.crt")),
                ("tls-key-file", self.path("server.key")),
                ("tls-ca-cert-file", self.path("ca.crt")),
                ("tls-auth-clients", "no".to_owned()),
            ]
            .map(|(name, value)| (name.to_owned(), value))
            .to_vec(),
            ca_file: self.path("ca.crt"),
        }
    }

    /// redis-server's TLS options; `clients`: whether it requires client certificates.
    fn server_args(&self, clients: bool) -> Vec<String> {
        require_tls();
        [
            "--tls-cert-file",
            &self.path("server.crt"),
            "--tls-key-file",
            &self.path("server.key"),
            "--tls-ca-cert-file",
            &self.path("ca.crt"),
            "--tls-auth-clients",
            if clients { "yes" } else { "no" },
            "--save",
            "",
            "--appendonly",
            "no",
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Fails the test, saying why, when the chosen server binary was built without TLS
/// (the Redis 6.2 and Valkey builds CI runs the other tests on are): these tests need
/// one with TLS, such as Debian's redis-server.
fn require_tls() {
    assert!(
        support::binary::has_tls(),
        "`{}` was built without TLS, so the TLS tests cannot run on it: run them on a \
         server built with TLS (Debian's redis-server), unsetting {} or pointing it there",
        support::binary::redis_server(),
        support::binary::VARIABLE
    );
}

fn openssl(dir: &Path, parts: &[&[&str]]) {
    let args: Vec<&str> = parts.concat();
    let status = Command::new("openssl")
        .args(&args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("cannot run openssl ({e}): install it with `apt-get install -y openssl`"));
    assert!(status.success(), "openssl {args:?} failed");
}

/// A TLS-only redis-server; killed on drop.
struct TlsServer {
    child: std::process::Child,
    port: u16,
}

impl TlsServer {
    fn start(certs: &Certs, clients: bool) -> TlsServer {
        let port = free_port();
        let mut args = certs.server_args(clients);
        args.extend(["--tls-port".to_owned(), port.to_string()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let child = spawn_redis(&args);
        wait_for_port(port);
        TlsServer { child, port }
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rule(name: &str) -> [Rule; 1] {
    [Rule::new(name, 2, Duration::from_secs(60))]
}

async fn limits(client: &Client, name: &str) {
    let rules = rule(name);
    assert!(client.check_rules(&rules).await.unwrap().allowed);
    assert!(client.check_rules(&rules).await.unwrap().allowed);
    assert!(
        !client.check_rules(&rules).await.unwrap().allowed,
        "{name}: the third of 2 is refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_single_node_lazy_and_from_the_environment() {
    let certs = Certs::make();
    let server = TlsServer::start(&certs, false);
    let url = format!("rediss://127.0.0.1:{}/", server.port);

    let client = Client::builder()
        .tls_ca_cert(certs.read("ca.crt"))
        .connect(&url)
        .await
        .unwrap();
    limits(&client, "tls:eager").await;
    let lazy = Client::builder()
        .tls_ca_cert(certs.read("ca.crt"))
        .connect_lazy(&url)
        .unwrap();
    limits(&lazy, "tls:lazy").await;
    let insecure = Client::connect(&format!("{url}#insecure")).await.unwrap();
    limits(&insecure, "tls:insecure").await;

    // SAFETY: the only test of this binary that touches the environment.
    std::env::set_var("REDIS_URL", format!("{url}#insecure"));
    let from_env = Client::from_env().unwrap();
    assert!(!from_env.is_memory());
    limits(&from_env, "tls:env").await;

    // Not trusted (the system's roots do not know the test CA): a TLS error that
    // says what to do, promptly.
    let started = Instant::now();
    let err = Client::connect(&url).await.unwrap_err();
    assert!(matches!(err, Error::Tls { .. }), "{err:?}");
    assert!(err.to_string().contains("tls_ca_cert"), "{err}");
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    // Plain text to a TLS port is not a hang either.
    let err = Client::connect(&format!("redis://127.0.0.1:{}/", server.port))
        .await
        .unwrap_err();
    assert!(err.is_backend_failure(), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates() {
    let certs = Certs::make();
    let server = TlsServer::start(&certs, true);
    let url = format!("rediss://127.0.0.1:{}/", server.port);
    let client = Client::builder()
        .tls_ca_cert(certs.read("ca.crt"))
        .tls_client_cert(certs.read("client.crt"), certs.read("client.key"))
        .connect(&url)
        .await
        .unwrap();
    limits(&client, "tls:mutual").await;
    let err = Client::builder()
        .tls_ca_cert(certs.read("ca.crt"))
        .connect(&url)
        .await
        .unwrap_err();
    assert!(err.is_backend_failure(), "without a client certificate: {err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_cluster() {
    let certs = Certs::make();
    let dir = std::env::temp_dir().join(format!(
        "redlimit-tls-cluster-{}-{}",
        std::process::id(),
        free_port()
    ));
    let mut nodes = Vec::new();
    for _ in 0..3 {
        let port = free_node_port();
        let node_dir = dir.join(port.to_string());
        std::fs::create_dir_all(&node_dir).unwrap();
        let mut args = certs.server_args(false);
        args.extend(
            [
                "--tls-port",
                &port.to_string(),
                "--tls-cluster",
                "yes",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--dir",
                node_dir.to_str().unwrap(),
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        nodes.push((port, KillOnDrop(spawn_redis(&args))));
    }
    for (port, _) in &nodes {
        wait_for_port(*port);
    }
    let ca = certs.path("ca.crt");
    let tls = ["--tls", "--cacert", ca.as_str()];
    let addresses: Vec<String> = nodes.iter().map(|(p, _)| format!("127.0.0.1:{p}")).collect();
    let mut create: Vec<&str> = tls.to_vec();
    create.extend(["--cluster", "create"]);
    create.extend(addresses.iter().map(String::as_str));
    create.extend(["--cluster-replicas", "0", "--cluster-yes"]);
    cli(&create);
    let deadline = Instant::now() + Duration::from_secs(30);
    for (port, _) in &nodes {
        let port = port.to_string();
        let mut info: Vec<&str> = tls.to_vec();
        info.extend(["-p", &port, "cluster", "info"]);
        while !cli(&info).contains("cluster_state:ok") {
            assert!(
                Instant::now() < deadline,
                "the TLS cluster did not become healthy in 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let url = format!("rediss+cluster://{}/", addresses.join(","));
    // (three TLS handshakes and the slots read: past the default 500 ms on a loaded
    // machine)
    let client = Client::builder()
        .tls_ca_cert(certs.read("ca.crt"))
        .connect_timeout(Duration::from_secs(5))
        .connect(&url)
        .await
        .unwrap();
    for user in 0..20 {
        limits(&client, &format!("tls:cluster:user:{user}")).await;
    }
    let lazy = Client::builder()
        .connect_lazy(&format!("{url}#insecure"))
        .unwrap();
    limits(&lazy, "tls:cluster:lazy").await;
    drop(nodes);
    let _ = std::fs::remove_dir_all(&dir);
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether anything on the loopback `port` answers a plain-text PING.
fn answers_plain_text(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut first = [0u8; 1];
    stream.write_all(b"PING\r\n").is_ok() && stream.read_exact(&mut first).is_ok()
}

fn assert_hidden(text: &str) {
    assert!(
        !text.contains(MASTER_PASSWORD) && !text.contains(SENTINEL_PASSWORD),
        "a password shown: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_sentinel_decides_over_tls_and_checks_the_certificates() {
    let certs = Certs::make();
    let set = RedisSentinel::start_tls(certs.sentinel_tls());
    let url = set.url();
    assert!(url.starts_with("rediss+sentinel://"), "{url}");
    // Nothing speaks plain text: the plain ports are 0, the listed ones TLS only, so
    // whatever decides below went through TLS.
    let (master, replica) = set.data_ports();
    for port in [master, replica] {
        assert_eq!(
            set.node_cli(port, &["config", "get", "port"]).lines().nth(1),
            Some("0")
        );
    }
    for port in set.sentinel_ports().into_iter().chain([master, replica]) {
        assert!(!answers_plain_text(port), "port {port} answers plain text");
    }

    let client = Client::builder()
        .tls_ca_cert(certs.read("ca.crt"))
        .connect(&url)
        .await
        .unwrap();
    limits(&client, "tls:sentinel").await;
    let logged = set.node_cli(master, &["zcard", "{tls:sentinel}:permits"]);
    assert_eq!(logged.trim(), "2", "decided on the master the sentinels name");
    let lazy = Client::builder()
        .tls_ca_cert(certs.read("ca.crt"))
        .connect_lazy(&url)
        .unwrap();
    limits(&lazy, "tls:sentinel:lazy").await;
    let insecure = Client::connect(&format!("{url}#insecure")).await.unwrap();
    limits(&insecure, "tls:sentinel:insecure").await;

    // A CA that did not sign the servers' certificates, and none (the system's roots):
    // a TLS error, promptly, no password shown.
    let other = Certs::make();
    for builder in [
        Client::builder().tls_ca_cert(other.read("ca.crt")),
        Client::builder(),
    ] {
        let started = Instant::now();
        let err = builder.connect(&url).await.unwrap_err();
        assert!(matches!(err, Error::Tls { .. }), "{err:?}");
        assert!(err.to_string().contains("tls_ca_cert"), "{err}");
        assert_hidden(&format!("{err} {err:?}"));
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }
    // Plain text to the TLS sentinels fails; it does not hang.
    let plain = url.replacen("rediss+sentinel://", "redis+sentinel://", 1);
    let err = Client::connect(&plain).await.unwrap_err();
    assert!(err.is_backend_failure(), "{err:?}");
    assert_hidden(&format!("{err} {err:?}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_sentinel_follows_failovers_over_tls() {
    let certs = Certs::make();
    let mut set = RedisSentinel::start_tls(certs.sentinel_tls());
    let client = Client::builder()
        .tls_ca_cert(certs.read("ca.crt"))
        .command_timeout(Duration::from_millis(200))
        .connect(&set.url())
        .await
        .unwrap();
    let rules = [Rule::new(
        "tls:sentinel:failover",
        1_000_000,
        Duration::from_secs(600),
    )];
    assert!(client.check_rules(&rules).await.unwrap().allowed);
    let count = |set: &RedisSentinel, port: u16| -> u64 {
        set.node_cli(port, &["zcard", "{tls:sentinel:failover}:permits"])
            .trim()
            .parse()
            .unwrap_or(0)
    };
    let (first, second) = set.data_ports();

    // A manual failover leaves the old master up (it turns replica seconds later):
    // followed at once only through `+switch-master`, heard over TLS.
    let sentinel = set.sentinel_ports()[0];
    set.failover(sentinel);
    wait_for_master(&set, second).await;
    let started = Instant::now();
    loop {
        // Decided there: the grant lands in that node's log.
        let before = count(&set, second);
        let granted = matches!(client.check_rules(&rules).await, Ok(d) if d.allowed);
        if granted && count(&set, second) > before {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "not on the announced master within 2 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The old master, now a replica in sync, is promoted when the new one is killed.
    // (up to 60 s: the sentinels turn it into a replica once they see it back, and the
    // suites run side by side on two cores)
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let replication = set.node_cli(first, &["info", "replication"]);
        if replication.contains("master_link_status:up") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the old master never replicated: {replication}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    set.kill(second);
    let killed = Instant::now();
    let mut failed = 0;
    loop {
        let before = count(&set, first);
        match client.check_rules(&rules).await {
            Ok(decision) if decision.allowed && count(&set, first) > before => break,
            Ok(_) => {}
            Err(err) => {
                assert!(err.is_backend_failure(), "{err:?}");
                assert_hidden(&format!("{err} {err:?}"));
                failed += 1;
            }
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "no failover within 30 s of the kill"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(failed > 0, "no call met the gap without a master");
    println!(
        "TLS: decided by the promoted node {:?} after the kill, {failed} calls failed meanwhile",
        killed.elapsed()
    );
}

/// Polls until the sentinels name `port` as the master.
async fn wait_for_master(set: &RedisSentinel, port: u16) {
    let started = Instant::now();
    while set.master_port() != port {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no failover within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
