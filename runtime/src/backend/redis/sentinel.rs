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

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo, Pipeline,
    RedisConnectionInfo, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value,
};

use crate::backend::redis::target::Target;
use crate::Error;

mod choice;

use choice::Answer;

/// How long after a failed search for the master commands fail at once with its error,
/// instead of each asking the sentinels again: at most ten searches a second per
/// client while there is no master.
const RETRY_AFTER_FAILURE: Duration = Duration::from_millis(100);

/// A sentinel URL's parts.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    pub sentinels: Vec<(String, u16)>,
    pub master: String,
    pub db: i64,
    pub username: Option<String>,
    pub password: Option<String>,
    pub sentinel_username: Option<String>,
    pub sentinel_password: Option<String>,
    pub tls: bool,
    pub insecure: bool,
}

impl std::fmt::Debug for SentinelUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelUrl")
            .field("sentinels", &self.sentinels)
            .field("master", &self.master)
            .field("db", &self.db)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// The parts of a `redis+sentinel://` or `rediss+sentinel://` URL, or `None` for any
/// other URL.
pub(crate) fn parse_url(url: &str) -> Option<Result<SentinelUrl, Error>> {
    let (tls, rest) = match url.strip_prefix("redis+sentinel://") {
        Some(rest) => (false, rest),
        None => (true, url.strip_prefix("rediss+sentinel://")?),
    };
    let invalid = |detail: &str| Error::InvalidUrl {
        url: Target::new(url).shown().to_owned(),
        detail: detail.to_owned(),
    };
    Some(parse_rest(rest, tls).map_err(|detail| invalid(&detail)))
}

fn parse_rest(rest: &str, tls: bool) -> Result<SentinelUrl, String> {
    let (rest, fragment) = split_off(rest, '#');
    let insecure = match fragment {
        None => false,
        Some("insecure") if tls => true,
        Some(_) => return Err("the only fragment accepted is `#insecure`, with rediss+sentinel://".into()),
    };
    let (rest, query) = split_off(rest, '?');
    // The user info ends at the last `@`: a password may hold one.
    let (auth, rest) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let (hosts, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (rest, ""),
    };
    let (master, db) = master_and_db(path)?;
    let (username, password) = credentials(auth)?;
    let (sentinel_username, sentinel_password) = sentinel_credentials(query.unwrap_or_default())?;
    Ok(SentinelUrl {
        sentinels: sentinels(hosts)?,
        master,
        db,
        username,
        password,
        sentinel_username,
        sentinel_password,
        tls,
        insecure,
    })
}

/// The sentinels' hosts and ports, at least one and at most [`MAX_SENTINELS`].
fn sentinels(hosts: &str) -> Result<Vec<(String, u16)>, String> {
    // Sentinels are named by their place in the list, never by their text: with a
    // `?` or `#` left unencoded in a password, the text read as hosts is the password.
    let sentinels = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .enumerate()
        .map(|(i, host)| host_port(host).map_err(|problem| format!("sentinel {} {problem}", i + 1)))
        .collect::<Result<Vec<_>, String>>()?;
    if sentinels.is_empty() {
        return Err("no sentinel listed (expected host:port[,host:port...])".into());
    }
    if sentinels.len() > MAX_SENTINELS {
        return Err(format!(
            "{} sentinels listed: at most {MAX_SENTINELS} are accepted",
            sentinels.len()
        ));
    }
    Ok(sentinels)
}

/// `master_name[/db]`, the path after the hosts.
fn master_and_db(path: &str) -> Result<(String, i64), String> {
    let mut path = path.trim_end_matches('/').split('/');
    let master = path.next().unwrap_or_default();
    if master.is_empty() {
        return Err("no master name (expected .../master_name[/db])".into());
    }
    let db = match path.next() {
        None => 0,
        Some(db) => db
            .parse::<i64>()
            .ok()
            .filter(|db| *db >= 0)
            .ok_or("the database after the master name is not a number")?,
    };
    if path.next().is_some() {
        return Err("more than a master name and a database in the path".into());
    }
    Ok((decode(master)?, db))
}

