//! A token bucket's state and arithmetic, as `lua/acquire.lua`'s token-bucket rules
//! keep it: tokens counted in units of 1/interval-in-ms of a token, so a refill of
//! `rate` tokens per `interval` ms adds exactly `rate` units per millisecond and every
//! number stays an integer (below 2^53, so Lua's doubles hold it exactly).

/// One bucket: its config, the units it holds, when it last refilled, and when it
/// will be full (and can be forgotten: a missing bucket is a full one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tokens {
    pub rate: u64,
    pub interval: u64,
    pub burst: u64,
    pub units: u64,
    pub at: u64,
    pub expires: u64,
}

/// What a decision plans for one token bucket (acquire.lua's token fields of `r`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenPlan {
    pub rate: u64,
    pub interval: u64,
    pub burst: u64,
    /// Units after refilling at the decision's time, before this call takes any.
    pub units: u64,
    /// The last refill time to store: the later of the stored one and now.
    pub at: u64,
}

impl TokenPlan {
    fn capacity(&self) -> u64 {
        self.burst * self.interval
    }

    /// Plans a bucket at `now` for a rule of `rate` per `interval` ms holding `burst`,
    /// from its stored state (`None`: missing, so full). A stored config that differs
    /// keeps its whole tokens, up to the new capacity, the fraction of a token dropped
    /// (never more than the rate passes); a full bucket stays full. Answers the plan and the stored
    /// config when it differed.
    pub fn new(
        rate: u64,
        interval: u64,
        burst: u64,
        stored: Option<&Tokens>,
        now: u64,
    ) -> (TokenPlan, Option<Tokens>) {
        let mut plan = TokenPlan {
            rate,
            interval,
            burst,
            units: burst * interval,
            at: now,
        };
        let Some(old) = stored else {
            return (plan, None);
        };
        let same = old.rate == rate && old.interval == interval && old.burst == burst;
        let refilled = refill(old.units, old.rate, old.burst * old.interval, old.at, now);
        plan.at = old.at.max(now);
        if same {
            plan.units = refilled;
            (plan, None)
        } else {
            // A full bucket holds no information (it may as well have expired): full
            // under the new config too.
            let old_capacity = old.burst * old.interval;
            plan.units = if refilled >= old_capacity {
                plan.capacity()
            } else {
                (refilled / old.interval * interval).min(plan.capacity())
            };
            (plan, Some(*old))
        }
    }

    /// Whether `permits` can be taken now; else the exact wait in ms until they can.
    pub fn wait(&self, permits: u64) -> Option<u64> {
        let need = permits * self.interval;
        (self.units < need).then(|| (need - self.units).div_ceil(self.rate))
    }

    /// Whole tokens left after taking `permits` (0 when refused).
    pub fn left(&self, taken: u64) -> u64 {
        (self.units - taken * self.interval) / self.interval
    }

    /// The state to store after taking `permits`: it expires when the bucket is full
    /// again (at least 1 ms on).
    pub fn stored(&self, taken: u64) -> Tokens {
        let units = self.units - taken * self.interval;
        let to_full = (self.capacity() - units).div_ceil(self.rate).max(1);
        Tokens {
            rate: self.rate,
            interval: self.interval,
            burst: self.burst,
            units,
            at: self.at,
            expires: self.at + to_full,
        }
    }
}

/// `units` refilled at `rate` per ms from `at` to `now`, up to `capacity`.
fn refill(units: u64, rate: u64, capacity: u64, at: u64, now: u64) -> u64 {
    let elapsed = u128::from(now.saturating_sub(at));
    let added = elapsed * u128::from(rate);
    if added >= u128::from(capacity.saturating_sub(units)) {
        capacity.max(units)
    } else {
        units + added as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_bucket_is_full_and_refills_exactly() {
        // 10 per 1 000 ms, burst 5: a token every 100 ms.
        let (plan, old) = TokenPlan::new(10, 1_000, 5, None, 0);
        assert!(old.is_none());
        assert_eq!(plan.wait(5), None);
        let stored = plan.stored(5);
        assert_eq!((stored.units, stored.expires), (0, 500), "full again in 500 ms");
        let (plan, _) = TokenPlan::new(10, 1_000, 5, Some(&stored), 150);
        assert_eq!(plan.units, 1_500, "1.5 tokens");
        assert_eq!(plan.wait(1), None);
        assert_eq!(plan.wait(2), Some(50), "half a token at 10 units per ms");
        assert_eq!(plan.left(1), 0);
    }

    #[test]
    fn a_changed_config_keeps_whole_tokens_up_to_the_new_capacity() {
        let stored = Tokens {
            rate: 10,
            interval: 1_000,
            burst: 10,
            units: 7_500,
            at: 0,
            expires: 250,
        };
        let (plan, old) = TokenPlan::new(60, 60_000, 5, Some(&stored), 0);
        assert_eq!(old, Some(stored));
        assert_eq!(
            plan.units,
            5 * 60_000,
            "7 whole tokens, clamped to the burst of 5"
        );
        let (plan, _) = TokenPlan::new(60, 60_000, 20, Some(&stored), 0);
        assert_eq!(plan.units, 7 * 60_000);
        // Full under the old config (as if it had expired): full under the new one.
        let (plan, _) = TokenPlan::new(60, 60_000, 20, Some(&stored), 250);
        assert_eq!(plan.units, 20 * 60_000);
    }
}
