//! Reserve, then settle: for costs known only after the call (the tokens a language
//! model used, the bytes a request sent). [`Client::reserve`] decides a call's rules
//! as [`Client::check_rules`] does, taking each rule's permits as an estimate, all or
//! nothing, in one round trip; [`Reservation::settle`] then tells every
//! [`settled`](Rule::settled) rule what the call actually used, in one round trip.
//!
//! A sliding window's grant keeps its time: what was not used goes back (as
//! Redisson's `release` adds to the value, up to the rate), and what was used beyond
//! the estimate is charged at the grant's time, even past the limit, and leaves the
//! window with the grant. A token bucket gets back what was not used, up to its
//! burst (a settle counts at least 1 token), or goes below zero by the excess and
//! refills from there. Either way later
//! calls wait until there is room again. So every window of a sliding-window rule
//! holds at most its rate plus the excess of the grants in it that overdrew (each at
//! most the rule's [`max_overdraft`](Rule::max_overdraft) when it has one).
//!
//! Here the reservation and its settle's steps; what a settle did in `settled.rs`,
//! where it runs and how long its caller waits in `settling.rs`, a settle sent again
//! in the background in `retry.rs`.

mod retry;
mod settled;
mod settling;

pub use settled::{RuleSettled, Settled};

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::algorithm::segments::{LEAST_ID, MOST_ID};

use crate::backend::{Members, RuleCall, RuleOutcome, SettleCall};
use crate::keys::LimiterKeys;
use crate::observe::{settle_counters, SettleCounters};
use crate::rules::rule::{merge, Merged};
use crate::{BucketShape, Client, Decision, Error, RateLimiterConfig, Rule, MAX_PERMITS};

/// The answer to [`Client::reserve`].
#[derive(Debug)]
#[must_use = "a reservation granted holds its estimate until it is settled"]
pub enum Reserved {
    /// Every rule had room for its estimate, now taken: settle it once the call knows
    /// what it used.
    Granted(Reservation),
    /// A rule refused (nothing was taken): its decision, with `retry_after`.
    Refused(Decision),
}

/// A call's grants, taken as estimates, to settle with what the call used.
///
/// Settle it once with [`settle`](Reservation::settle) (every settled rule the same
/// amount) or [`settle_each`](Reservation::settle_each) (an amount per settled rule);
/// either takes the reservation, so it cannot be settled twice. A reservation dropped
/// without settling keeps its estimates counted: never fewer than were reserved.
#[derive(Debug)]
pub struct Reservation {
    client: Client,
    decision: Decision,
    grants: Vec<Grant>,
}

/// The amounts a settle counts, one per settled rule, inline for a few.
pub(crate) type Amounts = SmallVec<[u64; 4]>;

/// One limiter's grant in a reservation.
#[derive(Debug)]
struct Grant {
    keys: LimiterKeys,
    /// Its limiter's name hashed as its rule keeps it.
    name_hash: u64,
    config: RateLimiterConfig,
    bucket: Option<BucketShape>,
    member: [u8; crate::member::MEMBER_LEN],
    estimate: u64,
    /// The permits the grant left the limiter.
    left: u64,
    /// A token bucket's refill at the grant: the decision's time, or across a
    /// cluster's slots, its own slot's.
    refilled_at: u64,
    /// A settled token bucket's: the id its grant opened a segment under (0: none).
    segment: u64,
    /// The index of the grant's (first) rule among the reservation's rules.
    first: usize,
    /// The rule's index when it is settled (`None`: it counts its permits as taken).
    settled: Option<usize>,
    max_overdraft: Option<u64>,
    /// A settled grant's metrics, under the `rule` label of a rule's template, or
    /// `by_hand` (`None`: not settled, so not counted).
    counters: Option<Arc<SettleCounters>>,
}

