//! A token bucket's arithmetic: the twin of `lua/lib/bucket.lua`, function for
//! function (`read_bucket`, `plan_tokens`, `token_cost`, `take_tokens`,
//! `store_tokens`; Lua's `idiv` and `cdiv` are Rust's integer divisions here). Plain
//! functions on numbers: no I/O, no locks, no clock read. The in-process backend
//! decides token buckets with them (`backend/memory/`), the `redlimit` CLI shows a
//! stored bucket with them, and the scripts `lua/tokens.lua`, `lua/tokens_one.lua` and
//! `lua/acquire.lua` take the same steps in Redis.
//!
//! Tokens are counted in units of 1/interval-in-ms of a token, so a refill of `rate`
//! tokens per `interval` ms adds exactly `rate` units per millisecond and every number
//! stays an integer (below 2^53, so Lua's doubles hold it exactly).
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
//!
//! ```
//! use redlimit_runtime::algorithm::bucket::{plan_tokens, read_bucket};
//!
//! // 10 per 1 000 ms, burst 20: 5 tokens at t = 1 000, refilled at t = 1 500.
//! let stored = read_bucket("10:1000:20:5000:1000").unwrap();
//! let (plan, changed) = plan_tokens(10, 1_000, 20, 0, Some(&stored), 1_500);
//! assert!(changed.is_none());
//! assert_eq!(plan.whole(plan.units), 10);
//! assert_eq!(plan.wait(11), Some(100));
//! ```

/// The number of steps of the cost factor between half and full coldness
/// (`COLD_STEPS` in `lua/lib/bucket.lua`, held equal by a test).
pub const COLD_STEPS: u64 = 65_536;

/// The largest number the scripts count exactly: 2^53.
const MAX_EXACT: i128 = 1 << 53;

/// The lowest units a bucket holds: -2^52. A cold grant's extra cost goes at most twice
/// the capacity below zero (half of 2^53 at most); a settle charging what a call used
/// beyond its estimate stops its debt here (`DEBT_FLOOR` in `lua/lib/bucket.lua`, held
/// equal by a test), which even at 1 token per ms takes 2^52 ms to pay back.
pub const DEBT_FLOOR: i64 = -(1 << 52);

/// A bucket as it is stored: its config, the units it holds (below zero while a cold
/// grant is paid back), when it last refilled (epoch ms) and its coldness. A missing
/// bucket is a full, cold one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    /// Tokens added per `interval`.
    pub rate: u64,
    /// In ms.
    pub interval: u64,
    /// The most tokens it holds.
    pub burst: u64,
    /// Warm-up in ms; 0: none.
    pub warmup: u64,
    /// In 1/`interval` of a token.
    pub units: i64,
    /// The last refill, in epoch ms.
    pub at: u64,
    /// Coldness, in units, from 0 (warm) to `warmup * rate`.
    pub cold: u64,
}

impl Stored {
    /// Whether this bucket is kept with this config.
    #[inline]
    pub fn holds(&self, rate: u64, interval: u64, burst: u64, warmup: u64) -> bool {
        (self.rate, self.interval, self.burst, self.warmup) == (rate, interval, burst, warmup)
    }

    /// Milliseconds from its refill time until it holds its burst again (0 when it
    /// does).
    pub fn full_in(&self) -> u64 {
        let short = (self.burst * self.interval) as i64 - self.units;
        short.max(0).unsigned_abs().div_ceil(self.rate)
    }

    /// Milliseconds from its refill time until it is full and cold again (0 when it
    /// is): `store_tokens` ends its key's TTL then, at least 1 ms on.
    pub fn rest_in(&self) -> u64 {
        let short =
            (self.burst * self.interval) as i64 - self.units + (self.warmup * self.rate - self.cold) as i64;
        short.max(0).unsigned_abs().div_ceil(self.rate)
    }
}

/// read_bucket: the bucket stored as `raw` (`rate:interval:burst:units:at`, or with a
/// warm-up `rate:interval:burst:units:at:warmup:cold`, either followed by `|` and the
/// segments of its pending reservations, [`Segments::read`](super::segments::Segments::read)),
/// or `None` when it is not one the scripts wrote (the same checks as theirs).
pub fn read_bucket(raw: &str) -> Option<Stored> {
    let (body, segments) = match raw.split_once('|') {
        Some((body, segments)) => (body, Some(segments)),
        None => (raw, None),
    };
    let stored = read_body(body)?;
    let capacity = stored.burst * stored.interval;
    match segments {
        Some(text) => super::segments::Segments::read(text, capacity).map(|_| stored),
        None => Some(stored),
    }
}

