//! `REDLIMIT_BENCH_ROW=<row> REDLIMIT_BENCH_CALLS=<n> cargo run --release --example
//! bench_memory`: `n` in-process decisions of one row, one after the other on one
//! thread, for counting the instructions each takes: after the row's set-up and 1 000
//! decisions not counted (first uses, governor's clock calibrating itself), the `n`
//! decisions run in `counted`, the one function `scripts/memory-instructions.sh` has
//! callgrind count.
//!
//! Rows: `window-hot` and `bucket-hot`, one limiter decided again and again (a
//! sliding window, a token bucket); `window-keys` and `bucket-keys`, 100 000 limiters
//! made first, then decided in turn; `governor-hot` and `governor-keys`, governor's
//! keyed limiter (`check_key`) on the same keys; `window-refused`, one exhausted
//! sliding window refused again and again; `governor-refused`, governor's refusal.
//! Every limiter but the refused ones grants every call (a rate of 10^9 a second), so
//! each row measures the work of a decision, not how often it refuses.
//!
//! Keys that come and go: `window-stayed` / `window-returning` and `bucket-stayed` /
//! `bucket-returning` decide 100 000 keys in turn under a rule of 1 000 a minute (the
//! bucket's burst 1 000), on a clock the row moves: by nothing in the `-stayed` rows,
//! so each key comes back to the window or bucket it left, and by 1 ms a decision in
//! the `-returning` rows, so each key comes back 100 s later, after its window emptied
//! or its bucket filled again. `governor-returning` is governor's keyed limiter of the
//! same quota on a clock moved the same way.
//!
//! How each cost grows (`growth-` rows, BENCHMARKS.md "How each cost grows"), every
//! decision granted but the `-deny` ones, on a clock the row moves:
//! `growth-rules-N` (N = 1, 2, 4, 8), one call of N rules on N limiters of 10^9 a
//! second, the clock moved by 1 ms a call; `growth-permits-P` (P = 1, 10, 100, 1000),
//! one rule of 1 000 a second taking P permits, the clock moved by the window a call;
//! `growth-window-N-allow` and `growth-window-N-deny` (N = 10, 1000, 100000), a window
//! holding N live grants, then a grant (the window slides by 1 ms a call, one grant
//! in, one out) or a refusal (a rate of N an hour, every permit taken); `growth-left-N`
//! (N = 10, 1000, 100000), the first decision after N one-permit grants left the
//! window (each counted decision after N uncounted grants: run it with a few calls);
//! `growth-held-N` (N = 1, 1000, 1000000), one limiter decided with N - 1 others held.
//!
//! Reservations: `reserve-window` and `reserve-bucket` reserve 2 permits of one
//! settled rule (a sliding window and a token bucket as in the `-hot` rows) and settle
//! the reservation with 1, one reservation and its settle a step; `reserve-window-2`
//! reserves on two settled sliding windows, each settled with 1.
//!
//! The floor: `floor-hot` and `floor-keys` (one key, 100 000 in turn) are the least a
//! keyed decision in process does, written here to be counted beside the others: the
//! wall clock read in epoch ms, a lock taken, the key's entry found in a hash table by
//! a hash computed before (as a rule keeps its name's), its name compared, one step of
//! GCRA (a theoretical arrival time, governor's algorithm), the lock released. No
//! expiry, no log, no sweep, no bound on memory, no answer but granted or not.
//! `floor-named` is the same over 100 000 keys, each decision given its name as text
//! and hashing it with the keyed SipHash std's maps use (as the layer's per-request
//! names are hashed).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use redlimit::{Algorithm, Client, Rule};

const KEYS: usize = 100_000;
const RATE: u32 = 1_000_000_000;

/// `keys` rules granting every call, in their steady state: a sliding window of 10^9 a
/// second (its log loses its oldest grants as it gains new ones) kept alive for an
/// hour, so that no limiter expires between its turns even under an instruction
/// counter (an expired limiter is made again, which is not what the row measures); a
/// token bucket of 10^9 tokens refilling one an hour, so that it is never full again
/// (a full bucket is forgotten, as in Redis).
fn rules(algorithm: Algorithm, keys: usize) -> Vec<[Rule; 1]> {
    let hour = Duration::from_secs(3600);
    (0..keys)
        .map(|k| {
            let name = format!("rate_limit:bench:mem:{k}");
            [match algorithm {
                Algorithm::TokenBucket => Rule::new(name, 1, hour)
                    .algorithm(Algorithm::TokenBucket)
                    .burst(u64::from(RATE)),
                _ => Rule::new(name, u64::from(RATE), Duration::from_secs(1)).keep_alive(Some(hour)),
            }]
        })
        .collect()
}

