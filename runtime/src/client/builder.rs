//! Building a [`Client`]: prefix, timeouts, clock, and where the state lives.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::AsyncConnectionConfig;

use crate::backend::memory::MemoryBackend;
use crate::backend::redis::connection::{
    cluster_nodes, primary_addresses, with_address, Conn, RawConnection,
};
use crate::backend::redis::failure::classify;
use crate::backend::redis::sentinel::{self, SentinelConn};
use crate::backend::redis::server::Eviction;
use crate::backend::redis::target::Target;
use crate::backend::redis::{RedisBackend, Replicas};
use crate::backend::Backend;
use crate::client::{DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX};
use crate::DEFAULT_MAX_LIMITERS;
use crate::{Client, Clock, Error};

/// Settings for a [`Client`]; finish with [`connect`](ClientBuilder::connect),
/// [`connect_lazy`](ClientBuilder::connect_lazy) or [`memory`](ClientBuilder::memory).
#[derive(Clone)]
pub struct ClientBuilder {
    prefix: String,
    command_timeout: Duration,
    connect_timeout: Duration,
    /// `None`: the system clock, read without a call through a pointer.
    clock: Option<Arc<dyn Clock>>,
    server_time: bool,
    max_limiters: usize,
    local_refusals: bool,
    replicas: Option<Replicas>,
    #[cfg(feature = "tls")]
    tls: crate::backend::redis::tls::TlsFiles,
}

/// The settings, without the clock's internals or the TLS files' contents (a client
/// key is a secret).
impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("prefix", &self.prefix)
            .field("command_timeout", &self.command_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("server_time", &self.server_time)
            .field("max_limiters", &self.max_limiters)
            .field("local_refusals", &self.local_refusals)
            .field("replicas", &self.replicas)
            .finish_non_exhaustive()
    }
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            prefix: DEFAULT_PREFIX.to_owned(),
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            clock: None,
            server_time: false,
            max_limiters: DEFAULT_MAX_LIMITERS,
            local_refusals: true,
            replicas: None,
            #[cfg(feature = "tls")]
            tls: Default::default(),
        }
    }
}

impl ClientBuilder {
    /// The prefix the attribute puts before its keys (default `rate_limit:`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The longest one Redis command may take (default 250 ms); past it the call
    /// fails with [`Error::Timeout`].
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// The longest establishing a connection may take (default 500 ms).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The clock decisions are made at (default: the system clock, as Redisson).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The most live limiters kept in process (default [`DEFAULT_MAX_LIMITERS`],
    /// 100 000): by a [`memory`](ClientBuilder::memory) client, and, for a Redis
    /// client, by the in-process limiters `on_error = "local"` decides on while Redis
    /// fails. Limiters are dropped once expired (idle past their keep-alive, a token
    /// bucket full again), as Redis drops their keys. While `max` are held, a
    /// decision that needs a new limiter is refused with [`Error::MemoryFull`] (under
    /// every `on_error`: it is not a backend failure), counted in
    /// `redlimit_memory_full_total` and logged once per client; the limiters held are never
    /// dropped early to make room, so a flood of new keys cannot reset a key's window.
    /// 0 refuses every new limiter.
    pub fn max_limiters(mut self, max: usize) -> Self {
        self.max_limiters = max;
        self
    }

    /// The clock, shared.
    pub(crate) fn shared_clock(mut self, clock: Option<Arc<dyn Clock>>) -> Self {
        self.clock = clock;
        self
    }

    /// Whether a refusal Redis gave may be answered again by this client, without a
    /// round trip, until its wait is over (default: on). Only refusals the client can
    /// answer exactly are kept: a call of one rule (a sliding window, or a token
    /// bucket without a warm-up) for the same permits, refused when one more permit
    /// would have let it pass. A grant is never made in process. What this can change:
    /// when another client gives permits back, deletes the limiter or raises its rate
    /// meanwhile, a call Redis would grant is refused, never for longer than the wait
    /// Redis gave. Off per rule with [`Rule::local_refusals`](crate::Rule::local_refusals).
    pub fn local_refusals(mut self, on: bool) -> Self {
        self.local_refusals = on;
        self
    }

