//! Building a [`Client`]: prefix, timeouts, clock, and where the state lives.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::memory::MemoryBackend;
use crate::backend::redis::connect::{Connected, Settings};
use crate::backend::redis::connection::RawConnection;
use crate::backend::redis::{Owner, Replicas};
use crate::backend::Backend;
use crate::client::clock::SystemClock;
use crate::client::Parts;
use crate::client::{DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX};
use crate::DEFAULT_MAX_LIMITERS;
use crate::{Client, Clock, Error};

/// The longest command or connect timeout a client takes.
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

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
    /// The prefix before the limiters the attribute and the layer name, and before the
    /// library's own keys in Redis (`<prefix>redlimit:overrides`, `...:rules`,
    /// `...:resets`, the refusal reports); default `rate_limit:`. Written as given, no
    /// separator added: end it with one (`svc:`). A handle's limiter
    /// ([`Client::rate_limiter`](crate::Client::rate_limiter),
    /// [`Client::token_bucket`](crate::Client::token_bucket)) and a [`Rule`](crate::Rule)
    /// are named in full by the caller, without it.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The longest one Redis command may take (default 250 ms); past it the call
    /// fails with [`Error::Timeout`]. From 1 ms to an hour: connecting refuses any
    /// other with [`Error::InvalidSetting`].
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// The longest establishing a connection may take (default 500 ms). From 1 ms to
    /// an hour: connecting refuses any other with [`Error::InvalidSetting`].
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
    /// fails. An expired limiter (idle past its keep-alive, a token bucket full again)
    /// decides as a missing one, as Redis drops its keys, and is dropped when the
    /// table needs its room. While `max` are held, a decision that needs a new
    /// limiter lets go of the lightest limiter a rule made, keeping its traces in a
    /// fixed summary that a limiter made again is recalled from (it counts at least
    /// what it counted, so a flood of new keys cannot reset a key's window), counted
    /// in `redlimit_memory_evicted_total`. Limiters configured by hand are never let
    /// go: while they hold the bound, a new limiter is refused with
    /// [`Error::MemoryFull`] (under every `on_error`: it is not a backend failure),
    /// counted in `redlimit_memory_full_total` and logged once per client. 0 refuses
    /// every new limiter.
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
    /// `WAIT`), waiting at most `timeout` for them. Replication is asynchronous:
    /// without this, a failover loses the grants the master acknowledged and the
    /// promoted replica had not received (see RELIABILITY.md, "When Redis loses
    /// data"). With it, a grant fewer replicas acknowledged in time fails with
    /// [`Error::NotReplicated`] (the permits stay taken; `on_error` decides the call).
    ///
    /// `WAIT` holds the connection it is sent on and covers that connection's writes
    /// only, so waited calls do not go on the client's shared connection: each joins a
    /// round on one of at most 8 connections of the client's own to the master, where
    /// the round's scripts go in one pipeline, then one `WAIT` for all of them. A
    /// waited grant costs two round trips (the script's, then `WAIT`'s) plus the
    /// replicas' acknowledgement; a refusal, one. Each caller answers within `timeout`
    /// of its call, whatever other callers wait for (a script the server is slow to
    /// answer is bounded by the command timeout, as any call is); a call that finds all 8
    /// connections waiting (replicas slow or cut off, more than 8 calls at once) and
    /// none freed within `timeout` fails with [`Error::ReplicaWaitsBusy`], unsent:
    /// it took no permit. For every replica's copy to count, ask for as many
    /// replicas as the master has. A single master (`redis://`, `redis+sentinel://`)
    /// only: `timeout` from 1 ms to below the command timeout, `replicas` from 1 to
    /// 2^31 - 1 (Redis reads `WAIT`'s count as a 32-bit signed integer); otherwise
    /// connecting fails with [`Error::InvalidSetting`]. A refusal is
    /// answered whatever the replicas acknowledged.
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replicas = Some(Replicas {
            count: replicas,
            timeout,
        });
        self
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
        let connected = self.redis()?.connect(url).await?;
        self.finish_redis(connected)
    }

    /// A connection made as [`connect`](ClientBuilder::connect) makes its own (the
    /// same URLs, timeouts and TLS, the same errors), for raw commands: the `redlimit`
    /// CLI's. Not a public API.
    #[doc(hidden)]
    pub async fn connect_raw(self, url: &str) -> Result<RawConnection, Error> {
        self.redis()?.connect_raw(url).await
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
        self.redis()?.connect_raw_primaries(url, routed).await
    }

    /// Connects to a Redis Cluster through any of its nodes (`redis://host:port/`).
    pub async fn connect_cluster(self, nodes: &[&str]) -> Result<Client, Error> {
        let nodes: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
        let connected = self.redis()?.connect_cluster(&nodes).await?;
        self.finish_redis(connected)
    }

    /// A Redis client that connects on first use and reconnects by itself, so an
    /// application can start while Redis is down. It may be made outside a Tokio
    /// runtime (in a `static`, before the runtime starts): the tasks it starts then
    /// run on the library's own runtime, a thread named `redlimit-io`.
    pub fn connect_lazy(self, url: &str) -> Result<Client, Error> {
        let connected = self.redis()?.connect_lazy(url)?;
        self.finish_redis(connected)
    }

    /// The settings the Redis backend connects with, its timeouts checked: each
    /// counts against the others and the server (the replicas' wait, silences told
    /// apart from a slow node), so one of none or of years would switch those off.
    fn redis(&self) -> Result<Settings, Error> {
        for (setting, timeout) in [
            ("command_timeout", self.command_timeout),
            ("connect_timeout", self.connect_timeout),
        ] {
            if !(Duration::from_millis(1)..=MAX_TIMEOUT).contains(&timeout) {
                return Err(Error::InvalidSetting {
                    setting,
                    problem: format!("a timeout of {timeout:?}: it must be from 1 ms to an hour"),
                });
            }
        }
        Ok(Settings {
            command_timeout: self.command_timeout,
            connect_timeout: self.connect_timeout,
            server_time: self.server_time,
            replicas: self.replicas,
            #[cfg(feature = "tls")]
            tls: self.tls.clone(),
        })
    }

    /// A client on the Redis backend `connected` is made for.
    fn finish_redis(self, connected: Connected) -> Result<Client, Error> {
        let shown = connected.target.shown().to_owned();
        let parts = self.parts();
        let clock = parts.clock.clone();
        let owner = Owner {
            prefix: parts.prefix.clone(),
            client_id: parts.client_id.clone(),
            clock: Arc::new(move || match &clock {
                None => SystemClock.now_ms(),
                Some(clock) => clock.now_ms(),
            }),
            overrides: parts.overrides.clone(),
            local_refusals: self.local_refusals,
        };
        let backend = self.redis()?.backend(connected, owner)?;
        Ok(Client::assemble(parts, Backend::Redis(Arc::new(backend)), shown))
    }

    /// A client on the in-process backend: same semantics, limits per process.
    pub fn memory(self) -> Client {
        let backend = MemoryBackend::new(self.max_limiters);
        Client::assemble(self.parts(), Backend::Memory(backend), "memory".to_owned())
    }

    /// What the client is made of beside its backend, its id new.
    fn parts(&self) -> Parts {
        Parts {
            prefix: self.prefix.clone(),
            client_id: Arc::from(uuid::Uuid::new_v4().to_string()),
            clock: self.clock.clone(),
            overrides: Default::default(),
            command_timeout: self.command_timeout,
            max_limiters: self.max_limiters,
        }
    }
}
