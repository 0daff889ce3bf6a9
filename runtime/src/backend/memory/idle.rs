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
    /// Whether every part this limiter holds is live at `now` (and holds something: a
    /// window bucket not empty), and it holds one at least: the usual limiter a sweep
    /// in turn meets. A sweep leaves such a limiter as it is (it is not idle, nothing
    /// of it expires, it is not empty), so it passes it by without those steps.
    #[inline(always)]
    pub(super) fn all_live(&self, now: u64) -> bool {
        if self.config_expires.is_some_and(|t| t <= now) {
            return false;
        }
        let mut held = self.config.is_some();
        // each part absent, live or not; one by one, stopping at the first not live
        let mut live = |part: Option<bool>| {
            held |= part.is_some();
            part != Some(false)
        };
        let all = live(self.buckets[0].as_ref().map(|b| b.live(now)))
            && live(self.buckets[1].as_ref().map(|b| b.live(now)))
            && live(self.tokens[0].as_ref().map(|t| t.expires > now))
            && live(self.tokens[1].as_ref().map(|t| t.expires > now))
            && live(self.recalled[0].as_ref().map(|r| r.until > now))
            && live(self.recalled[1].as_ref().map(|r| r.until > now));
        all && held
    }

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

    /// Whether a sweep in turn keeps this limiter where it is (`Some`): a rule made it
    /// and it is idle. Its log's memory goes when it held more than [`KEPT_LOG`]
    /// entries: `Some(true)` when some went.
    pub(super) fn kept_idle(&mut self, now: u64) -> Option<bool> {
        if !(self.by_rule && self.is_idle(now)) {
            return None;
        }
        let mut freed = false;
        for bucket in &mut self.buckets {
            if bucket.as_ref().is_some_and(|b| b.log.capacity() > KEPT_LOG) {
                *bucket = None;
                freed = true;
            }
        }
        Some(freed)
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
            epoch: super::state::new_epoch(),
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

impl Bucket {
    /// Whether a sweep keeps this window bucket at `now`: not expired, not empty.
    #[inline(always)]
    fn live(&self, now: u64) -> bool {
        self.expires.is_none_or(|t| t > now) && !self.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::memory::summary::{RecalledTokens, TOKEN_PARTS};
    use crate::RateType;
    use std::time::Duration;

    /// The parts a limiter holds, for seeing that a sweep's steps changed nothing.
    fn parts(l: &Limiter) -> (bool, Option<u64>, [bool; 2], [bool; 2], [bool; 2]) {
        (
            l.config.is_some(),
            l.config_expires,
            l.buckets.each_ref().map(|b| b.is_some()),
            l.tokens.each_ref().map(|t| t.is_some()),
            l.recalled.each_ref().map(|r| r.is_some()),
        )
    }

    #[test]
    fn a_limiter_all_live_is_one_a_sweep_leaves_as_it_is() {
        let now = 1_000;
        let config = RateLimiterConfig::new(RateType::Overall, 5, Duration::from_millis(100));
        let bucket = |expires: Option<u64>, logged: bool| Bucket {
            value: Some(4),
            log: if logged {
                [(990, 1, 0)].into_iter().collect()
            } else {
                Default::default()
            },
            total: u64::from(logged),
            expires,
            ..Bucket::default()
        };
        let tokens = |expires: u64| Tokens {
            state: Stored {
                rate: 5,
                interval: 100,
                burst: 5,
                warmup: 0,
                units: 100,
                at: now,
                cold: 0,
            },
            expires,
        };
        let window = |config_expires: Option<u64>, b: Option<Bucket>| Limiter {
            config: Some(config),
            config_expires,
            buckets: [b, None],
            ..Limiter::default()
        };
        let cases: Vec<(&str, Limiter, bool)> = vec![
            (
                "a live window",
                window(Some(now + 1), Some(bucket(Some(now + 1), true))),
                true,
            ),
            (
                "a window without keep-alive",
                window(None, Some(bucket(None, true))),
                true,
            ),
            ("a config alone", window(Some(now + 1), None), true),
            (
                "its config expired",
                window(Some(now), Some(bucket(Some(now + 1), true))),
                false,
            ),
            (
                "its bucket expired",
                window(Some(now + 1), Some(bucket(Some(now), true))),
                false,
            ),
            (
                "its bucket empty",
                window(Some(now + 1), Some(Bucket::default())),
                false,
            ),
            (
                "a value, no log",
                window(Some(now + 1), Some(bucket(Some(now + 1), false))),
                true,
            ),
            (
                "a live token bucket",
                Limiter {
                    tokens: [Some(tokens(now + 1)), None],
                    ..Limiter::default()
                },
                true,
            ),
            (
                "a token bucket full again",
                Limiter {
                    tokens: [None, Some(tokens(now))],
                    ..Limiter::default()
                },
                false,
            ),
            (
                "a recalled bucket waiting",
                Limiter {
                    recalled: [
                        Some(RecalledTokens {
                            tokens: 3 << TOKEN_PARTS,
                            until: now + 1,
                            at: now,
                        }),
                        None,
                    ],
                    ..Limiter::default()
                },
                true,
            ),
            (
                "a recalled bucket past",
                Limiter {
                    recalled: [
                        Some(RecalledTokens {
                            tokens: 3 << TOKEN_PARTS,
                            until: now,
                            at: now,
                        }),
                        None,
                    ],
                    ..Limiter::default()
                },
                false,
            ),
            ("nothing held", Limiter::default(), false),
        ];
        for (case, mut limiter, all_live) in cases {
            assert_eq!(limiter.all_live(now), all_live, "{case}");
            if all_live {
                // what a sweep does with it changes nothing, and keeps it
                let before = parts(&limiter);
                assert_eq!(limiter.kept_idle(now), None, "{case}");
                limiter.expire_all(now);
                assert_eq!(parts(&limiter), before, "{case}");
                assert!(!limiter.is_empty(), "{case}");
            }
        }
    }
}
