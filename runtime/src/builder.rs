//! Building a [`Client`]: prefix, timeouts, clock, and where the state lives.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::backend::connection::{cluster_nodes, Conn};
use crate::backend::memory::MemoryBackend;
use crate::backend::redis::RedisBackend;
use crate::backend::Backend;
use crate::client::{DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX};
use crate::{Client, Clock, Error, SystemClock};

/// Settings for a [`Client`]; finish with [`connect`](ClientBuilder::connect),
/// [`connect_lazy`](ClientBuilder::connect_lazy) or [`memory`](ClientBuilder::memory).
#[derive(Clone)]
pub struct ClientBuilder {
    prefix: String,
    command_timeout: Duration,
    connect_timeout: Duration,
    clock: Arc<dyn Clock>,
    server_time: bool,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            prefix: DEFAULT_PREFIX.to_owned(),
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            clock: Arc::new(SystemClock),
            server_time: false,
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
        self.clock = Arc::new(clock);
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

    /// Connects to Redis now; fails when the server cannot be reached in time.
    /// `redis+cluster://host:port,host:port/` connects to a Redis Cluster.
    pub async fn connect(self, url: &str) -> Result<Client, Error> {
        if let Some(nodes) = cluster_nodes(url) {
            return self.connect_cluster_nodes(&nodes?, url).await;
        }
        let (client, connection_config) = self.redis_config(url)?;
        let connect = ConnectionManager::new_with_config(client, connection_config);
        let conn = self.within_connect_timeout(connect).await?;
        Ok(self.finish_redis(Conn::Single(conn), url))
    }

    /// Connects to a Redis Cluster through any of its nodes (`redis://host:port/`).
    pub async fn connect_cluster(self, nodes: &[&str]) -> Result<Client, Error> {
        let nodes: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
        let target = format!("cluster {}", nodes.join(","));
        self.connect_cluster_nodes(&nodes, &target).await
    }

    async fn connect_cluster_nodes(self, nodes: &[String], target: &str) -> Result<Client, Error> {
        let client = self.cluster_client(nodes, target)?;
        let conn = self.within_connect_timeout(client.get_async_connection()).await?;
        Ok(self.finish_redis(Conn::Cluster(conn), target))
    }

    /// A Redis client that connects on first use and reconnects by itself, so an
    /// application can start while Redis is down. Must be called inside a Tokio runtime.
    pub fn connect_lazy(self, url: &str) -> Result<Client, Error> {
        if let Some(nodes) = cluster_nodes(url) {
            let client = self.cluster_client(&nodes?, url)?;
            let config = redis::cluster::ClusterConfig::new()
                .set_connection_timeout(self.connect_timeout)
                .set_response_timeout(self.command_timeout);
            let conn = client.get_pending_async_connection_with_config(config);
            return Ok(self.finish_redis(Conn::Cluster(conn), url));
        }
        let (client, connection_config) = self.redis_config(url)?;
        let conn = ConnectionManager::new_lazy_with_config(client, connection_config)?;
        Ok(self.finish_redis(Conn::Single(conn), url))
    }

    async fn within_connect_timeout<T>(
        &self,
        connect: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(conn) => Ok(conn?),
            Err(_) => Err(Error::Timeout {
                after: self.connect_timeout,
            }),
        }
    }

    fn cluster_client(&self, nodes: &[String], target: &str) -> Result<redis::cluster::ClusterClient, Error> {
        // Redirects and TRYAGAIN (a slot migrating) are retried within milliseconds:
        // the default waits start at 1.28 s, far past any request path's timeout.
        redis::cluster::ClusterClientBuilder::new(nodes.to_vec())
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.command_timeout)
            .retries(16)
            .min_retry_wait(2)
            .max_retry_wait(50)
            .retry_wait_formula(2, 2)
            .build()
            .map_err(|e| Error::InvalidUrl {
                url: target.to_owned(),
                detail: e.to_string(),
            })
    }

    fn finish_redis(self, conn: Conn, target: &str) -> Client {
        let backend = RedisBackend::new(conn, self.command_timeout, self.server_time);
        self.finish(Backend::Redis(backend), target)
    }

    /// A client on the in-process backend: same semantics, limits per process.
    pub fn memory(self) -> Client {
        self.finish(Backend::Memory(MemoryBackend::default()), "memory")
    }

    fn redis_config(&self, url: &str) -> Result<(redis::Client, ConnectionManagerConfig), Error> {
        let client = redis::Client::open(url).map_err(|e| Error::InvalidUrl {
            url: url.to_owned(),
            detail: e.to_string(),
        })?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.command_timeout))
            .set_max_delay(Duration::from_secs(2));
        Ok((client, config))
    }

    fn finish(self, backend: Backend, target: &str) -> Client {
        Client::assemble(
            backend,
            self.prefix,
            self.clock,
            self.command_timeout,
            redact(target),
        )
    }
}

/// Hides a password in a URL before it reaches logs or `Debug` output.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => format!("{}://***@{}", &url[..scheme], &url[at + 1..]),
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_stay_out_of_debug_output() {
        assert_eq!(
            redact("redis://user:secret@host:6379/0"),
            "redis://***@host:6379/0"
        );
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
    }
}
