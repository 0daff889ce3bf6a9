//! Token buckets as they are stored: the string `rate:interval:burst:units:at` (with
//! a warm-up `...:warmup:cold`) under `{NAME}:bucket`, `{NAME}:bucket:CLIENT_ID` per
//! client, read and refilled to a given time with the runtime's own arithmetic
//! (`redlimit_runtime::algorithm::bucket`, the twin of the scripts' `lib/bucket.lua`).
//! Read-only: the CLI computes from the stored state and writes nothing.

use redlimit_runtime::algorithm::bucket::{self, Plan, Stored};
use redlimit_runtime::keys::suffix;

/// A bucket's stored state, in the scripts' units: `units` in 1/`interval` of a token,
/// `cold` (its coldness) in the same units, from 0 (warm) to `warmup * rate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    pub rate: i64,
    pub interval_ms: i64,
    pub burst: i64,
    pub units: i64,
    pub at_ms: i64,
    pub warmup_ms: i64,
    pub cold: i64,
}

impl State {
    /// The state stored as `raw`, or `None` when it is not one the scripts wrote (the
    /// same checks as theirs: `read_bucket`).
    pub fn parse(raw: &str) -> Option<State> {
        bucket::read_bucket(raw).map(State::from)
    }

    /// The state in the runtime's terms (every number but `units` is at least 0).
    fn stored(&self) -> Stored {
        Stored {
            rate: self.rate as u64,
            interval: self.interval_ms as u64,
            burst: self.burst as u64,
            warmup: self.warmup_ms as u64,
            units: self.units,
            at: self.at_ms as u64,
            cold: self.cold as u64,
        }
    }

    /// The bucket refilled to `now` (ms): units up to the burst, the rest of the
    /// refill to its coldness, up to its maximum (`plan_tokens`' refill).
    pub fn at(&self, now: i64) -> State {
        if now <= self.at_ms {
            return *self;
        }
        let (units, cold) = bucket::refill(&self.stored(), now as u64);
        State {
            units,
            cold: cold as i64,
            at_ms: now,
            ..*self
        }
    }

    /// Whole tokens held (negative: a debt of a cold bucket's extra cost).
    pub fn tokens(&self) -> i64 {
        self.units.div_euclid(self.interval_ms)
    }

    /// Milliseconds until it holds its burst again.
    pub fn full_in_ms(&self) -> i64 {
        self.stored().full_in() as i64
    }

    /// Milliseconds until it is full and, with a warm-up, cold again: when its key
    /// expires.
    pub fn rested_in_ms(&self) -> i64 {
        self.stored().rest_in() as i64
    }

    /// Its coldness as a share of the most (0 warm, 1 cold); `None` without a warm-up.
    pub fn coldness(&self) -> Option<f64> {
        let coldest = self.warmup_ms * self.rate;
        (coldest > 0).then(|| self.cold as f64 / coldest as f64)
    }

    /// Tokens a permit costs now: 1, and above half the most coldness up to 3. The
    /// factor itself, which `token_cost` charges rounded up in `COLD_STEPS` steps.
    pub fn cost_per_permit(&self) -> f64 {
        let coldest = self.warmup_ms * self.rate;
        let half = (coldest / 2) as f64;
        if coldest <= 0 || (self.cold as f64) <= half {
            return 1.0;
        }
        1.0 + 2.0 * (self.cold as f64 - half) / (coldest as f64 - half)
    }

    /// Milliseconds until `permits` would be granted (0: now), `None` when more than
    /// the burst: a grant needs the permits' own tokens.
    pub fn wait_for(&self, permits: u64) -> Option<i64> {
        if permits > self.burst as u64 {
            return None;
        }
        // The bucket as it is, planned at its own refill time.
        let plan = Plan::refilled(&self.stored(), self.at_ms as u64);
        Some(plan.wait(permits).unwrap_or(0) as i64)
    }
}

