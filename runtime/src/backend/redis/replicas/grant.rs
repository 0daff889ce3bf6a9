//! A waited grant, the caller's side: its script call put in a round, its reply read
//! by its deadline (or taken back unsent), and, when it is a grant, the round's `WAIT`
//! heard by the same deadline.

use redis::Value;

use crate::backend::redis::lua::Lua;
use tokio::time::Instant;

use super::{Failed, Ticket, Waits, CONNECTIONS};
use crate::backend::redis::failure::classify;
use crate::backend::redis::give_back::may_have_run;
use crate::backend::redis::reconnects::{Failure, Reconnects};
use crate::backend::redis::replies::{about_the_server, script_error};
use crate::backend::redis::RedisBackend;
use crate::backend::{Outcome, RuleCall};
use crate::keys::Keys;
use crate::{member, Error};

/// A script call to answer once replicas have its grant.
pub(in crate::backend::redis) struct Waited<'a, 'c> {
    pub script: &'a Lua,
    pub cmd: redis::Cmd,
    pub calls: &'a [RuleCall<'c>],
    pub members: &'a [[u8; member::MEMBER_LEN]],
    pub only_buckets: bool,
    /// Whether its grants are in a log a refund can take them out of.
    pub refundable: bool,
    pub now: u64,
    /// The call's number: its tag, which its reply carries, modulo `CHECK`.
    pub number: u64,
}

/// What a caller heard of its grant.
enum Heard {
    Reply(Value),
    /// No connection took it by its deadline: it was never sent.
    NotSent,
    Failed(Failed),
    /// Sent, and not answered within the command timeout.
    Silent,
}

impl RedisBackend {
    /// Decides `call` in a round of `waits`: a refusal is answered as it comes, a grant
    /// once the replicas asked for have it, else fails with `NotReplicated` (the permits
    /// stay taken), all by the replicas' timeout from now; a grant no connection took
    /// by then fails with `ReplicaWaitsBusy`, unsent.
    pub(in crate::backend::redis) async fn acquire_replicated(
        &self,
        waits: &Waits,
        call: Waited<'_, '_>,
        failed_before: u32,
        pace: &Reconnects,
    ) -> Result<Outcome, Error> {
        let keys: Vec<Keys<'_>> = call.calls.iter().map(|c| c.keys).collect();
        let replicas = waits.replicas();
        let started = Instant::now();
        // (the connections kept for `WAIT` let go once the client's runtime ended, or
        // runs only when its own callers run it: within the replicas' timeout, as the
        // call is)
        let _ = tokio::time::timeout(replicas.timeout, self.carry_if_needed()).await;
        let deadline = started + replicas.timeout;
        let on = PaceOf { failed_before, pace };
        let (ticket, reply) = self.script_reply(waits, &call, &keys, started, &on).await?;
        let outcome =
            self.read_outcome(&reply, call.calls.len(), call.now, call.number, call.only_buckets)?;
        if !outcome.granted {
            return Ok(outcome);
        }
        let acknowledged = self.acknowledged(ticket, deadline, &keys).await?;
        if acknowledged < u64::from(replicas.count) {
            return Err(Error::NotReplicated {
                target: self.target.shown().to_owned(),
                wanted: replicas.count,
                acknowledged,
                after: replicas.timeout,
            });
        }
        Ok(outcome)
    }

