//! In-process limiter state: a map of limiters, each with its config and one bucket
//! per mode (the overall bucket, and this client's per_client bucket).

use super::idle::Idle;
use super::name::same_name;
use super::summary::{RecalledTokens, Summary};
use crate::algorithm::bucket::{Plan, Stored};
use crate::algorithm::segments::Segments;
use crate::algorithm::window::{self, Log};
use crate::{RateLimiterConfig, RateType};

/// Limiters by name, hashed with [`crate::keys::name_hash`] (keyed: names carry
/// callers' values); a decision hashes its name once (a rule keeps its hash) and
/// probes the table with it in each phase.
pub(super) struct Limiters {
    table: hashbrown::HashTable<(String, Limiter)>,
}

impl Limiters {
    pub fn hash(&self, name: &str) -> u64 {
        crate::keys::name_hash(name)
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut Limiter> {
        let hash = self.hash(name);
        self.get_hashed(hash, name)
    }

    /// The limiter `name`, whose [`hash`](Limiters::hash) is `hash`.
    #[inline]
    pub fn get_hashed(&mut self, hash: u64, name: &str) -> Option<&mut Limiter> {
        self.table
            .find_mut(hash, |(n, _)| same_name(n, name))
            .map(|(_, l)| l)
    }

    /// The limiter whose name hashes to `hash` and is the one `eq` looks for: each
    /// caller's closure makes a probe of its own, written where the caller is (the
    /// usual calls' probes are not shared with the phases').
    #[inline(always)]
    pub fn get_with(
        &mut self,
        hash: u64,
        eq: impl FnMut(&(String, Limiter)) -> bool,
    ) -> Option<&mut Limiter> {
        self.table.find_mut(hash, eq).map(|(_, l)| l)
    }

    /// The limiter `name`, created when missing.
    pub fn get_or_insert(&mut self, hash: u64, name: &str) -> &mut Limiter {
        let entry = self.table.entry(
            hash,
            |(n, _)| same_name(n, name),
            |(n, _)| crate::keys::name_hash(n),
        );
        &mut entry
            .or_insert_with(|| (name.to_owned(), Limiter::default()))
            .into_mut()
            .1
    }

    /// Removes the limiter `name`; true when it was held.
    pub fn remove(&mut self, name: &str) -> bool {
        let hash = self.hash(name);
        match self.table.find_entry(hash, |(n, _)| same_name(n, name)) {
            Ok(entry) => {
                entry.remove();
                true
            }
            Err(_) => false,
        }
    }

    /// The table itself, for going round it a few buckets at a time.
    pub(super) fn table_mut(&mut self) -> &mut hashbrown::HashTable<(String, Limiter)> {
        &mut self.table
    }

    /// Inserts `limiter` as `name` (not held yet).
    pub fn insert(&mut self, hash: u64, name: &str, limiter: Limiter) -> &mut Limiter {
        &mut self
            .table
            .insert_unique(hash, (name.to_owned(), limiter), |(n, _)| {
                crate::keys::name_hash(n)
            })
            .into_mut()
            .1
    }

    /// Whether the limiter `name`, whose hash is `hash`, is held.
    pub fn contains(&self, hash: u64, name: &str) -> bool {
        self.table.find(hash, |(n, _)| same_name(n, name)).is_some()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.table.len()
    }
}

pub(super) struct Store {
    pub limiters: Limiters,
    /// What this shard remembers of the limiters it let go at the bound.
    pub summary: Summary,
    /// The bucket of the table the next sweep starts at: sweeps go round the table a
    /// few buckets at a time, so none costs more than the buckets it is given.
    pub(super) cursor: usize,
    /// The last sweep in turn found nothing to do (see [`Swept::quiet`]): the next
    /// turn passes this shard by.
    pub(super) quiet: bool,
    /// Buckets sweeps have looked at, ever: what sweeping has cost.
    #[cfg(test)]
    pub swept: u64,
}

/// What a sweep did.
pub(super) struct Swept {
    /// The limiters it dropped.
    pub dropped: usize,
    /// It found nothing to do: every limiter it looked at was live, or a rule's idle
    /// limiter already kept (its log small), so nothing expired, dropped or freed.
    pub quiet: bool,
}

#[derive(Default)]
pub(super) struct Limiter {
    pub config: Option<RateLimiterConfig>,
    pub config_expires: Option<u64>,
    /// Indexed by [`slot`]: overall, per_client.
    pub(super) buckets: [Option<Bucket>; 2],
    /// Token buckets of this name (`{NAME}:bucket` and this client's), by [`slot`].
    pub(super) tokens: [Option<Tokens>; 2],
    /// Made by a rule's decision, and never configured by hand since: it may be let go
    /// at the bound (a rule makes it again, with the rule's config, from its traces).
    pub(super) by_rule: bool,
    /// Token buckets recalled from the summary, by [`slot`], until a decision of the
    /// bucket gives them its config.
    pub(super) recalled: [Option<RecalledTokens>; 2],
    /// Grants a recalled window counts that a shared cell of the summary added beyond
    /// its own trace, by [`slot`]: counted while held, never written back.
    pub(super) foreign: [Option<Grants>; 2],
    /// Reservations not settled yet whose grants it holds: while any is, it is not let
    /// go at the bound (a settle finds its grant where it was made).
    pub(super) pins: u32,
    /// The segments of its token buckets' pending reservations, by [`slot`]
    /// (`algorithm::segments`); none while no reservation of them is pending. They go
    /// with their bucket.
    pub(super) segments: Option<Box<[Segments; 2]>>,
}

/// `(time, permits)` of grants, oldest first.
pub(super) type Grants = Box<[(u64, u64)]>;

/// A token bucket held in process: its state as the scripts store it, and when it is
/// full and cold again (and can be forgotten: a missing bucket is a full, cold one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tokens {
    pub state: Stored,
    pub expires: u64,
}