/// The master's user name and password, from the user info.
fn credentials(auth: Option<&str>) -> Result<(Option<String>, Option<String>), String> {
    let Some(auth) = auth else {
        return Ok((None, None));
    };
    let (user, pass) = match auth.split_once(':') {
        Some((user, pass)) => (user, Some(pass)),
        None => (auth, None),
    };
    let user = decode(user)?;
    Ok((
        (!user.is_empty()).then_some(user),
        pass.map(decode).transpose()?.filter(|p| !p.is_empty()),
    ))
}

/// The sentinels' own user name and password, from the query.
fn sentinel_credentials(query: &str) -> Result<(Option<String>, Option<String>), String> {
    let (mut username, mut password) = (None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = Some(decode(value)?).filter(|v| !v.is_empty());
        match name {
            "sentinel_username" => username = value,
            "sentinel_password" => password = value,
            // Not named back: a parameter's name may be a mistyped secret.
            _ => {
                return Err(
                    "an unknown query parameter (accepted: sentinel_username, sentinel_password)".into(),
                )
            }
        }
    }
    Ok((username, password))
}

fn split_off(text: &str, at: char) -> (&str, Option<&str>) {
    match text.find(at) {
        Some(i) => (&text[..i], Some(&text[i + 1..])),
        None => (text, None),
    }
}

/// The most sentinels a URL may list (deployments run three or five).
const MAX_SENTINELS: usize = 64;

fn host_port(host: &str) -> Result<(String, u16), &'static str> {
    let (name, port) = host
        .rsplit_once(':')
        .ok_or("has no port (expected host:port; a `?` or `#` in a password must be written %3F, %23)")?;
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or("has no valid port (1 to 65535)")?;
    let name = match name.strip_prefix('[') {
        Some(v6) => v6
            .strip_suffix(']')
            .filter(|v6| v6.parse::<std::net::Ipv6Addr>().is_ok())
            .ok_or("has an IPv6 address that does not parse (expected [address]:port)")?,
        None if name.contains([':', '[', ']']) => {
            return Err("has a host with a `:` (an IPv6 address is written [address]:port)")
        }
        None => name,
    };
    if name.is_empty() {
        return Err("has no host");
    }
    Ok((name.to_owned(), port))
}

/// Percent-decoding, as URLs write user names, passwords and names.
fn decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("a `%` not followed by two hex digits")?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "a percent-encoded part that is not UTF-8".to_owned())
}

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
        let watched = Watched {
            sentinels: clients.clone(),
            master: url.master.clone(),
            timeouts,
        };
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
            }),
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(watched.listen(Arc::downgrade(&conn.inner)));
        }
        Ok(conn)
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
                if let Some((at, err)) = &state.failed {
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

    /// Forgets the connection `generation`, after a reply or an error that says the
    /// master is gone or is no longer the master.
    fn forget(&self, generation: u64) {
        let mut state = self.inner.lock();
        if matches!(&state.current, Some(current) if current.generation == generation) {
            state.current = None;
        }
    }
}

fn no_master(detail: &str) -> RedisError {
    RedisError::from((ErrorKind::Io, "no master found", detail.to_owned()))
}

/// A search for the master, begun under the state's lock: with no master in use, or
/// as a check that the master in use is still the one the sentinels name. Dropped,
/// whether it ran or not (a task the runtime never polled), it ends: `searching` is
/// cleared and what it found kept for the callers.
struct Search {
    inner: Arc<Inner>,
    /// The announcement fresh when it began, and `State::announcements` then.
    announced: Option<Announced>,
    announcements: u64,
    /// The master in use when it began: a check's.
    in_use: Option<Address>,
    found: Option<RedisResult<Found>>,
}

/// The master a search settled on.
struct Found {
    address: Address,
    /// A new connection, or `None` for the master in use.
    conn: Option<MultiplexedConnection>,
    /// Whether every sentinel answered and none named another master: the sentinels
    /// are asked again [`RECHECK_AGREED`] later if so, else [`RECHECK_EVERY`].
    settled: bool,
}

impl Search {
    fn begin(inner: &Arc<Inner>, state: &mut State) -> Search {
        state.searching = true;
        state.recheck_at = None;
        Search {
            inner: inner.clone(),
            announced: state
                .announced
                .clone()
                .filter(|a| a.at.elapsed() < ANNOUNCEMENT_KEPT),
            announcements: state.announcements,
            in_use: state.current.as_ref().map(|c| c.address.clone()),
            found: None,
        }
    }

