//! What the in-process backend remembers of the limiters it let go at its bound: a
//! table of a fixed number of cells, each holding traces that count at least what the
//! limiters they came from counted, so that a limiter made again from its traces is
//! never less used than it was.
//!
//! Each part of a limiter let go (the sliding window of each mode, the token bucket of
//! each mode) leaves a trace in one of two cells picked by the keyed hash of its name
//! and the part. A cell is *own* when it holds one part's trace (its tag is that part's
//! fingerprint), *mixed* when a trace had to share it with traces of others (both of its
//! cells held live traces of other parts). A part is recalled from those of its two
//! cells that are its own or mixed; a cell another part owns is not its.
//!
//! A trace is up to [`SLOTS`] slots, each an `end` time, an `amount`, an `until` (the
//! time the part would have expired, after which the slot counts for nothing) and, for
//! token buckets, the bucket's `burst`:
//! - a sliding window's slot: `amount` permits granted at or before `end`, recalled as
//!   one grant at `end` (later than each of them: they leave the window no earlier);
//! - a token bucket's slot: `amount` tokens short of full at `end`, recalled as short
//!   by that many falling in a straight line to none at `until` (the bucket refills at
//!   least that fast: it is full and cold by `until`), holding at most `burst`.
//!
//! A part's newest trace already counts what was recalled into it, so writing it to an
//! own cell replaces what was there; into a mixed cell it is merged slot by slot, each
//! slot the largest amount, latest `until` and smallest burst, which counts at least
//! what each trace merged into it counts. Nothing here reads a clock or allocates after
//! the table is made.

use crate::algorithm::bucket::Stored;

/// Slots per cell: a sliding window's live grants fall into at most three slots of
/// half its interval.
pub(super) const SLOTS: usize = 3;

const EMPTY: u64 = 0;
const MIXED: u64 = 1;

/// Which part of a limiter a trace is of: sliding window or token bucket, by mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    Window(usize),
    Bucket(usize),
}

