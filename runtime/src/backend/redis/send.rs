//! Each request run under the command timeout: whether it may be sent while no
//! connection reaches its server, the reply or failure read, and the pace of
//! reconnecting told what happened.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Instant;

use redis::RedisError;

use super::connection::Conn;
use super::failure::classify;
use super::moves::slot_moving;
use super::reconnects::{Failure, Reconnects};
use super::replies::{about_the_server, script_error, unfit};
use super::{RedisBackend, REMAKE_EVERY};
use crate::keys::Keys;
use crate::Error;

impl RedisBackend {
    /// Runs one request under the command timeout; script errors name their key.
    pub(super) async fn run<T, F>(&self, calls: &[Keys<'_>], request: impl Fn(Conn) -> F) -> Result<T, Error>
    where
        F: Future<Output = Result<T, RedisError>>,
    {
        let (failed_before, pace) = self.sendable(calls)?;
        self.send(failed_before, &pace, calls, false, request).await
    }

    /// The pace the call on `calls` follows while no connection reaches its server:
    /// the client's one server's, or on a cluster its slot's primary's.
    pub(super) fn pace(&self, calls: &[Keys<'_>]) -> Pace<'_> {
        match self.cluster {
            false => Pace::Server(&self.reconnects),
            true => Pace::Node(self.nodes.pace(calls)),
        }
    }

    /// Whether a command on `calls` may be sent: the failures to reach its server in a
    /// row so far and the pace it follows, or why the call fails without sending
    /// anything (an unsupported server, a server no connection reaches, whose
    /// connecting is paused).
    #[inline]
    pub(super) fn sendable(&self, calls: &[Keys<'_>]) -> Result<(u32, Pace<'_>), Error> {
        if let Some(refusal) = self.health.refusal(self.target.shown()) {
            return Err(refusal);
        }
        let pace = self.pace(calls);
        let (failed, tries) = pace
            .before()
            .map_err(|(failure, detail)| self.failure_error(failure, detail))?;
        if tries {
            self.connect_anew();
        }
        Ok((failed, pace))
    }

    /// The error a call answers for a failure its pace keeps.
    pub(super) fn failure_error(&self, failure: Failure, detail: String) -> Error {
        let target = self.target.shown().to_owned();
        match failure {
            Failure::Unreachable => Error::Unreachable { target, detail },
            Failure::Credentials => Error::AuthFailed { target, detail },
            Failure::Database => Error::UnknownDatabase { target, detail },
            Failure::Refusing => Error::Backend { detail },
            Failure::WrongServer => Error::WrongServer { target, detail },
        }
    }

    /// [`run`](RedisBackend::run) once [`sendable`](RedisBackend::sendable) said it
    /// may, after `failed_before` failures in a row; `again`: on a cluster, a call to
    /// a slot being moved is sent again within the timeout (`moves.rs`), by calling
    /// `request` again (the decisions only: a request sent again must be one that
    /// none of those answers ran and that is written anew at each try).
    pub(super) async fn send<T, F>(
        &self,
        failed_before: u32,
        pace: &Reconnects,
        calls: &[Keys<'_>],
        again: bool,
        request: impl Fn(Conn) -> F,
    ) -> Result<T, Error>
    where
        F: Future<Output = Result<T, RedisError>>,
    {
        // Read before the command: a sibling's timeout may have the connection made
        // again while this one waits on the old one.
        let connecting = !self.answered.load(Ordering::Relaxed);
        // (A cluster's only: whether a call that found no node failed at once, and
        // how long a call to a slot being moved has been tried.)
        let sent = self.cluster.then(Instant::now);
        // (the connection made again within the call's timeout; a cluster's call to a
        // slot being moved sent again within it, `moves.rs`)
        let call = async {
            self.carry_if_needed().await;
            let mut tries = 0;
            loop {
                let conn = self.conn();
                let reply = request(if connecting {
                    self.sent_where_it_lasts(conn)
                } else {
                    conn
                })
                .await;
                let wait = match (&reply, sent) {
                    (Err(err), Some(sent)) if again && failed_before == 0 && slot_moving(err) => {
                        self.moves.wait(tries, sent.elapsed(), self.timeout)
                    }
                    _ => None,
                };
                match wait {
                    Some(wait) => tokio::time::sleep(wait).await,
                    None => return reply,
                }
                tries += 1;
            }
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(value)) => {
                if connecting {
                    self.answered.store(true, Ordering::Relaxed);
                }
                self.replied();
                self.served();
                pace.answered();
                if self.cluster {
                    self.nodes.served(calls);
                }
                Ok(value)
            }
            Ok(Err(err)) => {
                if err.is_timeout() {
                    self.timed_out(failed_before, pace);
                } else if !err.is_io_error() {
                    self.replied();
                }
                let lost = err.is_io_error() && !err.is_timeout();
                let mut error = script_error(&err, calls)
                    .or_else(|| unfit(&err))
                    .unwrap_or_else(|| classify(&err, &self.target, self.timeout, connecting));
                if self.cluster
                    && err.kind() == redis::ErrorKind::ClusterConnectionNotFound
                    && sent.is_some_and(|sent| sent.elapsed() < self.timeout / 2)
                {
                    error = self.why_no_node(error).await;
                }
                // A connection whose opening commands are refused is never made
                // again by the connection manager: it is, at the try after a pause.
                let unreachable = lost || (self.cluster && node_unreached(&err));
                let failure = match &error {
                    Error::Unreachable { detail, .. } | Error::Backend { detail } if unreachable => {
                        Some((Failure::Unreachable, detail))
                    }
                    Error::AuthFailed { detail, .. } => Some((Failure::Credentials, detail)),
                    Error::UnknownDatabase { detail, .. } => Some((Failure::Database, detail)),
                    Error::WrongServer { detail, .. } => Some((Failure::WrongServer, detail)),
                    // The server's error about itself, not the call: answered, but
                    // nothing served (and behind a proxy that answers so and closes,
                    // a cluster's client connects again for each call). On the pace a
                    // cluster's nodes share until the slot map is read, one node's
                    // would pause the calls to the others: it counts once the map
                    // gives the node a pace of its own, or once no node serves.
                    Error::Backend { detail } if about_the_server(&err) => {
                        if self.cluster
                            && self.nodes.is_shared(pace)
                            && !self.refused_everywhere(failed_before > 0)
                        {
                            self.nodes.read_soon(self.conn(), self.timeout);
                            None
                        } else {
                            Some((Failure::Refusing, detail))
                        }
                    }
                    _ => None,
                };
                match failure {
                    Some((failure, detail)) => {
                        // (a redirect on the pace of its slot, made at the first: the
                        // failures before it counted none on that pace)
                        let slot = self.cluster && redirected(&err);
                        match slot.then(|| self.nodes.redirected(calls)).flatten() {
                            Some(slot) if !std::ptr::eq(&*slot, pace) => slot.failed(0, failure, detail),
                            _ => pace.failed(failed_before, failure, detail),
                        }
                        // Which node serves which slot, read for the next calls.
                        if self.cluster {
                            self.nodes.read_soon(self.conn(), self.timeout);
                        }
                    }
                    None if !err.is_io_error() && !err.is_timeout() => pace.answered_with_error(),
                    None => {}
                }
                // A lost connection (not a slow answer) is made again before the
                // next command can be answered.
                if lost {
                    self.answered.store(false, Ordering::Relaxed);
                    // The new connection is named, and the server looked at, again.
                    self.health.check_soon();
                    // A cluster's connection does not make itself again when its own
                    // task is gone (its runtime shut down): every command then fails
                    // as a broken pipe. (A node down is refused or reset: the cluster
                    // client follows the failover itself.)
                    if self.cluster && broken_pipe(&err) {
                        self.remake("the connection was lost", true);
                    } else if broken_pipe(&err) {
                        self.remake_lasting().await;
                    }
                }
                self.noting_step(Err(error))
            }
            Err(_) => {
                self.timed_out(failed_before, pace);
                Err(Error::Timeout {
                    after: self.timeout,
                    connecting,
                })
            }
        }
    }

    /// Why a cluster connection found no node: it says no more, and the cause may
    /// last (credentials refused, a server that is no cluster node, which answers some
    /// commands and not the scripts), which `on_error = "allow"` must not take for an
    /// outage. A connection made now, within the connect timeout, says it, at most
    /// once a [`REMAKE_EVERY`] and one at a time, the calls meanwhile answering what
    /// it found. Only for a call that failed at once: a silence times out, and is not
    /// looked into.
    #[cold]
    pub(super) async fn why_no_node(&self, unreached: Error) -> Error {
        let Some(remake) = self.remake.as_deref() else {
            return unreached;
        };
        let recent = || {
            self.diagnosed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
                .filter(|(at, _)| at.elapsed() < REMAKE_EVERY)
        };
        let found = match recent() {
            Some((_, found)) => found,
            None => {
                // One look at a time: a call that waited on another's reads what it found.
                let _looking = self.diagnosing.lock().await;
                match recent() {
                    Some((_, found)) => found,
                    None => {
                        let found = match remake.cluster().await {
                            // (Connected: the cause passed, or is a node's; the
                            // connection is left to be made again as for any failure.)
                            Some(Ok(_)) => None,
                            Some(Err(Some(err))) => match classify(&err, &self.target, self.timeout, true) {
                                Error::AuthFailed { detail, .. } => Some((Failure::Credentials, detail)),
                                Error::UnknownDatabase { detail, .. } => Some((Failure::Database, detail)),
                                Error::WrongServer { detail, .. } => Some((Failure::WrongServer, detail)),
                                _ => None,
                            },
                            _ => None,
                        };
                        *self.diagnosed.lock().unwrap_or_else(PoisonError::into_inner) =
                            Some((Instant::now(), found.clone()));
                        found
                    }
                }
            }
        };
        match found {
            Some((failure, detail)) => self.failure_error(failure, detail),
            None => unreached,
        }
    }
}

/// A failure that lasts until someone acts, and its cause as its error said it.
pub(super) type Lasting = (Failure, String);

/// The pace a call follows ([`RedisBackend::pace`]).
pub(super) enum Pace<'a> {
    Server(&'a Reconnects),
    Node(Arc<Reconnects>),
}

impl std::ops::Deref for Pace<'_> {
    type Target = Reconnects;

    fn deref(&self) -> &Reconnects {
        match self {
            Pace::Server(pace) => pace,
            Pace::Node(pace) => pace,
        }
    }
}

/// Whether a cluster's call failed for want of its slot's node, the cluster
/// client's retries spent: no node connection left, a redirect it could not follow
/// to the end ([`redirected`]), or the cluster down (a node lost, no replica
/// promoted yet). An error reply from whichever node answered, not a sign that the
/// slot's node answers.
fn node_unreached(err: &RedisError) -> bool {
    err.kind() == redis::ErrorKind::ClusterConnectionNotFound
        || redirected(err)
        || matches!(err.code(), Some("CLUSTERDOWN" | "MASTERDOWN"))
}

/// Whether a cluster's call ended in a redirect, its retries spent (a redirect to a
/// node it could not reach, nodes redirecting to each other or to themselves, a slot
/// being moved on Redis 6.2): counted on the slot's pace, not its node's.
fn redirected(err: &RedisError) -> bool {
    matches!(err.code(), Some("MOVED" | "ASK"))
}

/// Whether `err` is a broken pipe: the redis client's word for a connection whose
/// task is gone.
fn broken_pipe(err: &RedisError) -> bool {
    type Shared = Arc<dyn std::error::Error + Send + Sync>;
    // (The redis client gives its I/O error as the `Arc` it keeps it in.)
    std::error::Error::source(err)
        .and_then(|source| source.downcast_ref::<Shared>())
        .and_then(|shared| shared.downcast_ref::<std::io::Error>())
        .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A broken pipe is the only failure that has a cluster connection made again
    /// as lost: a node down is refused or reset, and the cluster client follows it.
    #[test]
    fn only_a_broken_pipe_is_a_connection_whose_task_is_gone() {
        let io = |kind| RedisError::from(std::io::Error::from(kind));
        assert!(broken_pipe(&io(std::io::ErrorKind::BrokenPipe)));
        assert!(broken_pipe(&RedisError::from(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "redis_cluster: Unable to send command",
        ))));
        for kind in [
            std::io::ErrorKind::ConnectionRefused,
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::TimedOut,
        ] {
            assert!(!broken_pipe(&io(kind)), "{kind:?}");
        }
        let server = RedisError::from((redis::ErrorKind::Client, "not a pipe"));
        assert!(!broken_pipe(&server));
    }
}
