//! Rules whose keys lie in different cluster slots cannot share one script call. They
//! are decided one slot after another, and when a later slot refuses, the permits the
//! earlier slots took are given back (their log members removed and values restored),
//! so the call stays all or nothing. Between taking and giving back, those permits are
//! held, never free: nothing can be over-granted in between, at worst briefly
//! under-granted.

use std::collections::HashMap;

use super::RedisBackend;
use crate::backend::{ConfigChange, Members, Outcome, RuleCall, RuleOutcome, SettleCall, SettleOutcome};
use crate::keys::hash_slot;
use crate::{member, Error};

/// Whether every call's keys lie in one slot.
pub(crate) fn one_slot(calls: &[RuleCall<'_>]) -> bool {
    let mut slots = calls.iter().map(|c| hash_slot(c.keys.config().as_bytes()));
    let first = slots.next();
    slots.all(|slot| Some(slot) == first)
}

/// RuleCall indexes grouped by slot, groups in the order of their first rule.
fn groups(calls: &[RuleCall<'_>]) -> Vec<Vec<usize>> {
    let mut order: Vec<Vec<usize>> = Vec::new();
    let mut by_slot: HashMap<u16, usize> = HashMap::new();
    for (i, call) in calls.iter().enumerate() {
        let slot = hash_slot(call.keys.config().as_bytes());
        let group = *by_slot.entry(slot).or_insert_with(|| {
            order.push(Vec::new());
            order.len() - 1
        });
        order[group].push(i);
    }
    order
}

/// Decides `calls` on `backend` one slot after another, all or nothing.
pub(crate) async fn acquire(
    backend: &RedisBackend,
    calls: &[RuleCall<'_>],
    now: u64,
) -> Result<Outcome, Error> {
    Ok(acquire_members(backend, calls, now).await?.0)
}

/// [`acquire`], answering the log members each call's grant was made under, and the
/// time each call's slot was decided at (each slot's script may decide a little later
/// than the one before: a token bucket in an earlier slot was refilled at its own
/// slot's time).
pub(crate) async fn acquire_members(
    backend: &RedisBackend,
    calls: &[RuleCall<'_>],
    now: u64,
) -> Result<(Outcome, Members, Vec<u64>), Error> {
    let mut sent: Members = vec![[0; member::MEMBER_LEN]; calls.len()];
    let mut taken: Vec<(Vec<usize>, Members)> = Vec::new();
    let kept = RuleOutcome {
        left: 0,
        config: ConfigChange::Kept,
    };
    let mut rules: crate::backend::RuleOutcomes = smallvec::smallvec![kept; calls.len()];
    let mut at_ms = now;
    let mut times = vec![now; calls.len()];
    for group in groups(calls) {
        let sub: Vec<RuleCall<'_>> = group.iter().map(|&i| calls[i].clone()).collect();
        // (at the latest time an earlier slot's call was decided at: one sent again
        // while its slot was moved would otherwise date the later slots' back)
        let (outcome, members) = match backend.acquire_group(&sub, at_ms).await {
            Ok(answer) => answer,
            Err(err) => {
                give_back(backend, calls, &taken).await;
                return Err(err);
            }
        };
        at_ms = at_ms.max(outcome.at_ms);
        for (&i, rule) in group.iter().zip(&outcome.rules) {
            rules[i] = *rule;
            times[i] = outcome.at_ms;
        }
        if !outcome.granted {
            give_back(backend, calls, &taken).await;
            // The earlier slots' permits are back: report them as available.
            for (group, _) in &taken {
                for &i in group {
                    rules[i].left += calls[i].permits;
                }
            }
            let refused = Outcome {
                granted: false,
                refused: outcome.refused.map(|r| group[r]),
                retry_ms: outcome.retry_ms,
                at_ms,
                rules,
            };
            return Ok((refused, sent, times));
        }
        for (&i, member) in group.iter().zip(&members) {
            sent[i] = *member;
        }
        taken.push((group, members));
    }
    let granted = Outcome {
        granted: true,
        refused: None,
        retry_ms: 0,
        at_ms,
        rules,
    };
    Ok((granted, sent, times))
}

/// Settles `calls` on `backend`, one script call per slot (one in all off a cluster).
pub(crate) async fn settle(
    backend: &RedisBackend,
    calls: &[SettleCall<'_>],
    now: u64,
) -> Result<Vec<SettleOutcome>, Error> {
    let slot = |c: &SettleCall<'_>| hash_slot(c.keys.config().as_bytes());
    if !backend.is_cluster() || calls.iter().all(|c| Some(slot(c)) == calls.first().map(slot)) {
        return backend.settle(calls, now).await;
    }
    let nothing = SettleOutcome {
        applied: false,
        left: None,
    };
    let mut settled = vec![nothing; calls.len()];
    let mut slots: Vec<u16> = calls.iter().map(slot).collect();
    slots.sort_unstable();
    slots.dedup();
    for at in slots {
        let group: Vec<usize> = (0..calls.len()).filter(|&i| slot(&calls[i]) == at).collect();
        let sub: Vec<SettleCall<'_>> = group.iter().map(|&i| calls[i].clone()).collect();
        for (i, done) in group.into_iter().zip(backend.settle(&sub, now).await?) {
            settled[i] = done;
        }
    }
    Ok(settled)
}

/// Refunds what earlier slots took; what cannot be refunded now is retried in the
/// background (it returns by itself when it leaves the window).
async fn give_back(backend: &RedisBackend, calls: &[RuleCall<'_>], taken: &[(Vec<usize>, Members)]) {
    for (group, members) in taken {
        crate::observe::refunded();
        let sub: Vec<RuleCall<'_>> = group.iter().map(|&i| calls[i].clone()).collect();
        if backend.refund(&sub, members).await.is_err() {
            backend.spawn_refund(&sub, members.clone());
        }
        // Token buckets get their tokens back once: a failed attempt may have applied,
        // and applying twice would grant more than the rate (failing leaves them spent).
        let _ = backend.refund_tokens(&sub).await;
    }
}
