//! What the in-process backend keeps of the limiters it evicts at its bound: a
//! fixed-size summary that can only over-count, so that a spray of new keys neither
//! resets a key nor locks new users out.
//!
//! At [`max_limiters`](crate::ClientBuilder::max_limiters), a decision that needs a
//! new limiter first sweeps for expired ones (as before); finding none, it evicts the
//! least recently used of the limiters a rule made in the shards it holds (a rule
//! writes its config back on every call, so nothing a caller set is lost) and records
//! its trace here. A limiter created later under a name whose trace is live starts
//! from it: a sliding window with one grant of the share of its rate the evicted
//! window held, at the newest grant's time, a token bucket as empty as the evicted
//! one would be now, and cold. Each name maps to one cell in each of [`ROWS`] rows
//! (by bits of its keyed hash, which callers cannot learn); a cell keeps the largest
//! share, the latest time and the latest refill of every trace recorded there, and a
//! name starts from the smallest of its cells. So a key evicted and back is at least
//! as used as it was, never less: no key gets more than its rate. What a spray can
//! still cost a key it never used is a start from a share another key left in both
//! of its cells: for a spray of keys each using a fraction `f` of its rate, at most
//! `f` of the rate.

use super::state::{Bucket, Limiter};
use super::tokens::{TokenPlan, Tokens};
use crate::{RateLimiterConfig, RateType};

/// Rows of cells; a name starts from the smallest of its cells.
pub(super) const ROWS: usize = 2;
/// Cells per row (a power of two).
pub(super) const WIDTH: usize = 1 << 13;
/// A share of a rate, in these parts.
const WHOLE: u64 = u16::MAX as u64;

/// What evicted limiters left in one cell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Trace {
    /// The share of its rate a window held (of [`WHOLE`], rounded up).
    used: u16,
    /// The newest grant of that window.
    at: u64,
    /// When nothing of the window counts any more.
    until: u64,
    /// When a token bucket is full again (0: no bucket).
    full_at: u64,
}

impl Trace {
    fn merge(&mut self, other: Trace) {
        self.used = self.used.max(other.used);
        self.at = self.at.max(other.at);
        self.until = self.until.max(other.until);
        self.full_at = self.full_at.max(other.full_at);
    }

    fn least(&mut self, other: Trace) {
        self.used = self.used.min(other.used);
        self.at = self.at.min(other.at);
        self.until = self.until.min(other.until);
        self.full_at = self.full_at.min(other.full_at);
    }

    /// Whether any of it counts at `now`.
    fn live(&self, now: u64) -> bool {
        (self.used > 0 && self.until > now) || self.full_at > now
    }

    /// The trace `limiter` leaves at `now`: its windows' largest share, its buckets'
    /// latest refill. `None` when nothing of it counts.
    pub fn of(limiter: &mut Limiter, now: u64) -> Option<Trace> {
        let mut trace = Trace::default();
        let config = limiter.live_config(now);
        for kind in [RateType::Overall, RateType::PerClient] {
            if let (Some(config), Some(bucket)) = (config, limiter.bucket(kind, now)) {
                trace.merge(window_trace(&config, bucket, now));
            }
            if let Some(tokens) = limiter.tokens(kind, now) {
                trace.merge(bucket_trace(tokens));
            }
        }
        trace.live(now).then_some(trace)
    }
}

fn window_trace(config: &RateLimiterConfig, bucket: &Bucket, now: u64) -> Trace {
    let rate = config.rate.max(1);
    let value = bucket.value.unwrap_or(rate as i64 - bucket.total as i64);
    // Everything the log holds (some may have left the window: more, never less),
    // or what the value says is out, whichever is more.
    let used = bucket.total.max((rate as i64 - value).max(0) as u64).min(rate);
    // (no log but a value short of the rate: out since an unknown time, so now)
    let at = bucket.newest().unwrap_or(now);
    Trace {
        used: (u128::from(used) * u128::from(WHOLE)).div_ceil(u128::from(rate)) as u16,
        at,
        until: at + config.interval_ms(),
        full_at: 0,
    }
}

fn bucket_trace(tokens: &Tokens) -> Trace {
    let capacity = (tokens.burst * tokens.interval) as i64;
    let lack = (capacity - tokens.units).max(0) as u64;
    Trace {
        full_at: tokens.at + lack.div_ceil(tokens.rate.max(1)),
        ..Trace::default()
    }
}

/// The cells, and whether any was ever written (until then a new limiter looks
/// nothing up).
pub(super) struct Summary {
    cells: Box<[Trace]>,
    written: bool,
}

impl Summary {
    pub fn new() -> Self {
        Summary {
            cells: vec![Trace::default(); ROWS * WIDTH].into_boxed_slice(),
            written: false,
        }
    }

    /// The cell of row `row` for a name hashing to `hash`: bits the shards and their
    /// tables do not use first.
    fn cell(row: usize, hash: u64) -> usize {
        let bits = (hash >> (40 - 13 * row)) as usize;
        row * WIDTH + (bits & (WIDTH - 1))
    }

    /// Records the trace of an evicted limiter whose name hashes to `hash`.
    pub fn record(&mut self, hash: u64, trace: Trace) {
        for row in 0..ROWS {
            self.cells[Self::cell(row, hash)].merge(trace);
        }
        self.written = true;
    }

    /// The trace a new limiter whose name hashes to `hash` starts from at `now`.
    pub fn recall(&self, hash: u64, now: u64) -> Option<Trace> {
        if !self.written {
            return None;
        }
        let mut least = self.cells[Self::cell(0, hash)];
        for row in 1..ROWS {
            least.least(self.cells[Self::cell(row, hash)]);
        }
        least.live(now).then_some(least)
    }
}

