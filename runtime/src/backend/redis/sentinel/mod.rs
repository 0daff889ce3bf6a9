//! Redis behind Sentinel: the master the sentinels name, found again after a failover.
//!
//! `redis+sentinel://[user:password@]host:port[,host:port...]/master_name[/db]`
//! (`rediss+sentinel://` for TLS to the sentinels and the master, `#insecure` to skip
//! certificate checks). The user info is the master's credentials; sentinels that
//! require their own take `?sentinel_username=...&sentinel_password=...`.
//!
//! A search asks every sentinel at once (`SENTINEL MASTER`), each within half the
//! connect timeout (the other half is the master's), and follows the master they name
//! as [`choice`] ranks them: the highest configuration epoch, then the master most
//! of them name, then the lowest address, so that every client given the same answers
//! follows the same node. That master must say it is one (`ROLE`); one that says it is
//! a replica is passed over for the next. A sentinel that hangs or is down costs at
//! most the time it is given. Sentinels that name different masters as up are logged,
//! once per process and disagreement, as a warning naming each sentinel and the master
//! it named. A search runs in a task of its own, one at a time per client, so callers
//! that give up do not cut it short.
//!
//! A call made [`RECHECK_EVERY`] after the last search, while that search met
//! sentinels that disagreed or did not answer, and [`RECHECK_AGREED`] after it
//! otherwise, has the sentinels all asked again, in the background (calls go on to
//! the master in use), and moves to the master they name now if it is another: clients
//! that were given different answers (a sentinel one of them could not reach) follow
//! the same master again within about a second of the sentinels' answers being the
//! same for both, and a client whose sentinels all agreed follows a master they name
//! anew without an announcement it heard (another set of sentinels under the same
//! name, an operator's hand) within ten seconds.
//!
//! Every command goes to the master found last. That master is forgotten, and the
//! next command asks the sentinels again, when a command fails because the connection
//! was lost, timed out, or reached a node that is no longer a master (`READONLY`,
//! `MASTERDOWN`), and when a sentinel announces a new master (`+switch-master`, which a
//! task of the client's listens for on one sentinel at a time): so a failover, a
//! crash's or an operator's, is followed without a restart.
//!
//! For 30 s after an announcement, searches try the announced master beside the
//! sentinels and follow no sentinel naming the master it replaced: one may not have
//! heard of the switch yet, and after an operator's failover the old master says it is
//! one, and takes writes, until the sentinels make it a replica seconds later. A search
//! that began before an announcement drops what it found. Once the listener has been
//! off its sentinel, a later switch may have gone unheard: the announced master is no
//! longer preferred, though the one it replaced is still not followed until the 30 s
//! are over.
//!
//! Commands are never sent twice: a script whose answer was lost may have run, and the
//! caller's `on_error` decides.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo, Pipeline,
    RedisConnectionInfo, RedisError, RedisFuture, RedisResult, Value,
};

mod choice;
mod listener;
mod own;
mod search;
pub(crate) use search::NOT_A_SENTINEL;
mod url;

use listener::Watched;
use search::Search;
pub(crate) use url::{parse_url, SentinelUrl};

/// How long after a failed search for the master commands fail at once with its error,
/// instead of each asking the sentinels again: at most ten searches a second per
/// client while there is no master.
const RETRY_AFTER_FAILURE: Duration = Duration::from_millis(100);

/// The connection settings: timeouts for the master's connections and the searches.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    pub connect: Duration,
    pub command: Duration,
}

/// A connection to the master the sentinels name, made again when it is lost.
/// Cheap to clone; clones share the connection.
#[derive(Clone)]
pub(crate) struct SentinelConn {
    inner: Arc<Inner>,
}

struct Inner {
    /// The sentinels, in the URL's order, each with the connection asked last.
    sentinels: Vec<Sentinel>,
    master: Master,
    state: Mutex<State>,
    /// Counts the searches finished; callers waiting for one watch it.
    searched: tokio::sync::watch::Sender<u64>,
    config: AsyncConnectionConfig,
    timeouts: Timeouts,
    db: i64,
    /// Whether a listener for announced failovers runs ([`Listening`]).
    listening: Arc<AtomicBool>,
}

