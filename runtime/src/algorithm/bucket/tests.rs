//! The token bucket's tests: refills, carried-over configs, warm-up, the refill's
//! shortcut against its definition, and the stored text read back.

use super::*;

/// The state to store after taking `taken` permits, and when it is full and cold.
fn store_after(plan: &Plan, taken: u64) -> (Stored, u64) {
    let (units, cold) = plan.take_tokens(taken);
    plan.store_tokens(units, cold)
}

fn take(stored_at: Option<&Stored>, warmup: u64, now: u64, permits: u64) -> (bool, Stored, u64) {
    let (plan, _) = plan_tokens(10, 1_000, 10, warmup, stored_at, now);
    let granted = plan.wait(permits).is_none();
    let (state, rest) = store_after(&plan, if granted { permits } else { 0 });
    (granted, state, rest)
}

#[test]
fn a_missing_bucket_is_full_and_refills_exactly() {
    // 10 per 1 000 ms, burst 5: a token every 100 ms.
    let (plan, old) = plan_tokens(10, 1_000, 5, 0, None, 0);
    assert!(old.is_none());
    assert_eq!(plan.wait(5), None);
    let (stored, rest) = store_after(&plan, 5);
    assert_eq!((stored.units, rest), (0, 500), "full again in 500 ms");
    let (plan, _) = plan_tokens(10, 1_000, 5, 0, Some(&stored), 150);
    assert_eq!(plan.units, 1_500, "1.5 tokens");
    assert_eq!(plan.wait(1), None);
    assert_eq!(plan.wait(2), Some(50), "half a token at 10 units per ms");
    assert_eq!(plan.left(1), 0);
}

#[test]
fn a_changed_config_keeps_whole_tokens_up_to_the_new_capacity() {
    let stored = Stored {
        rate: 10,
        interval: 1_000,
        burst: 10,
        warmup: 0,
        units: 7_500,
        at: 0,
        cold: 0,
    };
    let (plan, old) = plan_tokens(60, 60_000, 5, 0, Some(&stored), 0);
    assert_eq!(old, Some(stored));
    assert_eq!(
        plan.units,
        5 * 60_000,
        "7 whole tokens, clamped to the burst of 5"
    );
    let (plan, _) = plan_tokens(60, 60_000, 20, 0, Some(&stored), 0);
    assert_eq!(plan.units, 7 * 60_000);
    // Full under the old config (as if it had expired): full under the new one.
    let (plan, _) = plan_tokens(60, 60_000, 20, 0, Some(&stored), 250);
    assert_eq!(plan.units, 20 * 60_000);
    // Given a warm-up, a bucket that was not at rest starts warm; one at rest, cold.
    let (plan, _) = plan_tokens(10, 1_000, 10, 10_000, Some(&stored), 0);
    assert_eq!((plan.units, plan.cold), (7_000, 0));
    let (plan, _) = plan_tokens(10, 1_000, 10, 10_000, Some(&stored), 250);
    assert_eq!((plan.units, plan.cold), (10_000, 100_000));
}

