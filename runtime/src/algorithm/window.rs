//! The sliding window's arithmetic: the twin of the sliding-window steps of
//! `lua/acquire.lua` (`plan_bucket`, `take` with its `wait_for`, and the permits left
//! of `reply`) and of `lua/acquire_plain.lua`, which writes the same steps out under
//! the same names for the usual call. `lua/lib/` holds no file of them: the scripts
//! keep these steps inline, where a helper would cost every call a closure. Plain
//! functions on numbers and on a grant log: no I/O, no locks, no clock read.
//!
//! A limiter's state is Redisson's: a value (the permits available) and a log of
//! grants, `(score, permits)` oldest first, where a score is the time of a grant in
//! epoch ms. A grant leaves the window `interval` ms after its score; the value then
//! gets its permits back.

use std::collections::VecDeque;

use super::call_time::WALK;

/// A grant log: `(score, permits, tag)` of each grant, oldest first, as Redis orders
/// the sorted set (grants of one millisecond in the order they were made). The tag
/// names a reservation's grant for its settle, as a member's id does in Redis (0:
/// none); it takes the tuple's padding, so an entry is 16 bytes with or without it.
pub type Log = VecDeque<(u64, u32, u32)>;

/// plan_bucket, what left the window: the first entries of `log` with a score up to
/// `cutoff` (the decided time less the interval), and their permits.
#[inline]
pub fn stale(log: &Log, cutoff: i64) -> (usize, u64) {
    // Usually nothing has left: the oldest grant is still in the window.
    if cutoff < 0 || log.front().is_none_or(|&(score, _, _)| score > cutoff as u64) {
        return (0, 0);
    }
    // Then usually one: a grant of the window before, the next still in the window.
    if log.get(1).is_none_or(|&(score, _, _)| score > cutoff as u64) {
        #[cfg(test)]
        read::counted(1, 1);
        return (1, u64::from(log[0].1));
    }
    stale_many(log, cutoff)
}

/// [`stale`] when two entries or more left the window.
#[inline(never)]
fn stale_many(log: &Log, cutoff: i64) -> (usize, u64) {
    let (n, released) = log
        .iter()
        .take_while(|&&(score, _, _)| score <= cutoff as u64)
        .fold((0, 0), |(n, sum), &(_, p, _)| (n + 1, sum + u64::from(p)));
    #[cfg(test)]
    read::counted(n, n);
    (n, released)
}

/// plan_bucket, the value a decision starts from, and whether it must be written
/// whole: the stored `value` (`None`: missing) plus the permits `released` from the
/// window, or rebuilt from the log (the rate less the `live` permits it still holds)
/// when it is missing, when the config `changed`, or when the sum passes the rate (a
/// value inflated by hand, released permits or not: no grant, give-back or settle
/// leaves one above the rate, and the log is the authority).
#[inline]
pub fn plan_value(value: Option<i64>, changed: bool, released: u64, live: i64, rate: i64) -> (i64, bool) {
    match value {
        None => (rate - live, true),
        Some(_) if changed => (rate - live, true),
        Some(value) if value + released as i64 > rate => (rate - live, true),
        Some(value) if released > 0 => (value + released as i64, true),
        Some(value) => (value, false),
    }
}

/// plan_bucket on `lua/acquire_plain.lua`'s path: the stored `value` plus the permits
/// `released`; `None` when that passes the `rate`, a case `plan_value` decides from
/// the log.
#[inline]
pub fn plain_value(value: i64, released: u64, rate: i64) -> Option<i64> {
    if value + released as i64 > rate {
        return None;
    }
    Some(value + released as i64)
}

/// take: the permits a call of `permits` lacks when the bucket's `value` has already
/// given `spent` to the call's earlier rules; `None` when it has enough.
#[inline]
pub fn lacking(value: i64, spent: i64, permits: i64) -> Option<i64> {
    (value - spent < permits).then_some(permits + spent - value)
}

/// wait_for: milliseconds until `need` permits of `log` after its first `skip` entries
/// have left the window of `interval` ms, at `now`; `None` when it holds fewer (plus
/// the `pending` ones the call's earlier rules take from the same bucket). It reads at
/// most [`WALK`] entries: permits lacking past them get the time until the newest
/// entry leaves, an upper bound of the exact wait.
#[inline]
pub fn wait_for(log: &Log, skip: usize, need: i64, interval: i64, now: i64, pending: i64) -> Option<i64> {
    // Usually the oldest grant still in the window holds what is lacking.
    if let Some(&(score, p, _)) = log.get(skip) {
        if i64::from(p) >= need {
            #[cfg(test)]
            read::counted(1, 0);
            return Some(score as i64 + interval - now);
        }
    }
    wait_walk(log, skip, need, interval, now, pending)
}