impl From<Stored> for State {
    fn from(s: Stored) -> State {
        State {
            rate: s.rate as i64,
            interval_ms: s.interval as i64,
            burst: s.burst as i64,
            units: s.units,
            at_ms: s.at as i64,
            warmup_ms: s.warmup as i64,
            cold: s.cold as i64,
        }
    }
}

/// The limiter a bucket key belongs to, and its client for a per-client key: `{NAME}:bucket`,
/// `NAME:bucket` (NAME with a `{`), and either followed by `:CLIENT_ID`.
pub fn limiter_of(key: &str) -> Option<(String, Option<String>)> {
    let name_of = |base: &str| -> Option<String> {
        let name = match base.strip_prefix('{').and_then(|b| b.strip_suffix('}')) {
            Some(inner) if !inner.is_empty() && !inner.contains(['{', '}']) => inner.to_owned(),
            _ if base.contains('{') => base.to_owned(),
            _ => return None,
        };
        // Only a name whose own bucket key this is.
        (suffix(&name, "bucket") == format!("{base}:bucket")).then_some(name)
    };
    if let Some(base) = key.strip_suffix(":bucket") {
        if let Some(name) = name_of(base) {
            return Some((name, None));
        }
    }
    let (head, client) = key.rsplit_once(':')?;
    let base = head.strip_suffix(":bucket")?;
    if client.is_empty() {
        return None;
    }
    Some((name_of(base)?, Some(client.to_owned())))
}

/// One piece of a SCAN pattern: every piece but `*` matches one character.
enum Piece {
    Star,
    Any,
    Char(char),
    /// `[...]`: ranges (a single character is a range of one), negated with `^`.
    Class(Vec<(char, char)>, bool),
}

impl Piece {
    fn matches(&self, c: char) -> bool {
        match self {
            Piece::Star | Piece::Any => true,
            Piece::Char(p) => *p == c,
            Piece::Class(ranges, negate) => ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&c)) != *negate,
        }
    }
}

fn pieces(pattern: &str) -> Vec<Piece> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '*' => out.push(Piece::Star),
            '?' => out.push(Piece::Any),
            '\\' if i + 1 < chars.len() => {
                i += 1;
                out.push(Piece::Char(chars[i]));
            }
            '[' => {
                i += 1;
                let negate = chars.get(i) == Some(&'^');
                if negate {
                    i += 1;
                }
                let mut ranges = Vec::new();
                while i < chars.len() && chars[i] != ']' {
                    if chars[i] == '\\' && i + 1 < chars.len() {
                        ranges.push((chars[i + 1], chars[i + 1]));
                        i += 2;
                    } else if i + 2 < chars.len() && chars[i + 1] == '-' && chars[i + 2] != ']' {
                        let (a, b) = (chars[i], chars[i + 2]);
                        ranges.push((a.min(b), a.max(b)));
                        i += 3;
                    } else {
                        ranges.push((chars[i], chars[i]));
                        i += 1;
                    }
                }
                out.push(Piece::Class(ranges, negate));
            }
            c => out.push(Piece::Char(c)),
        }
        i += 1;
    }
    out
}

