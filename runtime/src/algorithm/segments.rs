//! A token bucket's pending reservations: the twin of the segment helpers of
//! `lua/lib/bucket.lua` (`read_segments`, `peak`, `open_segment`, `settle_segment`,
//! `close_segment`, `segments_text`), step for step.
//!
//! A settle gives back the tokens its grant did not use, but no more than the bucket
//! would hold had the grant taken only what it used: tokens given back that the
//! bucket would have refilled past its burst meanwhile are not given. Had the grant
//! taken less, the bucket would have held that much more from the grant on, and lost
//! the surplus above its burst wherever it peaked: what survives is at most the least
//! room (the burst less the tokens held) the bucket had at its peaks since the grant,
//! just before each take and now. A settle that gave back `g` made the bucket, from
//! its own grant on, hold `g` more than it did until then: what the bucket had of
//! room since that grant is `g` less.
//!
//! Each pending reservation's grant opens a segment, named by the grant's id (a
//! random number the reservation keeps), holding the least room the bucket had at
//! its peaks from that grant until the next segment opened, less what later settles
//! gave back; every take updates the last segment only. A settle gives back at most
//! the least room over its grant's segment and every later one, takes what it gave
//! back off those segments, and when its segment holds no pending grant left, merges
//! it into the one before (a grant before it reads both), or drops it when it is the
//! first. At most [`MOST_SEGMENTS`] are kept: the two oldest merge (their grants read
//! both, less room, never more). Segments older than the time an empty bucket takes to
//! fill are dropped: a grant that old gets nothing back by the refill bound already.
//! A grant whose segment is gone (dropped, the bucket made again or its config
//! changed) gets nothing back.
//!
//! Rooms are in the bucket's units (1/interval of a token), at most its capacity.

/// The most segments a bucket keeps (`MOST_SEGMENTS` in `lua/lib/bucket.lua`, held
/// equal by a test). Each costs a script about 30 000 instructions on every call on
/// the bucket while reservations are pending (its numbers read, its table made): past
/// it the two oldest merge, which gives their settles back no more than before.
pub const MOST_SEGMENTS: usize = 8;

/// The most pending grants a bucket's segments name (`MOST_GRANTS` in
/// `lua/lib/bucket.lua`, held equal by a test): past it the oldest is forgotten (its
/// settle gives nothing back), so that a bucket's text, which every call on it reads
/// and writes while reservations are pending, stays small.
pub const MOST_GRANTS: usize = 128;

/// The longest segments' text read, in bytes: 8 segments of two 16-digit numbers and
/// 128 ids of 15 digits with their separators fit well within it.
pub const MOST_TEXT: usize = 4_096;

/// The smallest grant id: every id has 15 digits (`ID_DIGITS` in
/// `lua/lib/bucket.lua`, held equal by a test), so that the scripts keep the ids as the
/// text they are stored in, count them by its length and find one by plain search: a
/// call on a bucket naming 128 reads no number of them, and no byte of them through
/// Lua's pattern matching.
pub const LEAST_ID: u64 = 100_000_000_000_000;

/// The largest grant id, 15 nines.
pub const MOST_ID: u64 = 999_999_999_999_999;

/// The characters of a grant id (`ID_DIGITS` in `lua/lib/bucket.lua`).
pub(crate) const ID_DIGITS: usize = 15;

/// One segment: the decision time (epoch ms) of its first grant (at least the one
/// before's), the least room since it opened less what settles gave back, and the ids
/// of its grants not settled yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub at: u64,
    pub room: u64,
    pub grants: Vec<u64>,
}

/// A bucket's segments, oldest first (see the module).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Segments(pub Vec<Segment>);

/// The room of a bucket of `capacity` units holding `units`, at most its capacity.
#[inline]
pub fn room_of(capacity: u64, units: i64) -> u64 {
    (i128::from(capacity) - i128::from(units)).clamp(0, i128::from(capacity)) as u64
}

