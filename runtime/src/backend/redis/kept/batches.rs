//! Hot limits served in batches: a rule with [`batch`](crate::Rule::batch) `k` takes
//! up to `k` permits from Redis in one grant, and this client serves them to later
//! calls of the same rule for at most the batch's lease, giving back what it did not
//! use when the lease ends (`lua/give_back.lua`, through the batch's own log member).
//!
//! Per limiter, one caller at a time takes the next batch (the slot's lock is held
//! across the round trip, so concurrent callers wait for it rather than each taking
//! one): a client holds at most one open batch per limiter at any instant, which is
//! what the bound of a window of `interval` (`rate + N * k`) rests on. A permit is
//! never served after its batch's lease ended, nor more than the batch holds, nor
//! after its limiter was reset (`shared::resets`: at once by the client resetting it,
//! within about a second by every other).
//!
//! Only calls of one rule batch, on Redis clients, for at most `k` permits; the rest
//! go to Redis as before. At most `MAX_ENTRIES` limiters are kept per client (a std
//! `HashMap`, whose hasher is keyed per process: names carry callers' values); with
//! that many batches open, a call on another limiter goes to Redis unbatched.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backend::decisions::one_rule_decision;
use crate::backend::redis::ongoing::Ongoing;
use crate::backend::redis::RedisBackend;
use crate::backend::{Outcome, RuleCall};
use crate::keys::Keys;
use crate::member::MEMBER_LEN;
use crate::{Decision, Error, LimiterKeys, Rule};

/// Limiters whose batches one client keeps, at most.
pub(crate) const MAX_ENTRIES: usize = 10_000;

/// How often, at least and at most, the sweeper looks for leases that ended.
const SWEEP_MIN: Duration = Duration::from_millis(5);
const SWEEP_MAX: Duration = Duration::from_secs(1);

/// Permits taken from Redis in one grant, served here until its lease ends.
#[derive(Debug)]
pub(crate) struct Batch {
    /// The log member Redis counted the batch under (its id and `taken`).
    member: [u8; MEMBER_LEN],
    taken: u64,
    used: u64,
    /// When Redis counted the batch, and the permits it had left then.
    at_ms: u64,
    redis_left: u64,
    /// The lease's end, on this client's clock (taken at + lease), and in real time:
    /// a client's clock that stalls or steps back (a manual one, a clock set back)
    /// does not stretch the lease.
    until_ms: u64,
    deadline: std::time::Instant,
    /// Its slot's count of resets when it was taken: once the limiter is reset
    /// (another count), it serves nothing.
    resets: u64,
}

impl Batch {
    /// Whether the lease is over at `now`, on the client's clock or in real time.
    fn ended(&self, now: u64) -> bool {
        now >= self.until_ms || std::time::Instant::now() >= self.deadline
    }

    /// Milliseconds until the lease ends, at `now` (the earlier of its two ends).
    fn left_ms(&self, now: u64) -> u64 {
        let real = self.deadline.saturating_duration_since(std::time::Instant::now());
        (self.until_ms.saturating_sub(now)).min(u64::try_from(real.as_millis()).unwrap_or(u64::MAX))
    }

    /// A grant of `permits` from the batch at `now`, when its lease runs and it holds
    /// them.
    fn serve(&mut self, permits: u64, now: u64) -> Option<Decision> {
        let left = self.taken - self.used;
        if self.ended(now) || left < permits {
            return None;
        }
        self.used += permits;
        Some(Decision {
            allowed: true,
            remaining: self.redis_left + (left - permits),
            retry_after: None,
            refused_by: None,
            at_ms: now.max(self.at_ms),
            tightest: Some(0),
        })
    }
}

/// One limiter's batch, and the rule it was taken for (a call of another rule on the
/// same limiter closes it).
#[derive(Default)]
struct State {
    rule: Option<Rule>,
    batch: Option<Batch>,
}

/// One limiter's batch, behind the lock its takes and give-backs hold; how many times
/// the limiter was reset ([`RedisBackend::end_batch`]): a batch taken before the last
/// reset, or while it was announced, serves nothing, whoever holds the lock; and
/// whether its batch was taken in the `per_client` mode.
#[derive(Default)]
struct Slot {
    state: tokio::sync::Mutex<State>,
    resets: AtomicU64,
    per_client: AtomicBool,
}

impl Slot {
    #[cfg(test)]
    fn new(state: State) -> Self {
        Slot {
            state: tokio::sync::Mutex::new(state),
            ..Default::default()
        }
    }

    /// Whether `batch` was taken since the limiter's last reset.
    fn current(&self, batch: &Batch) -> bool {
        batch.resets == self.resets.load(Ordering::Acquire)
    }