/// [`wait_for`] walking the log, when its first entry holds too few.
#[inline(never)]
fn wait_walk(log: &Log, skip: usize, need: i64, interval: i64, now: i64, pending: i64) -> Option<i64> {
    // (the scripts read the first `need` entries, then, when entries of no permits
    // among them left `need` uncovered, the rest of the WALK: WALK entries at most)
    let walk = WALK;
    let mut acc = 0i64;
    for &(score, p, _) in log.iter().skip(skip).take(walk) {
        #[cfg(test)]
        read::counted(1, 0);
        acc += i64::from(p);
        if acc >= need {
            return Some(score as i64 + interval - now);
        }
    }
    if log.len() > skip + walk {
        #[cfg(test)]
        read::counted(1, 0);
        let newest = log.back().map_or(now, |&(score, _, _)| score as i64);
        let wait = newest + interval - now;
        return Some(if pending > 0 { wait.max(interval) } else { wait });
    }
    (acc + pending >= need).then_some(interval)
}

/// reply: the permits left of a bucket whose plan started from `value` and gave
/// `spent` to the call (taken only when it is `granted`), at least 0.
#[inline]
pub fn left(value: i64, spent: i64, granted: bool) -> u64 {
    let left = if granted { value - spent } else { value };
    left.max(0) as u64
}

/// What this thread's decisions read of their logs, for the tests of how a decision's
/// work grows: entries read (those that left the window, and those a wait walks), and
/// the most that left the window one read found.
#[cfg(test)]
pub(crate) mod read {
    use std::cell::Cell;

    thread_local! {
        static READ: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
    }

    pub(super) fn counted(entries: usize, left: usize) {
        READ.with(|r| {
            let (read, most) = r.get();
            r.set((read + entries, most.max(left)));
        });
    }

    /// The entries read and the most that left, since the last call (then both 0).
    pub(crate) fn take() -> (usize, usize) {
        READ.with(|r| r.replace((0, 0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(entries: &[(u64, u32)]) -> Log {
        entries
            .iter()
            .map(|&(score, permits)| (score, permits, 0))
            .collect()
    }

    #[test]
    fn what_left_the_window() {
        let log = log(&[(100, 2), (200, 1), (300, 4)]);
        assert_eq!(stale(&log, 99), (0, 0));
        assert_eq!(stale(&log, 200), (2, 3));
        assert_eq!(stale(&log, 1_000), (3, 7));
        assert_eq!(stale(&log, -1), (0, 0));
        // one left (the usual case, read without the walk), of a longer log and alone
        assert_eq!(stale(&log, 100), (1, 2));
        assert_eq!(stale(&log, 199), (1, 2));
        assert_eq!(stale(&self::log(&[(100, 5)]), 150), (1, 5));
        assert_eq!(stale(&self::log(&[]), 150), (0, 0));
        // grants of one millisecond leave together
        assert_eq!(stale(&self::log(&[(100, 1), (100, 2), (101, 4)]), 100), (2, 3));
    }

    #[test]
    fn the_value_a_decision_starts_from() {
        assert_eq!(plan_value(None, false, 0, 3, 10), (7, true), "rebuilt");
        assert_eq!(plan_value(Some(2), true, 0, 3, 10), (7, true), "changed");
        assert_eq!(plan_value(Some(2), false, 4, 3, 10), (6, true), "released");
        assert_eq!(plan_value(Some(9), false, 4, 3, 10), (7, true), "inflated");
        assert_eq!(plan_value(Some(2), false, 0, 3, 10), (2, false), "as stored");
        assert_eq!(plain_value(2, 4, 10), Some(6));
        assert_eq!(plain_value(9, 4, 10), None);
        assert_eq!(
            plan_value(Some(12), false, 0, 3, 10),
            (7, true),
            "inflated, nothing released"
        );
        assert_eq!(plain_value(12, 0, 10), None, "inflated, nothing released");
        assert_eq!(plain_value(10, 0, 10), Some(10), "full: as stored");
    }

    #[test]
    fn the_wait_until_the_log_releases_the_permits() {
        // 1 s window at t = 500: grants at 100 (2 permits), 200 (1), 300 (4).
        let log = log(&[(100, 2), (200, 1), (300, 4)]);
        assert_eq!(lacking(2, 0, 3), Some(1));
        assert_eq!(lacking(5, 2, 3), None);
        assert_eq!(wait_for(&log, 0, 1, 1_000, 500, 0), Some(600));
        assert_eq!(
            wait_for(&log, 0, 2, 1_000, 500, 0),
            Some(600),
            "the first holds them all"
        );
        assert_eq!(
            wait_for(&log, 2, 4, 1_000, 500, 0),
            Some(800),
            "after two that left"
        );
        assert_eq!(wait_for(&log, 0, 3, 1_000, 500, 0), Some(700));
        assert_eq!(wait_for(&log, 1, 2, 1_000, 500, 0), Some(800));
        assert_eq!(wait_for(&log, 0, 8, 1_000, 500, 0), None, "the log holds 7");
        assert_eq!(
            wait_for(&log, 0, 8, 1_000, 500, 1),
            Some(1_000),
            "with a pending permit"
        );
        // Past WALK entries: the time until the newest leaves.
        let long: Log = (0..100).map(|i| (i, 1, 0)).collect();
        assert_eq!(wait_for(&long, 0, 80, 1_000, 500, 0), Some(99 + 1_000 - 500));
        assert_eq!(left(5, 3, true), 2);
        assert_eq!(left(5, 3, false), 5);
        assert_eq!(left(-1, 0, false), 0);
    }
}
