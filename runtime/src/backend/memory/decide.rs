//! A decision over one or more rules, as `lua/acquire.lua` makes it (and
//! `lua/tokens.lua` for token buckets alone), phase for phase and name for name, in
//! its order: Phase 1 `load_rule` (`load.rs`), `settle_time`, Phase 2 `plan_bucket`
//! and `take` (`plan.rs`), Phase 3 `commit` (`commit.rs`) and Phase 4 `reply` (here).
//! The arithmetic of each step is `crate::algorithm`'s. This file holds the entry
//! points: the usual call of one rule, and of several on limiters held with their
//! rules' configs, is decided first by `usual.rs`, which leaves every other case to the phases, and a decision
//! that creates limiters takes room for them from the bound first.

use std::sync::MutexGuard;

use super::commit::{commit, Decided};
use super::idle::Idle;
use super::load::{load_rules, Resolved};
use super::plan::{plan_and_take, BucketPlan};
use super::state::Store;
use super::usual::{decide_one, decide_several, decide_tokens_one, RuleDecision};
use super::{shard_of, Locked, MemoryBackend, AT_BOUND, PER_NEW};
use crate::algorithm::call_time::settle_time;
use crate::algorithm::window;
use crate::backend::Members;
use crate::backend::{Outcome, RuleCall, RuleOutcome};
use crate::Error;

/// The names' hashes of a decision's calls, inline for a few.
pub(crate) type Hashes = smallvec::SmallVec<[u64; 4]>;