impl Tokens {
    /// store_tokens: a planned bucket holding `units` and `cold`, as
    /// [`Plan::take_tokens`] answers them, until it is full and cold again.
    #[inline]
    pub fn stored(plan: &Plan, units: i64, cold: u64) -> Tokens {
        let (state, expires) = plan.store_tokens(units, cold);
        Tokens { state, expires }
    }
}

pub(super) struct Bucket {
    pub value: Option<i64>,
    /// (score, permits, tag) of each grant, oldest first, as Redis orders the sorted
    /// set (grants of one millisecond in the order they were made); the tag names a
    /// reservation's grant for its settle. Contiguous: a decision touches only its two
    /// ends.
    pub log: Log,
    /// Sum of the permits in `log`.
    pub total: u64,
    pub expires: Option<u64>,
    /// This log's own number in the process, new whenever a log is made or emptied:
    /// a reservation's settle finds its grant in the log it was made in, and in no
    /// later one holding another grant of its time and size (Redis finds it by its
    /// member).
    pub epoch: u32,
}

impl Default for Bucket {
    fn default() -> Self {
        Bucket {
            value: None,
            log: Log::default(),
            total: 0,
            expires: None,
            epoch: new_epoch(),
        }
    }
}

/// A number for a new or emptied log (wrapping after 2^32 of them: a settle would
/// need its grant's log made again 2^32 times before it, and a grant of its time and
/// size in it, to take the wrong one).
pub(super) fn new_epoch() -> u32 {
    static EPOCHS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    EPOCHS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

pub(super) fn slot(kind: RateType) -> usize {
    match kind {
        RateType::Overall => 0,
        RateType::PerClient => 1,
    }
}

impl Store {
    /// An empty store, whose summary has `cells` cells in each of its tables.
    pub fn new(cells: usize) -> Self {
        Store {
            limiters: Limiters {
                table: hashbrown::HashTable::new(),
            },
            summary: Summary::new(cells),
            cursor: 0,
            quiet: false,
            #[cfg(test)]
            swept: 0,
        }
    }

    /// Looks at the next `buckets` buckets of the table, in turn, and drops the
    /// limiters there that hold nothing live (every part expired, as Redis would have
    /// dropped their keys: a missing limiter decides as they would), but a rule's idle
    /// limiter under [`Idle::Keep`] (see `idle.rs`). Answers how many it dropped, and
    /// whether it found nothing to do. Work is `buckets`, whatever the number of
    /// limiters held.
    pub fn sweep(&mut self, now: u64, buckets: usize, idle: Idle) -> Swept {
        let table = &mut self.limiters.table;
        let size = table.num_buckets();
        let (mut dropped, mut quiet) = (0, true);
        for _ in 0..buckets.min(size) {
            // (a table's buckets are a power of two: the cursor wraps by a mask)
            let at = self.cursor & (size - 1);
            self.cursor = at + 1;
            #[cfg(test)]
            {
                self.swept += 1;
            }
            if let Ok(mut entry) = table.get_bucket_entry(at) {
                let limiter = &mut entry.get_mut().1;
                // (the usual case: nothing of it to expire, and not idle)
                if limiter.all_live(now) {
                    continue;
                }
                if let Some(freed) = (idle == Idle::Keep).then(|| limiter.kept_idle(now)).flatten() {
                    quiet &= !freed;
                    continue;
                }
                quiet = false;
                limiter.expire_all(now);
                if limiter.removable() {
                    entry.remove();
                    dropped += 1;
                }
            }
        }
        Swept { dropped, quiet }
    }
}

impl Limiter {
    #[inline]
    pub fn live_config(&mut self, now: u64) -> Option<RateLimiterConfig> {
        *self.live_config_ref(now)
    }

    /// [`live_config`](Limiter::live_config) where it is held.
    #[inline]
    pub fn live_config_ref(&mut self, now: u64) -> &Option<RateLimiterConfig> {
        if self.config_expires.is_some_and(|t| t <= now) {
            self.config = None;
            self.config_expires = None;
        }
        &self.config
    }

    /// The bucket of `kind`, unless missing or expired (an expired one is dropped).
    #[inline]
    pub fn bucket(&mut self, kind: RateType, now: u64) -> Option<&mut Bucket> {
        let at = slot(kind);
        if self.buckets[at]
            .as_ref()
            .is_some_and(|b| b.expires.is_some_and(|t| t <= now))
        {
            self.drop_bucket(at);
        }
        self.buckets[at].as_mut()
    }

    /// Drops the window bucket at `at`, and the record of the grants a shared cell
    /// added to it when it was recalled: those grants went with it, and must not be
    /// taken off new ones at the next eviction.
    fn drop_bucket(&mut self, at: usize) -> bool {
        self.foreign[at] = None;
        self.buckets[at].take().is_some()
    }

    pub fn bucket_or_default(&mut self, kind: RateType) -> &mut Bucket {
        self.buckets[slot(kind)].get_or_insert_with(Bucket::default)
    }

    /// Removes the config and both sliding-window buckets; true when any existed.
    pub fn remove_window(&mut self) -> bool {
        let existed = self.config.is_some() || self.buckets.iter().any(Option::is_some);
        self.config = None;
        self.config_expires = None;
        self.drop_bucket(0);
        self.drop_bucket(1);
        existed
    }

    pub fn remove_bucket(&mut self, kind: RateType) -> bool {
        self.drop_bucket(slot(kind))
    }

    pub fn is_empty(&self) -> bool {
        self.config.is_none()
            && self.buckets.iter().all(Option::is_none)
            && self.tokens.iter().all(Option::is_none)
            && self.recalled.iter().all(Option::is_none)
    }

    /// Whether it may leave the table: empty, and held by no reservation. A held one
    /// stays, empty, so that its reservations let go of this entry and of no later
    /// limiter of its name (they let go by name).
    pub fn removable(&self) -> bool {
        self.is_empty() && self.pins == 0
    }

    /// The token bucket of `kind`, unless missing or full again (then dropped).
    #[inline]
    pub fn tokens(&mut self, kind: RateType, now: u64) -> Option<&mut Tokens> {
        let at = slot(kind);
        if self.tokens[at].is_some_and(|t| t.expires <= now) {
            self.tokens[at] = None;
            if self.segments.is_some() {
                self.drop_segments_out_of_line(at);
            }
        }
        self.tokens[at].as_mut()
    }

    /// [`drop_segments`](Limiter::drop_segments) out of line, for a bucket full again
    /// whose reservations are pending: [`tokens`](Limiter::tokens) stays small enough
    /// to be inlined into the usual decision.
    #[cold]
    #[inline(never)]
    fn drop_segments_out_of_line(&mut self, at: usize) {
        self.drop_segments(at);
    }

    /// The segments of the pending reservations of the token bucket of `kind`, when
    /// any is pending.
    #[inline]
    pub fn segments(&mut self, kind: RateType) -> Option<&mut Segments> {
        let segments = &mut self.segments.as_mut()?[slot(kind)];
        (!segments.is_empty()).then_some(segments)
    }

    /// [`segments`](Limiter::segments), made when none is pending.
    pub fn segments_or_new(&mut self, kind: RateType) -> &mut Segments {
        &mut self.segments.get_or_insert_with(Default::default)[slot(kind)]
    }

    /// Drops the segments of the token bucket at `at` ([`slot`]) once none is left (none
    /// pending, or every one older than an empty bucket takes to fill): a bucket
    /// without them takes the usual paths again.
    #[inline]
    pub fn drop_empty_segments(&mut self, at: usize) {
        if self.segments.as_ref().is_some_and(|s| s[at].is_empty()) {
            self.drop_segments(at);
        }
    }

    /// Drops the segments of the token bucket at `at` ([`slot`]): it went, or its config
    /// changed; a settle of its reservations gets nothing back.
    #[inline]
    pub fn drop_segments(&mut self, at: usize) {
        if let Some(segments) = &mut self.segments {
            segments[at] = Segments::default();
            if segments.iter().all(Segments::is_empty) {
                self.segments = None;
            }
        }
    }

    /// The token bucket of `rule`'s mode, as [`tokens`](Limiter::tokens); one recalled
    /// from the summary takes the rule's config here: at most the tokens recalled (its
    /// burst at most), fully cold, refilled now.
    pub fn tokens_or_recalled(
        &mut self,
        rule: &RateLimiterConfig,
        burst: u64,
        warmup: u64,
        now: u64,
    ) -> Option<&mut Tokens> {
        let at = slot(rule.rate_type);
        if self.tokens[at].is_none() {
            if let Some(recalled) = self.recalled[at].take().filter(|r| r.until > now) {
                let state = recalled.bucket(rule.rate, rule.interval_ms(), burst, warmup, now);
                let expires = state.at + state.rest_in().max(1);
                self.tokens[at] = Some(Tokens { state, expires });
            }
        }
        self.tokens(rule.rate_type, now)
    }

    pub fn remove_tokens(&mut self, kind: RateType) {
        self.tokens[slot(kind)] = None;
        self.recalled[slot(kind)] = None;
        self.drop_segments(slot(kind));
    }

    pub fn set_tokens(&mut self, kind: RateType, tokens: Tokens) {
        self.tokens[slot(kind)] = Some(tokens);
    }

    #[inline]
    pub fn expire_all(&mut self, now: u64) {
        self.live_config(now);
        for recalled in &mut self.recalled {
            if recalled.is_some_and(|r| r.until <= now) {
                *recalled = None;
            }
        }
        for at in 0..2 {
            if self.tokens[at].is_some_and(|t| t.expires <= now) {
                self.tokens[at] = None;
                self.drop_segments(at);
            }
        }
        for at in 0..2 {
            if self.buckets[at]
                .as_ref()
                .is_some_and(|b| b.expires.is_some_and(|t| t <= now) || b.is_empty())
            {
                self.drop_bucket(at);
            }
        }
    }

    pub fn buckets_mut(&mut self) -> impl Iterator<Item = &mut Bucket> {
        self.buckets.iter_mut().flatten()
    }
}

impl Bucket {
    pub fn is_empty(&self) -> bool {
        self.value.is_none() && self.log.is_empty()
    }

    /// Entries with score <= cutoff, and their permits ([`window::stale`]).
    #[inline]
    pub fn stale(&self, cutoff: i64) -> (usize, u64) {
        window::stale(&self.log, cutoff)
    }

    /// Milliseconds until `need` permits of the log after its first `skip` entries
    /// have left the window ([`window::wait_for`]).
    #[inline]
    pub fn wait_for(&self, skip: usize, need: i64, interval: i64, now: i64, pending: i64) -> Option<i64> {
        window::wait_for(&self.log, skip, need, interval, now, pending)
    }

    /// Drops the first `n` entries, which hold `permits`.
    #[inline]
    pub fn remove_first(&mut self, n: usize, permits: u64) {
        // Usually none or one left the window: one at a time, where a drain's set-up
        // costs more than the removal.
        if n <= 4 {
            for _ in 0..n {
                self.log.pop_front();
            }
        } else {
            self.log.drain(..n);
        }
        self.total -= permits;
    }

    /// Logs a grant at `score`, after every grant with a score up to it.
    #[inline(always)]
    pub fn push(&mut self, score: u64, permits: u32) {
        let newest = self.newest();
        self.push_after(newest, score, permits);
    }

    /// [`push`](Bucket::push) for a caller that read the newest grant's score
    /// (`newest`) before dropping entries from the front only: the order is known
    /// without reading the log's end again.
    #[inline(always)]
    pub fn push_after(&mut self, newest: Option<u64>, score: u64, permits: u32) {
        if newest.is_none_or(|newest| newest <= score) {
            self.log.push_back((score, permits, 0));
        } else {
            self.insert(score, permits);
        }
        self.total += u64::from(permits);
    }

    /// A grant older than the newest (a clock far behind), logged in score order.
    #[cold]
    fn insert(&mut self, score: u64, permits: u32) {
        let at = self.log.partition_point(|&(s, _, _)| s <= score);
        self.log.insert(at, (score, permits, 0));
    }

    /// Takes up to `permits` out of the newest entries (the last one shrinks when it
    /// holds more than is left to take); answers how many were taken.
    pub fn take_newest(&mut self, permits: u64) -> u64 {
        let mut taken = 0;
        while taken < permits {
            let Some(newest) = self.log.back_mut() else {
                break;
            };
            let left = permits - taken;
            if u64::from(newest.1) > left {
                newest.1 -= left as u32;
                taken += left;
            } else {
                taken += u64::from(newest.1);
                self.log.pop_back();
            }
        }
        self.total -= taken;
        taken
    }

    /// Tags a reservation's grant of `permits` at `score`, just logged, with `tag`
    /// for its settle: the newest such entry not tagged yet (entries of one time and
    /// size are alike until tagged). False when no entry is left to tag.
    pub fn tag_grant(&mut self, score: u64, permits: u64, tag: u32) -> bool {
        let entry = self
            .log
            .iter_mut()
            .rev()
            .skip_while(|e| e.0 > score)
            .take_while(|e| e.0 == score)
            .find(|e| u64::from(e.1) == permits && e.2 == 0);
        entry.map(|e| e.2 = tag).is_some()
    }

    #[inline]
    pub fn newest(&self) -> Option<u64> {
        self.log.back().map(|&(score, _, _)| score)
    }
}
