//! The in-process backend: `lua/acquire.lua` and friends, step for step, over maps.
//! This file holds the backend itself: its shards and their locks, the sweep of
//! expired limiters and the bound on those held. A decision is `decide.rs` (the usual
//! call of one rule `usual.rs`, the phases `load.rs`, `plan.rs` and `commit.rs`), the
//! other operations `manage.rs`, the state held `state.rs`, what happens at the bound
//! `bound.rs` and `summary/`; the arithmetic of each algorithm is `crate::algorithm`'s.
//!
//! TTLs follow the same rules as the scripts, measured on the client's clock, and
//! expired limiters are swept so memory does not grow with the number of limiters
//! ever seen. Keys are never formatted: limiters are found by name, buckets by mode.
//!
//! What a decision costs does not grow with the number of limiters held: sweeping
//! goes round each shard's table a few buckets at a time (see [`MOST_SWEPT`]), and
//! the number of limiters held has a bound ([`crate::DEFAULT_MAX_LIMITERS`] unless
//! the builder says otherwise). At the bound a decision that would create a limiter
//! first sweeps its shard for expired ones; finding none, it lets go the lightest
//! limiter a rule made among a few of the shard's, keeping its traces in the shard's
//! summary (`summary/`, a fixed number of cells): a limiter made again from its traces
//! counts at least what it had counted, so no key's window is forgotten early. Limiters
//! configured by hand are never let go; a shard holding only those refuses new limiters
//! with [`Error::MemoryFull`].

mod bound;
mod commit;
mod decide;
mod idle;
mod load;
mod manage;
pub(crate) mod name;
mod plan;
mod settle;
mod state;
mod summary;
mod usual;

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

pub(crate) use self::decide::Hashes;
use self::idle::Idle;
pub(crate) use self::settle::epoch_member;
use self::state::Store;
pub(crate) use self::usual::RuleDecision;
use crate::Error;

/// The most live limiters an in-process backend holds, unless
/// [`ClientBuilder::max_limiters`](crate::ClientBuilder::max_limiters) says otherwise.
pub const DEFAULT_MAX_LIMITERS: usize = 100_000;

/// Limiters are spread over this many independently locked shards, so threads
/// deciding different limiters rarely wait for each other.
const SHARDS: usize = 16;

/// Every `SWEEP_EVERY`th decision of a thread sweeps [`IN_TURN`] buckets of the next
/// shard in turn, so shards no traffic reaches are cleaned too; a shard whose last turn
/// found nothing to do is passed by once, so a table of live limiters costs half the
/// sweeping one with expired limiters to drop does. Counted per thread: a counter
/// shared by every thread would be written by all of them on every decision.
const SWEEP_EVERY: usize = 64;
const IN_TURN: usize = 32;
/// Buckets a decision sweeps in a shard for each limiter it created there, so that
/// new limiters pay for the sweeping they make necessary: a shard's table of `B`
/// buckets is gone round once every `B / 4` new limiters.
const PER_NEW: usize = 4;
/// Buckets a decision that needs a new limiter sweeps in each of its shards when the
/// backend holds its maximum, looking for expired limiters to make room.
const AT_BOUND: usize = 32;
/// The most buckets one decision of one rule sweeps, whatever the number of limiters
/// held: one turn, a search for room at the bound, and its own new limiter's share.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const MOST_SWEPT: u64 = (IN_TURN + AT_BOUND + PER_NEW) as u64;

pub(crate) struct MemoryBackend {
    /// Names come from callers (API keys, addresses), so they are hashed with a keyed
    /// hash ([`crate::keys::name_hash`]): once per rule, for the shard and for the
    /// shard's table alike.
    shards: Box<[Mutex<Store>; SHARDS]>,
    room: Room,
    /// The sweeps in turn so far, over every thread: the next goes to the next shard,
    /// so that threads of a few decisions each (a thread per request) go round every
    /// shard, not only the first ones. Written only by a sweeping decision.
    turns: AtomicUsize,
}

/// The bound on the limiters held, over every shard. Written only when a limiter is
/// created or dropped, never by a decision on limiters already held.
struct Room {
    held: AtomicUsize,
    max: usize,
    /// Whether reaching the bound has been logged.
    warned: AtomicBool,
}