impl MemoryBackend {
    pub async fn acquire(&self, calls: &[RuleCall<'_>], clock_now: u64) -> Result<Outcome, Error> {
        self.decide_calls(calls, clock_now)
    }

    /// The decision of `calls` (nothing in process waits).
    pub fn decide_calls(&self, calls: &[RuleCall<'_>], clock_now: u64) -> Result<Outcome, Error> {
        let hashes: Hashes = calls.iter().map(|c| self.hash(c.keys.config())).collect();
        self.decide_hashed(calls, &hashes, clock_now)
    }

    /// The decision of `calls`, whose names hash to `hashes` (as
    /// [`name_hash`](crate::keys::name_hash) hashes them: the hashes rules keep).
    pub fn decide_hashed(
        &self,
        calls: &[RuleCall<'_>],
        hashes: &[u64],
        clock_now: u64,
    ) -> Result<Outcome, Error> {
        if let ([call], [hash]) = (calls, hashes) {
            return self.decide_rule(call, *hash, clock_now);
        }
        self.sweep_in_turn(clock_now);
        let mut locked = self.lock_all(hashes);
        if let Some(outcome) = decide_several(&mut locked, calls, hashes, clock_now) {
            return Ok(outcome);
        }
        decide(self, &mut locked, calls, hashes, clock_now)
    }

    /// A reservation's decision of `calls`: the outcome, and for each call the log
    /// member its settle finds the grant by, made under the shards' locks: for a
    /// sliding window's grant, the epoch of the log it was written to and the tag now
    /// written on its entry (see [`epoch_member`](super::epoch_member)); for a token
    /// bucket's, or none written, a member of neither. `hashes`: each call's name's
    /// hash ([`hash`](MemoryBackend::hash)). A granted call whose `pinned` is true holds
    /// its limiter until [`let_go`](MemoryBackend::let_go) lets it go. On limiters held with
    /// their rules' configs the usual path of several rules decides it (one rule too),
    /// the phases otherwise.
    pub fn reserve(
        &self,
        calls: &[RuleCall<'_>],
        hashes: &[u64],
        pinned: &[bool],
        clock_now: u64,
    ) -> Result<(Outcome, Members), Error> {
        debug_assert!(calls
            .iter()
            .zip(hashes)
            .all(|(c, &h)| h == self.hash(c.keys.config())));
        debug_assert_eq!(pinned.len(), calls.len());
        self.sweep_in_turn(clock_now);
        let mut locked = self.lock_all(hashes);
        let outcome = match decide_several(&mut locked, calls, hashes, clock_now) {
            Some(outcome) => outcome,
            None => decide(self, &mut locked, calls, hashes, clock_now)?,
        };
        let members = calls
            .iter()
            .zip(hashes)
            .zip(pinned)
            .map(|((call, &hash), &pin)| {
                let unmarked = super::epoch_member(0, 0);
                if !outcome.granted {
                    return unmarked;
                }
                let Some(limiter) = locked.store(hash).limiters.get_hashed(hash, call.keys.config()) else {
                    return unmarked;
                };
                if pin {
                    limiter.pins = limiter.pins.saturating_add(1);
                }
                let kind = match (call.bucket, call.rule) {
                    (None, Some(rule)) if call.permits > 0 => rule.rate_type,
                    _ => return unmarked,
                };
                match limiter.bucket(kind, clock_now) {
                    Some(bucket) => {
                        let tag = rand::random::<u32>().max(1);
                        let tagged = bucket.tag_grant(outcome.at_ms, call.permits, tag);
                        super::epoch_member(bucket.epoch, if tagged { tag } else { 0 })
                    }
                    None => unmarked,
                }
            })
            .collect();
        Ok((outcome, members))
    }

    /// [`decide_hashed`](MemoryBackend::decide_hashed) always through the phases: what
    /// the usual calls are held to.
    #[cfg(test)]
    pub(super) fn decide_phased(
        &self,
        calls: &[RuleCall<'_>],
        hashes: &[u64],
        clock_now: u64,
    ) -> Result<Outcome, Error> {
        self.sweep_in_turn(clock_now);
        decide(self, &mut self.lock_all(hashes), calls, hashes, clock_now)
    }

    /// The decision of one rule, whose name hashes to `hash`.
    pub fn decide_rule(&self, call: &RuleCall<'_>, hash: u64, clock_now: u64) -> Result<Outcome, Error> {
        match self.decide_one_rule(call, hash, None, clock_now)? {
            RuleDecision::Usual(usual) => Ok(usual.outcome()),
            RuleDecision::Phased(outcome) => Ok(outcome),
        }
    }

    /// The decision of one rule, whose name hashes to `hash`: one shard, and the usual
    /// calls (a sliding window's, a token bucket's, on a limiter held with the rule's
    /// config) decided on their own, without the phases' lists. `window_ms`: the
    /// rule's interval and keep-alive in ms, when its caller keeps them
    /// ([`Rule::window_ms`](crate::Rule::window_ms)).
    #[inline(always)]
    pub fn decide_one_rule(
        &self,
        call: &RuleCall<'_>,
        hash: u64,
        window_ms: Option<(u64, u64)>,
        clock_now: u64,
    ) -> Result<RuleDecision, Error> {
        self.sweep_in_turn(clock_now);
        let mut store = self.lock_shard(shard_of(hash));
        let usual = match call.bucket {
            None => decide_one(&mut store, call, hash, window_ms, clock_now),
            Some(shape) => decide_tokens_one(&mut store, call, shape, hash, window_ms, clock_now),
        };
        match usual {
            Some(usual) => Ok(RuleDecision::Usual(usual)),
            // (a copy made only here: the usual call reads its parts where they are)
            None => self
                .decide_other(store, call.clone(), hash, clock_now)
                .map(RuleDecision::Phased),
        }
    }

    /// Any other call of one rule: the phases.
    #[cold]
    #[inline(never)]
    fn decide_other(
        &self,
        store: MutexGuard<'_, Store>,
        call: RuleCall<'_>,
        hash: u64,
        now: u64,
    ) -> Result<Outcome, Error> {
        decide(
            self,
            &mut Locked::One(store),
            std::slice::from_ref(&call),
            &[hash],
            now,
        )
    }

    /// Room for the limiters a decision of `calls` creates (the names not held yet,
    /// each once), taken from the bound; at the bound, after sweeping their shards for
    /// expired limiters. Answers the first call of each new name.
    fn make_room(
        &self,
        locked: &mut Locked<'_>,
        calls: &[RuleCall<'_>],
        hashes: &[u64],
        now: u64,
    ) -> Result<Vec<usize>, Error> {
        let new = |locked: &mut Locked<'_>| -> Vec<usize> {
            (0..calls.len())
                .filter(|&i| {
                    let name = calls[i].keys.config();
                    !calls[..i].iter().any(|c| c.keys.config() == name)
                        && !locked.store(hashes[i]).limiters.contains(hashes[i], name)
                })
                .collect()
        };
        let mut fresh = new(locked);
        if self.room.take(fresh.len()) {
            return Ok(fresh);
        }
        // Dropping expired limiters changes no answer already computed (an expired
        // limiter decides as a missing one), but a call's own may go: count again.
        for &i in &fresh {
            self.sweep(locked.store(hashes[i]), now, AT_BOUND, Idle::Drop);
        }
        fresh = new(locked);
        if self.room.take(fresh.len()) {
            return Ok(fresh);
        }
        // Then one at a time, letting go limiters rules made (none of this call's):
        // each one's room handed straight to a new limiter.
        for (n, &i) in fresh.iter().enumerate() {
            if !self.room.take(1) && !self.evict(locked.store(hashes[i]), now, hashes) {
                // None inserted: the room taken, and the room let-go limiters left, is
                // the bound's again.
                self.room.give_back(n);
                return Err(self.room.refuse(calls[i].keys.config()));
            }
        }
        Ok(fresh)
    }

    /// The limiters of `calls` not held and remembered by their shard's summary, made
    /// again from their traces before the decision reads them (room taken for each).
    fn recall_calls(
        &self,
        locked: &mut Locked<'_>,
        calls: &[RuleCall<'_>],
        hashes: &[u64],
        now: u64,
    ) -> Result<(), Error> {
        for (i, call) in calls.iter().enumerate() {
            let store = locked.store(hashes[i]);
            let name = call.keys.config();
            if store.summary.is_empty() || store.limiters.contains(hashes[i], name) {
                continue;
            }
            self.recall(store, hashes[i], name, now, hashes, call.rule.is_some())?;
        }
        Ok(())
    }
}

/// The decision of `calls`, whose names hash to `hashes`, on their locked shards:
/// acquire.lua's phases, in its order.
pub(super) fn decide(
    backend: &MemoryBackend,
    locked: &mut Locked<'_>,
    calls: &[RuleCall<'_>],
    hashes: &[u64],
    clock_now: u64,
) -> Result<Outcome, Error> {
    // Limiters let go at the bound come back from their traces first: the decision
    // then reads them as held.
    backend.recall_calls(locked, calls, hashes, clock_now)?;
    // Phase 1, load_rule: each call's config, and the newest grant of its bucket.
    let (mut resolved, newest) = load_rules(locked, calls, hashes, clock_now)?;
    let now = settle_time(newest, clock_now);
    // Phase 2, plan_bucket and take: each bucket once, then each call's permits,
    // writing nothing.
    let (plans, refused, retry) = plan_and_take(locked, calls, &mut resolved, now, clock_now);
    let granted = refused.is_none();
    // Phase 3, commit (a call that only asks what is available writes nothing).
    if calls.iter().any(|c| c.permits > 0) {
        let decided = Decided {
            resolved: &resolved,
            plans: &plans,
            granted,
            now,
            clock_now,
        };
        let fresh = backend.make_room(locked, calls, hashes, clock_now)?;
        commit(locked, calls, &decided);
        for &i in &fresh {
            // Made by this call: a rule's may be let go at the bound.
            if let Some(limiter) = locked
                .store(hashes[i])
                .limiters
                .get_hashed(hashes[i], calls[i].keys.config())
            {
                limiter.by_rule = calls[i].rule.is_some();
            }
        }
        // Each new limiter pays for sweeping its share of the table, after the writes
        // (before them, a sweep could drop a limiter the writes then create again,
        // uncounted).
        for &i in &fresh {
            backend.sweep(locked.store(hashes[i]), clock_now, PER_NEW, Idle::Keep);
        }
    }
    // Phase 4, reply.
    Ok(Outcome {
        granted,
        refused,
        retry_ms: if granted { 0 } else { retry.max(0) as u64 },
        at_ms: now,
        rules: reply(calls, &resolved, &plans, granted),
    })
}

/// Phase 4, reply: each rule's permits (or tokens) left and what happened to its config.
fn reply(
    calls: &[RuleCall<'_>],
    resolved: &[Resolved],
    plans: &[BucketPlan],
    granted: bool,
) -> crate::backend::RuleOutcomes {
    resolved
        .iter()
        .zip(calls)
        .map(|(r, call)| {
            let left = match &r.tokens {
                Some(tokens) => tokens.left(if granted { call.permits } else { 0 }),
                None => window::left(plans[r.plan].value, plans[r.plan].spent, granted),
            };
            RuleOutcome {
                left,
                config: r.change,
            }
        })
        .collect()
}