    /// Looks for the master within the connect timeout. It runs in a task of its own,
    /// so callers that give up do not cut it short.
    async fn run(mut self) {
        let inner = self.inner.clone();
        let found = tokio::time::timeout(
            inner.timeouts.connect,
            inner.find(self.announced.as_ref(), self.in_use.as_ref()),
        )
        .await;
        if matches!(&found, Ok(Ok(found)) if found.settled) {
            // Kept only while the sentinels are asked again each second: once they
            // agree a client should not hold a connection to every sentinel.
            for sentinel in &inner.sentinels {
                sentinel.forget_conn();
            }
        }
        self.found = Some(found.unwrap_or_else(|_| {
            Err(no_master(&format!(
                "the sentinels did not name a reachable master within {:?}",
                inner.timeouts.connect
            )))
        }));
    }
}

impl Drop for Search {
    fn drop(&mut self) {
        let mut state = self.inner.lock();
        state.searching = false;
        match self.found.take() {
            // A switch announced meanwhile: what the sentinels said may be stale, so
            // the next caller searches again, announcement in hand.
            _ if state.announcements != self.announcements => state.failed = None,
            Some(Ok(found)) => {
                let after = if found.settled {
                    RECHECK_AGREED
                } else {
                    RECHECK_EVERY
                };
                state.recheck_at = Some(Instant::now() + after);
                // `None`: the master in use stays (or, if it was forgotten meanwhile,
                // the next caller searches again).
                if let Some(conn) = found.conn {
                    state.generation += 1;
                    state.current = Some(Current {
                        generation: state.generation,
                        conn,
                        address: found.address,
                    });
                }
                state.failed = None;
            }
            // A check that found nothing better keeps the master in use, and checks
            // again later.
            _ if self.in_use.is_some() && state.current.is_some() => {
                state.recheck_at = Some(Instant::now() + RECHECK_EVERY);
            }
            Some(Err(err)) => state.failed = Some((Instant::now(), err)),
            None => state.failed = Some((Instant::now(), no_master("the search was stopped"))),
        }
        drop(state);
        self.inner.searched.send_modify(|n| *n += 1);
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The master to follow, within the search's time: the one the sentinels name
    /// ([`named`](Inner::named)), and while a switch was announced a moment ago, the
    /// announced master tried beside them (the first of the two to give a master is
    /// taken), with no sentinel naming the master it replaced followed. When neither
    /// gives one, the most telling failure: the master's own (a wrong password, an
    /// untrusted certificate), else a sentinel's, else that no sentinel knows a master
    /// of that name that is up.
    async fn find(&self, announced: Option<&Announced>, in_use: Option<&Address>) -> RedisResult<Found> {
        use futures_util::future::{select, Either};
        let replaced = announced.map(|a| &a.old);
        let named = std::pin::pin!(self.named(replaced, in_use));
        let Some(hint) = announced.and_then(|a| a.new.clone()) else {
            return named.await.map_err(Failure::into_error);
        };
        let announced = std::pin::pin!(async move {
            // Not settled: the sentinels were not all heard.
            let found = |conn| Found {
                address: hint.clone(),
                conn,
                settled: false,
            };
            if in_use == Some(&hint) {
                return Ok(found(None));
            }
            match self.connect_master(&hint).await {
                Ok(Some(conn)) => Ok(found(Some(conn))),
                Ok(None) => Err(Failure::Master(not_a_master())),
                Err(err) => Err(Failure::Master(err)),
            }
        });
        let found = match select(announced, named).await {
            Either::Left((Ok(found), _)) | Either::Right((Ok(found), _)) => Ok(found),
            Either::Left((Err(first), other)) => other.await.map_err(|then| first.or_more_telling(then)),
            Either::Right((Err(first), other)) => other.await.map_err(|then| first.or_more_telling(then)),
        };
        found.map_err(Failure::into_error)
    }

    /// The master the sentinels name: every sentinel asked at once, the master to
    /// follow ranked by [`choice`], and sentinels that name different masters logged.
    async fn named(&self, replaced: Option<&Address>, in_use: Option<&Address>) -> Result<Found, Failure> {
        let poll = self.poll(replaced).await;
        if !choice::disagree(&poll.answers) {
            return self.follow(poll, in_use).await;
        }
        let said = poll.answers.clone();
        let followed = self.follow(poll, in_use).await;
        self.report_disagreement(&said, followed.as_ref().ok().map(|f| &f.address));
        followed
    }

    /// What every sentinel says, each asked at once and given half the connect timeout
    /// (the other half is the master's); one naming the master `replaced` is left out.
    async fn poll(&self, replaced: Option<&Address>) -> Poll {
        let budget = self.timeouts.connect / 2;
        let asked = futures_util::future::join_all(self.sentinels.iter().enumerate().map(
            |(place, sentinel)| async move {
                let said = tokio::time::timeout(budget, self.named_by(sentinel)).await;
                let said = said.unwrap_or_else(|_| {
                    // A request left unanswered: the next search connects anew.
                    sentinel.forget_conn();
                    Err(Failure::Sentinel(no_master(&format!(
                        "a sentinel did not answer within {budget:?}"
                    ))))
                });
                (place, said)
            },
        ))
        .await;
        let mut poll = Poll {
            answers: Vec::with_capacity(asked.len()),
            complete: true,
            failure: None,
        };
        for (sentinel, said) in asked {
            let failure = match said {
                Ok(answer) if replaced == Some(&answer.master) => Failure::Sentinel(no_master(
                    "a sentinel named the master a switch announced a moment ago replaced",
                )),
                Ok(answer) => {
                    poll.answers.push(Answer { sentinel, ..answer });
                    continue;
                }
                Err(failure) => failure,
            };
            // One that knows no master of that name answered all the same.
            poll.complete &= matches!(failure, Failure::Unknown(_));
            poll.failure = Some(match poll.failure.take() {
                Some(before) => before.or_more_telling(failure),
                None => failure,
            });
        }
        poll
    }

    /// The first master of the sentinels' ranking that says it is one, passing over
    /// those that say they are replicas. A master named only as down, or that cannot
    /// be used, ends the search: a master of a lower epoch is not taken instead. A
    /// check (`in_use`) whose first is the master in use keeps it.
    async fn follow(&self, poll: Poll, in_use: Option<&Address>) -> Result<Found, Failure> {
        let ranked = choice::ranked(&poll.answers);
        let settled = poll.complete && ranked.len() <= 1;
        let mut replica = None;
        for candidate in ranked {
            if !candidate.up {
                let failure = poll.failure.map(|f| f.or_more_telling(unknown_master()));
                return Err(failure.unwrap_or_else(unknown_master));
            }
            let found = |conn| Found {
                address: candidate.master.clone(),
                conn,
                settled,
            };
            if in_use == Some(&candidate.master) {
                return Ok(found(None));
            }
            match self.connect_master(&candidate.master).await {
                Ok(Some(conn)) => return Ok(found(Some(conn))),
                Ok(None) => replica = Some(Failure::Master(not_a_master())),
                Err(err) => return Err(Failure::Master(err)),
            }
        }
        Err(replica
            .or(poll.failure)
            .unwrap_or_else(|| Failure::Sentinel(no_master("no sentinel listed"))))
    }

    /// Logs, once per process and disagreement, the sentinels that name different
    /// masters as up, what each named, and the master followed (addresses and epochs,
    /// never a credential).
    fn report_disagreement(&self, answers: &[Answer], followed: Option<&Address>) {
        let sentinels: Vec<Address> = self.sentinels.iter().map(|s| s.address.clone()).collect();
        let said = choice::described(answers, &sentinels);
        if !choice::first_time(&format!("{} {said}", self.master.name)) {
            return;
        }
        let followed = followed.map_or_else(|| "none of them".to_owned(), choice::shown);
        tracing::warn!(
            master_name = %self.master.name,
            followed = %followed,
            "the sentinels name different masters for `{}`: {said}; following {followed} \
             (the highest config epoch, then the most sentinels, then the lowest address \
             decide, among masters that say they are one)",
            self.master.name
        );
    }

    /// What `sentinel` says of the master: its address, its epoch and whether it is up.
    async fn named_by(&self, sentinel: &Sentinel) -> Result<Answer, Failure> {
        let cached = sentinel.conn.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut conn = match cached {
            Some(conn) => conn,
            None => {
                let conn = sentinel
                    .client
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await
                    .map_err(Failure::Sentinel)?;
                *sentinel.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn.clone());
                conn
            }
        };
        let reply: RedisResult<std::collections::HashMap<String, String>> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(&self.master.name)
            .query_async(&mut conn)
            .await;
        let info = match reply {
            Ok(info) => info,
            Err(err) if err.code() == Some("ERR") && err.to_string().contains("No such master") => {
                return Err(unknown_master());
            }
            Err(err) => {
                sentinel.forget_conn();
                return Err(Failure::Sentinel(err));
            }
        };
        let flags = info.get("flags").map(String::as_str).unwrap_or_default();
        let up = flags.split(',').any(|f| f == "master")
            && !flags.split(',').any(|f| f == "s_down" || f == "o_down");
        let ip = info.get("ip").filter(|ip| !ip.is_empty());
        let port = info
            .get("port")
            .and_then(|p| p.parse::<u16>().ok())
            .filter(|p| *p != 0);
        // Sentinel has reported it since its first release; a reply without it ranks
        // below every epoch given.
        let epoch = info
            .get("config-epoch")
            .and_then(|e| e.parse::<u64>().ok())
            .unwrap_or(0);
        match (ip, port) {
            (Some(ip), Some(port)) if info.get("name") == Some(&self.master.name) => Ok(Answer {
                sentinel: 0,
                master: (ip.clone(), port),
                epoch,
                up,
            }),
            _ => Err(unknown_master()),
        }
    }