/// Whether `text` matches the SCAN pattern `pattern` (`*`, `?`, `[...]` with `^` and
/// ranges, `\` escapes), as Redis matches keys; in time linear in the text for each
/// `*`, never exponential.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p = pieces(pattern);
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    // The last `*` seen, and where in the text it was tried up to.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some(Piece::Star) => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(piece) if piece.matches(t[ti]) => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|piece| matches!(piece, Piece::Star))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_refills_as_the_scripts() {
        // 10 per second, burst 20: 5 tokens at t = 1000.
        let s = State::parse("10:1000:20:5000:1000").unwrap();
        assert_eq!(s.tokens(), 5);
        let later = s.at(1_500);
        assert_eq!(later.tokens(), 10, "10 per second: 5 in 500 ms");
        assert_eq!(later.full_in_ms(), 1_000);
        assert_eq!(s.at(100_000).tokens(), 20, "never above the burst");
        assert_eq!(s.wait_for(6), Some(100));
        assert_eq!(s.wait_for(5), Some(0));
        assert_eq!(s.wait_for(21), None);
        assert_eq!(s.coldness(), None);
        // A warm-up of 2 s: full refill beyond the burst adds to the coldness.
        let w = State::parse("10:1000:20:20000:0:2000:0").unwrap();
        let cold = w.at(10_000);
        assert_eq!(cold.cold, 20_000);
        assert_eq!(cold.coldness(), Some(1.0));
        assert_eq!(cold.cost_per_permit(), 3.0);
        assert_eq!(w.rested_in_ms(), 2_000);
        // In debt (a settle's excess): tokens below zero, down to the scripts' floor.
        assert_eq!(State::parse("1:1000:5:-1000:1").unwrap().tokens(), -1);
        for bad in [
            "",
            "1:2:3",
            "0:1000:5:0:1",
            "1:1000:5:-4503599627370497:1",
            "a:1:1:1:1",
            "1:1:1:1:1:1",
        ] {
            assert_eq!(State::parse(bad), None, "{bad}");
        }
    }

    /// What the CLI shows of a bucket is what the runtime decides with: its refill,
    /// its wait, and a permit's cost against `token_cost` (the factor shown, rounded up
    /// to the step the runtime charges).
    #[test]
    fn shows_what_the_runtime_decides() {
        for (raw, now) in [
            ("10:1000:20:5000:1000", 1_700),
            ("10:1000:20:-3000:0:2000:15000", 900),
            ("7:60000:3:20000:5:4000:0", 200_000),
            ("1:1:5:0:0:100:90", 3),
        ] {
            let stored = bucket::read_bucket(raw).unwrap();
            let (plan, _) = bucket::plan_tokens(
                stored.rate,
                stored.interval,
                stored.burst,
                stored.warmup,
                Some(&stored),
                now as u64,
            );
            let shown = State::parse(raw).unwrap().at(now);
            assert_eq!((shown.units, shown.cold as u64), (plan.units, plan.cold), "{raw}");
            for permits in 1..=stored.burst {
                let wait = plan.wait(permits).unwrap_or(0) as i64;
                assert_eq!(shown.wait_for(permits), Some(wait), "{raw}: {permits}");
            }
            let charged = plan.token_cost(1) as f64 / plan.interval as f64;
            let factor = shown.cost_per_permit();
            assert!(charged >= factor - 1e-9, "{raw}: {charged} < {factor}");
            assert!(
                charged - factor <= 1.0 / plan.interval as f64 + 2.0 / 65_536.0,
                "{raw}"
            );
        }
    }

    #[test]
    fn keys_name_their_limiter() {
        assert_eq!(limiter_of("{a:b}:bucket"), Some(("a:b".into(), None)));
        assert_eq!(
            limiter_of("{a}:bucket:c-1"),
            Some(("a".into(), Some("c-1".into())))
        );
        assert_eq!(limiter_of("x{t}y:bucket"), Some(("x{t}y".into(), None)));
        assert_eq!(limiter_of("{a}:value"), None);
        assert_eq!(limiter_of("a:bucket"), None, "no braces: not a bucket key");
    }

    #[test]
    fn patterns_match_as_redis_matches() {
        assert!(glob_match("rate_limit:tb*", "rate_limit:tb:user:1"));
        assert!(!glob_match("rate_limit:tb*", "other"));
        assert!(glob_match("a?c", "abc"));
        assert!(glob_match("a[b-d]c", "acc"));
        assert!(!glob_match("a[^b]c", "abc"));
        assert!(glob_match("a\\*", "a*"));
        assert!(!glob_match("a\\*", "ab"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*b*c", "aXbYbZc"));
        assert!(!glob_match("a*b*c", "aXbYbZ"));
        let long = "a".repeat(5000);
        assert!(
            !glob_match(&format!("{}b", "*a".repeat(20)), &long),
            "in linear time"
        );
    }
}