impl Part {
    fn index(self) -> u64 {
        match self {
            Part::Window(slot) => slot as u64,
            Part::Bucket(slot) => 2 + slot as u64,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Slot {
    end: u64,
    amount: u64,
    /// 0: an empty slot.
    until: u64,
    burst: u64,
}

impl Slot {
    fn live(&self, now: u64) -> bool {
        self.until > now
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Cell {
    tag: u64,
    slots: [Slot; SLOTS],
    /// A mixed cell's members: a Bloom filter of the fingerprints of every part whose
    /// trace went into it since it was claimed (three bits of 256 each).
    members: [u64; 4],
}

/// The three bits of a fingerprint in a cell's members.
fn member_bits(fingerprint: u64) -> [usize; 3] {
    [0, 1, 2].map(|i| ((fingerprint >> (8 * i + 2)) & 255) as usize)
}

impl Cell {
    fn live(&self, now: u64) -> bool {
        self.tag != EMPTY && self.slots.iter().any(|s| s.live(now))
    }

    fn add_member(&mut self, fingerprint: u64) {
        for bit in member_bits(fingerprint) {
            self.members[bit / 64] |= 1 << (bit % 64);
        }
    }

    /// Whether the part of `fingerprint` may have a trace here (never false when it
    /// has).
    fn may_hold(&self, fingerprint: u64) -> bool {
        member_bits(fingerprint)
            .iter()
            .all(|&bit| self.members[bit / 64] & (1 << (bit % 64)) != 0)
    }
}

/// A token bucket to keep: `short` whole tokens of full at `at` (short of its `burst`;
/// above it: a debt), refilling at least as fast as a straight line to full and cold by
/// `until`. `at` may be before the bucket's last refill: the time its refill had it
/// short by those whole tokens, so that rounding up to a whole token takes no refill
/// from the bucket.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BucketTrace {
    pub short: u64,
    pub burst: u64,
    pub at: u64,
    pub until: u64,
}

/// A sliding window as recalled (see [`Summary::recall_window`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Recalled {
    /// `(time, permits)` of the part's own trace, oldest first.
    pub own: Vec<(u64, u64)>,
    /// `(time, permits)` the mixed cell adds, oldest first.
    pub extra: Vec<(u64, u64)>,
    /// The latest time any of them is live until.
    pub until: u64,
}

impl Recalled {
    /// Both lists as one, oldest first.
    pub fn all(&self) -> Vec<(u64, u64)> {
        let mut all: Vec<(u64, u64)> = self.own.iter().chain(&self.extra).copied().collect();
        all.sort_unstable();
        all
    }
}

/// A token bucket as recalled: it holds at most `tokens` now, counted in 2^-[`TOKEN_PARTS`]
/// of a token (below zero: a debt), and is full and cold again by `until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecalledTokens {
    pub tokens: i128,
    pub until: u64,
    /// The time they are held at: the recall's, or a trace's if later (a clock that
    /// stepped back since: refill counts from there, as a bucket's own does).
    pub at: u64,
}

impl RecalledTokens {
    /// The bucket made from this recall at `now`, of the config given: the units it
    /// holds, from the later of `now` and [`at`](RecalledTokens::at), cold (the trace
    /// keeps no coldness).
    pub fn bucket(&self, rate: u64, interval: u64, burst: u64, warmup: u64, now: u64) -> Stored {
        Stored {
            rate,
            interval,
            burst,
            warmup,
            units: self.units(burst, interval),
            at: self.at.max(now),
            cold: warmup * rate,
        }
    }

    /// The units (1/`interval` of a token) a bucket of `burst` made from this recall
    /// holds: at most its burst, rounded down.
    pub fn units(&self, burst: u64, interval: u64) -> i64 {
        let parts = self.tokens.min(i128::from(burst) << TOKEN_PARTS);
        // parts * interval / 2^TOKEN_PARTS, the whole tokens and the rest apart
        let fraction = parts & ((1 << TOKEN_PARTS) - 1);
        let units = (parts >> TOKEN_PARTS) * i128::from(interval)
            + ((fraction * i128::from(interval)) >> TOKEN_PARTS);
        units as i64
    }
}

/// A recalled bucket's tokens are counted in 2^-32 of a token, this exponent: a bucket let go and made
/// again between two calls keeps the part of a token it refilled (in whole tokens, a
/// caller calling more often than a token comes, and let go between calls, would never
/// see one).
pub(crate) const TOKEN_PARTS: u32 = 32;

/// The traces of the limiters a shard let go: sliding windows' and token buckets'
/// apart (a cell's slots mean one or the other), each table allocated when its first
/// trace is written.
#[derive(Debug)]
pub(crate) struct Summary {
    windows: Vec<Cell>,
    buckets: Vec<Cell>,
    /// Cells in each table.
    size: usize,
}

/// A 64-bit mix (the finaliser of SplitMix64): spreads a keyed hash and a part over
/// the table and the fingerprint.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Summary {
    /// A summary of `cells` cells (at least one), allocated when the first trace is
    /// written.
    pub fn new(cells: usize) -> Self {
        Summary {
            windows: Vec::new(),
            buckets: Vec::new(),
            size: cells.max(2),
        }
    }

    /// Whether no trace was ever written.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty() && self.buckets.is_empty()
    }

    /// The most bytes a summary of `cells` cells holds.
    #[cfg(test)]
    pub fn most_bytes(cells: usize) -> usize {
        2 * cells.max(2) * std::mem::size_of::<Cell>()
    }

    /// The two cells a part's traces may be written to.
    #[cfg(test)]
    pub fn cells_of(&self, hash: u64, part: Part) -> [usize; 2] {
        let (_, first, second) = self.place(hash, part);
        [first, second]
    }

    fn table(&self, part: Part) -> &[Cell] {
        match part {
            Part::Window(_) => &self.windows,
            Part::Bucket(_) => &self.buckets,
        }
    }