    /// A connection to `address` once it says it is a master (`ROLE`), named for
    /// `CLIENT LIST`; `None` when it says it is not.
    async fn connect_master(&self, address: &Address) -> RedisResult<Option<MultiplexedConnection>> {
        let (host, port) = address.clone();
        let addr = match self.master.tls {
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
            .set_redis_settings(self.master.settings.clone());
        #[cfg(feature = "tls")]
        let client = match &self.master.certs {
            Some(certs) => redis::Client::build_with_tls(info, certs.clone())?,
            None => redis::Client::open(info)?,
        };
        #[cfg(not(feature = "tls"))]
        let client = redis::Client::open(info)?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        let role: redis::Role = redis::cmd("ROLE").query_async(&mut conn).await?;
        if !matches!(role, redis::Role::Primary { .. }) {
            return Ok(None);
        }
        redis::cmd("CLIENT")
            .arg("SETNAME")
            .arg(crate::backend::redis::server::CONNECTION_NAME)
            .query_async::<()>(&mut conn)
            .await?;
        Ok(Some(conn))
    }
}

/// What the sentinels said in one search.
struct Poll {
    /// Each answer naming a master, the master an announcement replaced left out.
    answers: Vec<Answer>,
    /// Whether every sentinel answered, none with the master an announcement replaced.
    complete: bool,
    /// The most telling failure of those that named no master.
    failure: Option<Failure>,
}

fn not_a_master() -> RedisError {
    RedisError::from((
        ErrorKind::Server(ServerErrorKind::ReadOnly),
        "the node the sentinel named is not a master",
    ))
}

/// Why one sentinel's lookup found no master.
enum Failure {
    /// The sentinel could not be asked (unreachable, wrong password, TLS).
    Sentinel(RedisError),
    /// It knows no master of that name that is up.
    Unknown(RedisError),
    /// The master it named could not be used.
    Master(RedisError),
}

impl Failure {
    /// How much it tells: the master's own failure (a wrong password, an untrusted
    /// certificate), then a sentinel's, then that none knows the master.
    fn weight(&self) -> u8 {
        match self {
            Failure::Unknown(_) => 0,
            Failure::Sentinel(_) => 1,
            Failure::Master(_) => 2,
        }
    }

