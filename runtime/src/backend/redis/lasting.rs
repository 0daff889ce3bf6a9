//! Where a client's work runs: its connection's tasks, its background work and its
//! give-backs, on a runtime that lasts (the client's own while it runs, else the
//! library's, [`carrier`](super::carrier)), the connection carried there when the
//! runtime it was made on ends or runs only while its own callers run it.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::PoisonError;
use std::time::Instant;

use tokio::runtime::RuntimeFlavor;

use super::connection::{Conn, Remake};
use super::{carrier, ongoing, Done, RedisBackend, REMAKE_EVERY};

impl RedisBackend {
    /// The runtime for work that must outlive the call that starts it (a settle, a
    /// connection made again): the client's own while it is a multi-thread runtime
    /// still running; the caller's when that is the client's own; else the library's
    /// ([`carrier`]), as a caller's runtime, of either kind, may end right after its
    /// call (a runtime made for each call). The caller's if that cannot be made.
    /// Outside a runtime (a client dropped after its own ended, a settle dropped
    /// there), the client's while it runs, else the library's.
    pub(crate) fn lasting(&self) -> Option<tokio::runtime::Handle> {
        let current = tokio::runtime::Handle::try_current().ok();
        match &self.runtime {
            // (looked at first: it runs, and spawns no probe to say so)
            Some(made_on)
                if current
                    .as_ref()
                    .is_some_and(|current| made_on.id() == current.id()) =>
            {
                current
            }
            Some(made_on) if made_on.runtime_flavor() == RuntimeFlavor::MultiThread && alive(made_on) => {
                Some(made_on.clone())
            }
            _ => carrier::carrier().or(current),
        }
    }

    /// Starts `task` through `ongoing` when one is needed there, on a runtime that
    /// lasts: the library's once the client's tasks are [`moving`](RedisBackend::moving)
    /// there, else [`lasting`](RedisBackend::lasting)'s.
    pub(super) fn keep_going<F>(&self, ongoing: &ongoing::Ongoing, task: impl FnOnce(ongoing::Turn) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let moving = self.moving();
        let runtime = match moving {
            true => carrier::carrier().or_else(|| self.lasting()),
            false => self.lasting(),
        };
        if let Some(runtime) = runtime {
            ongoing.start(&runtime, carrier::is_carrier(&runtime), moving, task);
        }
    }

    /// Whether the client's own tasks belong on the library's runtime: the connection
    /// was carried there, or the caller is off the client's current-thread runtime,
    /// which runs only while its own callers run it (a call answered here, from a kept
    /// refusal or a batch, sends nothing that would carry the connection).
    pub(super) fn moving(&self) -> bool {
        self.moved.load(Ordering::Relaxed) || self.off_its_current_thread_runtime()
    }

    /// Before a give-back sent from a task of its own on `to` (a client dropped, a
    /// batch closed) once the client's runtime ended, or when `to` is not the
    /// client's current-thread runtime, with no call since that carried the
    /// connection: it is carried on the library's runtime now, as the next call would
    /// have had it (without waiting: a client being dropped cannot), or the give-back
    /// would wait on tasks that ended with that runtime, or that run only while it
    /// does. `anyway`: `to` is the library's runtime because the one the give-back
    /// would have run on is shutting down, taking the connection's tasks with it.
    pub(crate) fn carry_at_once(&self, to: Option<&tokio::runtime::Handle>, anyway: bool) {
        let off_its_own = match (&self.runtime, to) {
            (Some(made_on), Some(to)) => {
                made_on.runtime_flavor() == RuntimeFlavor::CurrentThread && to.id() != made_on.id()
            }
            _ => false,
        };
        if self.moved.load(Ordering::Relaxed) || !(anyway || off_its_own || self.ended()) {
            return;
        }
        let (Some(remake), Some(carrier)) = (self.remake.as_deref(), carrier::carrier()) else {
            return;
        };
        // (made there: the tasks it starts are that runtime's)
        let _entered = carrier.enter();
        let remade = match remake {
            Remake::Cluster(_) => remake.cluster_pending(),
            _ => remake.carried(&self.conn(), carrier.clone()),
        };
        if let Some(remade) = remade {
            *self.conn.write().unwrap_or_else(PoisonError::into_inner) = remade;
            self.moved.store(true, Ordering::Relaxed);
        }
    }

    /// Whether the runtime the client was made on has ended.
    pub(super) fn ended(&self) -> bool {
        self.outlived.as_ref().is_some_and(carrier::Outlived::ended)
    }

    /// Whether the caller is on a runtime other than the client's own, when that is a
    /// current-thread runtime: one that runs only while its own callers block on it,
    /// or a task of its own does, so that the connection's tasks there may wait.
    pub(super) fn off_its_current_thread_runtime(&self) -> bool {
        match &self.runtime {
            Some(made_on) if made_on.runtime_flavor() == RuntimeFlavor::CurrentThread => {
                tokio::runtime::Handle::try_current().is_ok_and(|current| current.id() != made_on.id())
            }
            _ => false,
        }
    }

    /// [`carry_on`](RedisBackend::carry_on) when the client's runtime has ended, or
    /// is a current-thread runtime the caller is not on, and the connection was not
    /// carried since.
    #[inline]
    pub(super) async fn carry_if_needed(&self) {
        if !self.moved.load(Ordering::Relaxed) && (self.ended() || self.off_its_current_thread_runtime()) {
            self.carry_on().await;
        }
    }

