//! At the bound on the limiters held: a limiter a rule made is let go into the shard's
//! summary to make room for a new one, and a limiter made again finds its traces
//! there. Neither reads a clock or costs more than [`EVICT_SCAN`] buckets of the
//! table, whatever the number of limiters held.

use super::state::{Bucket, Limiter, Store};
use super::summary::{BucketTrace, Part, Summary};

/// The buckets of a shard's table looked at for a limiter to let go.
pub(super) const EVICT_SCAN: usize = 64;

impl Store {
    /// The limiter `name` (hash `hash`) as its traces remember it, when they remember
    /// anything: its sliding windows' grants, each at the end of its slot, and its token
    /// buckets' tokens at most, until a decision gives them their config.
    pub fn recall(&self, hash: u64, now: u64) -> Option<Limiter> {
        if self.summary.is_empty() {
            return None;
        }
        let mut limiter = Limiter::default();
        let mut any = false;
        for slot in 0..2 {
            let recalled = self.summary.recall_window(hash, Part::Window(slot), now);
            let grants = recalled.all();
            if !grants.is_empty() {
                let mut bucket = Bucket {
                    expires: Some(recalled.until),
                    ..Bucket::default()
                };
                for (time, mut permits) in grants {
                    // A log entry holds at most u32::MAX permits: more are several.
                    while permits > 0 {
                        let some = permits.min(u64::from(u32::MAX));
                        bucket.push(time, some as u32);
                        permits -= some;
                    }
                }
                limiter.buckets[slot] = Some(bucket);
                if !recalled.extra.is_empty() {
                    limiter.foreign[slot] = Some(recalled.extra.into_boxed_slice());
                }
                any = true;
            }
            limiter.recalled[slot] = self.summary.recall_bucket(hash, Part::Bucket(slot), now);
            any |= limiter.recalled[slot].is_some();
        }
        any.then_some(limiter)
    }

    /// Lets go the lightest limiter a rule made (the fewest permits and tokens used)
    /// among the next [`EVICT_SCAN`] buckets of the table, none of those whose names
    /// hash to `keep` (the limiters of the decision making room), writing its traces to
    /// the summary. False when there was none to let go.
    pub fn evict(&mut self, now: u64, keep: &[u64]) -> bool {
        let table = self.limiters.table_mut();
        let size = table.num_buckets();
        let mut lightest: Option<(usize, u64)> = None;
        for _ in 0..EVICT_SCAN.min(size) {
            let at = self.cursor % size;
            self.cursor = at + 1;
            let Ok(mut entry) = table.get_bucket_entry(at) else {
                continue;
            };
            let (name, limiter) = entry.get_mut();
            limiter.expire_all(now);
            if !evictable(limiter) {
                continue;
            }
            let hash = crate::keys::name_hash(name);
            if keep.contains(&hash) {
                continue;
            }
            let weight = weight(limiter);
            if lightest.is_none_or(|(_, w)| weight < w) {
                lightest = Some((at, weight));
            }
        }
        let Some((at, _)) = lightest else {
            return false;
        };
        let Ok(entry) = table.get_bucket_entry(at) else {
            return false;
        };
        let ((name, limiter), _) = entry.remove();
        let hash = crate::keys::name_hash(&name);
        keep_traces(&mut self.summary, hash, &limiter, now);
        crate::observe::memory_evicted();
        true
    }
}

/// Whether a limiter may be let go: a rule made it, no reservation holds it, and each
/// of its windows has an expiry (its traces live as long as it would have).
fn evictable(limiter: &Limiter) -> bool {
    limiter.by_rule && limiter.pins == 0 && limiter.buckets.iter().flatten().all(|b| b.expires.is_some())
}

/// What a limiter uses: permits in its windows' logs, tokens its buckets lack.
fn weight(limiter: &Limiter) -> u64 {
    let permits: u64 = limiter.buckets.iter().flatten().map(|b| b.total).sum();
    let short: u64 = limiter.tokens.iter().flatten().map(|t| short_of(&t.state)).sum();
    permits.saturating_add(short)
}

/// Whole tokens a bucket lacks of its burst at its last refill (more than its burst
/// while it pays back a cold grant), rounded up.
fn short_of(state: &crate::algorithm::bucket::Stored) -> u64 {
    let capacity = (state.burst * state.interval) as i64;
    (capacity - state.units)
        .max(0)
        .unsigned_abs()
        .div_ceil(state.interval)
}

/// A bucket's shortfall as its trace keeps it: the whole tokens it lacks of its burst at
/// its last refill, rounded up, and the time its refill had it lacking that many (as
/// late as a whole ms allows, so never less short then than the trace says). The line
/// from there to full then runs through what it holds at its last refill, or below.
fn trace_point(state: &crate::algorithm::bucket::Stored) -> (u64, u64) {
    let capacity = i128::from(state.burst) * i128::from(state.interval);
    let short = (capacity - i128::from(state.units)).max(0) as u128;
    let interval = u128::from(state.interval);
    let whole = short.div_ceil(interval);
    // refill adds `rate` units a ms
    let back = (whole * interval - short) / u128::from(state.rate);
    (whole as u64, state.at.saturating_sub(back as u64))
}