    fn table_mut(&mut self, part: Part) -> &mut Vec<Cell> {
        let size = self.size;
        let table = match part {
            Part::Window(_) => &mut self.windows,
            Part::Bucket(_) => &mut self.buckets,
        };
        if table.is_empty() {
            *table = vec![Cell::default(); size];
        }
        table
    }

    /// The part's fingerprint and its two cells.
    fn place(&self, hash: u64, part: Part) -> (u64, usize, usize) {
        let salted = hash ^ mix(part.index() + 1);
        let fingerprint = mix(salted.rotate_left(17) ^ 0x5851_f42d_4c95_7f2d) | 2;
        let n = self.size;
        let first = (mix(salted) % n as u64) as usize;
        let mut second = (mix(salted ^ 0x2545_f491_4f6c_dd1d) % n as u64) as usize;
        if second == first {
            second = (first + 1) % n;
        }
        (fingerprint, first, second)
    }

    /// The cells a part's traces may be in: its own and mixed ones.
    fn readable(&self, hash: u64, part: Part, now: u64) -> impl Iterator<Item = &Cell> {
        let (fingerprint, first, second) = self.place(hash, part);
        let table = self.table(part);
        [first, second]
            .into_iter()
            .filter_map(move |i| table.get(i))
            .filter(move |c| {
                (c.tag == fingerprint || (c.tag == MIXED && c.may_hold(fingerprint))) && c.live(now)
            })
    }

    /// The cell to write a part's trace to, and how: [`Target::Own`] (the part's own
    /// cell, or one no live trace holds, claimed), else the mixed one.
    fn writable(&mut self, hash: u64, part: Part, now: u64) -> (&mut Cell, Target) {
        let (fingerprint, first, second) = self.place(hash, part);
        let cells = self.table_mut(part);
        let pick = [first, second]
            .into_iter()
            .find(|&i| cells[i].tag == fingerprint && cells[i].live(now))
            .or_else(|| [first, second].into_iter().find(|&i| !cells[i].live(now)));
        if let Some(i) = pick {
            let cell = &mut cells[i];
            if cell.tag != fingerprint || !cell.live(now) {
                *cell = Cell {
                    tag: fingerprint,
                    ..Cell::default()
                };
            }
            return (cell, Target::Own);
        }
        // Both held live traces of others: share the one already shared, or the first.
        let i = if cells[second].tag == MIXED { second } else { first };
        let cell = &mut cells[i];
        if cell.tag != MIXED {
            // Its owner's trace stays, as the first member's.
            let owner = cell.tag;
            cell.add_member(owner);
            cell.tag = MIXED;
        }
        let member = cell.may_hold(fingerprint);
        cell.add_member(fingerprint);
        (cell, Target::Mixed { member })
    }

    /// Keeps a sliding window's grants (`(time, permits)`, any order), live until
    /// `until`, grouped in slots of half its `interval`.
    pub fn keep_window(
        &mut self,
        hash: u64,
        part: Part,
        grants: &[(u64, u64)],
        interval: u64,
        until: u64,
        now: u64,
    ) {
        if until <= now || grants.iter().all(|&(_, p)| p == 0) {
            return;
        }
        let width = (interval / 2).max(1);
        // Grouped by half-interval, each group at its newest grant's time: never later
        // than a grant it holds was made (a later time would move a decision reading
        // it forward, and let other grants leave its window early).
        let mut groups: Vec<(u64, Slot)> = Vec::with_capacity(grants.len());
        for &(time, permits) in grants.iter().filter(|g| g.1 > 0) {
            match groups.iter_mut().find(|(k, _)| *k == time / width) {
                Some((_, slot)) => {
                    slot.amount = slot.amount.saturating_add(permits);
                    slot.end = slot.end.max(time);
                }
                None => groups.push((
                    time / width,
                    Slot {
                        end: time,
                        amount: permits,
                        until,
                        burst: 0,
                    },
                )),
            }
        }
        let mut mine: Vec<Slot> = groups.into_iter().map(|(_, slot)| slot).collect();
        let (cell, into) = self.writable(hash, part, now);
        match into {
            Target::Own => {}
            Target::Mixed { member: true } => mine.extend(cell.slots.iter().filter(|s| s.live(now))),
            Target::Mixed { member: false } => mine = tails_max(&cell.slots, &mine, now),
        }
        cell.slots = squeeze(mine);
    }

