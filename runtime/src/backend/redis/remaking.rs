//! The connection's health as its replies tell it, and the connection made again:
//! when a reply does not fit its command, none comes in two command timeouts, a
//! server failed to connect, or a cluster's node stays silent.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use super::connection::{Conn, Remake};
use super::reconnects::Reconnects;
use super::server::Health;
use super::{current, reach, Done, RedisBackend, REMAKE_EVERY, SILENT_TIMEOUTS};
use crate::Error;

impl RedisBackend {
    /// A reply did not fit the command it answered ([`Error::UnexpectedReply`]): the
    /// connection may be out of step, each command handed another's reply, and stays
    /// so however long it lives. It is made again.
    #[cold]
    pub(super) fn out_of_step(&self) {
        self.remake("a reply did not fit its command", false);
    }

    /// A command timed out: the connection is made again when no reply has come for
    /// [`SILENT_TIMEOUTS`] command timeouts, counted from the first timed-out
    /// command's sending. (Calls cut by one slow answer all time out at once: they
    /// are one timeout.) On the call's pace, the try's timeout is a failed try while
    /// the connecting is paused, and so is a timeout once nothing came back for a
    /// command timeout after an earlier one (`Reconnects::timed_out`), except on the
    /// pace a cluster's nodes share until its slot map is read, unless the connection
    /// as a whole is silent. A cluster's node silent so has the cluster connection
    /// made again (at most once a [`REMAKE_EVERY`]).
    #[cold]
    pub(super) fn timed_out(&self, failed_before: u32, pace: &Reconnects) {
        let silent_for = {
            let mut since = self.silent_since.lock().unwrap_or_else(PoisonError::into_inner);
            let sent = Instant::now()
                .checked_sub(self.timeout)
                .unwrap_or_else(Instant::now);
            self.silent.store(true, Ordering::Relaxed);
            since.get_or_insert(sent).elapsed()
        };
        let all_silent = silent_for >= self.timeout * SILENT_TIMEOUTS;
        // On the one pace a cluster's nodes share until its slot map is read, a silence
        // is a failure only when the connection as a whole is silent: one node's would
        // pause the calls to the others.
        let silence_fails = !self.cluster || all_silent || !self.nodes.is_shared(pace);
        let silent = pace.timed_out(failed_before, self.timeout, silence_fails);
        if self.cluster {
            // Which node serves which slot, read for the next calls (at most once a
            // second), so that a silent node's pace is its own.
            self.nodes.read_soon(self.conn(), self.timeout);
        }
        if all_silent {
            self.remake("no reply came in two command timeouts", true);
        } else if self.cluster && silent {
            // The cluster client keeps its connection to a silent node, which a try
            // after a pause would wait on again, while the other nodes' replies keep
            // the connection as a whole from being silent: it is made again, the old
            // one serving the other nodes until the new one is connected.
            self.remake(
                "a node answered nothing for a command timeout after a timeout",
                false,
            );
        }
    }

    /// A reply came: the connection is not silent.
    #[inline]
    pub(super) fn replied(&self) {
        if self.silent.load(Ordering::Relaxed) {
            self.not_silent();
        }
    }

    /// A reply that is not an error came: no node refuses every call.
    #[inline]
    pub(super) fn served(&self) {
        if self.refusing.load(Ordering::Relaxed) {
            self.not_refusing();
        }
    }

    #[cold]
    pub(super) fn not_refusing(&self) {
        let mut since = self.refusing_since.lock().unwrap_or_else(PoisonError::into_inner);
        self.refusing.store(false, Ordering::Relaxed);
        *since = None;
    }

    /// Records that a cluster's node refused a call on the pace the nodes share (the
    /// slot map not read yet), and answers whether every node refuses: refusals, each
    /// within a command timeout of the last, and no call served, for a command timeout.
    /// (One node's refusals would otherwise pause the calls to the others; a cluster of
    /// one node, or behind one proxy, refuses them all.) A refusal on a pace already
    /// failing (`failing`: the try after a pause, longer than a command timeout) goes
    /// on with the refusals before it: taken as the first of new ones, it let the calls
    /// through again for a command timeout after each pause.
    #[cold]
    pub(super) fn refused_everywhere(&self, failing: bool) -> bool {
        let mut refusing = self.refusing_since.lock().unwrap_or_else(PoisonError::into_inner);
        self.refusing.store(true, Ordering::Relaxed);
        let now = Instant::now();
        let (since, last) = refusing.get_or_insert((now, now));
        if now - *last > self.timeout && !failing {
            *since = now;
        }
        *last = now;
        now - *since >= self.timeout
    }