    /// The script's reply to `call`, sent in a round by the replicas' deadline (once
    /// more after loading the script, on NOSCRIPT), and the ticket its `WAIT` comes on.
    async fn script_reply(
        &self,
        waits: &Waits,
        call: &Waited<'_, '_>,
        keys: &[Keys<'_>],
        started: Instant,
        on: &PaceOf<'_>,
    ) -> Result<(Ticket, Value), Error> {
        let deadline = started + waits.replicas().timeout;
        let mut loaded = false;
        loop {
            let tag = call.number % crate::backend::redis::replies::CHECK;
            let rules = call.calls.len();
            let mut ticket = waits.submit(call.cmd.clone(), (rules, tag), deadline, self.lasting());
            let heard = heard_grant(&mut ticket, deadline, started + self.timeout).await;
            self.tell_pace(&heard, on);
            let failed = match heard {
                Heard::Reply(value) => match value.extract_error() {
                    Ok(value) => return Ok((ticket, value)),
                    Err(err) if is_noscript(&err) && !loaded => {
                        // Loaded on the shared connection: the cache is the server's.
                        // Within what is left of the call's command timeout.
                        let load =
                            self.run(keys, |mut conn| async move { call.script.load(&mut conn).await });
                        match tokio::time::timeout_at(started + self.timeout, load).await {
                            Ok(loaded) => loaded?,
                            Err(_) => {
                                return Err(Error::Timeout {
                                    after: self.timeout,
                                    connecting: false,
                                })
                            }
                        }
                        loaded = true;
                        continue;
                    }
                    // It ran, and failed: nothing to give back.
                    Err(err) => Failed { err, sent: false },
                },
                Heard::Failed(failed) => failed,
                Heard::NotSent => {
                    return Err(Error::ReplicaWaitsBusy {
                        target: self.target.shown().to_owned(),
                        connections: CONNECTIONS,
                        after: waits.replicas().timeout,
                    })
                }
                Heard::Silent => {
                    if call.refundable {
                        self.spawn_refund(call.calls, call.members.to_vec());
                    }
                    return Err(Error::Timeout {
                        after: self.timeout,
                        connecting: false,
                    });
                }
            };
            return Err(self.round_failed(call, keys, failed).await);
        }
    }

    /// Tells the pace the calls on the shared connection follow what a waited call
    /// heard: a server no connection reaches, silent, or refusing every call, is not
    /// waited on by each waited call.
    fn tell_pace(&self, heard: &Heard, on: &PaceOf<'_>) {
        let PaceOf { failed_before, pace } = *on;
        let refused = |err: &redis::RedisError| {
            let cause = self.target.scrub(&err.to_string());
            pace.failed(failed_before, Failure::Refusing, &cause);
        };
        let err = match heard {
            Heard::Reply(Value::ServerError(err)) => {
                let err = redis::RedisError::from(err.clone());
                match about_the_server(&err) {
                    true => refused(&err),
                    false => pace.answered_with_error(),
                }
                return;
            }
            Heard::Reply(_) => return pace.answered(),
            Heard::NotSent => return,
            Heard::Silent => {
                pace.timed_out(failed_before, self.timeout, true);
                return;
            }
            Heard::Failed(Failed { err, .. }) => err,
        };
        if err.is_timeout() {
            pace.timed_out(failed_before, self.timeout, true);
        } else if err.is_io_error() {
            let cause = self.target.scrub(&err.to_string());
            pace.failed(failed_before, Failure::Unreachable, &cause);
        }
    }

    /// The error of a round that failed for `call`; a grant that may have run unheard
    /// is refunded, as on the shared connection.
    async fn round_failed(&self, call: &Waited<'_, '_>, keys: &[Keys<'_>], failed: Failed) -> Error {
        let Failed { err, sent } = failed;
        let error =
            script_error(&err, keys).unwrap_or_else(|| classify(&err, &self.target, self.timeout, !sent));
        if let Error::WrongType { .. } = error {
            return self.wrong_type(call.calls, error).await;
        }
        if sent && call.refundable && may_have_run(&error) {
            self.spawn_refund(call.calls, call.members.to_vec());
        }
        error
    }

    /// How many replicas the round's `WAIT` heard by `deadline` (0 when it did not
    /// answer by then); a `WAIT` that fails or answers something else than a count
    /// is an error, never a grant replicated.
    async fn acknowledged(&self, ticket: Ticket, deadline: Instant, keys: &[Keys<'_>]) -> Result<u64, Error> {
        match tokio::time::timeout_at(deadline, ticket.acked).await {
            Ok(Ok(Ok(value))) => counted(value).map_err(|other| Error::Backend {
                detail: format!(
                    "WAIT answered {}, not a count of replicas; the grant is not counted as replicated",
                    shown(&other)
                ),
            }),
            Ok(Ok(Err(err))) => {
                Err(script_error(&err, keys)
                    .unwrap_or_else(|| classify(&err, &self.target, self.timeout, false)))
            }
            Ok(Err(_)) | Err(_) => Ok(0),
        }
    }
}

/// The reply to `ticket`'s grant: by `deadline` while no connection took it (then it is
/// taken back), by `grant_by` (the command timeout) once one sent it.
async fn heard_grant(ticket: &mut Ticket, deadline: Instant, grant_by: Instant) -> Heard {
    match tokio::time::timeout_at(deadline, &mut ticket.grant).await {
        Ok(Ok(Ok(value))) => return Heard::Reply(value),
        Ok(Ok(Err(failed))) => return Heard::Failed(failed),
        // The round dropped it unsent, or the deadline came.
        Ok(Err(_)) | Err(_) => {}
    }
    if ticket.take_back() {
        return Heard::NotSent;
    }
    match tokio::time::timeout_at(grant_by, &mut ticket.grant).await {
        Ok(Ok(Ok(value))) => Heard::Reply(value),
        Ok(Ok(Err(failed))) => Heard::Failed(failed),
        Ok(Err(_)) | Err(_) => Heard::Silent,
    }
}

/// The pace a waited call follows, and the failures in a row on it when it was sent.
struct PaceOf<'a> {
    failed_before: u32,
    pace: &'a Reconnects,
}

/// The replicas a reply to `WAIT` counts, or the reply when it is no count.
fn counted(value: Value) -> Result<u64, Value> {
    match value {
        Value::Int(n) if n >= 0 => Ok(n.unsigned_abs()),
        other => Err(other),
    }
}

fn is_noscript(err: &redis::RedisError) -> bool {
    err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// A reply as an error shows it: at most 100 characters.
fn shown(value: &Value) -> String {
    crate::backend::redis::replies::abbreviated(format!("{value:?}"), 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_count_counts_replicas() {
        assert_eq!(counted(Value::Int(0)), Ok(0));
        assert_eq!(counted(Value::Int(3)), Ok(3));
        for garbage in [
            Value::Int(-1),
            Value::Nil,
            Value::Okay,
            Value::SimpleString("1".to_owned()),
            Value::BulkString(b"1".to_vec()),
            Value::Array(vec![Value::Int(1)]),
            Value::Double(1.0),
        ] {
            assert_eq!(counted(garbage.clone()), Err(garbage));
        }
    }
}
