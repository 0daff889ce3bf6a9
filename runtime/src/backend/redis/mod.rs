//! The Redis backend: a client's connection, each request run under the command
//! timeout, the server's health checked off the deciding path; one script call per
//! operation (EVALSHA with reload on NOSCRIPT), in the files beside this one. What a
//! client keeps in process because the state is remote is in [`kept`], what it shares
//! with every process through the library's own keys in [`shared`].

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use tokio::runtime::RuntimeFlavor;

use once_cell::sync::Lazy;
use redis::RedisError;

mod acquire;
mod carrier;
pub(crate) mod connect;
pub(crate) mod connection;
pub(crate) mod cross_slot;
pub(crate) mod failure;
mod give_back;
pub(crate) mod kept;
mod layout;
mod limiter;
mod lua;
mod nodes;
mod ongoing;
mod reach;
mod reconnects;
pub(crate) mod replicas;
mod replies;
pub(crate) mod scripts;
pub(crate) mod sentinel;
pub(crate) mod server;
mod settle;
pub(crate) mod shared;
pub(crate) mod target;
#[cfg(feature = "tls")]
pub(crate) mod tls;

pub use limiter::delete_limiter_keys;

use crate::keys::Keys;
use crate::rules::overrides::Overrides;
use crate::{Error, Rule};
use connection::{Conn, Remake};
use failure::classify;
use lua::Lua;
use nodes::Nodes;
use reconnects::{Failure, Reconnects};
use replies::{about_the_server, script_error, unfit};
use server::{Eviction, Health};
use target::Target;

struct Scripts {
    acquire: Lua,
    try_set_rate: Lua,
    configure: Lua,
    release: Lua,
    keep_alive: Lua,
    expire: Lua,
    refund: Lua,
    tokens: Lua,
    refund_tokens: Lua,
    reset: Lua,
    give_back: Lua,
    settle: Lua,
}

/// The least time between two makings again of a client's connection (after replies
/// that did not fit their commands, or timeouts).
const REMAKE_EVERY: Duration = Duration::from_secs(1);

/// How many command timeouts a connection may go without a reply, commands waiting,
/// before it is made again: it may have gone silent for good (a flow a NAT or a load
/// balancer forgot, a host gone without closing it), which nothing else reports for
/// many minutes. One timeout alone may be a slow answer, however many calls it cut.
const SILENT_TIMEOUTS: u32 = 2;

static SCRIPTS: Lazy<Scripts> = Lazy::new(|| Scripts {
    acquire: Lua::new(scripts::ACQUIRE.source),
    try_set_rate: Lua::new(scripts::TRY_SET_RATE.source),
    configure: Lua::new(scripts::CONFIGURE.source),
    release: Lua::new(scripts::RELEASE.source),
    keep_alive: Lua::new(scripts::KEEP_ALIVE.source),
    expire: Lua::new(scripts::EXPIRE.source),
    refund: Lua::new(scripts::REFUND.source),
    tokens: Lua::new(scripts::TOKENS.source),
    refund_tokens: Lua::new(scripts::REFUND_TOKENS.source),
    reset: Lua::new(scripts::RESET.source),
    give_back: Lua::new(scripts::GIVE_BACK.source),
    settle: Lua::new(scripts::SETTLE.source),
});

/// What [`ClientBuilder::wait_for_replicas`] asks: a grant is answered once this many
/// replicas have it, waiting at most `timeout` for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Replicas {
    pub count: u32,
    pub timeout: Duration,
}

/// The client a Redis backend serves, as its answers in process and its background
/// work need it.
pub(crate) struct Owner {
    pub prefix: String,
    pub client_id: Arc<str>,
    /// The client's clock, in epoch milliseconds.
    pub clock: Arc<dyn Fn() -> u64 + Send + Sync>,
    /// The rate overrides in force, shared with the client.
    pub overrides: Arc<Overrides>,
    /// Whether a refusal may be answered again in process
    /// (`ClientBuilder::local_refusals`).
    pub local_refusals: bool,
}

