//! Limiters whose every part has expired ("idle"): in Redis their keys are gone, and a
//! decision reads them as missing. A rule's idle limiter is kept in its shard's table
//! until the table needs its room, so that a key coming back after its window emptied
//! or its bucket filled again is decided in place, as a key that stayed is, instead of
//! being made again through the phases (a name, a log and the table's entry allocated
//! again, about four times a decision's work). Sweeps in turn and each new limiter's
//! share leave idle rule limiters where they are ([`Idle::Keep`]); at the bound, the
//! sweep that looks for room drops them first ([`Idle::Drop`]), and so does the
//! search for a limiter to let go (an idle limiter uses nothing).

use super::state::{slot, Bucket, Limiter, Tokens};
use crate::algorithm::bucket::Stored;
use crate::RateLimiterConfig;

/// What a sweep does with a rule's idle limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Idle {
    /// Kept, its log's memory given back when it held more than [`KEPT_LOG`] entries.
    Keep,
    /// Dropped, as every other limiter holding nothing live: the table needs room.
    Drop,
}

/// The most log entries an idle limiter keeps room for: beyond it the log is freed
/// (and allocated again if its key comes back), so an idle limiter costs about what a
/// new one does, whatever its window once held.
pub(super) const KEPT_LOG: usize = 16;

impl Limiter {
    /// Whether every part of this limiter has expired by `now` (or is empty), and no
    /// reservation holds it: a decision reads it as a missing limiter.
    pub fn is_idle(&self, now: u64) -> bool {
        let expired = |t: Option<u64>| t.is_some_and(|t| t <= now);
        self.pins == 0
            && (self.config.is_none() || expired(self.config_expires))
            && self
                .buckets
                .iter()
                .flatten()
                .all(|b| b.is_empty() || expired(b.expires))
            && self.tokens.iter().flatten().all(|t| t.expires <= now)
            && self.recalled.iter().flatten().all(|r| r.until <= now)
    }

    /// Whether a sweep in turn keeps this limiter where it is: a rule made it and it is
    /// idle. Its log's memory goes when it held more than [`KEPT_LOG`] entries.
    pub(super) fn kept_idle(&mut self, now: u64) -> bool {
        if !(self.by_rule && self.is_idle(now)) {
            return false;
        }
        for bucket in &mut self.buckets {
            if bucket.as_ref().is_some_and(|b| b.log.capacity() > KEPT_LOG) {
                *bucket = None;
            }
        }
        true
    }

    /// An idle limiter made live again in place for `rule`'s sliding window, as the
    /// phases make a missing one: the rule's config, a window holding the whole rate,
    /// nothing else (every other part had expired), a limiter a rule made. Its log's
    /// memory is reused. False, changing nothing, when the limiter is not idle. Only
    /// for a call that takes permits: the decision then writes its expiry.
    pub fn revive_window(&mut self, rule: &RateLimiterConfig, now: u64) -> bool {
        if !self.is_idle(now) {
            return false;
        }
        let at = slot(rule.rate_type);
        let mut bucket = self.buckets[at].take().unwrap_or_default();
        bucket.log.clear();
        // (made again by a rule, as the phases make a missing limiter)
        *self = Limiter {
            config: Some(*rule),
            by_rule: true,
            ..Limiter::default()
        };
        self.buckets[at] = Some(Bucket {
            value: Some(rule.rate as i64),
            log: bucket.log,
            total: 0,
            expires: None,
        });
        true
    }

    /// The token bucket of `rule`'s mode, held, or, when it is missing or full again
    /// (expired) and nothing was recalled for it, full and cold at `now` as the phases
    /// read a missing one (`plan_tokens` without a stored state). `None` when a recalled
    /// bucket waits for its config: the phases decide it.
    pub fn tokens_or_full(
        &mut self,
        rule: &RateLimiterConfig,
        burst: u64,
        warmup: u64,
        now: u64,
    ) -> Option<&mut Tokens> {
        let at = slot(rule.rate_type);
        if self.tokens(rule.rate_type, now).is_none() {
            if self.recalled[at].as_ref().is_some_and(|r| r.until > now) {
                return None;
            }
            let (rate, interval) = (rule.rate, rule.interval_ms());
            let state = Stored {
                rate,
                interval,
                burst,
                warmup,
                units: (burst * interval) as i64,
                at: now,
                cold: warmup * rate,
            };
            // Full and cold: at rest, as a missing bucket is; the decision stores it.
            self.tokens[at] = Some(Tokens { state, expires: now });
        }
        self.tokens[at].as_mut()
    }
}