impl Client {
    /// Decides `rules` as [`check_rules`](Client::check_rules) does (all or nothing, one
    /// round trip, the same refusal and `retry_after`), taking each rule's permits as
    /// the call's estimate, and answers the reservation to settle once the call knows
    /// what it used (see [`Rule::settled`]).
    ///
    /// Refused as misuse, before anything is taken: a rule that batches
    /// ([`Rule::batch`]: a batch's permits are served in process, with no grant of
    /// their own to settle), and a settled rule naming the same limiter as another rule
    /// of the call.
    pub async fn reserve(&self, rules: &[Rule]) -> Result<Reserved, Error> {
        self.reserve_labelled(rules, None).await
    }

    /// [`reserve`](Client::reserve), each rule's metrics labelled with `labels` (one
    /// per rule: the templates of an engine's rules), or `by_hand`.
    pub(crate) async fn reserve_labelled(
        &self,
        rules: &[Rule],
        labels: Option<&[Cow<'static, str>]>,
    ) -> Result<Reserved, Error> {
        crate::rules::rule::check_rule_count(rules)?;
        // (before the merge, which refuses some rules naming one limiter: a settled rule
        // among them is refused as such)
        check_reservable(rules)?;
        let merged = merge(rules)?;
        let keys = self.rules_keys(rules)?;
        let now = self.now_ms();
        if let Some(kept) = self.backend().kept_refusal(rules, now) {
            return Ok(Reserved::Refused(kept));
        }
        let mut calls = crate::backend::decisions::merged_calls(rules, &keys, &merged);
        // A settled grant of a token bucket opens a segment, under an id of its own
        // (of 15 digits, as the scripts keep ids), that its settle reads.
        for (call, m) in calls.iter_mut().zip(merged.iter()) {
            let opens = call.bucket.is_some() && call.permits > 0 && rules[m.config].is_settled();
            call.reserved = opens.then(|| LEAST_ID + rand::random::<u64>() % (MOST_ID - LEAST_ID + 1));
        }
        // (in process, each limiter's name hashed as its first rule keeps it, and the
        // settled grants' limiters held as they are decided)
        let hashes: SmallVec<[u64; 4]> = merged.iter().map(|m| rules[m.first].name_hash()).collect();
        let pinned: SmallVec<[bool; 4]> = merged.iter().map(|m| rules[m.config].is_settled()).collect();
        let (outcome, members, times) = self.backend().reserve(&calls, (&hashes, &pinned), now).await?;
        let decision = crate::backend::decisions::merged_decision(rules, &merged, &outcome, || self.now_ms());
        if !decision.allowed {
            return Ok(Reserved::Refused(decision));
        }
        // Refusals this client kept of them dropped on a grant, as a call's grant
        // drops them.
        for rule in rules {
            self.forget_refusal(rule.name());
        }
        let reservation = Reservation {
            client: self.clone(),
            decision,
            grants: self.grants(
                rules,
                (&merged, &calls),
                (&members, &hashes, &outcome.rules),
                (times.as_deref(), outcome.at_ms),
                labels,
            ),
        };
        for grant in &reservation.grants {
            if let Some(counters) = &grant.counters {
                counters.reserved(grant.estimate);
            }
        }
        Ok(Reserved::Granted(reservation))
    }

    /// A reservation's grants, one per merged call; `times`, each call's decided time
    /// when not all were decided at `at_ms` (across a cluster's slots).
    fn grants(
        &self,
        rules: &[Rule],
        (merged, calls): (&[Merged], &[RuleCall<'_>]),
        (members, hashes, outcomes): (&Members, &[u64], &[RuleOutcome]),
        (times, at_ms): (Option<&[u64]>, u64),
        labels: Option<&[Cow<'static, str>]>,
    ) -> Vec<Grant> {
        merged
            .iter()
            .zip(members)
            .zip(hashes)
            .zip(outcomes)
            .enumerate()
            .map(|(i, (((m, member), &name_hash), outcome))| {
                let rule = &rules[m.config];
                Grant {
                    // (the rule's name checked with the call's keys)
                    keys: LimiterKeys::checked_before(rule.name().to_owned(), self.shared_client_id()),
                    name_hash,
                    config: *rule.config(),
                    bucket: rule.shape(),
                    member: *member,
                    estimate: m.permits,
                    left: outcome.left,
                    refilled_at: times.map_or(at_ms, |times| times[i]),
                    segment: calls[i].reserved.unwrap_or(0),
                    first: m.first,
                    settled: rule.is_settled().then_some(m.first),
                    max_overdraft: rule.overdraft_cap(),
                    counters: rule.is_settled().then(|| {
                        settle_counters(
                            labels
                                .and_then(|labels| labels.get(m.first).cloned())
                                .unwrap_or(Cow::Borrowed(BY_HAND)),
                        )
                    }),
                }
            })
            .collect()
    }
}

/// The `rule` label of a reservation made by hand's metrics: its rules' names hold
/// callers' values, and a label's values must be few.
const BY_HAND: &str = "by_hand";

/// See [`Reservation::mark_ms`].
const MARK_MARGIN_MS: u64 = 60_000;

/// Refuses what a reservation cannot settle (see [`Client::reserve`]).
fn check_reservable(rules: &[Rule]) -> Result<(), Error> {
    let invalid = |rule: &Rule, problem: &str| Error::InvalidReservation {
        name: rule.name().to_owned(),
        problem: problem.to_owned(),
    };
    if let Some(rule) = rules.iter().find(|r| r.batch_size() > 1) {
        return Err(invalid(
            rule,
            "the rule takes batches (Rule::batch), whose permits have no grant of their own \
             to settle; reserve with rules of batch 1",
        ));
    }
    for rule in rules {
        let named = rules.iter().filter(|r| r.name() == rule.name());
        if named.clone().count() > 1 && named.clone().any(Rule::is_settled) {
            return Err(invalid(
                rule,
                "a settled rule names the same limiter as another rule of the call; give \
                 the settled rule a limiter of its own",
            ));
        }
    }
    Ok(())
}

impl Reservation {
    /// The decision that granted the reservation.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// Each limiter's permits left by the grant, with the index of its (first) rule
    /// among the reservation's rules, its rate and its window.
    pub fn left(&self) -> impl Iterator<Item = (usize, u64, u64, Duration)> + '_ {
        self.grants
            .iter()
            .map(|g| (g.first, g.left, g.config.rate, g.config.interval))
    }

    /// Settles every settled rule with `actual`, the amount the call used (in one
    /// round trip; none when every rule used its estimate).
    ///
    /// When the backend fails, the error is answered and the settle is sent again in
    /// the background until it lands or its grants have left their windows (an
    /// abandoned settle is counted in `redlimit_settles_abandoned_total`): it is never
    /// dropped silently, and a settle sent twice counts once.
    ///
    /// The settle is under way once this is first polled: in Redis it is sent from a
    /// task of its own, so a caller that goes away before the answer (a client
    /// disconnected, a `select!` branch taken, a timeout) leaves it to land.
    ///
    /// A reservation with no settled rule ([`Rule::settled`](crate::Rule::settled)) has
    /// nothing to settle `actual` on: refused as misuse (`Error::InvalidReservation`),
    /// its estimates staying counted, rather than answered as if the amount counted.
    pub async fn settle(self, actual: u64) -> Result<Settled, Error> {
        let count = self.grants.iter().filter(|g| g.settled.is_some()).count();
        if count == 0 {
            return Err(Error::InvalidReservation {
                name: self.grants.first().map_or("", |g| g.keys.config()).to_owned(),
                problem: "no rule of this reservation is settled, so the amount would count \
                          nowhere; mark the rules the call's usage settles with Rule::settled"
                    .to_owned(),
            });
        }
        self.start_settle(smallvec::smallvec![actual; count]).await
    }

    /// Settles each settled rule with its own amount: `actual` holds one per settled
    /// rule, in the order of the rules (refused as misuse, settling nothing,
    /// otherwise). Under way once first polled, as [`settle`](Reservation::settle) is.
    pub async fn settle_each(self, actual: &[u64]) -> Result<Settled, Error> {
        self.start_settle(Amounts::from_slice(actual)).await
    }

    /// The settle itself, where it is polled: see [`start_settle`](Reservation::start_settle).
    async fn settle_here(self, actual: &[u64]) -> Result<Settled, Error> {
        let settled: SmallVec<[&Grant; 4]> = self.grants.iter().filter(|g| g.settled.is_some()).collect();
        if actual.len() != settled.len() {
            let name = settled.first().map_or("", |g| g.keys.config()).to_owned();
            return Err(Error::InvalidReservation {
                name,
                problem: format!(
                    "{} amounts given to settle {} settled rules; give one per rule marked \
                     Rule::settled, in their order",
                    actual.len(),
                    settled.len()
                ),
            });
        }
        let mut report = Settled { rules: Vec::new() };
        for (grant, &used) in settled.iter().zip(actual) {
            let counted = grant.counted(used);
            report.rules.push(RuleSettled {
                rule: grant.settled.unwrap_or(0),
                name: grant.keys.config().to_owned(),
                estimate: grant.estimate,
                counted,
                uncharged: used.saturating_sub(counted),
                applied: true,
                remaining: grant.left,
            });
        }
        let calls: SmallVec<[SettleCall<'_>; 2]> = settled
            .iter()
            .zip(&report.rules)
            .filter(|(_, r)| r.counted != r.estimate)
            .map(|(grant, r)| grant.call(self.decision.at_ms, r.counted, self.mark_ms()))
            .collect();
        if calls.is_empty() {
            self.observe(&report);
            return Ok(report);
        }
        let changed: SmallVec<[usize; 4]> = (0..report.rules.len())
            .filter(|&i| report.rules[i].counted != report.rules[i].estimate)
            .collect();
        let sent = self.client.backend().settle(&calls, self.client.now_ms()).await;
        // A settle changes its limiters (permits back, or an excess), landed or maybe
        // landed: refusals this client kept of them are no longer Redis's answer.
        for &i in &changed {
            self.client.forget_refusal(&report.rules[i].name);
        }
        match sent {
            Ok(outcomes) => {
                let mut left: SmallVec<[Option<u64>; 4]> = smallvec::smallvec![None; report.rules.len()];
                for (i, outcome) in changed.into_iter().zip(outcomes) {
                    report.rules[i].applied = outcome.applied;
                    left[i] = outcome.left;
                }
                for ((grant, rule), left) in settled.iter().zip(&mut report.rules).zip(left) {
                    rule.remaining = left.unwrap_or_else(|| grant.left_after(rule));
                }
                self.observe(&report);
                Ok(report)
            }
            Err(error) => {
                if error.is_backend_failure() {
                    let labels = settled
                        .iter()
                        .zip(&report.rules)
                        .filter(|(_, r)| r.counted != r.estimate)
                        .filter_map(|(grant, _)| grant.label());
                    retry::spawn(&self.client, &calls, labels.collect(), self.retried_until());
                }
                Err(error)
            }
        }
    }

    /// The labels of the settled rules whose settle `actual` sends (what they count
    /// is not their estimate), each once, as a settle abandoned counts them; none when
    /// `actual` is not one amount per settled rule (refused before anything is sent).
    fn sent_labels(&self, actual: &[u64]) -> Vec<Cow<'static, str>> {
        let settled: SmallVec<[&Grant; 4]> = self.grants.iter().filter(|g| g.settled.is_some()).collect();
        if settled.len() != actual.len() {
            return Vec::new();
        }
        let sent = settled
            .iter()
            .zip(actual)
            .filter(|(g, &used)| g.counted(used) != g.estimate);
        let mut labels: Vec<Cow<'static, str>> = sent.filter_map(|(g, _)| g.label()).collect();
        labels.sort();
        labels.dedup();
        labels
    }

    /// Counts what a settle did, rule by rule, under each rule's label.
    fn observe(&self, report: &Settled) {
        let settled = self.grants.iter().filter(|g| g.settled.is_some());
        for (grant, rule) in settled.zip(&report.rules) {
            if let Some(counters) = &grant.counters {
                counters.settled(rule);
            }
        }
    }

    /// How long a token bucket's settle mark is kept: until the settle cannot be sent
    /// again (its last grant has left its window), and a minute more for an attempt
    /// sent before then that a slow server runs late.
    fn mark_ms(&self) -> u64 {
        self.retried_until().saturating_sub(self.client.now_ms()) + MARK_MARGIN_MS
    }

    /// Until when a settle the backend did not take is sent again (epoch ms): until the
    /// last of the grants leaves its window, and for a settle made later (a response
    /// streamed for longer than the interval, whose excess is charged when it is
    /// settled), for one interval more from now.
    fn retried_until(&self) -> u64 {
        let longest = self.grants.iter().map(|g| g.config.interval).max();
        let longest = longest.unwrap_or(Duration::ZERO).as_millis() as u64;
        (self.decision.at_ms + longest).max(self.client.now_ms() + longest)
    }
}

impl Drop for Reservation {
    /// Settled or not, its grants no longer hold their limiters in process (held as
    /// they were decided, so that none was let go at the bound before its settle).
    fn drop(&mut self) {
        if let Some(memory) = self.client.backend().in_process() {
            let settled = self.grants.iter().filter(|g| g.settled.is_some());
            memory.let_go(settled.map(|g| (g.keys.config(), g.name_hash)));
        }
    }
}

impl Grant {
    /// A settled grant's `rule` label.
    fn label(&self) -> Option<Cow<'static, str>> {
        self.counters.as_ref().map(|c| c.label.clone())
    }

    /// What a settle of `used` counts for this grant: at most its estimate and its
    /// overdraft cap, and at most `MAX_PERMITS`; a token bucket's, at least 1. (Each
    /// settle of a bucket leaves a mark in Redis for as long as it may be sent again,
    /// an interval and a minute: a grant given back whole would let calls, and their
    /// marks, through without bound. At 1 a grant, they are bounded by the rule.)
    fn counted(&self, used: u64) -> u64 {
        let most = self
            .estimate
            .saturating_add(self.max_overdraft.unwrap_or(u64::MAX));
        let least = u64::from(self.bucket.is_some());
        used.max(least).min(most).min(MAX_PERMITS)
    }

    /// The permits its limiter has left after `settled` (see [`RuleSettled::remaining`]).
    fn left_after(&self, settled: &RuleSettled) -> u64 {
        if !settled.applied {
            return self.left;
        }
        let most = self.bucket.map_or(self.config.rate, |shape| shape.burst);
        if settled.counted <= self.estimate {
            let back = self.estimate - settled.counted;
            self.left.saturating_add(back).min(most.max(self.left))
        } else {
            self.left.saturating_sub(settled.counted - self.estimate)
        }
    }

    /// The settle of this grant at `counted` permits.
    fn call(&self, at: u64, counted: u64, mark_ms: u64) -> SettleCall<'_> {
        SettleCall {
            keys: self.keys.borrowed(),
            rule: &self.config,
            bucket: self.bucket,
            member: &self.member,
            // (a window's grant is found at its time; a bucket's room counts the
            // refill from its bucket's)
            at: if self.bucket.is_some() {
                self.refilled_at
            } else {
                at
            },
            estimate: self.estimate,
            actual: counted,
            segment: self.segment,
            room: self.bucket.map_or(0, |shape| {
                crate::algorithm::bucket::grant_room(
                    shape.burst,
                    self.config.interval_ms(),
                    self.estimate,
                    self.left,
                )
            }),
            mark_ms,
            name_hash: Some(self.name_hash),
        }
    }
}