pub(crate) struct RedisBackend {
    /// The connection each command clones; replaced when a reply shows it out of step
    /// or it goes silent.
    conn: Arc<RwLock<Conn>>,
    /// How `conn` is made again (`None`: it is not).
    remake: Option<Arc<Remake>>,
    /// Whether `conn` is a Redis Cluster's (made again, it stays one).
    cluster: bool,
    /// When `conn` was last made again: at most once a [`REMAKE_EVERY`].
    remade_at: Mutex<Option<Instant>>,
    /// The last look into why a cluster connection found no node
    /// ([`why_no_node`](RedisBackend::why_no_node)): when, and the lasting cause found.
    diagnosed: Mutex<Option<(Instant, Option<Lasting>)>>,
    /// Held while a look into it is under way: one at a time, whatever the calls
    /// failing, the others waiting for what it finds.
    diagnosing: tokio::sync::Mutex<()>,
    /// Whether a command on `conn` timed out with no reply since: `silent_since` holds
    /// when the first of them was sent.
    silent: Arc<AtomicBool>,
    /// When `conn` went silent, as far as its timeouts tell: [`SILENT_TIMEOUTS`]
    /// command timeouts later with no reply, it is made again.
    silent_since: Mutex<Option<Instant>>,
    /// When a cluster's node first refused a call (its error about itself) with no
    /// call served since, and when last: the refusals count on the pace the nodes share
    /// once no node has served a call for a command timeout.
    refusing_since: Mutex<Option<(Instant, Instant)>>,
    /// Whether `refusing_since` holds: read at each reply.
    refusing: AtomicBool,
    timeout: Duration,
    /// Decide at the server's clock (TIME in the scripts) rather than the caller's.
    server_time: bool,
    /// The server as errors name it, and the passwords to keep out of them.
    target: Target,
    /// The number of the next decision's call: its tag ([`replies::CHECK`] modulo it),
    /// which the reply carries.
    calls: AtomicU64,
    /// Whether a command was answered since the connection was made or last lost:
    /// a timeout before that went to connecting, and says so.
    answered: AtomicBool,
    /// How often one server is connected to again while no connection reaches it.
    reconnects: Arc<Reconnects>,
    /// The same for each node of a Redis Cluster.
    nodes: Arc<Nodes>,
    /// The server's version, eviction policy and the connection's name, checked about
    /// once a minute off the deciding path.
    health: std::sync::Arc<Health>,
    /// The runtime the client was made on, where a cluster connection made again
    /// runs its task (a caller's runtime may end before the client does).
    runtime: Option<tokio::runtime::Handle>,
    /// Whether `runtime` has ended, read before each command.
    outlived: Option<carrier::Outlived>,
    /// Held while a connection is made again on a lasting runtime: the calls that
    /// need it wait for it.
    carrying: tokio::sync::Mutex<()>,
    /// Whether the connection was made again on a lasting runtime once `runtime` had
    /// ended.
    moved: AtomicBool,
    /// Whether a cluster connection is being made again: one at a time.
    remaking: Arc<AtomicBool>,
    /// Grants answered once replicas have them: the rounds and connections that wait.
    waits: Option<replicas::Waits>,
    owner: Owner,
    /// Refusals and batches answered in process.
    kept: kept::Kept,
    /// Give-backs sent off the callers' path: how many wait, and their turns.
    giving_back: Arc<give_back::GivingBack>,
    /// The refusals to report, the background task's state, the resets read.
    shared: shared::Shared,
}

/// A client dropped gives back what its open batches did not use.
impl Drop for RedisBackend {
    fn drop(&mut self) {
        self.give_back_all();
    }
}

impl RedisBackend {
    /// `connected`: a connection answered already (a client that connected eagerly),
    /// so a first timeout is the command's, not the connecting's.
    pub fn new(
        conn: Conn,
        timeout: Duration,
        server_time: bool,
        target: Target,
        connected: bool,
        owner: Owner,
    ) -> Self {
        let cluster = matches!(conn, Conn::Cluster(_));
        RedisBackend {
            cluster,
            conn: Arc::new(RwLock::new(conn)),
            remake: None,
            remade_at: Mutex::new(None),
            diagnosed: Mutex::new(None),
            diagnosing: tokio::sync::Mutex::new(()),
            silent: Arc::new(AtomicBool::new(false)),
            silent_since: Mutex::new(None),
            refusing_since: Mutex::new(None),
            refusing: AtomicBool::new(false),
            timeout,
            server_time,
            target,
            calls: AtomicU64::new(0),
            answered: AtomicBool::new(connected),
            reconnects: Arc::default(),
            nodes: Arc::default(),
            // An eager connect read the version already.
            health: std::sync::Arc::new(Health::new(connected, cluster)),
            runtime: tokio::runtime::Handle::try_current().ok(),
            outlived: tokio::runtime::Handle::try_current()
                .ok()
                .map(|runtime| carrier::Outlived::watch(&runtime)),
            carrying: tokio::sync::Mutex::new(()),
            moved: AtomicBool::new(false),
            remaking: Arc::new(AtomicBool::new(false)),
            waits: None,
            kept: kept::Kept::new(owner.local_refusals),
            giving_back: Arc::default(),
            shared: Default::default(),
            owner,
        }
    }

    /// The client's current time in epoch milliseconds.
    fn now_ms(&self) -> u64 {
        (self.owner.clock)()
    }

