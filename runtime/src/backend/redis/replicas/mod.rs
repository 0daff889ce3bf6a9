//! Grants answered once replicas have them, without holding the client's connection.
//!
//! `WAIT` blocks the connection it is sent on, and covers the writes made on that
//! connection only (a connection that never wrote is answered at once, whatever the
//! replicas hold). So a waited grant is not sent on the connection every command
//! shares: it joins a round on one of at most [`CONNECTIONS`] connections of the
//! client's own, where the round's grants are sent in one pipeline, then `WAIT` for
//! the latest deadline among those granted. One `WAIT` covers every grant of its round,
//! since they were written on its connection before it; a round of refusals sends no
//! `WAIT`. A caller that finds a connection free starts a round at once; one that
//! finds them all busy joins the round that forms for the next connection freed, and
//! the grants that join while a round's grants are on their way go out with it before
//! its `WAIT`. A caller whose deadline passes before a connection takes its grant
//! takes it back, unsent: nothing was spent. Each caller answers by its own deadline,
//! whatever the rounds of the others wait for.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError, RedisResult, Value};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::sentinel::SentinelConn;
use super::Replicas;

mod grant;
mod round;

pub(in crate::backend::redis) use grant::Waited;

/// The connections of its own a client waits for replicas on, at most.
pub(crate) const CONNECTIONS: usize = 8;

/// A client's rounds and the connections they run on. Dropped with the client: idle
/// connections close then, and a round under way closes its own when it ends (by the
/// latest deadline of its callers, plus a command timeout).
pub(crate) struct Waits {
    shared: Arc<Shared>,
}

struct Shared {
    replicas: Replicas,
    opener: Opener,
    /// For a new connection (connect timeout, no response timeout: `WAIT` is timed
    /// by its round).
    config: AsyncConnectionConfig,
    command_timeout: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The grants waiting for the next connection freed.
    forming: Vec<Member>,
    /// Connections no round uses.
    idle: Vec<Slot>,
    /// Connections rounds use.
    out: usize,
}

/// A connection of the pool, made at its first round and again after a failure,
/// with the master's generation behind Sentinel (0 otherwise).
#[derive(Default)]
struct Slot {
    conn: Option<(u64, MultiplexedConnection)>,
}

/// How the pool's connections are made: to the URL's server, or to the master the
/// sentinels name (a connection made for a replaced master is not used again).
pub(crate) enum Opener {
    Single(Box<redis::Client>),
    Sentinel(SentinelConn),
}

impl Opener {
    /// A new connection, named as the shared one is for `CLIENT LIST` (where the ACL
    /// allows it).
    async fn open(&self, config: &AsyncConnectionConfig) -> RedisResult<(u64, MultiplexedConnection)> {
        let (generation, mut conn) = match self {
            Opener::Single(client) => (
                0,
                client
                    .get_multiplexed_async_connection_with_config(config)
                    .await?,
            ),
            Opener::Sentinel(sentinel) => sentinel.open_own(config).await?,
        };
        let _: RedisResult<()> = redis::cmd("CLIENT")
            .arg("SETNAME")
            .arg(super::server::CONNECTION_NAME)
            .query_async(&mut conn)
            .await;
        Ok((generation, conn))
    }

    fn in_use(&self, generation: u64) -> bool {
        match self {
            Opener::Single(_) => true,
            Opener::Sentinel(sentinel) => sentinel.in_use(generation),
        }
    }

    /// Tells the shared connection what a connection of the pool heard: behind
    /// Sentinel, a lost or demoted master is searched for again (answers true then:
    /// the pool's connection to it is left too).
    fn heard(&self, generation: u64, reply: Result<&[Value], &RedisError>) -> bool {
        match self {
            Opener::Single(_) => false,
            Opener::Sentinel(sentinel) => sentinel.heard(generation, reply),
        }
    }
}

const WAITING: u8 = 0;
const SENT: u8 = 1;
const TAKEN_BACK: u8 = 2;

/// One caller's grant: its command, its deadline, and where its answers go.
struct Member {
    cmd: redis::Cmd,
    /// The rules it decides and its tag, to read whether its reply is a grant.
    rules: usize,
    tag: u64,
    deadline: Instant,
    state: Arc<AtomicU8>,
    grant: oneshot::Sender<Result<Value, Failed>>,
    acked: oneshot::Sender<RedisResult<Value>>,
}

impl Member {
    /// Marks it sent, unless its caller took it back.
    fn claim(&self) -> bool {
        self.state
            .compare_exchange(WAITING, SENT, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// A round that failed for a grant: `sent` when its command may have run.
pub(crate) struct Failed {
    pub err: RedisError,
    pub sent: bool,
}

/// A caller's hold on its grant in a round.
pub(crate) struct Ticket {
    state: Arc<AtomicU8>,
    grant: oneshot::Receiver<Result<Value, Failed>>,
    acked: oneshot::Receiver<RedisResult<Value>>,
}

impl Ticket {
    /// Takes the grant back if no round sent it: true when none ever will.
    fn take_back(&self) -> bool {
        match self
            .state
            .compare_exchange(WAITING, TAKEN_BACK, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(now) => now == TAKEN_BACK,
        }
    }
}

impl Waits {
    pub(crate) fn new(
        replicas: Replicas,
        opener: Opener,
        connect_timeout: Duration,
        command_timeout: Duration,
    ) -> Waits {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(None);
        Waits {
            shared: Arc::new(Shared {
                replicas,
                opener,
                config,
                command_timeout,
                state: Mutex::new(State::default()),
            }),
        }
    }

    pub(crate) fn replicas(&self) -> Replicas {
        self.shared.replicas
    }

    /// The connections kept idle let go: made on a runtime that has ended (the
    /// client's), their tasks ended with it. A round makes its connection again.
    pub(crate) fn forget_idle(&self) {
        self.shared.lock().idle.clear();
    }

    /// Puts `cmd` (a script call deciding `rules` rules) in a round, to be sent by
    /// `deadline` or not at all: a round starts at once on a free connection, else the
    /// grant waits for the next one freed. A round runs on `runtime`, where the
    /// connection it makes runs its task: one that lasts, as a caller's may end
    /// right after its call.
    fn submit(
        &self,
        cmd: redis::Cmd,
        (rules, tag): (usize, u64),
        deadline: Instant,
        runtime: Option<tokio::runtime::Handle>,
    ) -> Ticket {
        let (grant, grant_rx) = oneshot::channel();
        let (acked, acked_rx) = oneshot::channel();
        let state = Arc::new(AtomicU8::new(WAITING));
        let member = Member {
            cmd,
            rules,
            tag,
            deadline,
            state: state.clone(),
            grant,
            acked,
        };
        let mut pool = self.shared.lock();
        pool.forming.push(member);
        if pool.out < CONNECTIONS {
            let slot = pool.idle.pop().unwrap_or_default();
            pool.out += 1;
            let members = std::mem::take(&mut pool.forming);
            drop(pool);
            // Outside a runtime the round is dropped unrun: its slot is given back and
            // the caller, hearing nothing, takes its grant back.
            let out = round::Out::new(self.shared.clone(), slot);
            if let Some(runtime) = runtime {
                runtime.spawn(round::run(out, members));
            }
        }
        Ticket {
            state,
            grant: grant_rx,
            acked: acked_rx,
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}