impl Room {
    /// Takes room for `n` more limiters, unless that would pass the bound.
    fn take(&self, n: usize) -> bool {
        if n == 0 {
            return true;
        }
        let taken = self
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                held.checked_add(n).filter(|&after| after <= self.max)
            })
            .is_ok();
        if taken {
            crate::observe::memory_held(n as isize);
        }
        taken
    }

    fn give_back(&self, n: usize) {
        if n > 0 {
            self.held.fetch_sub(n, Ordering::Relaxed);
            crate::observe::memory_held(-(n as isize));
        }
    }

    /// The refusal of a new limiter `name` at the bound: counted, and logged the
    /// first time.
    fn refuse(&self, name: &str) -> Error {
        crate::observe::memory_full();
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                max_limiters = self.max,
                "the in-process rate limiter holds its maximum of {} live limiters and \
                 none it may let go (limiters configured by hand are kept): decisions \
                 that need a new limiter are refused until idle ones expire (raise \
                 ClientBuilder::max_limiters if this load is expected). Logged once.",
                self.max
            );
        }
        Error::MemoryFull {
            name: name.to_owned(),
            max: self.max,
        }
    }
}

thread_local! {
    static DECISIONS: Cell<usize> = const { Cell::new(0) };
}

#[cfg(test)]
impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend::new(DEFAULT_MAX_LIMITERS)
    }
}

impl MemoryBackend {
    /// A backend holding at most `max` limiters.
    pub fn new(max: usize) -> Self {
        MemoryBackend {
            // (an array: a shard's index, under SHARDS, needs no bounds check)
            shards: Box::new(std::array::from_fn(|_| {
                Mutex::new(Store::new(cells_per_shard(max)))
            })),
            room: Room {
                held: AtomicUsize::new(0),
                max,
                warned: AtomicBool::new(false),
            },
            turns: AtomicUsize::new(0),
        }
    }
}

impl Drop for MemoryBackend {
    /// Its limiters leave the gauge of those held.
    fn drop(&mut self) {
        let held = *self.room.held.get_mut();
        self.room.give_back(held);
    }
}

/// The cells of each of a shard's summary tables for a bound of `max` limiters: half a
/// cell per limiter over all shards, at least 8 a shard.
fn cells_per_shard(max: usize) -> usize {
    (max / 2 / SHARDS).max(8)
}

/// The most bytes the summaries of a backend holding at most `max` limiters take.
#[cfg(test)]
pub(crate) fn most_summary_bytes(max: usize) -> usize {
    SHARDS * summary::Summary::most_bytes(cells_per_shard(max))
}

/// The shard of a limiter whose name hashes to `hash`: bits the shard's table does not
/// use to place it (it takes the low bits, and the top seven as tags).
fn shard_of(hash: u64) -> usize {
    (hash >> 32) as usize % SHARDS
}

