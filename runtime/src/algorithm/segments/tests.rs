//! The segments' steps, their text, and settles with several reservations pending
//! against the bucket whose settled grants took only what they used.

use super::*;
use crate::algorithm::bucket::{grant_room, plan_tokens, room_at, Stored};

#[test]
fn segments_read_back_as_written_and_refuse_any_other_text() {
    let id = |n: u64| LEAST_ID + n;
    let mut segments = Segments::default();
    segments.open(1_000, 400, id(7));
    segments.open(1_500, 300, id(8));
    segments.open(1_400, 350, MOST_ID);
    let mut text = String::new();
    segments.write(&mut text);
    assert_eq!(
        text,
        "1000.400.100000000000007,1500.300.100000000000008,1500.350.999999999999999"
    );
    assert_eq!(Segments::read(&text, 400), Some(3));
    let one = id(1);
    for bad in [
        String::new(),
        "1000.1".into(),
        format!("1000.401.{one}"),
        format!("1500.1.{one},1000.1.{one}"),
        format!("1000.1.{one},"),
        format!("1000.1.{one}."),
        "1000.1.7".into(),
        "1000.1.0".into(),
        "1000.1.99999999999999".into(),
        "1000.1.9007199254740993".into(),
        "1000.1.1000000000000000".into(),
        "1000.1.0100000000000000".into(),
        format!("-1.1.{one}"),
        format!("1e3.1.{one}"),
        format!("1000.1..{one}"),
        format!("99999999999999999.1.{one}"),
        format!("00000000000000001.1.{one}"),
        format!("9007199254740993.1.{one}"),
    ] {
        assert_eq!(Segments::read(&bad, 400), None, "{bad:?}");
    }
    // Ids are counted by their text's length, as the scripts count them: another
    // program's text of that length is carried (it never equals a settle's id).
    for carried in [
        "1000.1.099999999999999",
        "1000.1.abcdefghijklmno",
        "1000.1.100000000000001X999999999999999",
        "0000000000000001.1.100000000000001",
    ] {
        assert!(Segments::read(carried, 400).is_some(), "{carried:?}");
    }
    assert_eq!(
        Segments::read(
            &format!("1000.1.{}.{}.{},1000.0.{}", id(1), id(2), id(3), id(4)),
            1
        ),
        Some(4),
        "grants of one ms, merged"
    );
    let most: Vec<String> = (0..=MOST_SEGMENTS).map(|i| format!("{i}.1.{one}")).collect();
    assert!(Segments::read(&most[..MOST_SEGMENTS].join(","), 1).is_some());
    assert_eq!(Segments::read(&most.join(","), 1), None, "one segment too many");
    let ids: Vec<String> = (1..=MOST_GRANTS as u64 + 1).map(|i| id(i).to_string()).collect();
    assert!(Segments::read(&format!("1.1.{}", ids[..MOST_GRANTS].join(".")), 1).is_some());
    assert_eq!(
        Segments::read(&format!("1.1.{}", ids.join(".")), 1),
        None,
        "one grant too many"
    );
    let long = format!("1.1.{}", vec![one.to_string(); MOST_TEXT].join("."));
    assert_eq!(
        Segments::read(&long, 1),
        None,
        "past the longest text, before reading it"
    );
}

/// Past the most pending grants, the oldest is forgotten (its settle gives nothing
/// back), a segment left without a grant dropped: a bucket's text stays small however
/// many reservations are pending.
#[test]
fn past_the_most_grants_the_oldest_is_forgotten() {
    let mut segments = Segments::default();
    for id in 0..MOST_GRANTS as u64 + 10 {
        segments.open(1_000 + id, 500, LEAST_ID + id + 1);
    }
    let ids: Vec<u64> = segments.0.iter().flat_map(|s| s.grants.clone()).collect();
    assert_eq!(ids.len(), MOST_GRANTS);
    assert_eq!(ids[0], LEAST_ID + 11, "the 10 oldest forgotten");
    assert_eq!(
        segments.settle(LEAST_ID + 1, 500),
        None,
        "nothing back for a forgotten grant"
    );
    assert!(segments.settle(LEAST_ID + 11, 500).is_some());
    let mut text = String::new();
    segments.write(&mut text);
    assert!(text.len() < MOST_TEXT, "{}", text.len());
}

#[test]
fn a_settle_reads_its_segment_and_every_later_one() {
    let mut segments = Segments::default();
    segments.open(100, 90, 1);
    segments.peak(40);
    // a grant of the same ms has a segment of its own
    segments.open(100, 70, 2);
    segments.peak(60);
    // the first grant reads both segments' least room, the second its own
    assert_eq!(segments.settle(1, 80), Some((0, 40)));
    assert_eq!(segments.settle(2, 80), Some((1, 60)));
    assert_eq!(segments.settle(3, 80), None, "a grant without a segment has none");
    // the second gives back 25: off its own room; merged into the first once settled
    segments.close(1, 2, 25);
    assert_eq!(
        segments.0,
        vec![Segment {
            at: 100,
            room: 35,
            grants: vec![1]
        }]
    );
    segments.close(0, 1, 35);
    assert!(segments.is_empty());
}

