//! A token bucket's state and arithmetic, as `lua/tokens.lua` and `lua/acquire.lua`'s
//! token-bucket rules keep it: tokens counted in units of 1/interval-in-ms of a token,
//! so a refill of `rate` tokens per `interval` ms adds exactly `rate` units per
//! millisecond and every number stays an integer (below 2^53, so Lua's doubles hold it
//! exactly).
//!
//! Warm-up (Guava's SmoothWarmingUp, with a burst): a bucket with a warm-up of `W` ms
//! also counts its *coldness*, from 0 (warm) to `W * rate` units (the tokens a full
//! refill rate adds in `W`). Refill that a full bucket cannot hold adds to its coldness;
//! every permit taken takes its units off it. Above half the maximum, a permit costs
//! more than one token: from 1 token at half up to 3 at the maximum, linearly, so a
//! cold bucket grants about a third of its burst at once and refills at a third of the
//! rate, rising to the full rate as permits are taken (over about `W` when callers
//! take all they can). A grant needs the permits' plain tokens; the extra cost is
//! taken too and may leave the bucket below zero, paid back by later callers' waits
//! (as Guava charges the next caller), so every call's wait stays exact and a call of
//! a whole burst is never refused for ever.

/// The number of steps of the cost factor between half and full coldness.
pub(crate) const COLD_STEPS: u64 = 65_536;

/// One bucket: its config, the units it holds (below zero while a cold grant is paid
/// back), when it last refilled, its coldness, and when it will be full and cold (and
/// can be forgotten: a missing bucket is a full, cold one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tokens {
    pub rate: u64,
    pub interval: u64,
    pub burst: u64,
    /// Warm-up in ms; 0: none.
    pub warmup: u64,
    pub units: i64,
    pub at: u64,
    pub cold: u64,
    pub expires: u64,
}

impl Tokens {
    /// Whether this bucket is kept with this config.
    pub fn holds(&self, rate: u64, interval: u64, burst: u64, warmup: u64) -> bool {
        (self.rate, self.interval, self.burst, self.warmup) == (rate, interval, burst, warmup)
    }
}

/// What a decision plans for one token bucket (acquire.lua's token fields of `r`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokenPlan {
    pub rate: u64,
    pub interval: u64,
    pub burst: u64,
    pub warmup: u64,
    /// Units after refilling at the decision's time, before this call takes any.
    pub units: i64,
    /// Coldness after refilling at the decision's time.
    pub cold: u64,
    /// The last refill time to store: the later of the stored one and now.
    pub at: u64,
}

impl TokenPlan {
    fn capacity(&self) -> u64 {
        self.burst * self.interval
    }

    /// The most coldness the bucket holds.
    fn coldest(&self) -> u64 {
        self.warmup * self.rate
    }

    /// Plans a bucket at `now` for a rule of `rate` per `interval` ms holding `burst`
    /// and warming up over `warmup` ms, from its stored state (`None`: missing, so full
    /// and cold). A stored config that differs keeps its whole tokens and whole tokens
    /// of coldness, each up to its new maximum (the fraction of a token dropped, a
    /// debt forgiven: never more than the rate passes); a bucket at rest (full and
    /// cold) stays at rest. Answers the plan and the stored state when its config
    /// differed.
    pub fn new(
        rate: u64,
        interval: u64,
        burst: u64,
        warmup: u64,
        stored: Option<&Tokens>,
        now: u64,
    ) -> (TokenPlan, Option<Tokens>) {
        let mut plan = TokenPlan {
            rate,
            interval,
            burst,
            warmup,
            units: (burst * interval) as i64,
            cold: warmup * rate,
            at: now,
        };
        let Some(old) = stored else {
            return (plan, None);
        };
        if old.holds(rate, interval, burst, warmup) {
            return (TokenPlan::refilled(old, now), None);
        }
        let (units, cold) = refill(old, now);
        plan.at = old.at.max(now);
        // A bucket at rest holds no information (it may as well have expired): at rest
        // under the new config too.
        let at_rest = units >= (old.burst * old.interval) as i64 && cold >= old.warmup * old.rate;
        if !at_rest {
            let whole = units.div_euclid(old.interval as i64).max(0) as u64;
            plan.units = (whole * interval).min(plan.capacity()) as i64;
            plan.cold = (cold / old.interval * interval).min(plan.coldest());
        }
        (plan, Some(*old))
    }