impl Segments {
    /// read_segments: how many pending grants the segments stored as `text` (`at.room.id[.id...]`,
    /// comma separated, oldest first) name for a bucket of `capacity` units, or `None`
    /// when they are not a list the scripts read: at most [`MOST_TEXT`] bytes, times in
    /// order, each room at most the capacity (times and rooms as the bucket's numbers,
    /// up to 2^53), ids of 15 characters each, at most [`MOST_SEGMENTS`] and
    /// [`MOST_GRANTS`] ids. As the scripts read them, the ids are counted by their
    /// text's length, not read: another program's text of that length is carried as
    /// it is, and never equals a settle's id (15 digits, [`LEAST_ID`] to [`MOST_ID`]).
    pub fn read(text: &str, capacity: u64) -> Option<usize> {
        if text.len() > MOST_TEXT {
            return None;
        }
        let (mut segments, mut grants, mut last) = (0, 0, 0);
        for part in text.split(',') {
            let (at, rest) = part.split_once('.')?;
            let (room, ids) = rest.split_once('.')?;
            // n ids and the n - 1 separators between them
            if (ids.len() + 1) % (ID_DIGITS + 1) != 0 {
                return None;
            }
            let (at, room) = (super::stored_number(at)?, super::stored_number(room)?);
            if room > capacity || at < last {
                return None;
            }
            last = at;
            segments += 1;
            grants += (ids.len() + 1) / (ID_DIGITS + 1);
            if segments > MOST_SEGMENTS || grants > MOST_GRANTS {
                return None;
            }
        }
        Some(grants)
    }

    /// segments_text: the text [`read`](Segments::read) reads.
    pub fn write(&self, out: &mut String) {
        use std::fmt::Write;
        for (i, s) in self.0.iter().enumerate() {
            let comma = if i == 0 { "" } else { "," };
            let _ = write!(out, "{comma}{}.{}", s.at, s.room);
            for id in &s.grants {
                let _ = write!(out, ".{id}");
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// peak: the bucket at a peak of `room` (just before a take, or at a settle): the
    /// last segment's least room.
    #[inline]
    pub fn peak(&mut self, room: u64) {
        if let Some(last) = self.0.last_mut() {
            last.room = last.room.min(room);
        }
    }

    /// open_segment: the pending reservation's grant `id` decided at `at` that left the
    /// bucket `room` (after its take): a segment of its own, at `at` or the last one's
    /// time when later (a clock behind it). Past [`MOST_SEGMENTS`], the two oldest merge;
    /// past [`MOST_GRANTS`], the oldest grant is forgotten (a segment left without one
    /// dropped: no earlier grant reads it).
    pub fn open(&mut self, at: u64, room: u64, id: u64) {
        let at = self.0.last().map_or(at, |last| last.at.max(at));
        self.0.push(Segment {
            at,
            room,
            grants: vec![id],
        });
        if self.0.len() > MOST_SEGMENTS {
            let second = self.0.remove(1);
            let first = &mut self.0[0];
            first.grants.extend(second.grants);
            first.room = first.room.min(second.room);
        }
        if self.0.iter().map(|s| s.grants.len()).sum::<usize>() > MOST_GRANTS {
            self.0[0].grants.remove(0);
            if self.0[0].grants.is_empty() {
                self.0.remove(0);
            }
        }
    }

    /// settle_segment: for the settle of grant `id`, with the bucket's room `now_room`
    /// now (a peak): its segment (the first holding it) and the most it may give back,
    /// the least room over that segment and every later one; `None` when it has none
    /// (nothing comes back).
    pub fn settle(&mut self, id: u64, now_room: u64) -> Option<(usize, u64)> {
        self.peak(now_room);
        let k = self.0.iter().position(|s| s.grants.contains(&id))?;
        let bound = self.0[k..].iter().map(|s| s.room).min().unwrap_or(0);
        Some((k, bound))
    }

    /// close_segment: grant `id` of segment `k` settled, giving back `back` units: taken
    /// off the rooms of that segment and every later one; the segment merged into the
    /// one before, or dropped when first, once no grant of it is pending.
    pub fn close(&mut self, k: usize, id: u64, back: u64) {
        for s in &mut self.0[k..] {
            s.room = s.room.saturating_sub(back);
        }
        let segment = &mut self.0[k];
        if let Some(at) = segment.grants.iter().position(|&g| g == id) {
            segment.grants.remove(at);
        }
        if segment.grants.is_empty() {
            let room = segment.room;
            self.0.remove(k);
            if let Some(before) = k.checked_sub(1).map(|j| &mut self.0[j]) {
                before.room = before.room.min(room);
            }
        }
    }

    /// The segments still of use at `now` to a bucket an empty one of which fills in
    /// `horizon` ms: those opened within it.
    pub fn prune(&mut self, now: u64, horizon: u64) {
        let old = self
            .0
            .iter()
            .take_while(|s| s.at.saturating_add(horizon) <= now)
            .count();
        self.0.drain(..old);
    }
}

#[cfg(test)]
mod tests;