#[test]
fn past_the_most_segments_the_two_oldest_merge_and_old_ones_are_dropped() {
    let mut segments = Segments::default();
    for i in 0..=MOST_SEGMENTS as u64 {
        segments.open(100 * (i + 1), 1_000 - i, i);
    }
    assert_eq!(segments.0.len(), MOST_SEGMENTS);
    assert_eq!(
        segments.0[0],
        Segment {
            at: 100,
            room: 999,
            grants: vec![0, 1]
        }
    );
    // the second grant now reads the first's rooms too
    assert_eq!(segments.settle(1, 5_000).map(|(k, _)| k), Some(0));
    // a clock behind: the segment takes the last one's time
    segments.open(50, 10, 99);
    assert_eq!(
        segments.0.last().map(|s| s.at),
        Some(100 * (MOST_SEGMENTS as u64 + 1))
    );
    segments.prune(1_300, 1_000);
    assert_eq!(
        segments.0[0].at, 400,
        "those opened 1 000 ms or more before dropped"
    );
}

/// Reservations, plain calls and settles at random on a token bucket, the settle
/// bounded as the backends bound it (its grant's room less the refill since, and with
/// `segments` the least room of its segment and every later one): after every settle
/// the bucket holds at most what it would had every settled grant taken only what it
/// used. Answers how many runs held more, and the tokens given back in all.
fn random_runs(segments: bool, runs: u64) -> (u64, u64) {
    let mut next = crate::test_support::draws(0x243f_6a88_85a3_08d3_u64);
    let (mut over, mut given) = (0, 0);
    for _ in 0..runs {
        let (rate, interval, burst) = (next(3) + 1, 1_000, next(100) + 20);
        let capacity = burst * interval;
        let fill_ms = capacity.div_ceil(rate);
        let gap = fill_ms / (next(8) + 2);
        let mut stored = Stored {
            rate,
            interval,
            burst,
            warmup: 0,
            units: capacity as i64,
            at: 0,
            cold: 0,
        };
        let mut kept = Segments::default();
        // (time, permits taken, the reservation's index when one)
        let mut history: Vec<(u64, u64, Option<usize>)> = Vec::new();
        // (granted at, estimate, used, room, settle at, settled)
        let mut reservations: Vec<(u64, u64, u64, u64, u64, bool)> = Vec::new();
        let mut now = 0;
        let mut run_over = false;
        for _ in 0..60 {
            now += next(gap) + 1;
            // the settles due by now, in their order
            loop {
                let due = (reservations.iter().enumerate())
                    .filter(|(_, r)| !r.5 && r.4 <= now)
                    .min_by_key(|(_, r)| r.4)
                    .map(|(i, _)| i);
                let Some(i) = due else { break };
                let (at, estimate, used, room, settle_at, _) = reservations[i];
                let id = i as u64;
                let plan = plan_tokens(rate, interval, burst, 0, Some(&stored), settle_at).0;
                let mut bound = room_at(room, rate, at, plan.at);
                let mut segment = None;
                if segments {
                    segment = kept.settle(id, room_of(capacity, plan.units));
                    bound = bound.min(segment.map_or(0, |(_, b)| b));
                }
                let (units, cold) = plan.settle_tokens(estimate, used, bound);
                let back = (units - plan.units).max(0) as u64;
                if let Some((k, _)) = segment {
                    kept.close(k, id, back);
                }
                given += back;
                stored = plan.store_tokens(units, cold).0;
                reservations[i].5 = true;
                // the bucket whose settled grants took only what they used
                let mut level = capacity as i64;
                let mut last = 0;
                for &(t, permits, reservation) in &history {
                    level = (level + (rate * (t - last)) as i64).min(capacity as i64);
                    last = t;
                    level -= match reservation.map(|r| reservations[r]) {
                        Some(r) if r.5 => r.2 as i64,
                        _ => permits as i64,
                    };
                }
                level = (level + (rate * (settle_at - last)) as i64).min(capacity as i64);
                run_over |= stored.units > level;
            }
            let plan = plan_tokens(rate, interval, burst, 0, Some(&stored), now).0;
            let whole = plan.whole(plan.units);
            let kind = next(4);
            let permits = match kind {
                // a drain: every whole token
                3 => whole,
                _ => next(burst / 2) + 1,
            };
            if permits == 0 || plan.wait(permits).is_some() {
                continue;
            }
            kept.peak(room_of(capacity, plan.units));
            let (units, cold) = plan.take_tokens(permits);
            stored = plan.store_tokens(units, cold).0;
            if kind < 2 {
                kept.open(now, room_of(capacity, units), reservations.len() as u64);
                let left = units.max(0) as u64 / interval;
                let room = grant_room(burst, interval, permits, left);
                let used = next(permits + 1);
                let settle_at = now + next(4 * gap) + 1;
                history.push((now, permits * interval, Some(reservations.len())));
                reservations.push((now, permits, used, room, settle_at, false));
            } else {
                history.push((now, permits * interval, None));
            }
            kept.prune(now, fill_ms);
        }
        over += u64::from(run_over);
    }
    (over, given)
}

/// The segments hold where the refill bound alone does not: with several
/// reservations pending, one's settle gave back what another's already had.
#[test]
fn settles_of_several_pending_reservations_never_leave_more_than_the_grants_used() {
    let (over, given) = random_runs(true, 3_000);
    assert_eq!(over, 0, "runs over the bucket of what was used");
    assert!(given > 0);
    let (over_without, _) = random_runs(false, 3_000);
    assert!(
        over_without > 0,
        "the refill bound alone holds here: the runs test nothing"
    );
}