    #[cold]
    pub(super) fn not_silent(&self) {
        self.silent.store(false, Ordering::Relaxed);
        *self.silent_since.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Makes the connection again, for `why`, at most once a [`REMAKE_EVERY`] (a
    /// server that answers every command so would otherwise be connected to at every
    /// call); commands already sent finish on the old one. `dead`: the old one
    /// answers nothing (silent, or its task gone), and is not kept.
    #[cold]
    pub(super) fn remake(&self, why: &str, dead: bool) {
        let Some(remake) = &self.remake else {
            return;
        };
        if let Remake::Cluster(_) = &**remake {
            // One connected at a time: a connect may take the connect timeout.
            if !dead && self.remaking.load(Ordering::Relaxed) {
                return;
            }
        }
        {
            let mut remade_at = self.remade_at.lock().unwrap_or_else(PoisonError::into_inner);
            if remade_at.is_some_and(|at| at.elapsed() < REMAKE_EVERY) {
                return;
            }
            *remade_at = Some(Instant::now());
        }
        if let Remake::Cluster(_) = &**remake {
            self.remake_cluster(remake, why, dead);
            return;
        }
        let Some(remade) = remake.remade(&self.conn()) else {
            return;
        };
        *self.conn.write().unwrap_or_else(PoisonError::into_inner) = remade;
        self.not_silent();
        self.answered.store(false, Ordering::Relaxed);
        self.health.check_soon();
        tracing::warn!(
            "Redis at `{}`: {why}; the connection is made again",
            self.target.shown()
        );
    }

    /// Puts a new connection (made on first use) in place of one to a server that
    /// failed to connect: the call trying again after a pause connects now. (On the
    /// old one it would meet the failure of the attempt made when the pause began,
    /// and the server, back meanwhile, would be reached a pause later.) Behind
    /// Sentinel, the master is forgotten at each lost connection already, and its
    /// search, which may outlast a call, is left to go on.
    #[cold]
    pub(super) fn connect_anew(&self) {
        let Some(remake) = self.remake.as_deref().filter(|r| matches!(r, Remake::Single(_))) else {
            return;
        };
        if let Some(remade) = remake.remade(&self.conn()) {
            *self.conn.write().unwrap_or_else(PoisonError::into_inner) = remade;
            self.answered.store(false, Ordering::Relaxed);
        }
    }

    /// [`remake`](RedisBackend::remake) for a Redis Cluster. A `dead` one (silent, or
    /// its task gone) answers nothing: a connection made on first use takes its place
    /// at once, and the old one is let go with the commands waiting on it. One out of
    /// step may still serve other nodes: a new one is connected in a task of its own
    /// and put in place once connected (it has answered: a timeout on it is not the
    /// connecting's), the old one serving until then, and kept if it cannot be.
    /// Either runs its own task on a runtime that lasts ([`lasting`](RedisBackend::lasting):
    /// the client's while it is a multi-thread runtime that runs, else the library's
    /// unless the caller is on the client's own): a caller's runtime may end before the
    /// client does, and the client's may no longer be driven, or have ended.
    pub(super) fn remake_cluster(&self, remake: &Arc<Remake>, why: &str, dead: bool) {
        let Some(runtime) = self.lasting() else {
            return;
        };
        let target = self.target.shown().to_owned();
        if dead {
            let pending = {
                let _entered = runtime.enter();
                remake.cluster_pending()
            };
            if let Some(pending) = pending {
                *self.conn.write().unwrap_or_else(PoisonError::into_inner) = pending;
                self.not_silent();
                // A timeout on the new one, until it answers, is its connecting's.
                self.answered.store(false, Ordering::Relaxed);
                self.health.check_soon();
                tracing::warn!("Redis at `{target}`: {why}; the cluster connection is made again");
            }
            return;
        }
        if self.remaking.swap(true, Ordering::Relaxed) {
            return;
        }
        // Cleared when the making ends, or its task is dropped unfinished.
        let done = Done(Arc::clone(&self.remaking));
        tracing::warn!("Redis at `{target}`: {why}; the cluster connection is made again");
        let (remake, slot, health, timeout) = (
            Arc::clone(remake),
            Arc::clone(&self.conn),
            Arc::clone(&self.health),
            self.timeout,
        );
        runtime.spawn(async move {
            let _done = done;
            remake_cluster(remake, slot, health, target, timeout).await;
        });
    }

    /// `result`, having made the connection again if it is [`Error::UnexpectedReply`].
    pub(super) fn noting_step<T>(&self, result: Result<T, Error>) -> Result<T, Error> {
        if let Err(Error::UnexpectedReply { .. }) = &result {
            self.out_of_step();
        }
        result
    }
}

/// A new cluster connection by `remake` put in `slot` once connected and every
/// primary that does not refuse connections answers on it, or one the old one does
/// not reach (each step within `timeout`: see [`reach`]), or the old one kept. It is
/// given the time its client takes to give up on a node (for the URL's nodes, then
/// the others, a connect timeout and a command timeout for the `PING` that checks
/// each, and a command timeout for the slot map), so that a silent node's
/// connection is found missing, not timed out.
async fn remake_cluster(
    remake: Arc<Remake>,
    slot: Arc<RwLock<Conn>>,
    health: Arc<Health>,
    target: String,
    timeout: Duration,
) {
    match remake
        .cluster_within(|connect| (connect + timeout) * 2 + timeout)
        .await
    {
        Some(Ok(conn)) => match reach::may_replace(&conn, &current(&slot), timeout).await {
            Ok(()) => {
                *slot.write().unwrap_or_else(PoisonError::into_inner) = conn;
                health.check_soon();
            }
            Err(missing) => tracing::warn!(
                "Redis at `{target}`: the cluster connection made again does not reach every \
                 primary that takes connections ({missing}); the old one is kept"
            ),
        },
        Some(Err(failed)) => {
            let failed = match failed {
                Some(err) => format!("{:?}", err.kind()),
                None => "no connection in the time given".to_owned(),
            };
            tracing::warn!(
                "Redis at `{target}`: the cluster connection could not be made again ({failed}); \
                 the old one is kept"
            )
        }
        None => {}
    }
}