    /// The limiter reset: its batch serves nothing from now on. It stays in the slot
    /// until the next call of the limiter gives it back, under the slot's lock, before
    /// it takes the next (so the next take never finds it counted still), or the
    /// sweeper does when its lease ends. A batch taken `per_client` is counted in this
    /// client's own keys: a reset that left them (`per_client_keys` false) leaves it.
    fn end(&self, per_client_keys: bool) {
        if per_client_keys || !self.per_client.load(Ordering::Acquire) {
            self.resets.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// A client's batches, by limiter name.
#[derive(Default)]
pub(crate) struct Batches {
    on: bool,
    sweeping: Ongoing,
    /// With `MAX_ENTRIES` slots, when the next lease ends or a second passed, whichever
    /// is first (no room is looked for before: a caller naming a new limiter every call
    /// costs one scan of the slots then, not one per call).
    full_until: AtomicU64,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
}

impl Batches {
    pub(crate) fn new(on: bool) -> Self {
        Batches {
            on,
            ..Default::default()
        }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The slots whose batch's lease ended at `now`, by name, and the ms until the next
    /// lease ends. A slot in use is left alone.
    fn ended(&self, now: u64) -> (Vec<(String, Arc<Slot>)>, u64) {
        let mut ended = Vec::new();
        let mut next = u64::MAX;
        for (name, slot) in self.slots().iter() {
            let Ok(state) = slot.state.try_lock() else {
                continue;
            };
            match &state.batch {
                Some(batch) if batch.ended(now) => ended.push((name.clone(), slot.clone())),
                Some(batch) => next = next.min(batch.left_ms(now)),
                None => {}
            }
        }
        (ended, next)
    }

    /// Takes every batch whose lease ended at `now` (every batch, with `all`) out of
    /// its slot, drops slots with none (`evict`), and answers them with the ms until the
    /// next lease ends. A slot in use is left alone.
    fn close(&self, now: u64, all: bool, evict: bool) -> (Vec<(String, Batch)>, u64) {
        let mut closed = Vec::new();
        let mut next = u64::MAX;
        self.slots().retain(|name, slot| {
            // Held by a caller (who may lock it next): not dropped, nor closed when locked.
            let evict = evict && Arc::strong_count(slot) == 1;
            let Ok(mut state) = slot.state.try_lock() else {
                return true;
            };
            match &state.batch {
                Some(batch) if !all && !batch.ended(now) => {
                    next = next.min(batch.left_ms(now));
                    true
                }
                Some(_) => {
                    closed.extend(state.batch.take().map(|b| (name.clone(), b)));
                    !evict
                }
                None => !evict,
            }
        });
        (closed, next)
    }
}

impl RedisBackend {
    /// A call of `rule` alone for `permits` served from the limiter's open batch, when
    /// it has one for this rule with the permits, its lease running, and no caller is
    /// taking the next one: without awaiting anything, so a decision's future carries
    /// none of the taking's state.
    pub(crate) fn serve_batched(&self, rule: &Rule, permits: u64) -> Option<Decision> {
        let batches = &self.kept.batches;
        if !batches.on || permits > rule.batch_size() {
            return None;
        }
        let slots = batches.slots();
        let slot = slots.get(rule.name())?;
        let mut state = slot.state.try_lock().ok()?;
        if !state.rule.as_ref().is_some_and(|kept| same_batch(kept, rule)) {
            return None;
        }
        let now = self.now_ms();
        let batch = state.batch.as_mut().filter(|batch| slot.current(batch))?;
        batch.serve(permits, now)
    }

    /// A call of `rule` alone for `permits`, served from the limiter's batch or by
    /// taking the next one; `None` when this call does not batch (no batch on the
    /// rule, more permits than a batch holds, an in-process client, or every slot
    /// taken), so it goes to Redis as usual.
    pub(crate) async fn check_batched(
        self: &Arc<Self>,
        rule: &Rule,
        permits: u64,
    ) -> Option<Result<Decision, Error>> {
        if !self.kept.batches.on || rule.batch_size() <= 1 || permits > rule.batch_size() {
            return None;
        }
        let slot = self.batch_slot(rule.name())?;
        // Behind another caller's take of this limiter's batch for no longer than a call
        // of Redis may take: a hung server's queue of callers does not grow the wait of
        // each by one command timeout more.
        let timeout = self.timeout;
        let Ok(mut state) = tokio::time::timeout(timeout, slot.state.lock()).await else {
            return Some(Err(Error::Timeout {
                after: timeout,
                connecting: false,
            }));
        };
        // The resets counted before the next batch is taken: one announced while it is
        // on its way leaves it serving nothing.
        let resets = slot.resets.load(Ordering::Acquire);
        let now = self.now_ms();
        if state.rule.as_ref().is_some_and(|kept| same_batch(kept, rule)) {
            let current = state.batch.as_mut().filter(|b| b.resets == resets);
            if let Some(granted) = current.and_then(|b| b.serve(permits, now)) {
                return Some(Ok(granted));
            }
        } else {
            state.rule = Some(rule.clone());
        }
        // What an ended batch did not use is back in Redis before the next take, or the
        // take would count it still and refuse, and the refusal would be kept.
        if let Some(done) = state.batch.take() {
            self.give_back_now(rule.name(), done).await;
        }
        let keys = match self.rule_keys(rule) {
            Ok(keys) => keys,
            Err(err) => return Some(Err(err)),
        };
        if let Some(refused) = self.kept.refusals.answer(rule, permits, now) {
            return Some(Ok(refused));
        }
        // The mode of the batch on its way, for a reset read meanwhile (`Slot::end`).
        let per_client = rule.config().rate_type == crate::RateType::PerClient;
        slot.per_client.store(per_client, Ordering::Release);
        let taken = self.take_batch(rule, keys, permits, resets).await;
        Some(taken.map(|(decision, batch)| {
            if batch.is_some() {
                // (again if the one sweeping ran on a runtime that ended)
                self.start_sweeper();
            }
            state.batch = batch;
            decision
        }))
    }

    /// The slot of the limiter `name`, made when missing; `None` when `MAX_ENTRIES`
    /// limiters have batches open (closed ones make room first, given back).
    fn batch_slot(self: &Arc<Self>, name: &str) -> Option<Arc<Slot>> {
        let batches = &self.kept.batches;
        if let Some(slot) = batches.slots().get(name) {
            return Some(slot.clone());
        }
        let now = self.now_ms();
        if batches.slots().len() >= MAX_ENTRIES {
            if now < batches.full_until.load(Ordering::Relaxed) {
                return None;
            }
            let (closed, next) = batches.close(now, false, true);
            let next = next.min(SWEEP_MAX.as_millis() as u64);
            batches
                .full_until
                .store(now.saturating_add(next), Ordering::Relaxed);
            for (name, batch) in closed {
                self.give_back_batch(&name, batch);
            }
        }
        let mut slots = batches.slots();
        if slots.len() >= MAX_ENTRIES && !slots.contains_key(name) {
            return None;
        }
        let slot = slots.entry(name.to_owned()).or_default().clone();
        Some(slot)
    }

    /// Takes the batch for a call of `permits`: `k` permits; when refused with at
    /// least `permits` left, that many up to `k`, else `permits` alone (so the refusal
    /// answered is the call's own, with its wait): at most two round trips. Answers
    /// the call's decision, and the batch when it holds more than the call took,
    /// marked with the slot's count of `resets` before it was taken.
    async fn take_batch(
        self: &Arc<Self>,
        rule: &Rule,
        keys: Keys<'_>,
        permits: u64,
        resets: u64,
    ) -> Result<(Decision, Option<Batch>), Error> {
        let k = rule.batch_size();
        let mut now = self.now_ms();
        let mut started = std::time::Instant::now();
        let (mut decision, mut member) = self.take(rule, keys, k, now).await?;
        let mut asked = k;
        if !decision.allowed && decision.remaining.max(permits) < k {
            asked = decision.remaining.max(permits);
            now = self.now_ms();
            started = std::time::Instant::now();
            (decision, member) = self.take(rule, keys, asked, now).await?;
        }
        if !decision.allowed {
            return Ok((decision, None));
        }
        let batch = (asked > permits).then(|| Batch {
            member,
            taken: asked,
            used: permits,
            at_ms: decision.at_ms,
            redis_left: decision.remaining,
            until_ms: now.saturating_add(rule.batch_lease_ms()),
            deadline: started + Duration::from_millis(rule.batch_lease_ms()),
            resets,
        });
        decision.remaining += asked - permits;
        Ok((decision, batch))
    }

    /// One round trip for `permits` of `rule` at `now`: the decision, and the member
    /// a grant was counted under.
    async fn take(
        self: &Arc<Self>,
        rule: &Rule,
        keys: Keys<'_>,
        permits: u64,
        now: u64,
    ) -> Result<(Decision, [u8; MEMBER_LEN]), Error> {
        let call = RuleCall {
            keys,
            permits,
            rule: Some(rule.config()),
            bucket: rule.shape(),
            reserved: None,
        };
        let (outcome, member) = Box::pin(self.acquire_batch(&call, now)).await?;
        let decision = one_rule_decision(rule, &outcome, || self.now_ms());
        self.keep_refusal(rule, permits, &decision, now);
        Ok((decision, member))
    }

    /// Decides one call, answering the log member it was granted under (a batch
    /// gives back through it), in its span and timed.
    async fn acquire_batch(
        &self,
        call: &RuleCall<'_>,
        now: u64,
    ) -> Result<(Outcome, [u8; MEMBER_LEN]), Error> {
        let span = crate::backend::redis_span();
        let decided = async {
            let (outcome, members) = self.acquire_group(std::slice::from_ref(call), now).await?;
            Ok((outcome, members[0]))
        };
        let timed = crate::observe::redis(crate::observe::Operation::Acquire, decided);
        tracing::Instrument::instrument(timed, span).await
    }

    /// Gives back, off the caller's path, what `batch` of the limiter `name` did not
    /// use; a refusal this client keeps of the limiter is dropped (permits came back).
    fn give_back_batch(&self, name: &str, batch: Batch) {
        if let Some(keys) = self.unused(name, &batch) {
            self.spawn_give_back(keys, batch.member, batch.used);
        }
        self.kept.refusals.forget(name);
    }

    /// [`give_back_batch`](RedisBackend::give_back_batch), done (or failed within the
    /// command timeout) when it returns.
    async fn give_back_now(&self, name: &str, batch: Batch) {
        if let Some(keys) = self.unused(name, &batch) {
            self.give_back(&keys, batch.member, batch.used).await;
        }
        self.kept.refusals.forget(name);
    }

    /// Starts, once per client, the task that gives back batches whose lease ended
    /// while no call came for them, and reads the resets announced (which end
    /// batches) when the background task has not read them for a second.
    /// Started again when the runtime it ran on ended, or the connection moved.
    pub(super) fn start_sweeper(self: &Arc<Self>) {
        if !self.kept.batches.sweeping.needed(|| self.moving()) {
            return;
        }
        let weak = Arc::downgrade(self);
        self.keep_going(&self.kept.batches.sweeping, |turn| async move {
            while turn.still() {
                let next = {
                    let Some(redis) = weak.upgrade() else {
                        return;
                    };
                    // Each under its slot's lock, until Redis has it back: a caller of
                    // the limiter waits for it rather than take while Redis still counts
                    // it.
                    let (ended, next) = redis.kept.batches.ended(redis.now_ms());
                    for (name, slot) in ended {
                        let mut state = slot.state.lock().await;
                        let now = redis.now_ms();
                        if let Some(batch) = state.batch.take_if(|batch| batch.ended(now)) {
                            redis.give_back_now(&name, batch).await;
                        }
                    }
                    // The resets announced, which end batches: read here too, as the
                    // background task may not run on a client that only batches.
                    redis.read_announcements_if_due();
                    next
                };
                let pause = Duration::from_millis(next).clamp(SWEEP_MIN, SWEEP_MAX);
                tokio::time::sleep(pause).await;
            }
        });
    }
}

/// Whether a batch taken for `kept` serves a call of `rule`: the same limiter, config
/// and batch, whatever each call's permits (a layer's cost per request varies them; a
/// batch serves any number up to what it holds).
fn same_batch(kept: &Rule, rule: &Rule) -> bool {
    kept.name() == rule.name()
        && kept.config() == rule.config()
        && kept.counted_by() == rule.counted_by()
        && kept.batch_size() == rule.batch_size()
        && kept.batch_lease_ms() == rule.batch_lease_ms()
}

impl RedisBackend {
    /// The keys to give back to what `batch` of the limiter `name` did not use, if any.
    fn unused(&self, name: &str, batch: &Batch) -> Option<LimiterKeys> {
        if batch.used >= batch.taken {
            return None;
        }
        LimiterKeys::with_client(name.to_owned(), self.owner.client_id.clone()).ok()
    }

    /// Ends this client's batch of the limiter `name`, reset (with this client's
    /// `per_client` keys: `per_client_keys`): not one permit more is served from it,
    /// nor from one being taken (see [`Slot::end`]). See `shared::resets`.
    pub(crate) fn end_batch(&self, name: &str, per_client_keys: bool) {
        if let Some(slot) = self.kept.batches.slots().get(name) {
            slot.end(per_client_keys);
        }
    }

    /// [`end_batch`](RedisBackend::end_batch) of every limiter: resets may have been
    /// missed, whatever keys they deleted.
    pub(crate) fn end_every_batch(&self) {
        for slot in self.kept.batches.slots().values() {
            slot.end(true);
        }
    }

    /// Gives back every open batch of a client being dropped, each in a task of its
    /// own.
    pub(crate) fn give_back_all(&self) {
        let (closed, _) = self.kept.batches.close(0, true, true);
        let mut on = None;
        for (name, batch) in closed {
            if let Some(keys) = self.unused(&name, &batch) {
                let runtime = on.get_or_insert_with(|| self.dropping_runtime());
                self.spawn_give_back_on(runtime.clone(), keys, batch.member, batch.used);
            }
        }
    }
}

#[cfg(test)]
mod tests;
