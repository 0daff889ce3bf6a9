//! Connecting to Redis: one server, a cluster or Sentinel's master, over TLS or not,
//! each within the connect timeout and its failures named (a refused connection, a
//! wrong password, a server too old for the scripts); the backend made on the
//! connection, and the raw connections the `redlimit` CLI runs its commands on.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::AsyncConnectionConfig;

use super::connection::{cluster_nodes, primary_addresses, with_address, Conn, RawConnection, Remake};
use super::failure::classify;
use super::replicas::{Opener, Waits};
use super::sentinel::{self, SentinelConn};
use super::server::Eviction;
use super::target::Target;
use super::{Owner, RedisBackend, Replicas};
use crate::Error;

/// What a client's settings say of Redis: the builder hands them over to connect.
#[derive(Clone)]
pub(crate) struct Settings {
    pub command_timeout: Duration,
    pub connect_timeout: Duration,
    pub server_time: bool,
    pub replicas: Option<Replicas>,
    #[cfg(feature = "tls")]
    pub tls: super::tls::TlsFiles,
}

/// A connection made: where it goes, whether it answered already (an eager connect,
/// which read the server's version), and the eviction policy read.
pub(crate) struct Connected {
    pub conn: Conn,
    pub target: Target,
    pub connected: bool,
    pub eviction: Option<Eviction>,
    /// What made the connection, for connections of its own and for making it again.
    pub client: Option<MadeBy>,
}

/// The client a connection was made by (one per client: its size does not matter).
#[allow(clippy::large_enum_variant)]
pub(crate) enum MadeBy {
    /// One server's.
    Single(redis::Client),
    /// A Redis Cluster's.
    Cluster(redis::cluster::ClusterClient),
}

impl Settings {
    /// Connects to `url` now (`redis+cluster://` for a cluster, `redis+sentinel://`
    /// for Sentinel's master, `rediss://` for TLS).
    pub(crate) async fn connect(&self, url: &str) -> Result<Connected, Error> {
        let (conn, target, eviction, client) = self.connect_conn(url).await?;
        Ok(Connected {
            conn,
            target,
            connected: true,
            eviction,
            client,
        })
    }

    /// The connection [`connect`](ClientBuilder::connect) makes, where it goes, and
    /// what the server's eviction policy is.
    /// Also what made it.
    async fn connect_conn(
        &self,
        url: &str,
    ) -> Result<(Conn, Target, Option<Eviction>, Option<MadeBy>), Error> {
        let target = Target::new(url);
        if let Some(nodes) = cluster_nodes(url) {
            let (conn, eviction, client) = self.connect_cluster_conn(&nodes?, &target).await?;
            return Ok((conn, target, eviction, Some(MadeBy::Cluster(client))));
        }
        if let Some(parts) = sentinel::parse_url(url) {
            let mut conn = self.sentinel_conn(&parts?, &target)?;
            let eviction = self.check_server(&mut conn, &target).await?;
            return Ok((conn, target, eviction, None));
        }
        let (client, connection_config) = self.redis_config(url, &target)?;
        let eviction = self.probe(&client, &target).await?;
        let connect = ConnectionManager::new_with_config(client.clone(), connection_config);
        let conn = self.within_connect_timeout(connect, &target).await?;
        Ok((Conn::Single(conn), target, eviction, Some(MadeBy::Single(client))))
    }

    /// A connection made as [`connect`](Settings::connect) makes its own, for raw
    /// commands.
    pub(crate) async fn connect_raw(&self, url: &str) -> Result<RawConnection, Error> {
        let (conn, target, _, _) = self.connect_conn(url).await?;
        Ok(RawConnection::new(conn, target, self.command_timeout))
    }

