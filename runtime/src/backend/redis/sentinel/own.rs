//! Connections of their own to the master in use, beside the one every command
//! shares: the connections that wait for replicas (`WAIT` holds the connection it is
//! sent on), each tied to the master it was made for; and how any connection to a
//! master is made.

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, IntoConnectionInfo, RedisError, RedisResult, Value};

use super::{lost_master, no_master, replied_not_the_master, Address, Master, SentinelConn};

impl SentinelConn {
    /// A new connection to the master in use (searched for first when there is none)
    /// and that master's generation.
    pub(crate) async fn open_own(
        &self,
        config: &AsyncConnectionConfig,
    ) -> RedisResult<(u64, MultiplexedConnection)> {
        let (generation, _) = self.master().await?;
        let address = {
            let state = self.inner.lock();
            match &state.current {
                Some(current) if current.generation == generation => current.address.clone(),
                _ => return Err(no_master("the master changed while a connection was made")),
            }
        };
        let client = self.inner.master.client(&address)?;
        let conn = client
            .get_multiplexed_async_connection_with_config(config)
            .await?;
        Ok((generation, conn))
    }

    /// Whether `generation` is still the master in use: a connection made for an
    /// earlier one goes to a node the sentinels no longer name.
    pub(crate) fn in_use(&self, generation: u64) -> bool {
        matches!(&self.inner.lock().current, Some(current) if current.generation == generation)
    }

    /// Forgets the master of `generation` when a command on a connection of its own
    /// failed, or was answered, in a way that says the master is gone or demoted;
    /// answers whether it did.
    pub(crate) fn heard(&self, generation: u64, reply: Result<&[Value], &RedisError>) -> bool {
        let gone = match reply {
            Err(err) => lost_master(err),
            Ok(values) => values.iter().any(replied_not_the_master),
        };
        if gone {
            self.forget(generation);
        }
        gone
    }
}

impl Master {
    /// A client for the master at `address`, with its credentials, database and TLS.
    pub(super) fn client(&self, address: &Address) -> RedisResult<redis::Client> {
        let (host, port) = address.clone();
        let addr = match self.tls {
            None => ConnectionAddr::Tcp(host, port),
            Some(insecure) => ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                tls_params: None,
            },
        };
        let info = addr
            .into_connection_info()?
            .set_redis_settings(self.settings.clone());
        #[cfg(feature = "tls")]
        if let Some(certs) = &self.certs {
            return redis::Client::build_with_tls(info, certs.clone());
        }
        redis::Client::open(info)
    }
}
