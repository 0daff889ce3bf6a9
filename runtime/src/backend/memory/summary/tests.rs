//! The summary's promise, checked against a model: whatever was merged, a part's
//! recalled grants count at least what it granted in any window still live, and a
//! recalled token bucket holds no more than the part held.

use super::*;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// permits at or after tau
fn tail(grants: &[(u64, u64)], tau: u64) -> u64 {
    grants.iter().filter(|g| g.0 >= tau).map(|g| g.1).sum()
}

#[test]
fn an_own_trace_comes_back_as_grouped() {
    let mut s = Summary::new(64);
    let g = [(1_000, 2), (20_000, 1), (50_000, 3)];
    s.keep_window(7, Part::Window(0), &g, 60_000, 110_000, 60_000);
    let r = s.recall_window(7, Part::Window(0), 61_000).own;
    assert_eq!(r, vec![(20_000, 3), (50_000, 3)]);
    // another part, another name: nothing
    assert!(s.recall_window(7, Part::Window(1), 61_000).own.is_empty());
    assert!(s.recall_window(8, Part::Window(0), 61_000).own.is_empty());
    // dead after until
    assert!(s.recall_window(7, Part::Window(0), 110_000).own.is_empty());
}

#[test]
fn recalled_then_kept_again_does_not_grow() {
    let mut s = Summary::new(64);
    let g = [(1_000, 2), (20_000, 1), (50_000, 3)];
    s.keep_window(7, Part::Window(0), &g, 60_000, 110_000, 60_000);
    let mut now = 61_000;
    for _ in 0..50 {
        let r = s.recall_window(7, Part::Window(0), now).own;
        s.keep_window(7, Part::Window(0), &r, 60_000, 110_000, now);
        now += 10;
    }
    assert_eq!(
        s.recall_window(7, Part::Window(0), now).own,
        vec![(20_000, 3), (50_000, 3)]
    );
}

/// Many names in a small table: every name's recalled tails cover its own, at every
/// time, whatever was merged; buckets likewise recall no more tokens than held.
#[test]
fn model_every_recall_covers_its_own() {
    for seed in 1..=2_000u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let cells = 1 + rng.below(16) as usize;
        let mut s = Summary::new(cells);
        // truth: per name, its grants and its bucket (short, burst, at, until)
        let names = 1 + rng.below(if seed % 2 == 0 { 40 } else { 400 });
        let mut truth: Vec<Vec<(u64, u64)>> = vec![Vec::new(); names as usize];
        let mut buckets: Vec<Option<(u64, u64, u64, u64)>> = vec![None; names as usize];
        let mut until_of: Vec<u64> = vec![0; names as usize];
        let mut now = 100_000u64;
        let intervals = [1_000u64, 7_000, 60_000];
        for _ in 0..400 {
            now += rng.below(3_000);
            let k = rng.below(names) as usize;
            let hash = mix_name(k as u64);
            let interval = intervals[k % 3];
            if until_of[k] <= now {
                truth[k].clear();
            }
            match rng.below(3) {
                0 => {
                    // The name is made again from its traces, takes some grants and is
                    // let go: it writes back its own trace and new grants, never the
                    // extra the mixed cell added.
                    let recalled = s.recall_window(hash, Part::Window(0), now);
                    check(&recalled.all(), &truth[k], now, until_of[k], seed, interval);
                    let mut grants = recalled.own.clone();
                    for _ in 0..rng.below(4) {
                        let t = now - rng.below(interval.min(now));
                        let p = 1 + rng.below(5);
                        grants.push((t, p));
                        truth[k].push((t, p));
                    }
                    let until = now + interval;
                    if !grants.is_empty() {
                        until_of[k] = until;
                    }
                    if seed == 2 && k == KDBG {
                        eprintln!("keep k={k} now={now} grants={grants:?} recalled={recalled:?}");
                    }
                    s.keep_window(hash, Part::Window(0), &grants, interval, until, now);
                    if !grants.is_empty() {
                        let back = s.recall_window(hash, Part::Window(0), now);
                        check(
                            &back.all(),
                            &truth[k],
                            now,
                            until_of[k],
                            seed + 1_000_000,
                            interval,
                        );
                    }
                }
                1 => {
                    let recalled = s.recall_bucket(hash, Part::Bucket(0), now);
                    if let Some((short, burst, at, until)) = buckets[k] {
                        if until > now {
                            // in parts of a token: got <= burst - short * (until - now) / (until - at)
                            let full = (burst as i128) << TOKEN_PARTS;
                            let got = recalled.map_or(full, |r| r.tokens.min(full));
                            let (left, span) = ((until - now.max(at)) as i128, (until - at) as i128);
                            assert!(
                                got * span <= full * span - ((short as i128) << TOKEN_PARTS) * left,
                                "seed {seed}: bucket recalled {got} parts, above {burst} less {short} \
                                 falling from {at} to none at {until}, at {now}"
                            );
                        }
                    }
                    let burst = 10 + (k as u64 % 3);
                    let short = rng.below(30);
                    let until = now + 1 + rng.below(20_000);
                    // The new state is no fuller than the recalled one.
                    let short = match recalled {
                        Some(r) => short.max(
                            ((((burst as i128) << TOKEN_PARTS) - r.tokens).max(0) as u128)
                                .div_ceil(1 << TOKEN_PARTS) as u64,
                        ),
                        None => short,
                    };
                    buckets[k] = Some((short, burst, now, until));
                    s.keep_bucket(
                        hash,
                        Part::Bucket(0),
                        BucketTrace {
                            short,
                            burst,
                            at: now,
                            until,
                        },
                        now,
                    );
                }
                _ => {
                    let back = s.recall_window(hash, Part::Window(0), now);
                    check(&back.all(), &truth[k], now, until_of[k], seed, interval);
                }
            }
        }
    }
}

const KDBG: usize = usize::MAX;
fn check(recalled: &[(u64, u64)], truth: &[(u64, u64)], now: u64, until: u64, seed: u64, interval: u64) {
    if until <= now {
        return;
    }
    for &(tau, _) in truth.iter().filter(|g| g.0 + interval > now) {
        assert!(
            tail(recalled, tau) >= tail(truth, tau),
            "seed {seed}: at {tau} recalled {} < true {} ({recalled:?} vs {truth:?})",
            tail(recalled, tau),
            tail(truth, tau)
        );
    }
}

fn mix_name(k: u64) -> u64 {
    k.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x1234
}

#[test]
fn a_summary_takes_at_most_its_stated_bytes() {
    assert_eq!(std::mem::size_of::<Cell>(), 136);
    assert_eq!(Summary::most_bytes(500), 136_000);
    assert_eq!(crate::backend::memory::most_summary_bytes(100_000), 13_600_000);
}