    /// Keeps a token bucket's trace: alone in its own cell, or as one more bound among
    /// a mixed cell's.
    pub fn keep_bucket(&mut self, hash: u64, part: Part, trace: BucketTrace, now: u64) {
        if trace.until <= now || trace.short == 0 {
            return;
        }
        let slot = Slot {
            end: trace.at,
            amount: trace.short,
            until: trace.until,
            burst: trace.burst,
        };
        match self.writable(hash, part, now) {
            (cell, Target::Own) => cell.slots = [slot, Slot::default(), Slot::default()],
            (cell, Target::Mixed { .. }) => add_bucket(&mut cell.slots, slot, now),
        }
    }

    /// A sliding window's grants as recalled, oldest first, in two lists: `own`, the
    /// trace in the part's own cell, and `extra`, what its mixed cells hold (its own
    /// grants written there, and others'). With them, the latest time a slot is live
    /// until.
    ///
    /// `extra` may be other parts' grants; it is counted while the limiter is held, but
    /// never written back (the mixed cell keeps it): a part's trace holds only its own
    /// grants, so traces do not grow by passing others' through.
    pub fn recall_window(&self, hash: u64, part: Part, now: u64) -> Recalled {
        let mut recalled = Recalled::default();
        if self.windows.is_empty() {
            return recalled;
        }
        let (fingerprint, ..) = self.place(hash, part);
        let cells: Vec<&Cell> = self.readable(hash, part, now).collect();
        let live = |c: &&Cell| {
            c.slots
                .iter()
                .filter(|s| s.live(now))
                .copied()
                .collect::<Vec<Slot>>()
        };
        let own: Vec<Slot> = cells
            .iter()
            .filter(|c| c.tag == fingerprint)
            .flat_map(live)
            .collect();
        let mixed: Vec<Slot> = cells.iter().filter(|c| c.tag == MIXED).flat_map(live).collect();
        recalled.until = own.iter().chain(&mixed).map(|s| s.until).max().unwrap_or(0);
        recalled.own = own.iter().map(|s| (s.end, s.amount)).collect();
        recalled.own.sort_unstable();
        // A part's grants may be split between its own cell and the mixed ones (each
        // written when the other was not to be had): all of them count.
        recalled.extra = mixed.iter().map(|s| (s.end, s.amount)).collect();
        recalled.extra.sort_unstable();
        recalled
    }

    /// A token bucket as recalled: at most as many tokens as any of its slots allows
    /// now; `None` when none is live (the bucket is full and cold).
    pub fn recall_bucket(&self, hash: u64, part: Part, now: u64) -> Option<RecalledTokens> {
        if self.buckets.is_empty() {
            return None;
        }
        self.readable(hash, part, now)
            .flat_map(|c| c.slots.iter())
            .filter(|s| s.live(now))
            .map(|s| RecalledTokens {
                tokens: (i128::from(s.burst) << TOKEN_PARTS) - short_at(s, now),
                until: s.until,
                at: s.end.max(now),
            })
            .reduce(|a, b| RecalledTokens {
                tokens: a.tokens.min(b.tokens),
                until: a.until.max(b.until),
                at: a.at.max(b.at),
            })
    }
}

/// What a bucket slot is still short at `now`, in 2^-[`TOKEN_PARTS`] of a token rounded
/// up: its amount at its end (or before), falling in a straight line to none at its
/// `until`.
fn short_at(slot: &Slot, now: u64) -> i128 {
    let amount = u128::from(slot.amount);
    if now <= slot.end {
        return (amount << TOKEN_PARTS) as i128;
    }
    let left = u128::from(slot.until - now);
    let span = u128::from(slot.until - slot.end);
    // (amount * left / span) in parts, the whole tokens and the rest apart: amount times
    // left fits 128 bits, shifted by the parts it may not
    let scaled = amount * left;
    let parts = ((scaled / span) << TOKEN_PARTS) + ((scaled % span) << TOKEN_PARTS).div_ceil(span);
    parts as i128
}