    /// A connection to one server, or through Sentinel, that has not answered yet
    /// (made lazily, or being made again), used by a caller not on a runtime that
    /// lasts ([`lasting`](RedisBackend::lasting)): the command is sent from a task of
    /// that runtime, so that the tasks the connecting starts (the connection's own,
    /// a search for the master) are that runtime's. Started from the caller's, they
    /// would end with it, and a runtime made for one call ends right after it.
    #[cold]
    pub(super) fn sent_where_it_lasts(&self, conn: Conn) -> Conn {
        if !matches!(conn, Conn::Single(_) | Conn::Sentinel(_)) {
            return conn;
        }
        match (self.lasting(), tokio::runtime::Handle::try_current()) {
            (Some(lasting), Ok(current)) if lasting.id() != current.id() => {
                Conn::Carried(Box::new(conn), lasting)
            }
            _ => conn,
        }
    }

    /// The client's runtime has ended, and with it the tasks of its connections made
    /// there (or on a caller's runtime since): a command handed to one now would never
    /// be sent, and fail as a broken pipe. Or it is a current-thread runtime a caller
    /// is not on, where those tasks run only while it runs. The connection is made
    /// again on the library's runtime before the call sends, once, the calls meanwhile
    /// waiting for it: to one server or through Sentinel, its commands are sent from
    /// that runtime's tasks from then on ([`carry`](RedisBackend::carry)); a cluster's
    /// runs its own task there. The connections kept for `WAIT` are let go.
    #[cold]
    pub(super) async fn carry_on(&self) {
        let _turn = self.carrying.lock().await;
        if self.moved.load(Ordering::Relaxed) {
            return;
        }
        if let Some(waits) = &self.waits {
            waits.forget_idle();
        }
        match (self.conn(), &self.remake) {
            (Conn::Cluster(_), Some(remake)) => {
                let why =
                    "the runtime the client was made on ended, or runs only when its own callers run it";
                self.remake_cluster(remake, why, true);
                self.moved.store(true, Ordering::Relaxed);
            }
            (Conn::Cluster(_), None) => self.moved.store(true, Ordering::Relaxed),
            _ => {
                self.carry(true).await;
                // (the library's runtime does not end: carried there, never again)
                if matches!(self.conn(), Conn::Carried(_, on) if carrier::is_carrier(&on)) {
                    self.moved.store(true, Ordering::Relaxed);
                }
            }
        }
    }

    /// A connection to one server, or through Sentinel, found lost (a broken pipe) by
    /// a caller on a runtime that may not last (one not the client's own, or any once
    /// the client's has ended) is made again on a runtime that lasts
    /// ([`lasting`](RedisBackend::lasting)): from then on its commands are sent from
    /// that runtime's tasks, where it connects again after a loss. Left to itself, the
    /// connection manager would connect again on the runtime of the call that found
    /// it lost, which may end right after that call (a runtime made for each call),
    /// and the new connection with it.
    #[cold]
    pub(super) async fn remake_lasting(&self) {
        let _turn = self.carrying.lock().await;
        self.carry(false).await;
    }

    /// The connection carried by a runtime that lasts, made there (`ended`: the
    /// client's runtime has ended, or is a current-thread one the caller is not on,
    /// and the connection it had is let go whatever runtime the caller is on);
    /// nothing when it is carried there already, or the caller is on that runtime,
    /// where the connection manager connects again by itself. At most once a
    /// [`REMAKE_EVERY`] but when `ended`; the caller holds `carrying`, so the calls
    /// needing it meanwhile wait for it.
    pub(super) async fn carry(&self, ended: bool) {
        let Some(remake) = self
            .remake
            .clone()
            .filter(|remake| matches!(**remake, Remake::Single(_) | Remake::Sentinel))
        else {
            return;
        };
        let Some(runtime) = self.lasting() else {
            return;
        };
        let current = tokio::runtime::Handle::try_current().ok();
        let old = self.conn();
        let lasts = match &old {
            // (the library's runtime does not end, and its thread drives it: a caller
            // on the client's current-thread runtime would carry it where the other
            // callers' commands wait until that runtime runs)
            Conn::Carried(_, on) => on.id() == runtime.id() || carrier::is_carrier(on),
            _ => !ended && current.is_some_and(|current| current.id() == runtime.id()),
        };
        if lasts || self.remaking.swap(true, Ordering::Relaxed) {
            return;
        }
        let done = Done(self.remaking.clone());
        {
            let mut remade_at = self.remade_at.lock().unwrap_or_else(PoisonError::into_inner);
            if !ended && remade_at.is_some_and(|at| at.elapsed() < REMAKE_EVERY) {
                return;
            }
            *remade_at = Some(Instant::now());
        }
        let (slot, carrier) = (self.conn.clone(), runtime.clone());
        // Made there, so that the tasks it starts are that runtime's; put in place at
        // once (it connects at its first command; a search through Sentinel goes on
        // there however long it takes): the old one's tasks are gone.
        let remade = runtime.spawn(async move {
            let _done = done;
            let remade = remake.carried(&old, carrier)?;
            *slot.write().unwrap_or_else(PoisonError::into_inner) = remade;
            Some(())
        });
        if let Ok(Ok(Some(()))) = tokio::time::timeout(self.timeout, remade).await {
            self.answered.store(false, Ordering::Relaxed);
            tracing::warn!(
                "Redis at `{}`: the connection's task ran on a runtime that ended, or may; it is \
                 made again on one that lasts",
                self.target.shown()
            );
        }
    }
}

/// Whether `runtime` still runs what is spawned on it: a runtime shut down drops it
/// at once (a task that never ends, to tell).
pub(super) fn alive(runtime: &tokio::runtime::Handle) -> bool {
    let probe = runtime.spawn(std::future::pending::<()>());
    let alive = !probe.is_finished();
    probe.abort();
    alive
}