/// [`read_bucket`] of the bucket's own fields.
fn read_body(raw: &str) -> Option<Stored> {
    let fields: Vec<&str> = raw.split(':').collect();
    if fields.len() != 5 && fields.len() != 7 {
        return None;
    }
    // (a debt, the units below zero, by its value: checked against the floor below)
    let number = |i: usize, signed: bool| -> Option<i64> {
        let text = *fields.get(i)?;
        match text.strip_prefix('-').filter(|_| signed) {
            Some(digits) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
                text.parse().ok()
            }
            Some(_) => None,
            None => super::stored_number(text).map(|n| n as i64),
        }
    };
    let (rate, interval, burst) = (number(0, false)?, number(1, false)?, number(2, false)?);
    let (units, at) = (number(3, true)?, number(4, false)?);
    let (warmup, cold) = match fields.len() {
        7 => (number(5, false)?, number(6, false)?),
        _ => (0, 0),
    };
    let cap = i128::from(burst) * i128::from(interval);
    let coldest = i128::from(warmup) * i128::from(rate);
    let valid = rate >= 1
        && i128::from(rate) <= MAX_EXACT
        && interval >= 1
        && burst >= 1
        && cap <= MAX_EXACT
        && i128::from(at) <= MAX_EXACT
        && coldest <= 1 << 45
        && i128::from(cold) <= coldest
        && (warmup == 0 || 4 * cap <= MAX_EXACT)
        && units >= DEBT_FLOOR
        && i128::from(units) <= cap;
    // Every number but `units` is at least 0 once the checks pass. A debt deeper than
    // the capacity less 2^53 (an earlier build's settle left one, in a bucket of more
    // than 2^52 units) is read at that floor, as the scripts read it: the room within 2^53.
    valid.then_some(Stored {
        rate: rate as u64,
        interval: interval as u64,
        burst: burst as u64,
        warmup: warmup as u64,
        units: units.max((cap - MAX_EXACT) as i64),
        at: at as u64,
        cold: cold as u64,
    })
}

/// What a decision plans for one token bucket (the token fields of `r` in the
/// scripts, once `plan_tokens` has run).
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// The rule's rate.
    pub rate: u64,
    /// The rule's interval, in ms.
    pub interval: u64,
    /// The rule's burst.
    pub burst: u64,
    /// The rule's warm-up, in ms.
    pub warmup: u64,
    /// Units after refilling at the decision's time, before this call takes any.
    pub units: i64,
    /// Coldness after refilling at the decision's time.
    pub cold: u64,
    /// The last refill time to store: the later of the stored one and now.
    pub at: u64,
}

/// plan_tokens: a bucket at `now` for a rule of `rate` per `interval` ms holding
/// `burst` and warming up over `warmup` ms, from its stored state (`None`: missing, so
/// full and cold). A stored config that differs keeps its whole tokens and whole
/// tokens of coldness, each up to its new maximum (the fraction of a token dropped, a
/// debt forgiven: never more than the rate passes); a bucket at rest (full and cold)
/// stays at rest. Answers the plan and the stored state when its config differed.
pub fn plan_tokens(
    rate: u64,
    interval: u64,
    burst: u64,
    warmup: u64,
    stored: Option<&Stored>,
    now: u64,
) -> (Plan, Option<Stored>) {
    let mut plan = Plan {
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
        return (Plan::refilled(old, now), None);
    }
    let (units, cold) = refill(old, now);
    plan.at = old.at.max(now);
    // A bucket at rest holds no information (it may as well have expired): at rest
    // under the new config too.
    let at_rest = units >= (old.burst * old.interval) as i64 && cold >= old.warmup * old.rate;
    if !at_rest {
        // (products past 64 bits, a large old burst or coldness taken to a long new
        // interval, capped as the scripts' doubles cap them)
        let whole = units.div_euclid(old.interval as i64).max(0) as u64;
        let carried = |n: u64, most: u64| (u128::from(n) * u128::from(interval)).min(u128::from(most)) as u64;
        plan.units = carried(whole, plan.capacity()) as i64;
        plan.cold = carried(cold / old.interval, plan.coldest());
    }
    (plan, Some(*old))
}