/// The shards one decision touches, locked in index order so that two decisions
/// over the same shards cannot deadlock. One shard (the usual call) needs no list.
enum Locked<'a> {
    One(MutexGuard<'a, Store>),
    Many(smallvec::SmallVec<[(usize, MutexGuard<'a, Store>); 4]>),
}

impl Locked<'_> {
    /// The store of the limiter whose name hashes to `hash`.
    fn store(&mut self, hash: u64) -> &mut Store {
        match self {
            Locked::One(guard) => guard,
            Locked::Many(guards) => {
                let shard = shard_of(hash);
                let (_, guard) = guards
                    .iter_mut()
                    .find(|(i, _)| *i == shard)
                    .expect("every shard of the call is locked");
                guard
            }
        }
    }
}

impl MemoryBackend {
    /// The shard of `name`, locked. A panic elsewhere cannot leave a half-made
    /// decision (every mutation happens after all checks), so poisoning is ignored.
    fn lock(&self, name: &str) -> MutexGuard<'_, Store> {
        self.lock_shard(shard_of(self.hash(name)))
    }

    #[inline]
    fn lock_shard(&self, shard: usize) -> MutexGuard<'_, Store> {
        self.shards[shard].lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The shard `shard` locked when it is free, without waiting (a shard poisoned by
    /// a panic read as [`lock_shard`](Self::lock_shard) reads it).
    fn try_lock_shard(&self, shard: usize) -> Option<MutexGuard<'_, Store>> {
        match self.shards[shard].try_lock() {
            Ok(store) => Some(store),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// The hash of a limiter name, for [`shard_of`] and the shard's table.
    fn hash(&self, name: &str) -> u64 {
        crate::keys::name_hash(name)
    }

    /// The shards of the limiters whose names hash to `hashes`, locked.
    fn lock_all(&self, hashes: &[u64]) -> Locked<'_> {
        let first = hashes.first().map_or(0, |&h| shard_of(h));
        if hashes.iter().skip(1).all(|&h| shard_of(h) == first) {
            return Locked::One(self.lock_shard(first));
        }
        let mut shards: smallvec::SmallVec<[usize; 4]> = hashes.iter().map(|&h| shard_of(h)).collect();
        shards.sort_unstable();
        shards.dedup();
        Locked::Many(shards.into_iter().map(|i| (i, self.lock_shard(i))).collect())
    }

    /// Sweeps [`IN_TURN`] buckets of the next shard in turn every `SWEEP_EVERY`
    /// decisions of this thread, unless that shard is busy.
    #[inline]
    fn sweep_in_turn(&self, now: u64) {
        let n = DECISIONS.with(|d| {
            let n = d.get();
            d.set(n.wrapping_add(1));
            n
        });
        if n % SWEEP_EVERY == 0 {
            self.sweep_shard_in_turn(now);
        }
    }

    #[cold]
    fn sweep_shard_in_turn(&self, now: u64) {
        let turn = self.turns.fetch_add(1, Ordering::Relaxed);
        let Some(mut store) = self.try_lock_shard(turn % SHARDS) else {
            return;
        };
        if std::mem::take(&mut store.quiet) {
            return;
        }
        let swept = store.sweep(now, IN_TURN, Idle::Keep);
        store.quiet = swept.quiet;
        self.room.give_back(swept.dropped);
    }

    /// Sweeps `buckets` buckets of `store`, doing with rules' idle limiters what
    /// `idle` says.
    fn sweep(&self, store: &mut Store, now: u64, buckets: usize, idle: Idle) {
        let dropped = store.sweep(now, buckets, idle).dropped;
        self.room.give_back(dropped);
    }

    /// Room for the limiter `name` (hash `hash`) in `store`, when it is not held yet:
    /// at the bound, after sweeping [`AT_BOUND`] buckets for it, and else by letting go
    /// a limiter a rule made (none of those hashing to `keep`) into the summary.
    /// A limiter made again from its traces is inserted here; any other is the
    /// caller's to insert.
    fn room_for(
        &self,
        store: &mut Store,
        hash: u64,
        name: &str,
        now: u64,
        keep: &[u64],
    ) -> Result<(), Error> {
        if store.limiters.contains(hash, name) {
            return Ok(());
        }
        if !self.recall(store, hash, name, now, keep, false)? {
            self.take_room(store, name, now, keep)?;
        }
        self.sweep(store, now, PER_NEW, Idle::Keep);
        Ok(())
    }

    /// Room for one more limiter `name` in `store`: from the bound, from expired
    /// limiters swept, or from a limiter let go (its room handed straight over).
    fn take_room(&self, store: &mut Store, name: &str, now: u64, keep: &[u64]) -> Result<(), Error> {
        if self.room.take(1) {
            return Ok(());
        }
        self.sweep(store, now, AT_BOUND, Idle::Drop);
        if self.room.take(1) || self.evict(store, now, keep) {
            return Ok(());
        }
        Err(self.room.refuse(name))
    }

    /// Lets go a limiter a rule made (none of those hashing to `keep`) to make room:
    /// in `store` (whose shard is locked), else in the first other shard free to lock
    /// (never waiting for one, so no two decisions can wait for each other). Its room
    /// is handed straight over: the count of limiters held does not change.
    fn evict(&self, store: &mut Store, now: u64, keep: &[u64]) -> bool {
        if store.evict(now, keep) {
            return true;
        }
        (0..SHARDS).any(|shard| {
            self.try_lock_shard(shard)
                .is_some_and(|mut other| other.evict(now, keep))
        })
    }

    /// The limiter `name` (hash `hash`), not held, made again from its traces when the
    /// summary remembers it (room taken as for a new limiter). Answers whether it was.
    fn recall(
        &self,
        store: &mut Store,
        hash: u64,
        name: &str,
        now: u64,
        keep: &[u64],
        by_rule: bool,
    ) -> Result<bool, Error> {
        let Some(mut limiter) = store.recall(hash, now) else {
            return Ok(false);
        };
        self.take_room(store, name, now, keep)?;
        limiter.by_rule = by_rule;
        store.limiters.insert(hash, name, limiter);
        Ok(true)
    }

    /// Number of limiters held (live or not yet swept); for tests of the sweep.
    #[cfg(test)]
    fn len(&self) -> usize {
        (0..SHARDS)
            .map(|shard| self.lock_shard(shard).limiters.len())
            .sum()
    }
}

#[cfg(test)]
mod growth_tests;
#[cfg(test)]
mod tests;