/// Held by the listener's task: cleared when the task ends or is dropped with its
/// runtime. (Not the client's `Inner`, which the listener holds weakly, so that it
/// ends with the client.)
struct Listening(Arc<AtomicBool>);

impl Drop for Listening {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

struct Sentinel {
    client: redis::Client,
    /// Its host and port as the URL lists them, for the log.
    address: Address,
    conn: Mutex<Option<MultiplexedConnection>>,
}

impl Sentinel {
    /// Forgets the connection kept to it (lost, or left unanswered).
    fn forget_conn(&self) {
        *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// How to reach a master a sentinel names: its name, credentials, database and TLS.
struct Master {
    name: String,
    settings: RedisConnectionInfo,
    /// `Some(insecure)` for TLS.
    tls: Option<bool>,
    #[cfg(feature = "tls")]
    certs: Option<redis::TlsCertificates>,
}

#[derive(Default)]
struct State {
    /// The master's connection, and a number that changes with each new one.
    current: Option<Current>,
    generation: u64,
    /// When the next call has the sentinels asked again, in the background.
    recheck_at: Option<Instant>,
    /// The last search's failure, and when.
    failed: Option<(Instant, RedisError)>,
    /// Whether that failure is a search dropped before it ended (its runtime ended),
    /// which says nothing of the sentinels.
    stopped: bool,
    /// Whether a search is under way.
    searching: bool,
    /// The switch a sentinel announced last (`+switch-master`), for
    /// [`ANNOUNCEMENT_KEPT`]: a sentinel asked meanwhile may not have heard of it and
    /// name the old master, which says it is one until it is made a replica.
    announced: Option<Announced>,
    /// Counts announcements: a search that began before one drops what it found.
    announcements: u64,
}

/// A node's IP address (or host name) and port, as sentinels name it.
type Address = (String, u16);

/// The master in use.
struct Current {
    generation: u64,
    conn: MultiplexedConnection,
    address: Address,
}

/// A new master a sentinel announced, the one it replaced, and when.
#[derive(Clone)]
struct Announced {
    /// `None` once the listener has been off its sentinel: a later switch may have
    /// gone unheard, so the announced master is no longer preferred.
    new: Option<Address>,
    old: Address,
    at: Instant,
}

/// How long after an announcement searches try its new master beside the sentinels
/// and follow no sentinel naming the master it replaced: the sentinels make an old
/// master that is still up a replica 8 s after the switch at the earliest, at their
/// next look at it (every 10 s, every second during a failover).
const ANNOUNCEMENT_KEPT: Duration = Duration::from_secs(30);

/// How long after a search that met sentinels disagreeing, or not answering, the
/// next call has them all asked again: clients given different answers follow the
/// same master again within about this long of the sentinels' agreeing, inside the
/// seconds a failover takes.
const RECHECK_EVERY: Duration = Duration::from_secs(1);

/// How long after a search whose sentinels all answered and agreed the next call has
/// them asked again: a master they name anew without an announcement this client
/// hears is followed within about this long. Each check connects to every sentinel
/// and closes those connections once they agree again.
const RECHECK_AGREED: Duration = Duration::from_secs(10);

impl SentinelConn {
    pub(crate) fn new(
        url: &SentinelUrl,
        timeouts: Timeouts,
        #[cfg(feature = "tls")] certs: Option<redis::TlsCertificates>,
    ) -> RedisResult<SentinelConn> {
        let clients = sentinel_clients(
            url,
            #[cfg(feature = "tls")]
            certs.clone(),
        )?;
        let mut settings = RedisConnectionInfo::default().set_db(url.db);
        if let Some(user) = &url.username {
            settings = settings.set_username(user);
        }
        if let Some(pass) = &url.password {
            settings = settings.set_password(pass);
        }
        // Every connection the search makes answers within the connect timeout.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(Some(timeouts.command));
        let conn = SentinelConn {
            inner: Arc::new(Inner {
                sentinels: clients
                    .into_iter()
                    .zip(&url.sentinels)
                    .map(|(client, address)| Sentinel {
                        client,
                        address: address.clone(),
                        conn: Mutex::new(None),
                    })
                    .collect(),
                master: Master {
                    name: url.master.clone(),
                    settings,
                    tls: url.tls.then_some(url.insecure),
                    #[cfg(feature = "tls")]
                    certs,
                },
                state: Mutex::new(State::default()),
                searched: tokio::sync::watch::channel(0).0,
                config,
                timeouts,
                db: url.db,
                listening: Arc::new(AtomicBool::new(false)),
            }),
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            conn.listen_on(&runtime);
        }
        Ok(conn)
    }

    /// Starts the listener for announced failovers on `runtime`, unless one listens
    /// already: one at a time, while the client lives. (One whose runtime ended was
    /// dropped with it, and no longer counts.)
    fn listen_on(&self, runtime: &tokio::runtime::Handle) {
        if self.inner.listening.swap(true, Ordering::Relaxed) {
            return;
        }
        let watched = Watched {
            sentinels: self.inner.sentinels.iter().map(|s| s.client.clone()).collect(),
            master: self.inner.master.name.clone(),
            timeouts: self.inner.timeouts,
        };
        let listening = Listening(Arc::clone(&self.inner.listening));
        let inner = Arc::downgrade(&self.inner);
        runtime.spawn(async move {
            let _listening = listening;
            watched.listen(inner).await;
        });
    }

    /// The master's connection: the one in use, or the one a search finds. The search
    /// runs in a task of its own, one at a time: a caller that gives up (its command
    /// timeout is shorter than the connect timeout) does not cut it short, and the
    /// next caller takes what it found. A call that finds a master in use has the
    /// sentinels asked again, in the background, when that is due.
    async fn master(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        let mut searched = self.inner.searched.subscribe();
        // Whether a search ended while this call waited.
        let mut waited = false;
        // Whether this call began a search again after one was stopped: once.
        let mut searched_again = false;
        loop {
            {
                let mut state = self.inner.lock();
                if let Some(current) = &state.current {
                    let found = (current.generation, current.conn.clone());
                    let due = state.recheck_at.is_some_and(|at| at <= Instant::now());
                    if due && !state.searching {
                        let recheck = Search::begin(&self.inner, &mut state);
                        drop(state);
                        tokio::spawn(recheck.run());
                    }
                    return Ok(found);
                }
                if state.failed.is_some() && state.stopped && !searched_again {
                    // Dropped with the runtime it ran on (a caller's, ended after its
                    // call): this call looks again, on its own runtime, once.
                    searched_again = true;
                    state.failed = None;
                } else if let Some((at, err)) = &state.failed {
                    // A search failed since this call began, or a moment ago.
                    if waited || at.elapsed() < RETRY_AFTER_FAILURE {
                        return Err(err.clone());
                    }
                }
                if !state.searching {
                    let search = Search::begin(&self.inner, &mut state);
                    // Spawned with the lock released: a task the runtime refuses (it is
                    // shutting down) is dropped at once, and its drop ends the search.
                    drop(state);
                    tokio::spawn(search.run());
                }
            }
            waited = true;
            if searched.changed().await.is_err() {
                return Err(no_master("the search for the master stopped"));
            }
        }
    }

    /// Forgets the master's connection, whichever it is: the next command has the
    /// sentinels asked for the master and connects to it again.
    pub(crate) fn forget_master(&self) {
        self.inner.lock().current = None;
    }

    /// The connection moved to `runtime` (one that lasts), from whose tasks its
    /// commands are sent from now on: the connections it kept, whose tasks may have
    /// ended with the runtime they ran on, are forgotten, and the listener, when it
    /// ended with it too, starts again there.
    pub(crate) fn carried_to(&self, runtime: &tokio::runtime::Handle) {
        self.forget_master();
        for sentinel in &self.inner.sentinels {
            sentinel.forget_conn();
        }
        self.listen_on(runtime);
    }

    /// Forgets the connection `generation`, after a reply or an error that says the
    /// master is gone or is no longer the master.
    fn forget(&self, generation: u64) {
        let mut state = self.inner.lock();
        if matches!(&state.current, Some(current) if current.generation == generation) {
            state.current = None;
        }
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn no_master(detail: &str) -> RedisError {
    RedisError::from((ErrorKind::Io, "no master found", detail.to_owned()))
}

/// A client for each sentinel of `url`, over TLS for `rediss+sentinel://`.
fn sentinel_clients(
    url: &SentinelUrl,
    #[cfg(feature = "tls")] certs: Option<redis::TlsCertificates>,
) -> RedisResult<Vec<redis::Client>> {
    url.sentinels
        .iter()
        .map(|(host, port)| {
            let addr = if url.tls {
                ConnectionAddr::TcpTls {
                    host: host.clone(),
                    port: *port,
                    insecure: url.insecure,
                    tls_params: None,
                }
            } else {
                ConnectionAddr::Tcp(host.clone(), *port)
            };
            sentinel_client(
                addr,
                url,
                #[cfg(feature = "tls")]
                certs.clone(),
            )
        })
        .collect()
}

/// A client for one sentinel, with the sentinels' credentials.
fn sentinel_client(
    addr: ConnectionAddr,
    url: &SentinelUrl,
    #[cfg(feature = "tls")] certs: Option<redis::TlsCertificates>,
) -> RedisResult<redis::Client> {
    let mut settings = RedisConnectionInfo::default();
    if let Some(user) = &url.sentinel_username {
        settings = settings.set_username(user);
    }
    if let Some(pass) = &url.sentinel_password {
        settings = settings.set_password(pass);
    }
    let info: ConnectionInfo = addr.into_connection_info()?.set_redis_settings(settings);
    #[cfg(feature = "tls")]
    if let Some(certs) = certs {
        return redis::Client::build_with_tls(info, certs);
    }
    redis::Client::open(info)
}

/// Whether `err` means the master's connection is no use: lost, silent, or to a node
/// that is no longer the master.
fn lost_master(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_unrecoverable_error()
        || not_the_master(err.code().unwrap_or_default(), err.detail().unwrap_or_default())
}

/// Whether a server's error reply says the node is no longer a writable master: its
/// code, or, inside a script on Redis 6.2, the code of the command the script ran.
/// Never a word found elsewhere in the text: a script's error may quote stored
/// values, which anyone who can write a key could make read `READONLY`.
fn not_the_master(code: &str, detail: &str) -> bool {
    let (code, _) = crate::backend::redis::replies::unwrapped(code, detail);
    matches!(code, "READONLY" | "MASTERDOWN")
}

/// The error reply in `value`, if it is one that says the node is not the master.
/// (The connection hands error replies back as values; only a lost connection is an
/// error there.)
fn replied_not_the_master(value: &Value) -> bool {
    match value {
        Value::ServerError(err) => not_the_master(err.code(), err.details().unwrap_or_default()),
        _ => false,
    }
}

impl ConnectionLike for SentinelConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut conn) = self.master().await?;
            let reply = conn.req_packed_command(cmd).await;
            match &reply {
                Err(err) if lost_master(err) => self.forget(generation),
                Ok(value) if replied_not_the_master(value) => self.forget(generation),
                _ => {}
            }
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut conn) = self.master().await?;
            let reply = conn.req_packed_commands(pipeline, offset, count).await;
            match &reply {
                Err(err) if lost_master(err) => self.forget(generation),
                Ok(values) if values.iter().any(replied_not_the_master) => self.forget(generation),
                _ => {}
            }
            reply
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.db
    }
}

#[cfg(test)]
mod tests;
