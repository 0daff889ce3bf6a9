//! Permits given back: the grants of a call no caller will use refunded (a call that
//! timed out or was dropped while its script was on its way, a token bucket's grant a
//! later slot's refusal undoes), and what a batch did not use.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use super::connection::Conn;
use super::nodes::SlotMap;
use super::{layout, Arg, RedisBackend, SCRIPTS};
use crate::backend::RuleCall;
use crate::keys::Keys;
use crate::{member, Error, LimiterKeys, RateType};

/// The most give-backs sent off the callers' path at once: the rest wait their turn,
/// each with its own command timeout once sent. 10 000 batches given back at once
/// (their leases over) went on the connection together, so the calls behind them and
/// the give-backs themselves timed out: with no reply heard in time (the replies of
/// commands timed out are dropped), the client took the connection for one that
/// answers nothing, paused its calls and made it again.
const AT_ONCE: usize = 16;

/// The most give-backs off the callers' path waiting or sent: past it a give-back is
/// let go, its permits counted until they leave the window (stricter, never looser).
/// Callers naming a new batched limiter at every call end batches faster than they
/// go back: 256 of them left 159 472 give-backs waiting after 20 s (389 MB), and more
/// the longer they went on.
const MOST_QUEUED: usize = 10_000;

/// Give-backs off the callers' path: their turns on the connection, and how many are
/// waiting for one or sent.
pub(super) struct GivingBack {
    turns: tokio::sync::Semaphore,
    queued: AtomicUsize,
}

impl Default for GivingBack {
    fn default() -> Self {
        GivingBack {
            turns: tokio::sync::Semaphore::new(AT_ONCE),
            queued: AtomicUsize::new(0),
        }
    }
}

/// One give-back counted in [`GivingBack::queued`] until it is dropped (done, or its
/// task dropped with its runtime).
struct Queued(Arc<GivingBack>);

