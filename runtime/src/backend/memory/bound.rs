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
            let mut grants: Vec<(u64, u64)> = bucket.log.iter().map(|&(t, p)| (t, u64::from(p))).collect();
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
            let trace = BucketTrace {
                short: short_of(state),
                burst: state.burst,
                at: state.at,
                until: tokens.expires,
            };
            summary.keep_bucket(hash, Part::Bucket(slot), trace, now);
        }
    }
}