    /// Answers a grant only once `replicas` replicas of the master have it (Redis's
    /// `WAIT`, sent with the script in one round trip), waiting at most `timeout` for
    /// them. Replication is asynchronous: without this, a failover loses the grants
    /// the master acknowledged and the promoted replica had not received (see
    /// RELIABILITY.md, "When Redis loses data"). With it, a grant fewer replicas
    /// acknowledged in time fails with [`Error::NotReplicated`] (the permits stay
    /// taken; `on_error` decides the call), and every grant costs the replicas' round
    /// trip in latency; `WAIT` holds the client's connection while it waits, so
    /// concurrent grants queue behind each other's wait (with replicas cut off, callers
    /// past the first few reach the command timeout). For every replica's copy to
    /// count, ask for as many replicas as
    /// the master has. A single master (`redis://`, `redis+sentinel://`) only: `timeout`
    /// from 1 ms to below the command timeout, `replicas` at least 1; otherwise
    /// connecting fails with [`Error::InvalidSetting`]. A refusal is answered whatever
    /// the replicas acknowledged.
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replicas = Some(Replicas {
            count: replicas,
            timeout,
        });
        self
    }

    /// The `wait_for_replicas` setting, checked against the others and the server.
    fn replicas(&self, cluster: bool) -> Result<Option<Replicas>, Error> {
        let Some(replicas) = self.replicas else {
            return Ok(None);
        };
        let invalid = |problem: String| Error::InvalidSetting {
            setting: "wait_for_replicas",
            problem,
        };
        if replicas.count == 0 {
            return Err(invalid(
                "0 replicas waits for nothing: ask for at least 1".to_owned(),
            ));
        }
        if replicas.timeout < Duration::from_millis(1) || replicas.timeout >= self.command_timeout {
            return Err(invalid(format!(
                "a timeout of {:?}: it must be at least 1 ms and below the command timeout ({:?})",
                replicas.timeout, self.command_timeout
            )));
        }
        if cluster {
            return Err(invalid(
                "a Redis Cluster: waiting for replicas is offered on a single master \
                 (redis://, rediss:// or redis+sentinel://)"
                    .to_owned(),
            ));
        }
        Ok(Some(replicas))
    }

    /// Decide at the Redis server's clock (`TIME` inside the scripts) instead of this
    /// process's, for fleets whose clocks cannot be trusted: windows are then exact
    /// whatever the clients' skew. The trade-off: Java Redisson clients sharing the
    /// limiter still stamp grants with their own clocks, so mix the two only when the
    /// server's and the Java hosts' clocks agree (see RELIABILITY.md). Redis only; the
    /// in-process backend has one clock.
    pub fn server_time(mut self, server_time: bool) -> Self {
        self.server_time = server_time;
        self
    }

    /// Trusts the CA certificate in `pem` (PEM) for `rediss://` connections, instead of
    /// the system's roots.
    #[cfg(feature = "tls")]
    pub fn tls_ca_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca = Some(pem.into());
        self
    }

    /// Presents a client certificate and its private key (both PEM) on `rediss://`
    /// connections, for servers that require one (`tls-auth-clients yes`).
    #[cfg(feature = "tls")]
    pub fn tls_client_cert(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.tls.client = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Connects to Redis now; fails, naming the cause, when the server cannot be
    /// reached, refuses the credentials or has no such database.
    /// `redis+cluster://host:port,host:port/` connects to a Redis Cluster;
    /// `rediss://` uses TLS (cargo feature `tls`).
    pub async fn connect(self, url: &str) -> Result<Client, Error> {
        let (conn, target, eviction) = self.connect_conn(url).await?;
        self.finish_redis(conn, target, true, eviction)
    }

    /// The connection [`connect`](ClientBuilder::connect) makes, where it goes, and
    /// what the server's eviction policy is.
    async fn connect_conn(&self, url: &str) -> Result<(Conn, Target, Option<Eviction>), Error> {
        let target = Target::new(url);
        if let Some(nodes) = cluster_nodes(url) {
            let (conn, eviction) = self.connect_cluster_conn(&nodes?, &target).await?;
            return Ok((conn, target, eviction));
        }
        if let Some(parts) = sentinel::parse_url(url) {
            let mut conn = self.sentinel_conn(&parts?, &target)?;
            let eviction = self.check_server(&mut conn, &target).await?;
            return Ok((conn, target, eviction));
        }
        let (client, connection_config) = self.redis_config(url, &target)?;
        let eviction = self.probe(&client, &target).await?;
        let connect = ConnectionManager::new_with_config(client, connection_config);
        let conn = self.within_connect_timeout(connect, &target).await?;
        Ok((Conn::Single(conn), target, eviction))
    }

    /// A connection made as [`connect`](ClientBuilder::connect) makes its own (the
    /// same URLs, timeouts and TLS, the same errors), for raw commands: the `redlimit`
    /// CLI's. Not a public API.
    #[doc(hidden)]
    pub async fn connect_raw(self, url: &str) -> Result<RawConnection, Error> {
        let (conn, target, _) = self.connect_conn(url).await?;
        Ok(RawConnection::new(conn, target, self.command_timeout))
    }

    /// A raw connection to each primary behind `url`, for commands a node answers for
    /// its own keys only (SCAN): `routed` itself (made by
    /// [`connect_raw`](ClientBuilder::connect_raw) on `url`) for one server or
    /// Sentinel's master; for a cluster URL, each primary `CLUSTER NODES` on `routed`
    /// names and does not mark failing, reached with the first listed node's
    /// credentials and TLS. The `redlimit` CLI's. Not a public API.
    #[doc(hidden)]
    pub async fn connect_raw_primaries(
        self,
        url: &str,
        routed: &RawConnection,
    ) -> Result<Vec<RawConnection>, Error> {
        let Some(nodes) = cluster_nodes(url) else {
            return Ok(vec![routed.clone()]);
        };
        let node = &nodes?[0];
        let reply: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut routed.clone())
            .await
            .map_err(|e| routed.error(&e))?;
        let mut primaries = Vec::new();
        for addr in primary_addresses(&reply) {
            primaries.push(self.clone().connect_raw(&with_address(node, addr)).await?);
        }
        Ok(primaries)
    }

    /// Connects to a Redis Cluster through any of its nodes (`redis://host:port/`).
    pub async fn connect_cluster(self, nodes: &[&str]) -> Result<Client, Error> {
        let nodes: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
        let target = Target::nodes(&nodes);
        self.connect_cluster_nodes(&nodes, target).await
    }

    async fn connect_cluster_nodes(self, nodes: &[String], target: Target) -> Result<Client, Error> {
        let (conn, eviction) = self.connect_cluster_conn(nodes, &target).await?;
        self.finish_redis(conn, target, true, eviction)
    }

    async fn connect_cluster_conn(
        &self,
        nodes: &[String],
        target: &Target,
    ) -> Result<(Conn, Option<Eviction>), Error> {
        let client = self.cluster_client(nodes, target)?;
        let mut conn = self
            .within_connect_timeout(client.get_async_connection(), target)
            .await?;
        let eviction = self.check_server(&mut conn, target).await?;
        Ok((Conn::Cluster(conn), eviction))
    }

    /// A Redis client that connects on first use and reconnects by itself, so an
    /// application can start while Redis is down. Must be called inside a Tokio runtime.
    pub fn connect_lazy(self, url: &str) -> Result<Client, Error> {
        let target = Target::new(url);
        if let Some(nodes) = cluster_nodes(url) {
            let client = self.cluster_client(&nodes?, &target)?;
            let config = redis::cluster::ClusterConfig::new()
                .set_connection_timeout(self.connect_timeout)
                .set_response_timeout(self.command_timeout);
            let conn = client.get_pending_async_connection_with_config(config);
            return self.finish_redis(Conn::Cluster(conn), target, false, None);
        }
        if let Some(parts) = sentinel::parse_url(url) {
            let conn = self.sentinel_conn(&parts?, &target)?;
            return self.finish_redis(conn, target, false, None);
        }
        let (client, connection_config) = self.redis_config(url, &target)?;
        let conn = ConnectionManager::new_lazy_with_config(client, connection_config)
            .map_err(|err| classify(&err, &target, self.connect_timeout, true))?;
        self.finish_redis(Conn::Single(conn), target, false, None)
    }

    /// The connection to the master the sentinels of `url` name (found at its first
    /// command, and again after each failover).
    fn sentinel_conn(&self, url: &sentinel::SentinelUrl, target: &Target) -> Result<Conn, Error> {
        if url.tls && !cfg!(feature = "tls") {
            return Err(Error::InvalidUrl {
                url: target.shown().to_owned(),
                detail: "TLS needs the cargo feature `tls` of redlimit for rediss+sentinel:// URLs"
                    .to_owned(),
            });
        }
        let timeouts = sentinel::Timeouts {
            connect: self.connect_timeout,
            command: self.command_timeout,
        };
        #[cfg(feature = "tls")]
        let conn = {
            crate::backend::redis::tls::install_crypto_provider();
            SentinelConn::new(url, timeouts, self.tls.certificates())
        };
        #[cfg(not(feature = "tls"))]
        let conn = SentinelConn::new(url, timeouts);
        let conn = conn.map_err(|e| invalid_url(target, &e))?;
        Ok(Conn::Sentinel(conn))
    }

    /// One connection and a PING, to report what stops a connection by its name
    /// (the reconnecting connection retries instead of answering); then the server's
    /// version and eviction policy.
    async fn probe(&self, client: &redis::Client, target: &Target) -> Result<Option<Eviction>, Error> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.connect_timeout));
        let attempt = async {
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            redis::cmd("PING").query_async::<()>(&mut conn).await?;
            Ok(conn)
        };
        let mut conn = self.within_connect_timeout(attempt, target).await?;
        self.check_server(&mut conn, target).await
    }

    /// Refuses a server older than the scripts need, naming the version found; reads
    /// its eviction policy (`None` when it would not say).
    async fn check_server(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
        target: &Target,
    ) -> Result<Option<Eviction>, Error> {
        let read = async {
            let server = crate::backend::redis::server::read_server(conn).await?;
            let eviction = crate::backend::redis::server::read_eviction(conn)
                .await
                .ok()
                .flatten();
            Ok::<_, crate::backend::redis::server::ServerProblem>((server, eviction))
        };
        match tokio::time::timeout(self.connect_timeout, read).await {
            Ok(Ok((_, eviction))) => Ok(eviction),
            Ok(Err(problem)) => Err(problem.into_error(target.shown(), |err| {
                classify(err, target, self.connect_timeout, true)
            })),
            Err(_) => Err(Error::ConnectTimeout {
                target: target.shown().to_owned(),
                after: self.connect_timeout,
            }),
        }
    }

    async fn within_connect_timeout<T>(
        &self,
        connect: impl std::future::Future<Output = redis::RedisResult<T>>,
        target: &Target,
    ) -> Result<T, Error> {
        let timed_out = || Error::ConnectTimeout {
            target: target.shown().to_owned(),
            after: self.connect_timeout,
        };
        match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(err)) if err.is_timeout() => Err(timed_out()),
            Ok(Err(err)) => Err(classify(&err, target, self.connect_timeout, true)),
            Err(_) => Err(timed_out()),
        }
    }

    fn cluster_client(
        &self,
        nodes: &[String],
        target: &Target,
    ) -> Result<redis::cluster::ClusterClient, Error> {
        // Redirects and TRYAGAIN (a slot migrating) are retried within milliseconds:
        // the default waits start at 1.28 s, far past any request path's timeout.
        let builder = redis::cluster::ClusterClientBuilder::new(nodes.to_vec())
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.command_timeout)
            .retries(16)
            .min_retry_wait(2)
            .max_retry_wait(50)
            .retry_wait_formula(2, 2);
        #[cfg(feature = "tls")]
        let builder = match self.tls.certificates() {
            Some(certs) => builder.certs(certs),
            None => builder,
        };
        builder.build().map_err(|e| invalid_url(target, &e))
    }

    /// `connected`: an eager connect, which read the version and `eviction` (a lazy
    /// client reads them at its first decision).
    fn finish_redis(
        self,
        conn: Conn,
        target: Target,
        connected: bool,
        eviction: Option<Eviction>,
    ) -> Result<Client, Error> {
        let replicas = self.replicas(matches!(conn, Conn::Cluster(_)))?;
        let shown = target.shown().to_owned();
        let backend = RedisBackend::new(conn, self.command_timeout, self.server_time, target, connected)
            .wait_for_replicas(replicas);
        if let Some(eviction) = &eviction {
            backend.record_eviction(eviction);
        }
        Ok(self.finish(Backend::Redis(backend), shown))
    }

    /// A client on the in-process backend: same semantics, limits per process.
    pub fn memory(self) -> Client {
        let backend = MemoryBackend::new(self.max_limiters);
        self.finish(Backend::Memory(backend), "memory".to_owned())
    }

    fn redis_config(
        &self,
        url: &str,
        target: &Target,
    ) -> Result<(redis::Client, ConnectionManagerConfig), Error> {
        #[cfg(feature = "tls")]
        let client = match self.tls.certificates() {
            Some(certs) => {
                crate::backend::redis::tls::install_crypto_provider();
                redis::Client::build_with_tls(url, certs)
            }
            None => {
                crate::backend::redis::tls::install_crypto_provider();
                redis::Client::open(url)
            }
        };
        #[cfg(not(feature = "tls"))]
        let client = redis::Client::open(url);
        let client = client.map_err(|e| invalid_url(target, &e))?;
        // One connection attempt per command at most, failing with its real cause
        // (refused, wrong password, ...), rather than retries with growing pauses
        // that outlast any request's timeout; the next command tries again.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.command_timeout))
            .set_number_of_retries(0);
        Ok((client, config))
    }

    fn finish(self, backend: Backend, shown: String) -> Client {
        Client::assemble(
            backend,
            self.prefix,
            self.clock,
            self.command_timeout,
            shown,
            self.max_limiters,
            self.local_refusals,
        )
    }
}

fn invalid_url(target: &Target, err: &redis::RedisError) -> Error {
    // The connection layer's text, without the name of its error kind.
    let text = err.to_string().replace(&format!(" - {:?}", err.kind()), "");
    let detail = target.scrub(&text);
    let detail = if detail.contains("TLS") && !cfg!(feature = "tls") {
        format!("{detail}; enable the cargo feature `tls` of redlimit for rediss:// URLs")
    } else {
        detail
    };
    Error::InvalidUrl {
        url: target.shown().to_owned(),
        detail,
    }
}
