//! A connection's rounds: the grants sent in one pipeline, the late ones after them,
//! then one `WAIT` for those granted, timed to the latest deadline among them; then the
//! next round formed meanwhile, or the connection back to the pool.

use std::sync::Arc;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{ErrorKind, RedisError, RedisResult, Value};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Failed, Member, Shared, Slot};
use crate::backend::redis::replies::parse_acquire_reply;

/// A connection a round holds: given back to the pool when its rounds end, or, when
/// the task is dropped under way (its runtime shutting down), closed.
pub(super) struct Out {
    shared: Arc<Shared>,
    slot: Option<Slot>,
}

impl Out {
    pub(super) fn new(shared: Arc<Shared>, slot: Slot) -> Out {
        Out {
            shared,
            slot: Some(slot),
        }
    }

    /// The grants that formed the next round meanwhile, or none: the connection goes
    /// back to the pool.
    fn next(&mut self) -> Option<Vec<Member>> {
        let mut state = self.shared.lock();
        if !state.forming.is_empty() {
            return Some(std::mem::take(&mut state.forming));
        }
        if let Some(slot) = self.slot.take() {
            state.idle.push(slot);
        }
        state.out -= 1;
        None
    }
}

impl Drop for Out {
    fn drop(&mut self) {
        if self.slot.take().is_some() {
            let mut state = self.shared.lock();
            state.out -= 1;
            state.idle.push(Slot::default());
        }
    }
}

/// The pipelines of late grants a round sends before its `WAIT`, at most.
const LATE_PIPELINES: usize = 3;

/// A granted caller waiting for the round's `WAIT`.
struct Waiting {
    deadline: Instant,
    acked: oneshot::Sender<RedisResult<Value>>,
}

/// Runs rounds on the connection `out` holds, `members` first, until none is formed.
pub(super) async fn run(mut out: Out, mut members: Vec<Member>) {
    loop {
        let shared = out.shared.clone();
        if let Some(slot) = out.slot.as_mut() {
            round(&shared, slot, members).await;
        }
        match out.next() {
            Some(next) => members = next,
            None => return,
        }
    }
}

async fn round(shared: &Shared, slot: &mut Slot, members: Vec<Member>) {
    let members = sendable(members);
    let Some(latest) = members.iter().map(|m| m.deadline).max() else {
        return;
    };
    let (generation, conn) = match connection(shared, slot, latest).await {
        Ok(found) => found,
        Err(err) => {
            for member in members {
                let failed = Failed {
                    err: err.clone(),
                    sent: false,
                };
                let _ = member.grant.send(Err(failed));
            }
            return;
        }
    };
    let mut waiting = send_grants(shared, slot, generation, &conn, members).await;
    // Grants that joined while these were on their way go out before the WAIT (a few
    // times at most: each delays the WAIT of those before by a round trip).
    for _ in 0..LATE_PIPELINES {
        if slot.conn.is_none() {
            break;
        }
        let late = sendable(std::mem::take(&mut shared.lock().forming));
        if late.is_empty() {
            break;
        }
        waiting.extend(send_grants(shared, slot, generation, &conn, late).await);
    }
    if slot.conn.is_some() {
        wait(shared, slot, generation, &conn, waiting).await;
    }
}

/// The members whose callers still wait and have a millisecond left for `WAIT`; the
/// others are dropped unsent, and their callers take them back.
fn sendable(mut members: Vec<Member>) -> Vec<Member> {
    let soonest = Instant::now() + std::time::Duration::from_millis(1);
    members.retain(|m| !m.grant.is_closed() && m.deadline > soonest);
    members
}

/// The slot's connection, made again when it failed or went to a replaced master,
/// within the latest deadline of the round.
async fn connection(
    shared: &Shared,
    slot: &mut Slot,
    latest: Instant,
) -> RedisResult<(u64, MultiplexedConnection)> {
    if let Some((generation, conn)) = &slot.conn {
        if shared.opener.in_use(*generation) {
            return Ok((*generation, conn.clone()));
        }
    }
    slot.conn = None;
    match tokio::time::timeout_at(latest, shared.opener.open(&shared.config)).await {
        Ok(Ok(found)) => {
            slot.conn = Some(found.clone());
            Ok(found)
        }
        Ok(Err(err)) => Err(err),
        Err(_) => Err(timed_out("connecting for the replicas' wait")),
    }
}

fn timed_out(what: &str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("{what} timed out"),
    ))
}