impl Plan {
    /// The most units the bucket holds.
    #[inline]
    fn capacity(&self) -> u64 {
        self.burst * self.interval
    }

    /// The most coldness the bucket holds.
    #[inline]
    fn coldest(&self) -> u64 {
        self.warmup * self.rate
    }

    /// The plan of a stored bucket at `now`, under its own config (`plan_tokens` when
    /// the config is the rule's own).
    #[inline]
    pub fn refilled(stored: &Stored, now: u64) -> Plan {
        let (units, cold) = refill(stored, now);
        Plan {
            rate: stored.rate,
            interval: stored.interval,
            burst: stored.burst,
            warmup: stored.warmup,
            units,
            cold,
            at: stored.at.max(now),
        }
    }

    /// token_cost: the units `permits` cost now: their tokens, and on a bucket colder
    /// than half its maximum up to twice as many again (in [`COLD_STEPS`] steps).
    #[inline]
    pub fn token_cost(&self, permits: u64) -> u64 {
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
    #[inline]
    pub fn wait(&self, permits: u64) -> Option<u64> {
        let need = (permits * self.interval) as i64;
        (self.units < need).then(|| (need - self.units).unsigned_abs().div_ceil(self.rate))
    }

    /// Whole tokens left after taking `permits` (0 when refused, or in debt).
    #[inline]
    pub fn left(&self, taken: u64) -> u64 {
        self.whole(self.take_tokens(taken).0)
    }

    /// The whole tokens in `units` (0 in debt).
    #[inline]
    pub fn whole(&self, units: i64) -> u64 {
        units.max(0) as u64 / self.interval
    }

    /// take_tokens: units and coldness after taking `taken` permits: their cost off
    /// the units, their tokens off the coldness.
    #[inline]
    pub fn take_tokens(&self, taken: u64) -> (i64, u64) {
        if taken == 0 {
            return (self.units, self.cold);
        }
        let need = taken * self.interval;
        (
            self.units - self.token_cost(taken) as i64,
            self.cold.saturating_sub(need),
        )
    }

    /// The settle of a grant of `estimate` permits that used `actual` (settle.lua's
    /// `settle_tokens`, after the refill): units and coldness with the tokens not used
    /// given back, at most `room` units (see [`grant_room`] and [`room_at`]) and up to
    /// the capacity, and to a warm-up the coldness they took off it and as much as
    /// the extra cost a cold grant may have charged for them less what came back, up to
    /// the coldest; or the excess taken as taking it would, down to the rate below
    /// zero (one interval's refill; [`DEBT_FLOOR`] at the lowest, and the capacity
    /// less 2^53, so that the room stays within 2^53 as the scripts count it).
    pub fn settle_tokens(&self, estimate: u64, actual: u64, room: u64) -> (i64, u64) {
        if actual < estimate {
            let unused = u128::from(estimate - actual) * u128::from(self.interval);
            let back = unused.min(u128::from(room));
            let units = (i128::from(self.units) + back as i128).min(i128::from(self.capacity()));
            // and to a warm-up, the coldness the permits not used took off it, and the
            // extra cost a cold grant may have charged for them (up to two tokens a
            // permit) less what came back: had the grant taken only what it used,
            // those tokens would have refilled the bucket sooner and its refill past
            // the burst made it colder
            let cooled = (4 * unused).saturating_sub(back);
            let cold = (u128::from(self.cold) + cooled).min(u128::from(self.coldest()));
            return (units as i64, cold as u64);
        }
        // An excess whose plain tokens reach the floor, the rate below zero: the floor
        // (a settle may charge up to 2^32 permits, whose units no 64-bit product holds
        // for a long interval).
        let floor = (-(i128::from(self.rate) * i128::from(self.interval)))
            .max(i128::from(DEBT_FLOOR))
            .max(i128::from(self.capacity()) - MAX_EXACT) as i64;
        let excess = actual - estimate;
        let need = u128::from(excess) * u128::from(self.interval);
        let above = i128::from(self.units) - i128::from(floor);
        // To a warm-up, an excess takes off the coldness only the tokens of the permits
        // a grant could take now, their tokens held (a grant never takes a token the
        // bucket lacks), whose cost the units above the floor pay: the part of an
        // excess charged into debt, or past the floor (charged nothing), warms
        // nothing. Warmth bought with debt tipped a bucket drained as it refills from
        // one that stays cold into one that stays warm, granting about twice as much
        // for a larger report; past the floor, reporting more warmed it for free (up
        // to its warm-up switched off at once).
        let held = u64::try_from(self.units).map_or(0, |units| units / self.interval);
        let warmed = |permits: u64| self.cold.saturating_sub(permits.min(held) * self.interval);
        if (need as i128) < above {
            let (units, _) = self.take_tokens(excess);
            if units >= floor {
                return (units, warmed(excess));
            }
        }
        // The floor (a warm-up's extra cost may have left the units below it: kept
        // there), warmed by at most the permits whose cost the units above it paid.
        let paid = u64::try_from(above).map_or(0, |above| self.permits_costing_at_most(above));
        (floor.min(self.units), warmed(paid))
    }

    /// The most permits whose [`token_cost`](Plan::token_cost) is at most `units`.
    fn permits_costing_at_most(&self, units: u64) -> u64 {
        let coldest = self.coldest();
        let half = coldest / 2;
        if self.cold <= half {
            return units / self.interval;
        }
        // Each permit's cost is its tokens times 1 + 2 steps / COLD_STEPS, rounded up
        // over all of them: the quotient, then corrected by a permit either way.
        let steps = u128::from(self.cold - half) * u128::from(COLD_STEPS) / u128::from(coldest - half);
        let per = (u128::from(COLD_STEPS) + 2 * steps) * u128::from(self.interval);
        let mut permits = (u128::from(units) * u128::from(COLD_STEPS) / per) as u64;
        while permits > 0 && self.token_cost(permits) > units {
            permits -= 1;
        }
        while self.token_cost(permits + 1) <= units {
            permits += 1;
        }
        permits
    }

    /// store_tokens: the state to store holding `units` and `cold` (as
    /// [`take_tokens`](Plan::take_tokens) answers them), and when it is full and cold
    /// again (at least 1 ms after its refill time): where its key's TTL ends.
    #[inline]
    pub fn store_tokens(&self, units: i64, cold: u64) -> (Stored, u64) {
        // `Stored::rest_in`, at least 1, in unsigned numbers: a plan never holds more
        // than its capacity.
        let short = (self.capacity() as i64 - units) as u64 + (self.coldest() - cold);
        let to_rest = short.div_ceil(self.rate).max(1);
        let stored = Stored {
            rate: self.rate,
            interval: self.interval,
            burst: self.burst,
            warmup: self.warmup,
            units,
            at: self.at,
            cold,
        };
        (stored, self.at + to_rest)
    }
}

/// The refill of `plan_tokens`: a stored bucket's units and coldness refilled at its
/// own rate from its last refill to `now`: units up to its capacity, the rest to its
/// coldness, up to its maximum.
#[inline]
pub fn refill(old: &Stored, now: u64) -> (i64, u64) {
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

/// The units a settle may give back of a grant of `estimate` permits that left `left`
/// whole tokens in a bucket of `burst` refilled at `interval` units a token: the room
/// above the bucket's units right after the grant, at most. Those units were at most
/// the capacity less the estimate's tokens (the bucket held at most its capacity) and
/// less than `left + 1` tokens. Tokens given back beyond that room would have been
/// refilled past the capacity, had the grant taken only what it used.
pub fn grant_room(burst: u64, interval: u64, estimate: u64, left: u64) -> u64 {
    let (interval, capacity) = (u128::from(interval), u128::from(burst) * u128::from(interval));
    let after = (capacity.saturating_sub(u128::from(estimate) * interval))
        .min(u128::from(left) * interval + interval - 1);
    (capacity - after.min(capacity)) as u64
}

/// The part of a grant's `room` (its [`grant_room`], at `at`) left at `now`, the
/// bucket's refill time, by a bucket refilled at `rate` units a ms: what refilled
/// since filled the room first. A settle giving back no more than this never lets a
/// bucket hold more than it would had the grant taken only what it used, while no
/// other settle gave back into it since the grant.
pub fn room_at(room: u64, rate: u64, at: u64, now: u64) -> u64 {
    let refilled = u128::from(rate) * u128::from(now.saturating_sub(at));
    u128::from(room).saturating_sub(refilled) as u64
}

#[cfg(test)]
mod tests;