    /// A raw connection to each primary behind `url` (see
    /// `ClientBuilder::connect_raw_primaries`).
    pub(crate) async fn connect_raw_primaries(
        &self,
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
            primaries.push(self.connect_raw(&with_address(node, addr)).await?);
        }
        Ok(primaries)
    }

    /// Connects now to a Redis Cluster through any of its `nodes`.
    pub(crate) async fn connect_cluster(&self, nodes: &[String]) -> Result<Connected, Error> {
        let target = Target::nodes(nodes);
        let (conn, eviction, client) = self.connect_cluster_conn(nodes, &target).await?;
        Ok(Connected {
            conn,
            target,
            connected: true,
            eviction,
            client: Some(MadeBy::Cluster(client)),
        })
    }

    async fn connect_cluster_conn(
        &self,
        nodes: &[String],
        target: &Target,
    ) -> Result<(Conn, Option<Eviction>, redis::cluster::ClusterClient), Error> {
        let client = self.cluster_client(nodes, target)?;
        let mut conn = self
            .within_connect_timeout(client.get_async_connection(), target)
            .await?;
        let eviction = self.check_server(&mut conn, target).await?;
        Ok((Conn::Cluster(conn), eviction, client))
    }

    /// A connection made on first use, and made again by itself. Outside a runtime,
    /// what it starts now starts on the library's.
    pub(crate) fn connect_lazy(&self, url: &str) -> Result<Connected, Error> {
        let outside = tokio::runtime::Handle::try_current()
            .is_err()
            .then(super::carrier::carrier)
            .flatten();
        let _entered = outside.as_ref().map(tokio::runtime::Handle::enter);
        let target = Target::new(url);
        let lazy = |conn, target, client| Connected {
            conn,
            target,
            connected: false,
            eviction: None,
            client,
        };
        if let Some(nodes) = cluster_nodes(url) {
            let client = self.cluster_client(&nodes?, &target)?;
            let conn = client.get_pending_async_connection_with_config(self.cluster_config());
            return Ok(lazy(Conn::Cluster(conn), target, Some(MadeBy::Cluster(client))));
        }
        if let Some(parts) = sentinel::parse_url(url) {
            let conn = self.sentinel_conn(&parts?, &target)?;
            return Ok(lazy(conn, target, None));
        }
        let (client, connection_config) = self.redis_config(url, &target)?;
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), connection_config)
            .map_err(|err| classify(&err, &target, self.connect_timeout, true))?;
        Ok(lazy(Conn::Single(conn), target, Some(MadeBy::Single(client))))
    }

    /// The backend on `connected` for the client `owner` says, its `wait_for_replicas`
    /// setting checked.
    pub(crate) fn backend(&self, connected: Connected, owner: Owner) -> Result<RedisBackend, Error> {
        let Connected {
            conn,
            target,
            connected,
            eviction,
            client,
        } = connected;
        let replicas = self.replicas(matches!(conn, Conn::Cluster(_)))?;
        let remake = match (&conn, &client) {
            (Conn::Sentinel(_), _) => Some(Remake::Sentinel),
            (Conn::Single(_), Some(MadeBy::Single(client))) => {
                Some(Remake::Single(Box::new((client.clone(), self.manager_config()))))
            }
            (Conn::Cluster(_), Some(MadeBy::Cluster(client))) => Some(Remake::Cluster(Box::new((
                client.clone(),
                self.cluster_config(),
                self.connect_timeout,
            )))),
            _ => None,
        };
        let opener = match (&conn, client) {
            (Conn::Sentinel(sentinel), _) => Some(Opener::Sentinel(sentinel.clone())),
            (Conn::Single(_), Some(MadeBy::Single(client))) => Some(Opener::Single(Box::new(client))),
            _ => None,
        };
        let waits = match (replicas, opener) {
            (Some(replicas), Some(opener)) => Some(Waits::new(
                replicas,
                opener,
                self.connect_timeout,
                self.command_timeout,
            )),
            // Never a grant answered as replicated without a wait.
            (Some(_), None) => {
                return Err(Error::InvalidSetting {
                    setting: "wait_for_replicas",
                    problem: "this connection cannot make connections of its own to wait on".to_owned(),
                })
            }
            (None, _) => None,
        };
        let backend = RedisBackend::new(
            conn,
            self.command_timeout,
            self.server_time,
            target,
            connected,
            owner,
        )
        .wait_for_replicas(waits)
        .remake_by(remake);
        if let Some(eviction) = &eviction {
            backend.record_eviction(eviction);
        }
        Ok(backend)
    }

    /// The `wait_for_replicas` setting, checked against the others and the server.
    pub(crate) fn replicas(&self, cluster: bool) -> Result<Option<Replicas>, Error> {
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
        // Redis 7.0 reads WAIT's count into a 32-bit int: 2^31 is answered at once.
        if i32::try_from(replicas.count).is_err() {
            return Err(invalid(format!(
                "{} replicas: Redis reads the count as a 32-bit signed integer; ask for at most {}",
                replicas.count,
                i32::MAX
            )));
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
        // Four retries, not the default 16: each retry on a node that cannot be
        // reached connects again, and a call that spends them fails rather than
        // times out, so that the node's pace (`nodes`) sees it.
        let builder = redis::cluster::ClusterClientBuilder::new(nodes.to_vec())
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.command_timeout)
            .retries(4)
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

    /// How a Redis Cluster connection made on first use (or made again) connects and
    /// answers: within the client's timeouts, as one made now does.
    fn cluster_config(&self) -> redis::cluster::ClusterConfig {
        redis::cluster::ClusterConfig::new()
            .set_connection_timeout(self.connect_timeout)
            .set_response_timeout(self.command_timeout)
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
        Ok((client, self.manager_config()))
    }

    /// How a connection to one server is made and made again: one connection attempt
    /// per command at most, failing with its real cause (refused, wrong password,
    /// ...), rather than retries with growing pauses that outlast any request's
    /// timeout; the next command tries again.
    fn manager_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.command_timeout))
            .set_number_of_retries(0)
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