    /// The plan of a stored bucket at `now`, under its own config.
    pub fn refilled(stored: &Tokens, now: u64) -> TokenPlan {
        let (units, cold) = refill(stored, now);
        TokenPlan {
            rate: stored.rate,
            interval: stored.interval,
            burst: stored.burst,
            warmup: stored.warmup,
            units,
            cold,
            at: stored.at.max(now),
        }
    }

    /// The units `permits` cost now: their tokens, and on a bucket colder than half its
    /// maximum up to twice as many again.
    pub fn cost(&self, permits: u64) -> u64 {
        let need = permits * self.interval;
        let coldest = self.coldest();
        let half = coldest / 2;
        if self.cold <= half {
            return need;
        }
        let steps = u128::from(self.cold - half) * u128::from(COLD_STEPS) / u128::from(coldest - half);
        let extra = (2 * u128::from(need) * steps).div_ceil(u128::from(COLD_STEPS));
        need + extra as u64
    }

    /// Whether `permits` can be taken now (their plain tokens are there); else the
    /// exact wait in ms until they can.
    pub fn wait(&self, permits: u64) -> Option<u64> {
        let need = (permits * self.interval) as i64;
        (self.units < need).then(|| (need - self.units).unsigned_abs().div_ceil(self.rate))
    }

    /// Whole tokens left after taking `permits` (0 when refused, or in debt).
    pub fn left(&self, taken: u64) -> u64 {
        self.whole(self.after(taken).0)
    }

    /// The whole tokens in `units` (0 in debt).
    pub fn whole(&self, units: i64) -> u64 {
        units.max(0) as u64 / self.interval
    }

    /// Units and coldness after taking `permits`.
    pub fn after(&self, taken: u64) -> (i64, u64) {
        if taken == 0 {
            return (self.units, self.cold);
        }
        let need = taken * self.interval;
        (
            self.units - self.cost(taken) as i64,
            self.cold.saturating_sub(need),
        )
    }

    /// The state to store after taking `permits`: it expires when the bucket is full
    /// and cold again (at least 1 ms on).
    pub fn stored(&self, taken: u64) -> Tokens {
        let (units, cold) = self.after(taken);
        self.stored_as(units, cold)
    }

    /// The state to store holding `units` and `cold`, as [`after`](TokenPlan::after)
    /// answers them.
    pub fn stored_as(&self, units: i64, cold: u64) -> Tokens {
        let short = (self.capacity() as i64 - units) as u64 + (self.coldest() - cold);
        let to_rest = short.div_ceil(self.rate).max(1);
        Tokens {
            rate: self.rate,
            interval: self.interval,
            burst: self.burst,
            warmup: self.warmup,
            units,
            at: self.at,
            cold,
            expires: self.at + to_rest,
        }
    }
}

