//! The Redis backend: a client's connection and what it holds, the server's health
//! checked off the deciding path. Each request is run under the command timeout in
//! [`send`], the connection made again in [`remaking`], and kept on a runtime that
//! lasts in [`lasting`]; one script call per operation (EVALSHA with reload on
//! NOSCRIPT), in the files beside this one. What a client keeps in process because the
//! state is remote is in [`kept`], what it shares with every process through the
//! library's own keys in [`shared`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use once_cell::sync::Lazy;

mod acquire;
mod carrier;
pub(crate) mod connect;
pub(crate) mod connection;
pub(crate) mod cross_slot;
pub(crate) mod failure;
mod give_back;
pub(crate) mod kept;
mod lasting;
mod layout;
mod limiter;
mod lua;
mod moves;
mod nodes;
mod ongoing;
mod reach;
mod reconnects;
mod remaking;
pub(crate) mod replicas;
mod replies;
pub(crate) mod scripts;
mod send;
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
use lua::Lua;
use nodes::Nodes;
use reconnects::Reconnects;
use send::Lasting;
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
    /// A cluster's calls to a slot being moved, tried again from this reserve.
    moves: moves::MoveRetries,
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
            moves: moves::MoveRetries::default(),
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

    /// Whether this is a Redis Cluster (rules may then lie in several slots).
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }
}

/// Clears a flag when dropped.
struct Done(Arc<AtomicBool>);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

/// The connection in `slot` now.
fn current(slot: &RwLock<Conn>) -> Conn {
    slot.read().unwrap_or_else(PoisonError::into_inner).clone()
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