fn redlimit_row(algorithm: Algorithm, keys: usize, calls: usize) {
    let client = Client::builder().max_limiters(KEYS + 1).memory();
    let rules = rules(algorithm, keys);
    let decide = |i: usize| {
        let decision = poll_once(client.check_rules(black_box(&rules[i % keys])));
        assert!(decision.unwrap().allowed);
    };
    (0..keys.max(1_000)).for_each(decide);
    counted(calls, decide);
}

/// The `reserve-` rows: 2 permits of `n` settled rules of the `-hot` rows' kind
/// reserved, then settled with 1.
fn reserve_row(algorithm: Algorithm, n: usize, calls: usize) {
    let client = Client::builder().max_limiters(KEYS + 1).memory();
    let rules: Vec<Rule> = rules(algorithm, n)
        .into_iter()
        .map(|[rule]| rule.permits(2).settled())
        .collect();
    let decide = |_| {
        let reserved = poll_once(client.reserve(black_box(&rules))).unwrap();
        let redlimit::Reserved::Granted(reservation) = reserved else {
            panic!("refused: {reserved:?}")
        };
        let settled = poll_once(reservation.settle(black_box(1))).unwrap();
        assert!(settled.rules.iter().all(|r| r.applied));
    };
    (0..1_000).for_each(decide);
    counted(calls, decide);
}

/// A future polled once where it is made: in process nothing waits.
fn poll_once<F: std::future::Future>(future: F) -> F::Output {
    let future = std::pin::pin!(future);
    match future.poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
        std::task::Poll::Ready(output) => output,
        std::task::Poll::Pending => panic!("an in-process decision waited"),
    }
}

/// `calls` decisions: the function the script counts.
#[inline(never)]
fn counted(calls: usize, mut decide: impl FnMut(usize)) {
    for i in 0..calls {
        decide(i);
    }
}

/// The `-stayed` and `-returning` rows: `KEYS` keys of 1 000 a minute decided in turn on
/// a clock moved by `step` a decision (the move counted in both rows alike).
fn coming_and_going_row(algorithm: Algorithm, step: Duration, calls: usize) {
    let clock = redlimit::ManualClock::new(1_700_000_000_000);
    let client = Client::builder()
        .max_limiters(KEYS + 1)
        .clock(clock.clone())
        .memory();
    let minute = Duration::from_secs(60);
    let rules: Vec<[Rule; 1]> = (0..KEYS)
        .map(|k| {
            let rule = Rule::new(format!("rate_limit:bench:mem:{k}"), 1_000, minute);
            [match algorithm {
                Algorithm::TokenBucket => rule.algorithm(Algorithm::TokenBucket).burst(1_000),
                _ => rule,
            }]
        })
        .collect();
    let decide = |i: usize| {
        clock.advance(black_box(step));
        let decision = poll_once(client.check_rules(black_box(&rules[i % KEYS])));
        assert!(decision.unwrap().allowed);
    };
    (0..KEYS).for_each(decide);
    counted(calls, decide);
}

/// governor's keyed limiter of 1 000 a minute over `KEYS` keys on a clock moved by
/// 1 ms a decision, as `coming_and_going_row` moves its own.
fn governor_returning_row(calls: usize) {
    let clock = governor::clock::FakeRelativeClock::default();
    let quota = governor::Quota::per_minute(NonZeroU32::new(1_000).unwrap());
    let limiter = governor::RateLimiter::dashmap_with_clock(quota, clock.clone());
    let decide = |i: usize| {
        clock.advance(black_box(Duration::from_millis(1)));
        assert!(limiter.check_key(black_box(&((i % KEYS) as u64))).is_ok());
    };
    (0..KEYS).for_each(decide);
    counted(calls, decide);
}

fn governor_row(keys: usize, calls: usize) {
    let quota = governor::Quota::per_second(NonZeroU32::new(RATE).unwrap());
    let limiter = governor::RateLimiter::keyed(quota);
    let decide = |i: usize| assert!(limiter.check_key(black_box(&((i % keys) as u64))).is_ok());
    (0..keys.max(1_000)).for_each(decide);
    counted(calls, decide);
}

/// A name with its hash computed once, the table's key in the floor rows.
struct Hashed {
    hash: u64,
    name: String,
}

