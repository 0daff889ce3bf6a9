//! The search for the master: every sentinel asked at once, the master they name
//! followed as [`choice`](super::choice) ranks them once it says it is a master, a
//! switch announced a moment ago tried beside them; run in a task of its own, one at a
//! time per client, its outcome kept for the callers.

use std::sync::Arc;
use std::time::Instant;

use redis::aio::MultiplexedConnection;
use redis::{ErrorKind, RedisError, RedisResult, ServerErrorKind};

use super::choice::{self, Answer};
use super::{
    no_master, Address, Announced, Current, Inner, Sentinel, State, ANNOUNCEMENT_KEPT, RECHECK_AGREED,
    RECHECK_EVERY,
};

/// A search for the master, begun under the state's lock: with no master in use, or
/// as a check that the master in use is still the one the sentinels name. Dropped,
/// whether it ran or not (a task the runtime never polled), it ends: `searching` is
/// cleared and what it found kept for the callers.
pub(super) struct Search {
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
    pub(super) fn begin(inner: &Arc<Inner>, state: &mut State) -> Search {
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
    pub(super) async fn run(mut self) {
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
        state.stopped = self.found.is_none();
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
            // A Redis server listed as a sentinel: its own error would read as the
            // server's, which it is not.
            Err(err) if err.code() == Some("ERR") && err.to_string().contains("unknown command") => {
                sentinel.forget_conn();
                return Err(Failure::Sentinel(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    NOT_A_SENTINEL,
                ))));
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
        let client = self.master.client(address)?;
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

/// What a server listed as a sentinel that does not know `SENTINEL` is.
pub(crate) const NOT_A_SENTINEL: &str =
    "a server the URL lists as a sentinel does not know the SENTINEL command: it is not a sentinel";

fn unknown_master() -> Failure {
    Failure::Unknown(RedisError::from((
        ErrorKind::MasterNameNotFoundBySentinel,
        "Master with given name not found in sentinel",
    )))
}