/// Sends the grants of `members` not taken back, in one pipeline, and hands each
/// caller its reply; answers those granted (or whose reply does not read), to wait for.
async fn send_grants(
    shared: &Shared,
    slot: &mut Slot,
    generation: u64,
    conn: &MultiplexedConnection,
    mut members: Vec<Member>,
) -> Vec<Waiting> {
    members.retain(Member::claim);
    if members.is_empty() {
        return Vec::new();
    }
    let mut pipe = redis::pipe();
    for member in &mut members {
        pipe.add_command(std::mem::take(&mut member.cmd));
    }
    let mut conn = conn.clone();
    let sent = conn.req_packed_commands(&pipe, 0, members.len());
    let values = match tokio::time::timeout(shared.command_timeout, sent).await {
        Ok(Ok(values)) if values.len() == members.len() => values,
        reply => {
            let err = match reply {
                Ok(Err(err)) => err,
                Ok(Ok(_)) => RedisError::from((ErrorKind::Parse, "a pipeline's replies miscounted")),
                Err(_) => timed_out("a round's grants"),
            };
            shared.opener.heard(generation, Err(&err));
            slot.conn = None;
            for member in members {
                let failed = Failed {
                    err: err.clone(),
                    sent: true,
                };
                let _ = member.grant.send(Err(failed));
            }
            return Vec::new();
        }
    };
    if shared.opener.heard(generation, Ok(&values)) {
        slot.conn = None;
    }
    let mut waiting = Vec::new();
    for (member, value) in members.into_iter().zip(values) {
        let granted = maybe_granted(&value, member.rules, member.tag);
        if member.grant.send(Ok(value)).is_ok() && granted {
            waiting.push(Waiting {
                deadline: member.deadline,
                acked: member.acked,
            });
        }
    }
    waiting
}

/// Whether a script's reply may be a grant: a refusal, or an error, needs no replica.
fn maybe_granted(value: &Value, rules: usize, tag: u64) -> bool {
    match value {
        Value::ServerError(_) => false,
        // acquire_plain.lua's integer: a grant at any time is not negative.
        Value::Int(n) if rules == 1 => *n >= 0,
        // The time is the caller's to check; a grant is a grant at any.
        _ => parse_acquire_reply(value, rules, None, Some(tag)).is_none_or(|outcome| outcome.granted),
    }
}

/// One `WAIT` for every caller in `waiting` still there, timed to the latest of their
/// deadlines (at least 1 ms: `WAIT` with 0 would block for ever); each hears its reply.
async fn wait(
    shared: &Shared,
    slot: &mut Slot,
    generation: u64,
    conn: &MultiplexedConnection,
    waiting: Vec<Waiting>,
) {
    let now = Instant::now();
    let waiting: Vec<Waiting> = waiting
        .into_iter()
        .filter(|w| !w.acked.is_closed() && w.deadline > now)
        .collect();
    let Some(latest) = waiting.iter().map(|w| w.deadline).max() else {
        return;
    };
    let within = latest - now;
    let ms = u64::try_from(within.as_micros().div_ceil(1000))
        .unwrap_or(u64::MAX)
        .max(1);
    let cmd = redis::cmd("WAIT").arg(shared.replicas.count).arg(ms).clone();
    let mut conn = conn.clone();
    let sent = conn.req_packed_command(&cmd);
    let heard = match tokio::time::timeout(within + shared.command_timeout, sent).await {
        Ok(Ok(value)) => {
            if shared.opener.heard(generation, Ok(std::slice::from_ref(&value))) {
                slot.conn = None;
            }
            value.extract_error()
        }
        Ok(Err(err)) => {
            shared.opener.heard(generation, Err(&err));
            slot.conn = None;
            Err(err)
        }
        // Every caller is past its deadline: the connection is left, as it may be hung.
        Err(_) => {
            slot.conn = None;
            return;
        }
    };
    for w in waiting {
        let _ = w.acked.send(heard.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_grant_or_a_reply_that_does_not_read_is_waited_for() {
        // acquire_plain.lua's integer: permits left after a grant, minus the wait of
        // a refusal (each times 2^20, plus the call's tag).
        assert!(maybe_granted(&Value::Int(4), 1, 0));
        assert!(maybe_granted(&Value::Int(0), 1, 0));
        assert!(!maybe_granted(&Value::Int(-250), 1, 0));
        // A script's error (NOSCRIPT here) is answered as it is, with no WAIT.
        let error = redis::parse_redis_value(b"-NOSCRIPT No matching script\r\n").unwrap();
        assert!(matches!(error, Value::ServerError(_)), "{error:?}");
        assert!(!maybe_granted(&error, 1, 0));
        // A reply that does not read is waited for: never a grant unconfirmed.
        assert!(maybe_granted(&Value::SimpleString("?".to_owned()), 1, 0));
        assert!(maybe_granted(&Value::Nil, 2, 0));
    }
}