impl std::hash::Hash for Hashed {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl PartialEq for Hashed {
    fn eq(&self, other: &Hashed) -> bool {
        self.name == other.name
    }
}

impl Eq for Hashed {}

/// The hasher of the floor's table: the hash a `Hashed` carries, as it is.
#[derive(Default)]
struct Carried(u64);

impl std::hash::Hasher for Carried {
    fn write(&mut self, _: &[u8]) {
        unreachable!("a Hashed writes its hash only")
    }

    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The floor rows' clock: the wall clock in epoch ms, in ns.
#[inline(always)]
fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        * 1_000_000
}

/// One GCRA step on a theoretical arrival time `tat`, in ns: one permit every ns
/// (10^9 a second), a burst of a second's permits. Whether it granted.
#[inline(always)]
fn gcra_step(tat: &mut u64, now: u64) -> bool {
    let (emission, burst) = (1u64, 1_000_000_000u64);
    let start = (*tat).max(now);
    let allowed = start - now <= burst;
    if allowed {
        *tat = start + emission;
    }
    allowed
}

fn floor_row(keys: usize, calls: usize) {
    use std::hash::BuildHasher;
    type Table = std::collections::HashMap<Hashed, u64, std::hash::BuildHasherDefault<Carried>>;
    let sip = std::collections::hash_map::RandomState::new();
    let names: Vec<Hashed> = (0..keys)
        .map(|k| {
            let name = format!("rate_limit:bench:mem:{k}");
            Hashed {
                hash: sip.hash_one(&name),
                name,
            }
        })
        .collect();
    let mut table = Table::default();
    for name in &names {
        table.insert(
            Hashed {
                hash: name.hash,
                name: name.name.clone(),
            },
            0,
        );
    }
    let table = std::sync::Mutex::new(table);
    let decide = |i: usize| {
        let now = now_ns();
        let mut table = table.lock().unwrap();
        let allowed = gcra_step(table.get_mut(black_box(&names[i % keys])).unwrap(), now);
        drop(table);
        assert!(allowed);
    };
    (0..keys.max(1_000)).for_each(decide);
    counted(calls, decide);
}

/// `floor_row` over `KEYS` keys, each decision hashing its name (given as text) with
/// a keyed SipHash before the table's probe.
fn floor_named_row(calls: usize) {
    let names: Vec<String> = (0..KEYS).map(|k| format!("rate_limit:bench:mem:{k}")).collect();
    let table: std::collections::HashMap<String, u64> = names.iter().map(|name| (name.clone(), 0)).collect();
    let table = std::sync::Mutex::new(table);
    let decide = |i: usize| {
        let now = now_ns();
        let mut table = table.lock().unwrap();
        let allowed = gcra_step(table.get_mut(black_box(names[i % KEYS].as_str())).unwrap(), now);
        drop(table);
        assert!(allowed);
    };
    (0..KEYS).for_each(decide);
    counted(calls, decide);
}

fn main() {
    let row = std::env::var("REDLIMIT_BENCH_ROW").expect("REDLIMIT_BENCH_ROW is not set");
    let calls: usize = std::env::var("REDLIMIT_BENCH_CALLS")
        .ok()
        .map_or(200_000, |n| n.parse().expect("REDLIMIT_BENCH_CALLS is a number"));
    match row.as_str() {
        "window-hot" => redlimit_row(Algorithm::SlidingWindow, 1, calls),
        "window-keys" => redlimit_row(Algorithm::SlidingWindow, KEYS, calls),
        "bucket-hot" => redlimit_row(Algorithm::TokenBucket, 1, calls),
        "bucket-keys" => redlimit_row(Algorithm::TokenBucket, KEYS, calls),
        "governor-hot" => governor_row(1, calls),
        "window-stayed" => coming_and_going_row(Algorithm::SlidingWindow, Duration::ZERO, calls),
        "window-returning" => coming_and_going_row(Algorithm::SlidingWindow, Duration::from_millis(1), calls),
        "bucket-stayed" => coming_and_going_row(Algorithm::TokenBucket, Duration::ZERO, calls),
        "bucket-returning" => coming_and_going_row(Algorithm::TokenBucket, Duration::from_millis(1), calls),
        "governor-returning" => governor_returning_row(calls),
        "governor-keys" => governor_row(KEYS, calls),
        "floor-hot" => floor_row(1, calls),
        "floor-keys" => floor_row(KEYS, calls),
        "floor-named" => floor_named_row(calls),
        "reserve-window" => reserve_row(Algorithm::SlidingWindow, 1, calls),
        "reserve-bucket" => reserve_row(Algorithm::TokenBucket, 1, calls),
        "reserve-window-2" => reserve_row(Algorithm::SlidingWindow, 2, calls),
        "window-refused" => {
            let client = Client::memory();
            let rules = [Rule::new(
                "rate_limit:bench:mem:refused",
                1,
                Duration::from_secs(3600),
            )];
            let decide = |_| assert!(!poll_once(client.check_rules(black_box(&rules))).unwrap().allowed);
            let _ = poll_once(client.check_rules(&rules));
            (0..1_000).for_each(decide);
            counted(calls, decide);
        }
        "governor-refused" => {
            let limiter =
                governor::RateLimiter::keyed(governor::Quota::per_hour(NonZeroU32::new(1).unwrap()));
            let _ = limiter.check_key(&1u64);
            let decide = |_| assert!(limiter.check_key(black_box(&1u64)).is_err());
            (0..1_000).for_each(decide);
            counted(calls, decide);
        }
        growth if growth.starts_with("growth-") => growth_row(growth, calls),
        other => panic!(
            "REDLIMIT_BENCH_ROW={other}: expected a growth- row, window-hot, window-keys, bucket-hot, bucket-keys, \
             governor-hot, governor-keys, window-refused, governor-refused, window-stayed, \
             window-returning, bucket-stayed, bucket-returning, governor-returning, floor-hot, floor-keys, \
             floor-named, reserve-window, reserve-bucket or reserve-window-2"
        ),
    }
}

/// The `growth-` rows: `row` is `growth-<kind>-<n>[-allow|-deny]`.
fn growth_row(row: &str, calls: usize) {
    let mut parts = row.split('-').skip(1);
    let kind = parts.next().unwrap_or_default();
    let n: usize = parts
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{row}: expected growth-<kind>-<number>"));
    let clock = redlimit::ManualClock::new(1_700_000_000_000);
    let client = Client::builder()
        .max_limiters(n.max(KEYS) + 8)
        .clock(clock.clone())
        .memory();
    let check = |rules: &[Rule], granted: bool| {
        assert_eq!(
            poll_once(client.check_rules(black_box(rules))).unwrap().allowed,
            granted
        );
    };
    if kind == "left" {
        // the first decision after n one-permit grants left the window
        let rules = [growth_rule("left", n, Duration::from_secs(1))];
        for _ in 0..calls {
            clock.advance(Duration::from_secs(3600));
            (0..n).for_each(|_| check(&rules, true));
            clock.advance(Duration::from_secs(1));
            counted(1, |_| check(&rules, true));
        }
        return;
    }
    let growth = growth_set_up(kind, n, parts.next() != Some("deny"));
    growth
        .fill
        .iter()
        .for_each(|rule| check(std::slice::from_ref(rule), true));
    let decide = |_| {
        clock.advance(growth.step);
        check(&growth.rules, growth.granted);
    };
    (0..growth.warm_up).for_each(decide);
    counted(calls, decide);
}

/// A `growth-` row but `left`: the rules of each decision, decided once each first
/// (`fill`), then `warm_up` decisions not counted, the clock moved by `step` before
/// each; each decision granted or not.
struct Growth {
    fill: Vec<Rule>,
    rules: Vec<Rule>,
    step: Duration,
    warm_up: usize,
    granted: bool,
}

/// A rule of the `growth-` rows, kept alive an hour.
fn growth_rule(name: &str, rate: usize, interval: Duration) -> Rule {
    Rule::new(format!("rate_limit:bench:growth:{name}"), rate as u64, interval)
        .keep_alive(Some(Duration::from_secs(3600)))
}

fn growth_set_up(kind: &str, n: usize, allow: bool) -> Growth {
    let (ms, second) = (Duration::from_millis(1), Duration::from_secs(1));
    let growth = |rules: Vec<Rule>, step: Duration, warm_up: usize| Growth {
        fill: Vec::new(),
        rules,
        step,
        warm_up,
        granted: true,
    };
    match kind {
        // n rules on n limiters, the window sliding by 1 ms a call
        "rules" => growth(
            (0..n)
                .map(|i| growth_rule(&format!("rules:{i}"), RATE as usize, second))
                .collect(),
            ms,
            2_000,
        ),
        // n permits of a rate of 1 000 a second, a window later each time
        "permits" => growth(
            vec![growth_rule("permits", 1_000, second).permits(n as u64)],
            second,
            1_000,
        ),
        // a window of n live grants, then a grant (the window slides by 1 ms a call,
        // one grant in and one out) or a refusal (a rate of n an hour, nothing leaving)
        "window" if allow => growth(vec![growth_rule("window", 2 * n, ms * n as u32)], ms, n + 1_000),
        "window" => {
            let rule = growth_rule("window", n, Duration::from_secs(3600));
            Growth {
                fill: vec![rule.clone(); n],
                granted: false,
                ..growth(vec![rule], ms, 1_000)
            }
        }
        // one limiter decided, with n - 1 others held
        "held" => Growth {
            fill: (0..n)
                .map(|i| growth_rule(&format!("held:{i}"), RATE as usize, second))
                .collect(),
            ..growth(vec![growth_rule("held:0", RATE as usize, second)], ms, 1_000)
        },
        _ => panic!("growth-{kind}: expected growth-rules, -permits, -window, -left or -held"),
    }
}