/// Writes each part a limiter holds to the summary: every grant of its windows' logs
/// but those a shared cell added when it was recalled, plus the permits its value says
/// are taken beyond them (counted now), and each token bucket's shortfall at its last
/// refill. Buckets recalled and not decided since are left out: the summary still holds
/// their traces.
fn keep_traces(summary: &mut Summary, hash: u64, limiter: &Limiter, now: u64) {
    let config = limiter.config;
    for slot in 0..2 {
        if let Some(bucket) = &limiter.buckets[slot] {
            let until = bucket.expires.unwrap_or(now);
            let mut grants: Vec<(u64, u64)> = bucket.log.iter().map(|&(t, p, _)| (t, u64::from(p))).collect();
            for &(time, mut permits) in limiter.foreign[slot].iter().flatten() {
                for grant in grants.iter_mut().filter(|g| g.0 == time) {
                    let off = grant.1.min(permits);
                    grant.1 -= off;
                    permits -= off;
                }
            }
            if let (Some(value), Some(config)) = (bucket.value, config) {
                let taken = (config.rate as i64).saturating_sub(value).max(0) as u64;
                if taken > bucket.total {
                    grants.push((now, taken - bucket.total));
                }
            }
            let interval = config.map_or(until.saturating_sub(now), |c| c.interval_ms());
            summary.keep_window(hash, Part::Window(slot), &grants, interval, until, now);
        }
        if let Some(tokens) = &limiter.tokens[slot] {
            let state = &tokens.state;
            let (short, at) = trace_point(state);
            let trace = BucketTrace {
                short,
                burst: state.burst,
                at,
                until: tokens.expires,
            };
            summary.keep_bucket(hash, Part::Bucket(slot), trace, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::bucket::{refill, Stored};

    /// A token bucket let go and made again from its trace holds at most what it would
    /// have held, and at most a ms of refill (and a unit of rounding) less: over random
    /// buckets, in debt or not, let go and made again at random times.
    #[test]
    fn a_bucket_made_again_from_its_trace_holds_what_it_held_or_a_ms_less() {
        let mut below = crate::test_support::draws(0x9e37_79b9_7f4a_7c15_u64);
        let (mut traced, mut short_of_held) = (0, 0);
        for case in 0..50_000 {
            let rate = 1 + below(if case % 2 == 0 { 10 } else { 100_000 });
            let interval = 1 + below(if case % 3 == 0 { 1_000 } else { 3_600_000 });
            let burst = 1 + below(((1u64 << 40) / interval).clamp(1, 10_000));
            let capacity = (burst * interval) as i64;
            let debt = (rate * interval).min(1 << 40) as i64;
            let units = below((capacity + debt + 1) as u64) as i64 - debt;
            let at = 1_700_000_000_000 + below(1_000);
            let state = Stored {
                rate,
                interval,
                burst,
                warmup: 0,
                units,
                at,
                cold: 0,
            };
            let until = at + state.rest_in().max(1);
            let let_go = at + below(until - at + 2);
            // made again later, or, a clock having stepped back, before it refilled
            let now = match below(4) {
                0 => at - below(5_000),
                _ => let_go + below(until + 10 - let_go),
            };
            // compared where both count from: the later of the two times, or after
            let then = now.max(at) + below(2) * below(until - at + 10);
            let (short, point) = trace_point(&state);
            let mut summary = Summary::new(4);
            let trace = BucketTrace {
                short,
                burst,
                at: point,
                until,
            };
            summary.keep_bucket(case, Part::Bucket(0), trace, let_go);
            let held = i128::from(refill(&state, then).0);
            let made = match summary.recall_bucket(case, Part::Bucket(0), now) {
                Some(recalled) => {
                    traced += 1;
                    let made = recalled.bucket(rate, interval, burst, 0, now);
                    i128::from(refill(&made, then).0)
                }
                // let go full, no trace kept: made again full, as Redis, whose key
                // expired then, does whatever a client's clock says later
                None if let_go >= until => continue,
                None => i128::from(capacity),
            };
            let case = format!("{state:?} let go at {let_go}, made again at {now}, read at {then}");
            assert!(made <= held, "{case}: {made} units, above the {held} held");
            assert!(
                held - made <= i128::from(rate) + 1,
                "{case}: {made} units of {held}"
            );
            short_of_held += u32::from(made < held);
        }
        assert!(traced > 20_000, "{traced} traced");
        assert!(short_of_held > 0, "the rounding is seen");
    }
}