/// A new limiter under `config` (a token bucket's `shape` when it is one), started
/// from `trace` at `now`.
pub(super) fn seeded(
    trace: &Trace,
    config: &RateLimiterConfig,
    shape: Option<crate::BucketShape>,
    now: u64,
) -> Limiter {
    let mut limiter = Limiter::default();
    let keep = config.keep_alive_ms();
    match shape {
        Some(shape) => {
            if trace.full_at > now {
                limiter.set_tokens(config.rate_type, seeded_tokens(trace, config, shape, now));
            }
        }
        None => {
            limiter.config = Some(*config);
            limiter.config_expires = (keep > 0).then_some(now + keep);
            let used = (u128::from(trace.used) * u128::from(config.rate)).div_ceil(u128::from(WHOLE)) as u64;
            let used = used.min(config.rate).min(u64::from(u32::MAX));
            if used > 0 && trace.at + config.interval_ms() > now {
                let bucket = limiter.bucket_or_default(config.rate_type);
                bucket.push(trace.at.min(now), used as u32);
                bucket.value = Some(config.rate as i64 - used as i64);
                bucket.expires = Some(now.max(trace.at) + keep.max(config.interval_ms()));
            }
        }
    }
    limiter
}

/// A token bucket as empty as one full at `trace.full_at` is at `now`, and cold.
fn seeded_tokens(trace: &Trace, config: &RateLimiterConfig, shape: crate::BucketShape, now: u64) -> Tokens {
    let interval = config.interval_ms();
    let capacity = (shape.burst * interval) as i64;
    let lack = (trace.full_at - now)
        .saturating_mul(config.rate)
        .min(3 * capacity as u64) as i64;
    let plan = TokenPlan {
        rate: config.rate,
        interval,
        burst: shape.burst,
        warmup: shape.warmup_ms,
        units: capacity - lack,
        cold: shape.warmup_ms * config.rate,
        at: now,
    };
    plan.stored_as(capacity - lack, shape.warmup_ms * config.rate)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use std::time::Duration;

    #[test]
    fn the_summary_takes_half_a_mebibyte_whatever_is_evicted() {
        assert_eq!(std::mem::size_of::<Trace>() * ROWS * WIDTH, 512 * 1024);
    }

    /// Every trace recorded is recalled at least as large, whatever else shares its
    /// cells: a name evicted and back is never less used.
    #[test]
    fn a_recalled_trace_is_never_less_than_the_one_recorded() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut summary = Summary::new();
        let traces: Vec<(u64, Trace)> = (0..100_000)
            .map(|_| {
                let at = rng.random_range(0..1_000_000);
                let trace = Trace {
                    used: rng.random(),
                    at,
                    until: at + rng.random_range(1..100_000),
                    full_at: rng.random_range(0..2_000_000),
                };
                (rng.random(), trace)
            })
            .collect();
        for &(hash, trace) in &traces {
            summary.record(hash, trace);
        }
        for &(hash, trace) in &traces {
            let now = rng.random_range(0..1_000_000);
            match summary.recall(hash, now) {
                Some(recalled) => {
                    assert!(
                        recalled.used >= trace.used && recalled.at >= trace.at,
                        "{trace:?}"
                    );
                    assert!(recalled.until >= trace.until && recalled.full_at >= trace.full_at);
                }
                None => assert!(!trace.live(now), "{trace:?} forgotten at {now}"),
            }
        }
    }

    /// A window made from a trace takes what the evicted one held: it grants what was
    /// left, no more, until the evicted grants would have left the window.
    #[test]
    fn a_window_made_from_a_trace_grants_no_more_than_was_left() {
        let config = RateLimiterConfig::new(RateType::Overall, 5, Duration::from_secs(60))
            .with_keep_alive(Duration::from_secs(60));
        let mut evicted = Limiter::default();
        evicted.config = Some(config);
        let bucket = evicted.bucket_or_default(RateType::Overall);
        for at in [1_000, 2_000, 3_000] {
            bucket.push(at, 1);
        }
        bucket.value = Some(2);
        let trace = Trace::of(&mut evicted, 4_000).unwrap();
        let mut made = seeded(&trace, &config, None, 5_000);
        let bucket = made.bucket(RateType::Overall, 5_000).unwrap();
        assert_eq!((bucket.value, bucket.total), (Some(2), 3));
        assert_eq!(bucket.newest(), Some(3_000), "leaving with the newest grant");
        // A token bucket 4 tokens short of its 5, refilling 5 a minute, is made as
        // short as it is now (48 s to full), and cold.
        let shape = crate::BucketShape {
            burst: 5,
            warmup_ms: 0,
        };
        let capacity = 5 * 60_000;
        let tokens = Tokens {
            rate: 5,
            interval: 60_000,
            burst: 5,
            warmup: 0,
            units: capacity - 4 * 60_000,
            at: 10_000,
            cold: 0,
            expires: 10_000 + 48_000,
        };
        let mut evicted = Limiter::default();
        evicted.set_tokens(RateType::Overall, tokens);
        let trace = Trace::of(&mut evicted, 10_000).unwrap();
        assert_eq!(trace.full_at, 58_000);
        let mut made = seeded(&trace, &config, Some(shape), 10_000);
        let made = made.tokens(RateType::Overall, 10_000).copied().unwrap();
        assert_eq!(made.units, tokens.units);
    }
}