/// Adds a token bucket's slot to a mixed cell's, each slot a bound of its own: into a
/// free slot, else joined with the oldest slot ending at or after it, else the two
/// oldest are joined first. A join keeps the larger shortfall, the later end and
/// `until` and the smaller burst: at least as tight a bound as either.
fn add_bucket(slots: &mut [Slot; SLOTS], new: Slot, now: u64) {
    if let Some(slot) = slots.iter_mut().find(|s| !s.live(now)) {
        *slot = new;
        return;
    }
    if let Some(slot) = slots
        .iter_mut()
        .filter(|s| s.end >= new.end)
        .min_by_key(|s| s.end)
    {
        join(slot, new);
        return;
    }
    slots.sort_unstable_by_key(|s| s.end);
    let oldest = slots[0];
    join(&mut slots[1], oldest);
    slots[0] = new;
}

fn join(slot: &mut Slot, other: Slot) {
    slot.end = slot.end.max(other.end);
    slot.amount = slot.amount.max(other.amount);
    slot.until = slot.until.max(other.until);
    slot.burst = slot.burst.min(other.burst);
}

/// Where a trace is written.
enum Target {
    /// The part's own cell: the trace replaces what was there (it counts all of it).
    Own,
    /// A mixed cell. A `member` may have written there before: its new trace is added
    /// to the cell's (its earlier one may be in there, mixed with others'); any other
    /// has nothing there, and the cell becomes the larger of the two at every time.
    Mixed { member: bool },
}

/// The grants of a mixed cell's `slots` and of one part's `mine` (which also holds
/// the cell's live slots) as one list whose permits at or after any time are the more
/// of the two's: a slot at each end, holding what the larger tail adds there, live
/// until the latest `until` of the slots ending there or before (whose permits it may
/// now stand for).
fn tails_max(slots: &[Slot; SLOTS], mine: &[Slot], now: u64) -> Vec<Slot> {
    let cell: Vec<Slot> = slots.iter().copied().filter(|s| s.live(now)).collect();
    let own = mine;
    let tail = |list: &[Slot], at: u64| {
        list.iter()
            .filter(|s| s.end >= at)
            .fold(0u64, |n, s| n.saturating_add(s.amount))
    };
    let mut ends: Vec<u64> = cell.iter().chain(own).map(|s| s.end).collect();
    ends.sort_unstable();
    ends.dedup();
    let mut out = Vec::with_capacity(ends.len());
    let mut counted = 0u64;
    for &end in ends.iter().rev() {
        let most = tail(&cell, end).max(tail(own, end));
        if most > counted {
            let until = cell
                .iter()
                .chain(own)
                .filter(|s| s.end <= end)
                .map(|s| s.until)
                .max()
                .unwrap_or(0);
            out.push(Slot {
                end,
                amount: most - counted,
                until,
                burst: 0,
            });
            counted = most;
        }
    }
    out
}

/// At most [`SLOTS`] slots out of `slots` (a sliding window's): while there are more,
/// the oldest joins the next (their permits counted at the later end: leaving no
/// earlier), live until the later `until`.
fn squeeze(mut slots: Vec<Slot>) -> [Slot; SLOTS] {
    slots.sort_unstable_by_key(|s| s.end);
    while slots.len() > SLOTS {
        let oldest = slots.remove(0);
        let next = &mut slots[0];
        next.amount = next.amount.saturating_add(oldest.amount);
        next.until = next.until.max(oldest.until);
    }
    let mut out = [Slot::default(); SLOTS];
    out[..slots.len()].copy_from_slice(&slots);
    out
}

#[cfg(test)]
mod tests;