    /// The keys of `rule` for this client, checked as the client checks them.
    fn rule_keys<'r>(&'r self, rule: &'r Rule) -> Result<Keys<'r>, Error> {
        crate::rules::checks::rule_keys(rule, &self.owner.prefix, &self.owner.client_id)
    }

    /// Makes the connection again by `remake` when a reply does not fit its command, or
    /// none comes in two command timeouts.
    pub(crate) fn remake_by(mut self, remake: Option<Remake>) -> Self {
        self.remake = remake.map(Arc::new);
        self
    }

    /// The connection, for one command or a task's few.
    fn conn(&self) -> Conn {
        current(&self.conn)
    }

    /// The slot map a script load reads on a cluster (see `lua::Lua::load_for`).
    fn slot_map(&self) -> Option<nodes::SlotMap<'_>> {
        self.cluster.then_some(nodes::SlotMap {
            nodes: &self.nodes,
            timeout: self.timeout,
        })
    }

    /// A reply did not fit the command it answered ([`Error::UnexpectedReply`]): the
    /// connection may be out of step, each command handed another's reply, and stays
    /// so however long it lives. It is made again.
    #[cold]
    fn out_of_step(&self) {
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
    fn timed_out(&self, failed_before: u32, pace: &Reconnects) {
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
    fn replied(&self) {
        if self.silent.load(Ordering::Relaxed) {
            self.not_silent();
        }
    }

    /// A reply that is not an error came: no node refuses every call.
    #[inline]
    fn served(&self) {
        if self.refusing.load(Ordering::Relaxed) {
            self.not_refusing();
        }
    }

    #[cold]
    fn not_refusing(&self) {
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
    fn refused_everywhere(&self, failing: bool) -> bool {
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
    fn not_silent(&self) {
        self.silent.store(false, Ordering::Relaxed);
        *self.silent_since.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Makes the connection again, for `why`, at most once a [`REMAKE_EVERY`] (a
    /// server that answers every command so would otherwise be connected to at every
    /// call); commands already sent finish on the old one. `dead`: the old one
    /// answers nothing (silent, or its task gone), and is not kept.
    #[cold]
    fn remake(&self, why: &str, dead: bool) {
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
    fn keep_going<F>(&self, ongoing: &ongoing::Ongoing, task: impl FnOnce(ongoing::Turn) -> F)
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
    fn moving(&self) -> bool {
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
    fn ended(&self) -> bool {
        self.outlived.as_ref().is_some_and(carrier::Outlived::ended)
    }

    /// Whether the caller is on a runtime other than the client's own, when that is a
    /// current-thread runtime: one that runs only while its own callers block on it,
    /// or a task of its own does, so that the connection's tasks there may wait.
    fn off_its_current_thread_runtime(&self) -> bool {
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
    async fn carry_if_needed(&self) {
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
    fn sent_where_it_lasts(&self, conn: Conn) -> Conn {
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
    async fn carry_on(&self) {
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
    async fn remake_lasting(&self) {
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
    async fn carry(&self, ended: bool) {
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
    fn remake_cluster(&self, remake: &Arc<Remake>, why: &str, dead: bool) {
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
    fn noting_step<T>(&self, result: Result<T, Error>) -> Result<T, Error> {
        if let Err(Error::UnexpectedReply { .. }) = &result {
            self.out_of_step();
        }
        result
    }

    /// Answers grants once replicas have them, waiting on `waits`.
    pub(crate) fn wait_for_replicas(mut self, waits: Option<replicas::Waits>) -> Self {
        self.waits = waits;
        self
    }

    /// Notes the eviction policy a connect read.
    pub fn record_eviction(&self, eviction: &Eviction) {
        self.health.record_eviction(eviction, self.target.shown());
    }

    /// Checks the server in a task of its own when a check is due at `now`.
    #[inline]
    fn maybe_check(&self, now: u64) {
        if self.health.due(now) {
            self.spawn_check(now);
        }
    }

    #[cold]
    fn spawn_check(&self, now: u64) {
        // Checked once the server answers again.
        // (On one server, a pause over waits for the try of the next call; a
        // cluster's pace left paused with no call to try it, such as the one shared
        // before the slot map was read, would keep the check waiting for good.)
        if self.reconnects.paused() || (self.cluster && self.nodes.any_pausing()) {
            return;
        }
        // (on a runtime that lasts: the check's command may be the one that makes a
        // lazy connection, whose tasks would end with a caller's runtime)
        let Some(runtime) = self.lasting() else {
            return;
        };
        if !self.health.begin(now) {
            return;
        }
        let health = self.health.clone();
        let mut conn = self.conn();
        let target = self.target.shown().to_owned();
        let timeout = self.timeout * 4;
        runtime.spawn(async move {
            let _ = tokio::time::timeout(timeout, health.check(&mut conn, &target)).await;
            health.end();
        });
    }

    /// The scripts' time argument: the caller's clock, or empty for the server's.
    fn now_arg(&self, now: u64) -> Arg<'static> {
        match self.server_time {
            false => Arg::Int(now),
            true => Arg::Text(""),
        }
    }

    /// Runs one request under the command timeout; script errors name their key.
    pub(super) async fn run<T, F>(
        &self,
        calls: &[Keys<'_>],
        request: impl FnOnce(Conn) -> F,
    ) -> Result<T, Error>
    where
        F: Future<Output = Result<T, RedisError>>,
    {
        let (failed_before, pace) = self.sendable(calls)?;
        self.send(failed_before, &pace, calls, request).await
    }

    /// The pace the call on `calls` follows while no connection reaches its server:
    /// the client's one server's, or on a cluster its slot's primary's.
    fn pace(&self, calls: &[Keys<'_>]) -> Pace<'_> {
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
    fn sendable(&self, calls: &[Keys<'_>]) -> Result<(u32, Pace<'_>), Error> {
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
    fn failure_error(&self, failure: Failure, detail: String) -> Error {
        let target = self.target.shown().to_owned();
        match failure {
            Failure::Unreachable => Error::Unreachable { target, detail },
            Failure::Credentials => Error::AuthFailed { target, detail },
            Failure::Database => Error::UnknownDatabase { target, detail },
            Failure::Refusing => Error::Backend { detail },
            Failure::WrongServer => Error::WrongServer { target, detail },
        }
    }

    /// Puts a new connection (made on first use) in place of one to a server that
    /// failed to connect: the call trying again after a pause connects now. (On the
    /// old one it would meet the failure of the attempt made when the pause began,
    /// and the server, back meanwhile, would be reached a pause later.) Behind
    /// Sentinel, the master is forgotten at each lost connection already, and its
    /// search, which may outlast a call, is left to go on.
    #[cold]
    fn connect_anew(&self) {
        let Some(remake) = self.remake.as_deref().filter(|r| matches!(r, Remake::Single(_))) else {
            return;
        };
        if let Some(remade) = remake.remade(&self.conn()) {
            *self.conn.write().unwrap_or_else(PoisonError::into_inner) = remade;
            self.answered.store(false, Ordering::Relaxed);
        }
    }

    /// [`run`](RedisBackend::run) once [`sendable`](RedisBackend::sendable) said it
    /// may, after `failed_before` failures in a row.
    async fn send<T, F>(
        &self,
        failed_before: u32,
        pace: &Reconnects,
        calls: &[Keys<'_>],
        request: impl FnOnce(Conn) -> F,
    ) -> Result<T, Error>
    where
        F: Future<Output = Result<T, RedisError>>,
    {
        // Read before the command: a sibling's timeout may have the connection made
        // again while this one waits on the old one.
        let connecting = !self.answered.load(Ordering::Relaxed);
        // (A cluster's only: whether a call that found no node failed at once.)
        let sent = self.cluster.then(Instant::now);
        // (the connection made again within the call's timeout)
        let call = async {
            self.carry_if_needed().await;
            let conn = self.conn();
            request(if connecting {
                self.sent_where_it_lasts(conn)
            } else {
                conn
            })
            .await
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
    async fn why_no_node(&self, unreached: Error) -> Error {
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

    /// Whether this is a Redis Cluster (rules may then lie in several slots).
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }
}

/// A failure that lasts until someone acts, and its cause as its error said it.
type Lasting = (Failure, String);

/// The pace a call follows ([`RedisBackend::pace`]).
enum Pace<'a> {
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

/// Whether `runtime` still runs what is spawned on it: a runtime shut down drops it
/// at once (a task that never ends, to tell).
fn alive(runtime: &tokio::runtime::Handle) -> bool {
    let probe = runtime.spawn(std::future::pending::<()>());
    let alive = !probe.is_finished();
    probe.abort();
    alive
}

/// Clears a flag when dropped.
struct Done(Arc<AtomicBool>);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
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

/// The connection in `slot` now.
fn current(slot: &RwLock<Conn>) -> Conn {
    slot.read().unwrap_or_else(PoisonError::into_inner).clone()
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

/// One argument of a script, written as Redis receives it (no allocation).
#[derive(Clone, Copy)]
enum Arg<'a> {
    Int(u64),
    Bytes(&'a [u8]),
    Text(&'static str),
}

impl redis::ToRedisArgs for Arg<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        match *self {
            Arg::Int(n) => n.write_redis_args(out),
            Arg::Bytes(bytes) => out.write_arg(bytes),
            Arg::Text(text) => out.write_arg(text.as_bytes()),
        }
    }
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