#[test]
fn a_cold_bucket_grants_a_third_of_its_burst_then_a_third_of_the_rate() {
    // 10 per s, burst 10, warm-up 10 s: coldness up to 100 tokens, a permit costs
    // 3 tokens at the coldest.
    let (plan, _) = plan_tokens(10, 1_000, 10, 10_000, None, 0);
    assert_eq!((plan.cold, plan.token_cost(1)), (100_000, 3_000));
    let mut state = None;
    let mut granted = 0;
    while let (true, next, _) = take(state.as_ref(), 10_000, 0, 1) {
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
    let (plan, _) = plan_tokens(10, 1_000, 10, 10_000, Some(&state), 0);
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
        let (plan, _) = plan_tokens(10, 1_000, 10, warmup, state.as_ref(), now);
        match plan.wait(1) {
            None => {
                per_second[(now / 1_000) as usize] += 1;
                state = Some(store_after(&plan, 1).0);
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
    let mut stored = Stored {
        rate: 10,
        interval: 1_000,
        burst: 10,
        warmup: 10_000,
        units: 10_000,
        at: 0,
        cold: 0,
    };
    let mut rest = 0;
    for t in 0..200 {
        let (granted, next, next_rest) = take(Some(&stored), 10_000, t * 100, 1);
        assert!(granted);
        (stored, rest) = (next, next_rest);
    }
    assert_eq!(stored.cold, 0);
    // Full for half the warm-up: cold up to the threshold, still at cost 1.
    let full_at = stored.at + (10_000 - stored.units as u64).div_ceil(10);
    let (plan, _) = plan_tokens(10, 1_000, 10, 10_000, Some(&stored), full_at + 5_000);
    assert_eq!((plan.cold, plan.token_cost(1)), (50_000, 1_000));
    // Longer: dearer, up to 3 tokens.
    let (plan, _) = plan_tokens(10, 1_000, 10, 10_000, Some(&stored), full_at + 7_500);
    assert_eq!((plan.cold, plan.token_cost(1)), (75_000, 2_000));
    let (plan, _) = plan_tokens(10, 1_000, 10, 10_000, Some(&stored), full_at + 60_000);
    assert_eq!((plan.cold, plan.token_cost(1)), (100_000, 3_000));
    // The state expires exactly when it is full and cold.
    assert_eq!(rest, full_at + 10_000);
}

/// The refill, with its 64-bit shortcut, against its definition in wide integers:
/// units up to the capacity, what a full bucket cannot hold to the coldness, up to
/// its maximum; over random states, at the edges of each range too.
#[test]
fn the_refill_agrees_with_its_definition() {
    fn defined(old: &Stored, now: u64) -> (i64, u64) {
        let capacity = i128::from(old.burst * old.interval);
        let total = i128::from(old.units) + i128::from(now.saturating_sub(old.at)) * i128::from(old.rate);
        if total <= capacity {
            return (total as i64, old.cold);
        }
        let base = i128::from(old.units).max(capacity);
        let cold = (i128::from(old.cold) + total - base).min(i128::from(old.warmup * old.rate));
        (base as i64, cold as u64)
    }
    let mut draw = crate::test_support::draws(0x2545_f491_4f6c_dd1d_u64);
    let mut next = |below: u64| match draw(4) {
        0 => 0,
        1 => below - 1,
        _ => draw(below),
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
        let old = Stored {
            rate,
            interval,
            burst,
            warmup,
            units,
            at,
            cold,
        };
        assert_eq!(refill(&old, now), defined(&old, now), "{old:?} at {now}");
        // Around the moment the bucket is full.
        let full_at = at + (capacity as i64 - units).max(0) as u64 / rate;
        for now in full_at.saturating_sub(1)..=full_at + 2 {
            assert_eq!(refill(&old, now), defined(&old, now), "{old:?} at {now}");
        }
    }
}

#[test]
fn reads_what_the_scripts_store_and_refuses_the_rest() {
    let stored = read_bucket("10:1000:20:5000:1000").unwrap();
    assert_eq!(
        stored,
        Stored {
            rate: 10,
            interval: 1_000,
            burst: 20,
            warmup: 0,
            units: 5_000,
            at: 1_000,
            cold: 0,
        }
    );
    let warm = read_bucket("10:1000:20:-20000:0:2000:5").unwrap();
    assert_eq!((warm.units, warm.warmup, warm.cold), (-20_000, 2_000, 5));
    // In debt (a settle's excess), down to the floor.
    assert_eq!(read_bucket("1:1000:5:-1:1").unwrap().units, -1);
    // with its pending reservations' segments
    assert_eq!(
        read_bucket(
            "10:1000:20:5000:1000|900.15000.100000000000002,1000.20000.100000000000001.100000000000003"
        ),
        Some(stored)
    );
    let floor = format!("1:1000:5:{}:1", super::DEBT_FLOOR);
    assert_eq!(read_bucket(&floor).unwrap().units, super::DEBT_FLOOR);
    // Numbers as the scripts read them, as text up to 2^53: 16 characters with
    // leading zeros, and a capacity of 2^53 with the debt it leaves room for (2^53).
    assert_eq!(read_bucket("0000000000000010:1000:20:5000:1000"), Some(stored));
    assert!(read_bucket("1:8589934592:1048576:0:1").is_some());
    // a debt leaving more than 2^53 of room (an earlier build's settle's): read at the
    // floor a settle leaves now, the capacity less 2^53
    let deep = read_bucket("4503599627370498:1:4503599627370499:-4503599627370496:1").unwrap();
    assert_eq!(deep.units, 4_503_599_627_370_499 - (1 << 53));
    // ids of another program's text, of their length: carried, as the scripts do
    assert!(read_bucket("10:1000:20:5000:1000|900.15000.abcdefghijklmno").is_some());
    for bad in [
        "",
        "1:2:3",
        "0:1000:5:0:1",
        "1:1000:5:-4503599627370497:1",
        "a:1:1:1:1",
        "1:1:1:1:1:1",
        "10:1000:20:0:0:2000:20001",
        "1:9007199254740993:1:0:0",
        // a number past 2^53, which the scripts would read rounded
        "9007199254740993:1000:1:0:0",
        "1:1000:1:0:9007199254740993",
        "1:8589934592:1048576:9007199254740993:0",
        "1:1000:1:0:0:9007199254740993:0",
        // 17 characters, leading zeros and all: the scripts read no such number
        "00000000000000010:1000:20:5000:1000",
        "10:1000:20:00000000000005000:1000",
        // a capacity of 2^53 + 1 (3 x 3002399751580331), which a double rounds
        "1:3002399751580331:3:9007199254740992:1",
        // more tokens than it holds: no code of the library stores one so
        "10:1000:20:20001:0",
        "10:1000:20:5000:1000|",
        "10:1000:20:5000:1000|1000.5",
        "10:1000:20:5000:1000|1000.20001.5",
        "10:1000:20:5000:1000|1000.5.1|",
    ] {
        assert_eq!(read_bucket(bad), None, "{bad}");
    }
}

/// store_tokens ends a bucket's TTL when `Stored::rest_in` says, at least 1 ms on.
#[test]
fn a_stored_bucket_rests_when_rest_in_says() {
    let mut state = None;
    for now in (0..3_000).step_by(37) {
        let (plan, _) = plan_tokens(10, 1_000, 10, 10_000, state.as_ref(), now);
        let granted = plan.wait(1).is_none();
        let (stored, rest) = store_after(&plan, u64::from(granted));
        assert_eq!(rest, stored.at + stored.rest_in().max(1), "{stored:?}");
        state = Some(stored);
    }
}

/// A small bucket's rate, interval and burst drawn by `next`, with its capacity and
/// the ms it takes to fill.
fn small_bucket(next: &mut impl FnMut(u64) -> u64) -> (u64, u64, u64, u64, u64) {
    let (rate, interval, burst) = (next(20) + 1, next(1_000) + 1, next(20) + 1);
    let capacity = burst * interval;
    (rate, interval, burst, capacity, capacity.div_ceil(rate))
}

/// That bucket, without a warm-up, holding `units` at 1 000 ms.
fn small_stored((rate, interval, burst): (u64, u64, u64), units: i64) -> Stored {
    Stored {
        rate,
        interval,
        burst,
        warmup: 0,
        units,
        at: 1_000,
        cold: 0,
    }
}

/// A settle gives back no more than the bucket would hold had the grant taken only
/// what it used, and, with no other call between, less than a token short of it:
/// over random buckets (in debt too), grants, refills and another call between.
#[test]
fn a_settle_gives_back_at_most_what_the_grant_would_have_left() {
    let mut next = crate::test_support::draws(0x9e37_79b9_7f4a_7c15_u64);
    let mut settled_short = 0;
    for _ in 0..100_000 {
        let (rate, interval, burst, capacity, fill_ms) = small_bucket(&mut next);
        let units = next(capacity + capacity / 2 + 1) as i64 - (capacity / 2) as i64;
        let start = small_stored((rate, interval, burst), units);
        // `permits` taken from `stored` at `now` when it holds them: the state after.
        let take = |stored: &Stored, now: u64, permits: u64| {
            let (plan, _) = plan_tokens(rate, interval, burst, 0, Some(stored), now);
            let granted = plan.wait(permits).is_none();
            let (units, cold) = plan.take_tokens(if granted { permits } else { 0 });
            (plan.store_tokens(units, cold).0, granted)
        };
        let granted_at = 1_000 + next(fill_ms + 2);
        let (plan, _) = plan_tokens(rate, interval, burst, 0, Some(&start), granted_at);
        let whole = plan.whole(plan.units);
        if whole == 0 {
            continue;
        }
        let estimate = next(whole) + 1;
        let actual = next(estimate);
        let (real, _) = take(&start, granted_at, estimate);
        let (as_if, _) = take(&start, granted_at, actual);
        let left = real.units.max(0) as u64 / interval;
        let other = if next(2) == 0 { 0 } else { next(burst) + 1 };
        let between = granted_at + next(2 * fill_ms + 2);
        // (what the other call was granted taken in both: the bucket that gave more
        // back must not grant more)
        let (real, granted) = take(&real, between, other);
        let (as_if, as_if_granted) = take(&as_if, between, if granted { other } else { 0 });
        assert!(!granted || as_if_granted);
        let now = between + next(fill_ms + 2);
        let room = room_at(grant_room(burst, interval, estimate, left), rate, granted_at, now);
        let (settled, _) = plan_tokens(rate, interval, burst, 0, Some(&real), now)
            .0
            .settle_tokens(estimate, actual, room);
        let would = plan_tokens(rate, interval, burst, 0, Some(&as_if), now).0.units;
        let case =
            format!("{start:?} {estimate} at {granted_at}, {actual} used, {other} at {between}, at {now}");
        assert!(settled <= would, "{case}: {settled} > {would}");
        if other == 0 {
            assert!(would - settled < interval as i64, "{case}: {settled}, {would}");
            settled_short += u32::from(settled < would);
        }
    }
    // The room is read from whole tokens left: short of a fraction only now and then.
    assert!(settled_short < 5_000, "{settled_short}");
}

/// A warm-up bucket's settle leaves it granting no more at one instant than had its
/// grant taken only what it used: over random warm-up buckets (cold, warm, in debt),
/// grants, settles at once or later, the permits one at a time until refused at a
/// random time after the settle, never more than from the other bucket.
#[test]
fn a_warm_up_settle_grants_no_more_than_the_grant_taking_what_it_used() {
    let mut next = crate::test_support::draws(0x6a09_e667_f3bc_c908_u64);
    let mut compared = 0;
    for _ in 0..50_000 {
        let (rate, interval, burst) = (next(20) + 1, next(1_000) + 1, next(20) + 1);
        let warmup = next(4 * interval) + 1;
        let capacity = burst * interval;
        let fill_ms = capacity.div_ceil(rate);
        let start = Stored {
            rate,
            interval,
            burst,
            warmup,
            units: next(capacity + 1) as i64,
            at: 1_000,
            cold: next(warmup * rate + 1),
        };
        let plan_at =
            |stored: &Stored, now: u64| plan_tokens(rate, interval, burst, warmup, Some(stored), now).0;
        let granted_at = 1_000 + next(fill_ms + 2);
        let plan = plan_at(&start, granted_at);
        let whole = plan.whole(plan.units);
        if whole == 0 {
            continue;
        }
        let estimate = next(whole) + 1;
        let actual = next(estimate + 1);
        let (units, cold) = plan.take_tokens(estimate);
        let left = plan.whole(units);
        let real = plan.store_tokens(units, cold).0;
        let (units, cold) = plan.take_tokens(actual);
        let as_if = plan.store_tokens(units, cold).0;
        let settled_at = granted_at + next(2 * fill_ms + 2);
        let real_plan = plan_at(&real, settled_at);
        let room = room_at(
            grant_room(burst, interval, estimate, left),
            rate,
            granted_at,
            settled_at,
        );
        let (units, cold) = real_plan.settle_tokens(estimate, actual, room);
        let settled = real_plan.store_tokens(units, cold).0;
        // permits taken one at a time until refused, at `now`
        let drained = |stored: &Stored, now: u64| {
            let mut plan = plan_at(stored, now);
            let mut taken = 0;
            while plan.wait(1).is_none() && taken < 4 * burst {
                let (units, cold) = plan.take_tokens(1);
                (plan.units, plan.cold) = (units, cold);
                taken += 1;
            }
            taken
        };
        let now = settled_at + next(3 * fill_ms + 2);
        let (ours, other) = (drained(&settled, now), drained(&as_if, now));
        assert!(
            ours <= other,
            "{start:?}: {estimate} at {granted_at}, {actual} used, settled at {settled_at}, drained at {now}: {ours} > {other}"
        );
        compared += 1;
    }
    assert!(compared > 30_000, "{compared}");
}

/// A settle's excess the debt's floor cuts (its cost would take the units below it)
/// leaves a warm-up bucket at the floor, warmed by the tokens of the most permits whose
/// cost the units above the floor paid: every such excess, `u64::MAX` too, leaves the
/// same bucket, no warmer and no fuller than the largest excess the floor does not cut
/// (found here a permit at a time), over random warm-up buckets (cold, warm, in debt).
#[test]
fn an_excess_the_floor_cuts_warms_no_more_than_the_largest_it_does_not() {
    let mut next = crate::test_support::draws(0xbb67_ae85_84ca_a73b_u64);
    let mut cut_warm = 0;
    for _ in 0..20_000 {
        let plan = random_warm_up_plan(&mut next);
        let (rate, interval, capacity) = (plan.rate, plan.interval, plan.capacity());
        let floor = (-(i128::from(rate) * i128::from(interval)))
            .max(i128::from(DEBT_FLOOR))
            .max(i128::from(capacity) - MAX_EXACT) as i64;
        let above = (plan.units - floor).max(0) as u64;
        let mut fits = 0;
        while plan.token_cost(fits + 1) <= above {
            fits += 1;
        }
        let estimate = next(5);
        let largest = plan.settle_tokens(estimate, estimate + fits, 0);
        assert!(largest.0 >= floor.min(plan.units), "{plan:?}: {largest:?}");
        let past = [fits + 1, fits + 2 + next(1_000), u64::MAX - estimate];
        let settled: Vec<(i64, u64)> = past
            .iter()
            .map(|&excess| plan.settle_tokens(estimate, estimate + excess, 0))
            .collect();
        let case = format!("{plan:?}: {fits} fit above the floor {floor}, {largest:?}, past {settled:?}");
        assert!(settled.iter().all(|&s| s == settled[0]), "{case}");
        let (units, cold) = settled[0];
        assert_eq!(units, floor.min(plan.units), "{case}");
        assert!(units <= largest.0 && cold >= largest.1, "{case}");
        cut_warm += u32::from(cold < plan.cold);
    }
    assert!(cut_warm > 5_000, "{cut_warm}");
}

/// A settle's excess takes off a warm-up's coldness no more than the tokens of the
/// permits a grant could take at the settle (their tokens held, none in debt): over
/// random warm-up buckets (cold, warm, in debt) and excesses (small, past the floor,
/// `u64::MAX`), the coldness left is at least the coldness less those tokens.
#[test]
fn an_excess_warms_no_more_than_a_grant_could_take() {
    let mut next = crate::test_support::draws(0x3c6e_f372_fe94_f82b_u64);
    let mut warmed_less = 0;
    for _ in 0..20_000 {
        let plan = random_warm_up_plan(&mut next);
        let (rate, interval, burst) = (plan.rate, plan.interval, plan.burst);
        let estimate = next(5);
        let excess = match next(3) {
            0 => next(burst + 1) + 1,
            1 => next(4 * (burst + rate)) + 1,
            _ => u64::MAX - estimate,
        };
        let (_, cold) = plan.settle_tokens(estimate, estimate + excess, 0);
        let held = plan.units.max(0) as u64 / interval;
        let least = plan.cold.saturating_sub(excess.min(held) * interval);
        assert!(
            cold >= least,
            "{plan:?}: {excess} past {estimate}: {cold} < {least}"
        );
        warmed_less += u32::from(cold > plan.cold.saturating_sub(excess.saturating_mul(interval)));
    }
    assert!(warmed_less > 2_000, "{warmed_less}");
}

/// A random warm-up bucket (cold, warm, or in debt down to its rate below zero),
/// planned up to 100 ms after its last refill.
fn random_warm_up_plan(next: &mut impl FnMut(u64) -> u64) -> Plan {
    let (rate, interval, burst) = (next(20) + 1, next(1_000) + 1, next(20) + 1);
    let warmup = next(4 * interval) + 1;
    let stored = Stored {
        rate,
        interval,
        burst,
        warmup,
        units: next(burst * interval + 1) as i64 - next(2) as i64 * next(rate * interval) as i64,
        at: 1_000,
        cold: next(warmup * rate + 1),
    };
    plan_tokens(rate, interval, burst, warmup, Some(&stored), 1_000 + next(100)).0
}