impl Queued {
    /// Counted, or `None` (and not counted) when [`MOST_QUEUED`] are already.
    fn new(giving: &Arc<GivingBack>) -> Option<Queued> {
        // (counted first, and taken off by the guard's drop whatever the answer)
        let before = giving.queued.fetch_add(1, Ordering::Relaxed);
        let queued = Queued(Arc::clone(giving));
        (before < MOST_QUEUED).then_some(queued)
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Attempts at refunding a timed-out grant, and the pause before each retry.
const REFUND_ATTEMPTS: u32 = 3;
const REFUND_BACKOFF: Duration = Duration::from_millis(500);

impl RedisBackend {
    /// Gives back the grants of `members` (one per call) where they are in a log;
    /// answers how many were.
    pub(crate) async fn refund(
        &self,
        calls: &[RuleCall<'_>],
        members: &[[u8; member::MEMBER_LEN]],
    ) -> Result<i64, Error> {
        let keys = refund_keys(calls);
        let all: Vec<Keys<'_>> = calls.iter().map(|c| c.keys).collect();
        let (keys, slots) = (&keys, self.slot_map());
        self.run(&all, |mut conn| async move {
            let mut invocation = SCRIPTS.refund.prepare_invoke();
            invocation.key(&keys[..]);
            for member in members {
                invocation.arg(&member[..]);
            }
            invocation.invoke(&mut conn, slots).await
        })
        .await
    }

    /// A call that failed after it was sent may still run (a hung server answers
    /// later): its grants would spend permits no caller uses. Refund them in the
    /// background: first on the same connection, so the refund runs after the call,
    /// then on the client's connection at the time (one made again meanwhile: the one
    /// the call was sent on is let go, rather than kept, and connected again, by the
    /// refund), unless nothing has answered since a timeout.
    pub(crate) fn spawn_refund(&self, calls: &[RuleCall<'_>], members: Vec<[u8; member::MEMBER_LEN]>) {
        // (on a runtime that lasts: a caller's made for its call would drop it)
        let Some(runtime) = self.lasting() else {
            return;
        };
        let keys = refund_keys(calls);
        let mut first = Some(self.conn());
        let timeout = self.timeout;
        let reconnects = match self.cluster {
            false => Arc::clone(&self.reconnects),
            true => self.nodes.pace(&calls.iter().map(|c| c.keys).collect::<Vec<_>>()),
        };
        let (slot, silent) = (Arc::clone(&self.conn), Arc::clone(&self.silent));
        let nodes = self.cluster.then(|| Arc::clone(&self.nodes));
        runtime.spawn(async move {
            let slots = nodes.as_ref().map(|nodes| SlotMap { nodes, timeout });
            for attempt in 0..REFUND_ATTEMPTS {
                let conn = first.take();
                // Not sent while the connecting is paused (it would try a connection
                // of its own, and a call that failed to connect never ran), nor again
                // while nothing answers.
                if reconnects.paused() || (conn.is_none() && silent.load(Ordering::Relaxed)) {
                    tokio::time::sleep(REFUND_BACKOFF * (attempt + 1)).await;
                    continue;
                }
                let mut conn =
                    conn.unwrap_or_else(|| slot.read().unwrap_or_else(PoisonError::into_inner).clone());
                let mut invocation = SCRIPTS.refund.prepare_invoke();
                invocation.key(&keys[..]);
                for member in &members {
                    invocation.arg(&member[..]);
                }
                // Sent before the timeout can drop it: the connection writes it in order.
                let refund = invocation.invoke::<i64>(&mut conn, slots);
                // All refunded: done. None: the call may not have run yet (it was
                // sent on a connection since replaced), so look again later.
                if let Ok(Ok(refunded)) = tokio::time::timeout(timeout * 4, refund).await {
                    if refunded as usize >= members.len() {
                        return;
                    }
                }
                tokio::time::sleep(REFUND_BACKOFF * (attempt + 1)).await;
            }
            tracing::debug!(
                "grants of a timed-out rate limiter call were not all found to refund; \
                 any that ran return to the limiter when they leave the window"
            );
        });
    }

    /// Gives the token-bucket calls among `calls` back the tokens they took, once (a
    /// retried refund could give them twice): for grants a later slot's refusal undoes.
    pub(crate) async fn refund_tokens(&self, calls: &[RuleCall<'_>]) -> Result<(), Error> {
        let mut invocation = SCRIPTS.refund_tokens.prepare_invoke();
        let mut any = false;
        for call in calls {
            let (Some(_), Some(rule)) = (call.bucket, call.rule) else {
                continue;
            };
            let key = match rule.rate_type {
                RateType::Overall => call.keys.bucket(),
                RateType::PerClient => call.keys.client_bucket(),
            };
            invocation.key(key).arg(call.permits * rule.interval_ms());
            any = true;
        }
        if !any {
            return Ok(());
        }
        let keys: Vec<Keys<'_>> = calls.iter().map(|c| c.keys).collect();
        let (invocation, slots) = (&invocation, self.slot_map());
        self.run(&keys, |mut conn| async move {
            invocation.invoke::<u64>(&mut conn, slots).await.map(|_| ())
        })
        .await
    }

    /// Gives back what a batch taken under `member` did not use (`used` of its permits
    /// were), see `lua/give_back.lua`: in a task of its own, off the caller's path, on
    /// a runtime that lasts (a caller's current-thread one left undriven would hold its
    /// turns, and every give-back would wait; a caller's made for its call would drop
    /// it). A give-back that fails or never runs leaves the permits counted until they
    /// leave the window: stricter, never looser.
    pub(crate) fn spawn_give_back(&self, keys: LimiterKeys, member: [u8; member::MEMBER_LEN], used: u64) {
        let runtime = self.lasting();
        self.carry_at_once(runtime.as_ref(), false);
        self.spawn_give_back_on(runtime, keys, member, used);
    }

    /// The runtime a client being dropped gives its batches back on: a runtime that
    /// lasts, but the library's when that one is shutting down (a client dropped with
    /// a task of its runtime as it shuts down: that runtime drops what is spawned on
    /// it), the connection carried there first when needed.
    pub(crate) fn dropping_runtime(&self) -> Option<tokio::runtime::Handle> {
        let runtime = self.lasting()?;
        let shutting_down = !super::lasting::alive(&runtime);
        let to = match shutting_down {
            true => super::carrier::carrier(),
            false => Some(runtime),
        };
        self.carry_at_once(to.as_ref(), shutting_down);
        to
    }

    /// [`spawn_give_back`](RedisBackend::spawn_give_back) on `runtime` (not at all
    /// without one).
    pub(crate) fn spawn_give_back_on(
        &self,
        runtime: Option<tokio::runtime::Handle>,
        keys: LimiterKeys,
        member: [u8; member::MEMBER_LEN],
        used: u64,
    ) {
        let Some(runtime) = runtime else {
            return;
        };
        let Some(queued) = Queued::new(&self.giving_back) else {
            tracing::debug!(
                "a batch's unused permits were not given back ({MOST_QUEUED} give-backs wait \
                 already); they return to the limiter when they leave the window"
            );
            return;
        };
        let (slot, timeout) = (Arc::clone(&self.conn), self.timeout);
        let nodes = self.cluster.then(|| Arc::clone(&self.nodes));
        runtime.spawn(async move {
            let slots = nodes.as_ref().map(|nodes| SlotMap { nodes, timeout });
            // (never closed: the backend owns it)
            let Ok(_turn) = queued.0.turns.acquire().await else {
                return;
            };
            // The connection at the time: one made again meanwhile, the old let go.
            let mut conn = slot.read().unwrap_or_else(PoisonError::into_inner).clone();
            give_back(&mut conn, slots, timeout, &keys, member, used).await;
        });
    }

    /// [`spawn_give_back`](RedisBackend::spawn_give_back) on the caller's path: done (or
    /// failed, within the command timeout) when it returns.
    pub(crate) async fn give_back(&self, keys: &LimiterKeys, member: [u8; member::MEMBER_LEN], used: u64) {
        // (sent without a call: carried first when the connection's runtime ended)
        let _ = tokio::time::timeout(self.timeout, self.carry_if_needed()).await;
        give_back(
            &mut self.conn(),
            self.slot_map(),
            self.timeout,
            keys,
            member,
            used,
        )
        .await;
    }
}

/// One give-back (`lua/give_back.lua`), within `timeout`; a failure is logged at debug
/// level only (the permits return when they leave the window).
async fn give_back(
    conn: &mut Conn,
    slots: Option<SlotMap<'_>>,
    timeout: Duration,
    keys: &LimiterKeys,
    member: [u8; member::MEMBER_LEN],
    used: u64,
) {
    let mut args = [Arg::Text(""); layout::limiter::GIVE_BACK.args.len()];
    args[layout::limiter::GIVE_BACK_MEMBER] = Arg::Bytes(&member[..]);
    args[layout::limiter::GIVE_BACK_USED] = Arg::Int(used);
    let mut invocation = SCRIPTS.give_back.prepare_invoke();
    invocation.key(&keys.all()[..]).arg(&args[..]);
    let given = tokio::time::timeout(timeout, invocation.invoke::<u64>(conn, slots)).await;
    if !matches!(given, Ok(Ok(_))) {
        tracing::debug!(
            "a batch's unused permits were not given back; they return to the limiter when \
             they leave the window"
        );
    }
}

/// refund.lua's keys: value, client value, permits, client permits of each call.
fn refund_keys(calls: &[RuleCall<'_>]) -> Vec<String> {
    use layout::refunds::{CLIENT_PERMITS, CLIENT_VALUE, PERMITS, REFUND, VALUE};
    calls
        .iter()
        .flat_map(|call| {
            let k = call.keys;
            let mut keys: [String; REFUND.rule_keys.len()] = Default::default();
            keys[VALUE] = k.value();
            keys[CLIENT_VALUE] = k.client_value();
            keys[PERMITS] = k.permits();
            keys[CLIENT_PERMITS] = k.client_permits();
            keys
        })
        .collect()
}

/// Refunds a call's grants when its future is dropped while its script is on its way
/// (the caller's own timeout, a `select!`, a reset HTTP/2 stream): the script may have
/// run, and nobody will use what it granted.
pub(super) struct RefundIfDropped<'a, 'c> {
    pub backend: &'a RedisBackend,
    pub calls: &'a [RuleCall<'c>],
    pub members: &'a [[u8; member::MEMBER_LEN]],
    pub armed: bool,
}

impl RefundIfDropped<'_, '_> {
    /// The reply came (or the call failed, which refunds on its own terms).
    pub(super) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for RefundIfDropped<'_, '_> {
    fn drop(&mut self) {
        if self.armed {
            self.backend.spawn_refund(self.calls, self.members.to_vec());
        }
    }
}

/// Whether a failed call may have reached Redis and run there.
pub(super) fn may_have_run(err: &Error) -> bool {
    match err {
        // A connection lost after the call was written: it may have run.
        Error::Timeout { .. } | Error::Unreachable { .. } => true,
        _ => false,
    }
}