    /// `then` if it tells more than this one, which it replaces on a tie.
    fn or_more_telling(self, then: Failure) -> Failure {
        if then.weight() >= self.weight() {
            then
        } else {
            self
        }
    }

    fn into_error(self) -> RedisError {
        match self {
            Failure::Sentinel(err) | Failure::Unknown(err) | Failure::Master(err) => err,
        }
    }
}

fn unknown_master() -> Failure {
    Failure::Unknown(RedisError::from((
        ErrorKind::MasterNameNotFoundBySentinel,
        "Master with given name not found in sentinel",
    )))
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

/// The announcements of new masters a client listens for.
struct Watched {
    sentinels: Vec<redis::Client>,
    master: String,
    timeouts: Timeouts,
}

/// The channel on which sentinels announce a new master:
/// `<master name> <old ip> <old port> <new ip> <new port>`.
const SWITCH_MASTER: &str = "+switch-master";

/// How often a listener looks whether its client is gone, and how long it waits
/// before trying the next sentinel.
const LISTENER_PAUSE: Duration = Duration::from_secs(1);

impl Watched {
    /// Listens on one sentinel after another until the client is dropped; each new
    /// master announced for this master's name makes the next command look again.
    async fn listen(self, inner: std::sync::Weak<Inner>) {
        let mut next = 0;
        let mut listened = false;
        while inner.strong_count() > 0 {
            let sentinel = &self.sentinels[next % self.sentinels.len()];
            next += 1;
            let subscribed = tokio::time::timeout(self.timeouts.connect, async {
                let mut pubsub = sentinel.get_async_pubsub().await?;
                pubsub.subscribe(SWITCH_MASTER).await?;
                Ok::<_, RedisError>(pubsub)
            })
            .await;
            if let Ok(Ok(pubsub)) = subscribed {
                // A switch may have been announced while no one listened.
                if listened {
                    unknown_switch(&inner);
                }
                listened = true;
                self.until_closed(pubsub, &inner).await;
                // Deaf until it subscribes again: a switch may go unheard meanwhile.
                if let Some(inner) = inner.upgrade() {
                    if let Some(announced) = &mut inner.lock().announced {
                        announced.new = None;
                    }
                }
            }
            tokio::time::sleep(LISTENER_PAUSE).await;
        }
    }

    /// Until the sentinel's connection closes, or the sentinel stops answering: a
    /// quiet pause is followed by a PING, so a sentinel that hangs with its connection
    /// open is left for the next instead of deafening the client.
    async fn until_closed(&self, pubsub: redis::aio::PubSub, inner: &std::sync::Weak<Inner>) {
        let (mut sink, mut messages) = pubsub.split();
        while inner.strong_count() > 0 {
            match tokio::time::timeout(LISTENER_PAUSE, messages.next()).await {
                Err(_) => {
                    let pong = tokio::time::timeout(self.timeouts.connect, sink.ping::<Value>()).await;
                    if !matches!(pong, Ok(Ok(_))) {
                        return;
                    }
                }
                Ok(None) => return,
                Ok(Some(message)) => {
                    let payload: String = message.get_payload().unwrap_or_default();
                    match switched(&payload, &self.master) {
                        Some(Some((old, new))) => announce(inner, old, new),
                        // This master's, and not as Redis writes them: a switch this
                        // client cannot follow, so the master in use is forgotten and
                        // the last announced one no longer preferred.
                        Some(None) => unknown_switch(inner),
                        None => {}
                    }
                }
            }
        }
    }
}

/// Forgets the master in use after a switch this client may not know of (announced
/// while its listener was off its sentinel, or in a message it cannot read): the next
/// command asks the sentinels again, a search under way drops what it finds, and the
/// last announced master is no longer preferred (the master it replaced is still not
/// followed).
fn unknown_switch(inner: &std::sync::Weak<Inner>) {
    forget_and(inner, |state| {
        if let Some(announced) = &mut state.announced {
            announced.new = None;
        }
    });
}

/// Forgets the master in use for the one announced, which searches try first.
fn announce(inner: &std::sync::Weak<Inner>, old: Address, new: Address) {
    forget_and(inner, |state| {
        state.announced = Some(Announced {
            new: Some(new),
            old,
            at: Instant::now(),
        });
    });
}

/// Forgets the master in use (a search under way drops what it finds) and changes
/// `state` by `and`, under one lock: a search that begins afterwards sees both.
fn forget_and(inner: &std::sync::Weak<Inner>, and: impl FnOnce(&mut State)) {
    if let Some(inner) = inner.upgrade() {
        let mut state = inner.lock();
        state.current = None;
        state.failed = None;
        state.announcements += 1;
        and(&mut state);
    }
}

/// What a `+switch-master` message says of `master`: `None` when it is another
/// master's, `Some(None)` when it may be this master's but does not read as Redis
/// writes them, else the old and the new master's addresses. Redis writes `<master
/// name> <old ip> <old port> <new ip> <new port>`; it is read from the end, as a
/// master's name may hold a space.
fn switched(payload: &str, master: &str) -> Option<Option<(Address, Address)>> {
    let mut parts = payload.rsplitn(5, ' ');
    let fields: Vec<&str> = parts.by_ref().take(4).collect();
    let address = |ip: &str, port: &str| {
        let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
        (!ip.is_empty()).then(|| (ip.to_owned(), port))
    };
    // `fields` holds the new port, the new ip, the old port and the old ip.
    let addresses = match fields[..] {
        [new_port, new_ip, old_port, old_ip] => address(old_ip, old_port).zip(address(new_ip, new_port)),
        _ => None,
    };
    match (parts.next(), addresses) {
        // A message that reads names its master: another master's is left alone.
        (Some(name), Some(addresses)) => (name == master).then_some(Some(addresses)),
        // One that does not read is this master's if it begins with its name.
        _ => payload
            .strip_prefix(master)
            .is_some_and(|rest| rest.starts_with(' '))
            .then_some(None),
    }
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
mod tests {
    use super::*;

    #[test]
    fn only_a_replys_code_says_not_the_master() {
        assert!(not_the_master(
            "READONLY",
            "You can't write against a read only replica."
        ));
        assert!(not_the_master("MASTERDOWN", "Link with MASTER is down"));
        // Redis 6.2's wording of a command's error inside a script.
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let detail = format!(
            "Error running script (call to f_{sha}): @user_script:1: @user_script: 1: \
             -READONLY You can't write against a read only replica."
        );
        assert!(not_the_master("ERR", &detail));
        // A script's own error quoting a stored value.
        assert!(!not_the_master(
            "redlimit:bad_bucket:1",
            "bucket READONLY You can't write"
        ));
        assert!(!not_the_master("ERR", "redlimit:bad_bucket:1 bucket READONLY"));
    }

    #[test]
    fn an_announcement_names_the_masters_of_its_master_only() {
        let addr = |ip: &str, port| (ip.to_owned(), port);
        assert_eq!(
            switched("mymaster 127.0.0.1 6379 127.0.0.1 6380", "mymaster"),
            Some(Some((addr("127.0.0.1", 6379), addr("127.0.0.1", 6380))))
        );
        assert_eq!(
            switched("my master 10.0.0.1 6379 10.0.0.2 6380", "my master"),
            Some(Some((addr("10.0.0.1", 6379), addr("10.0.0.2", 6380))))
        );
        // Another master's: nothing to do.
        for other in [
            "othermaster 127.0.0.1 6379 127.0.0.1 6380",
            "xmymaster 127.0.0.1 6379 127.0.0.1 6380",
            "x mymaster 127.0.0.1 6379 127.0.0.1 6380",
            // Another master whose name begins with this one's and a space.
            "mymaster b 127.0.0.1 6379 127.0.0.1 6380",
            "mymasterx",
            "127.0.0.1 6379 127.0.0.1 6380",
            "",
        ] {
            assert_eq!(switched(other, "mymaster"), None, "{other}");
        }
        // This master's, unreadable: the master in use is forgotten, nothing followed.
        for unreadable in [
            "mymaster 127.0.0.1 6379 127.0.0.1 0",
            "mymaster 127.0.0.1 6379 127.0.0.1 x",
            "mymaster 127.0.0.1 6379  6380",
            "mymaster 127.0.0.1 6379 127.0.0.1 6380 ",
            "mymaster 127.0.0.1 x 127.0.0.1 6380",
            "mymaster 6380",
        ] {
            assert_eq!(switched(unreadable, "mymaster"), Some(None), "{unreadable}");
        }
    }

    fn parsed(url: &str) -> SentinelUrl {
        parse_url(url).expect("a sentinel URL").expect("valid")
    }

    #[test]
    fn sentinel_urls() {
        assert!(parse_url("redis://a:1/").is_none());
        assert!(parse_url("redis+cluster://a:1/").is_none());
        let url = parsed("redis+sentinel://a:26379,b:26380/mymaster");
        assert_eq!(url.sentinels, [("a".into(), 26379), ("b".into(), 26380)]);
        assert_eq!((url.master.as_str(), url.db, url.tls), ("mymaster", 0, false));
        assert_eq!((url.username, url.password), (None, None));

        let url = parsed("rediss+sentinel://app:p%40ss@w@a:1/m/3?sentinel_password=s%26p#insecure");
        assert_eq!(url.username.as_deref(), Some("app"));
        assert_eq!(url.password.as_deref(), Some("p@ss@w"));
        assert_eq!(url.sentinel_password.as_deref(), Some("s&p"));
        assert_eq!((url.db, url.tls, url.insecure), (3, true, true));

        let url = parsed("redis+sentinel://:secret@[::1]:26379/m/");
        assert_eq!(url.sentinels, [("::1".into(), 26379)]);
        assert_eq!((url.username, url.password.as_deref()), (None, Some("secret")));
    }

    #[test]
    fn bad_sentinel_urls_say_what_is_accepted() {
        for (url, says) in [
            ("redis+sentinel:///m", "no sentinel listed"),
            ("redis+sentinel://a:1", "no master name"),
            ("redis+sentinel://a/m", "sentinel 1 has no port"),
            ("redis+sentinel://a:1,b:0/m", "sentinel 2 has no valid port"),
            ("redis+sentinel://a:1:2/m", "with a `:`"),
            ("redis+sentinel://[::1:1/m", "IPv6 address that does not parse"),
            ("redis+sentinel://a:1/m/x", "not a number"),
            ("redis+sentinel://a:1/m/1/2", "more than a master name"),
            ("redis+sentinel://a:1/m?timeout=1", "accepted: sentinel_username"),
            ("redis+sentinel://a:1/m#insecure", "only fragment"),
            ("redis+sentinel://u:%zz@a:1/m", "two hex digits"),
        ] {
            let err = parse_url(url).unwrap().unwrap_err();
            assert!(err.to_string().contains(says), "{url}: {err}");
        }
    }

    #[test]
    fn huge_host_lists_are_refused() {
        let hosts: Vec<String> = (0..65).map(|i| format!("10.0.0.{i}:26379")).collect();
        let err = parse_url(&format!("redis+sentinel://{}/m", hosts.join(",")))
            .unwrap()
            .unwrap_err();
        assert!(err.to_string().contains("at most 64"), "{err}");
        assert!(
            parse_url(&format!("redis+sentinel://{}/m", hosts[..64].join(",")))
                .unwrap()
                .is_ok()
        );
    }

    #[test]
    fn a_password_cut_at_an_unencoded_question_mark_is_not_shown() {
        // Before the `?`: `:hunter2` reads as the only host.
        for url in [
            "redis+sentinel://:hunter2?x@a:1/m",
            "redis+sentinel://u:hunter2?x@a:1/m",
            "redis+sentinel://:hunter2:9?x@a:1/m",
            "redis+sentinel://:hunter2#x@a:1/m",
        ] {
            let err = parse_url(url).unwrap().unwrap_err();
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains("hunter2"), "{url}: {shown}");
        }
    }

    #[test]
    fn secrets_stay_out_of_errors_and_debug() {
        let err = parse_url("redis+sentinel://u:hunter2@a:1/m?sentinel_password=s3cret&hunter2=1")
            .unwrap()
            .unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains("hunter2") && !shown.contains("s3cret"), "{shown}");
        let url = parsed("redis+sentinel://u:hunter2@a:1/m?sentinel_password=s3cret");
        let shown = format!("{url:?}");
        assert!(!shown.contains("hunter2") && !shown.contains("s3cret"), "{shown}");
    }
}