/// A stored bucket's units and coldness refilled at its own rate from its last refill
/// to `now`: units up to its capacity, the rest to its coldness, up to its maximum.
fn refill(old: &Tokens, now: u64) -> (i64, u64) {
    // The usual case, a bucket short of full refilled short of full, in 64 bits.
    let elapsed = now.saturating_sub(old.at);
    let room = (old.burst * old.interval) as i64 - old.units;
    if let Some(added) = elapsed
        .checked_mul(old.rate)
        .filter(|&added| room >= 0 && added <= room as u64)
    {
        return (old.units + added as i64, old.cold);
    }
    let capacity = i128::from(old.burst * old.interval);
    let added = i128::from(now.saturating_sub(old.at)) * i128::from(old.rate);
    let room = capacity - i128::from(old.units);
    if added <= room {
        return (old.units + added as i64, old.cold);
    }
    let coldest = i128::from(old.warmup * old.rate);
    let cold = (i128::from(old.cold) + added - room.max(0)).min(coldest);
    (old.units.max(capacity as i64), cold as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(stored: Option<&Tokens>, warmup: u64, now: u64, permits: u64) -> (bool, Tokens) {
        let (plan, _) = TokenPlan::new(10, 1_000, 10, warmup, stored, now);
        let granted = plan.wait(permits).is_none();
        (granted, plan.stored(if granted { permits } else { 0 }))
    }

    #[test]
    fn a_missing_bucket_is_full_and_refills_exactly() {
        // 10 per 1 000 ms, burst 5: a token every 100 ms.
        let (plan, old) = TokenPlan::new(10, 1_000, 5, 0, None, 0);
        assert!(old.is_none());
        assert_eq!(plan.wait(5), None);
        let stored = plan.stored(5);
        assert_eq!((stored.units, stored.expires), (0, 500), "full again in 500 ms");
        let (plan, _) = TokenPlan::new(10, 1_000, 5, 0, Some(&stored), 150);
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
            warmup: 0,
            units: 7_500,
            at: 0,
            cold: 0,
            expires: 250,
        };
        let (plan, old) = TokenPlan::new(60, 60_000, 5, 0, Some(&stored), 0);
        assert_eq!(old, Some(stored));
        assert_eq!(
            plan.units,
            5 * 60_000,
            "7 whole tokens, clamped to the burst of 5"
        );
        let (plan, _) = TokenPlan::new(60, 60_000, 20, 0, Some(&stored), 0);
        assert_eq!(plan.units, 7 * 60_000);
        // Full under the old config (as if it had expired): full under the new one.
        let (plan, _) = TokenPlan::new(60, 60_000, 20, 0, Some(&stored), 250);
        assert_eq!(plan.units, 20 * 60_000);
        // Given a warm-up, a bucket that was not at rest starts warm; one at rest, cold.
        let (plan, _) = TokenPlan::new(10, 1_000, 10, 10_000, Some(&stored), 0);
        assert_eq!((plan.units, plan.cold), (7_000, 0));
        let (plan, _) = TokenPlan::new(10, 1_000, 10, 10_000, Some(&stored), 250);
        assert_eq!((plan.units, plan.cold), (10_000, 100_000));
    }

    #[test]
    fn a_cold_bucket_grants_a_third_of_its_burst_then_a_third_of_the_rate() {
        // 10 per s, burst 10, warm-up 10 s: coldness up to 100 tokens, a permit costs
        // 3 tokens at the coldest.
        let (plan, _) = TokenPlan::new(10, 1_000, 10, 10_000, None, 0);
        assert_eq!((plan.cold, plan.cost(1)), (100_000, 3_000));
        let mut state = None;
        let mut granted = 0;
        while let (true, next) = take(state.as_ref(), 10_000, 0, 1) {
            state = Some(next);
            granted += 1;
        }
        assert_eq!(
            granted, 4,
            "10 tokens at about 3 each: the last one goes into debt"
        );
        let state = state.unwrap();
        assert!(state.units < 0, "in debt: {state:?}");
        // The next token is exactly the debt and one token away, at 10 units per ms.
        let (plan, _) = TokenPlan::new(10, 1_000, 10, 10_000, Some(&state), 0);
        let wait = plan.wait(1).unwrap();
        assert_eq!(wait, ((1_000 - state.units) as u64).div_ceil(10));
        assert!((270..=300).contains(&wait), "about 3 tokens' time: {wait} ms");
        assert!(!take(Some(&state), 10_000, wait - 1, 1).0);
        assert!(take(Some(&state), 10_000, wait, 1).0);
    }

    /// Grants per second of callers taking every permit as soon as it can be had,
    /// from a cold start, for `seconds`.
    fn grants_per_second(warmup: u64, seconds: u64) -> Vec<u64> {
        let mut per_second = vec![0; seconds as usize];
        let (mut state, mut now) = (None, 0);
        while now < seconds * 1_000 {
            let (plan, _) = TokenPlan::new(10, 1_000, 10, warmup, state.as_ref(), now);
            match plan.wait(1) {
                None => {
                    per_second[(now / 1_000) as usize] += 1;
                    state = Some(plan.stored(1));
                }
                Some(wait) => now += wait,
            }
        }
        per_second
    }

    #[test]
    fn the_rate_rises_from_a_third_to_the_full_rate_over_the_warm_up() {
        let warm = grants_per_second(0, 20);
        assert_eq!(
            warm[0], 19,
            "no warm-up: the burst, then a token every 100 ms from 100 to 900"
        );
        assert!(warm[1..].iter().all(|&n| n == 10), "{warm:?}");
        let cold = grants_per_second(10_000, 20);
        assert!(cold[0] <= 4 + 4, "a third of the burst and of the rate: {cold:?}");
        assert!((3..=4).contains(&cold[1]), "{cold:?}");
        // After the first second (which holds the burst), never slower.
        assert!(cold[1..].windows(2).all(|w| w[1] >= w[0]), "{cold:?}");
        let full = cold.iter().position(|&n| n == 10).unwrap();
        assert!(
            (8..=10).contains(&full),
            "the full rate after about the warm-up: {cold:?}"
        );
        assert!(cold[full..].iter().all(|&n| n == 10), "and it stays: {cold:?}");
    }

    #[test]
    fn only_idle_time_makes_a_bucket_cold() {
        // A bucket used at its rate never fills, so it stays warm.
        let mut stored = Tokens {
            rate: 10,
            interval: 1_000,
            burst: 10,
            warmup: 10_000,
            units: 10_000,
            at: 0,
            cold: 0,
            expires: 10_000,
        };
        for t in 0..200 {
            let (granted, next) = take(Some(&stored), 10_000, t * 100, 1);
            assert!(granted);
            stored = next;
        }
        assert_eq!(stored.cold, 0);
        // Full for half the warm-up: cold up to the threshold, still at cost 1.
        let full_at = stored.at + (10_000 - stored.units as u64).div_ceil(10);
        let (plan, _) = TokenPlan::new(10, 1_000, 10, 10_000, Some(&stored), full_at + 5_000);
        assert_eq!((plan.cold, plan.cost(1)), (50_000, 1_000));
        // Longer: dearer, up to 3 tokens.
        let (plan, _) = TokenPlan::new(10, 1_000, 10, 10_000, Some(&stored), full_at + 7_500);
        assert_eq!((plan.cold, plan.cost(1)), (75_000, 2_000));
        let (plan, _) = TokenPlan::new(10, 1_000, 10, 10_000, Some(&stored), full_at + 60_000);
        assert_eq!((plan.cold, plan.cost(1)), (100_000, 3_000));
        // The state expires exactly when it is full and cold.
        assert_eq!(stored.expires, full_at + 10_000);
    }

    /// The refill, with its 64-bit shortcut, against its definition in wide integers:
    /// units up to the capacity, what a full bucket cannot hold to the coldness, up to
    /// its maximum; over random states, at the edges of each range too.
    #[test]
    fn the_refill_agrees_with_its_definition() {
        fn defined(old: &Tokens, now: u64) -> (i64, u64) {
            let capacity = i128::from(old.burst * old.interval);
            let total = i128::from(old.units) + i128::from(now.saturating_sub(old.at)) * i128::from(old.rate);
            if total <= capacity {
                return (total as i64, old.cold);
            }
            let base = i128::from(old.units).max(capacity);
            let cold = (i128::from(old.cold) + total - base).min(i128::from(old.warmup * old.rate));
            (base as i64, cold as u64)
        }
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |below: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            match seed % 4 {
                0 => 0,
                1 => below - 1,
                _ => seed % below,
            }
        };
        for _ in 0..200_000 {
            let (rate, interval, burst, warmup) = (
                next(1 << 30) + 1,
                next(1 << 22) + 1,
                next(1 << 30) + 1,
                next(1 << 22),
            );
            let capacity = burst * interval;
            let units = next(2 * capacity) as i64 - capacity as i64 / 2;
            let cold = next(warmup * rate + 1);
            let at = next(1 << 45);
            let now = at.saturating_add(next(u64::MAX)).saturating_sub(next(1 << 10));
            let old = Tokens {
                rate,
                interval,
                burst,
                warmup,
                units,
                at,
                cold,
                expires: 0,
            };
            assert_eq!(refill(&old, now), defined(&old, now), "{old:?} at {now}");
            // Around the moment the bucket is full.
            let full_at = at + (capacity as i64 - units).max(0) as u64 / rate;
            for now in full_at.saturating_sub(1)..=full_at + 2 {
                assert_eq!(refill(&old, now), defined(&old, now), "{old:?} at {now}");
            }
        }
    }
}
