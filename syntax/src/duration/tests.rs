//! The grammar's tests: what it accepts and refuses, with which message, that no
//! text makes it panic, and durations built part by part against a model of the rules.

use super::*;

/// A small deterministic generator for the random-input tests, so the crate needs no
/// test dependency.
struct XorShift(u64);

impl XorShift {
    /// The next number below `n`.
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

#[test]
fn accepted() {
    assert_eq!(parse_ms("250ms"), Ok(250));
    assert_eq!(parse_ms("60s"), Ok(60_000));
    assert_eq!(parse_ms("5m"), Ok(300_000));
    assert_eq!(parse_ms("1h"), Ok(3_600_000));
    assert_eq!(parse_ms("2d"), Ok(172_800_000));
}

#[test]
fn compound_and_decimal_forms() {
    assert_eq!(parse_ms("1m30s"), Ok(90_000));
    assert_eq!(parse_ms("1h15m"), Ok(4_500_000));
    assert_eq!(parse_ms("1d2h3m4s5ms"), Ok(93_784_005));
    assert_eq!(parse_ms("1s500ms"), Ok(1_500));
    assert_eq!(parse_ms("1.5s"), Ok(1_500));
    assert_eq!(parse_ms("0.25s"), Ok(250));
    assert_eq!(parse_ms("1m0.5s"), Ok(60_500));
    assert_eq!(parse_ms("1.5h"), Ok(5_400_000));
    assert_eq!(parse_ms("0.001s"), Ok(1));
}

#[test]
fn rejected_with_a_reason() {
    for (input, says) in [
        ("", "empty"),
        ("s", "must start each part with a number"),
        ("60", "needs a unit"),
        ("60sec", "unknown unit `sec`"),
        ("1.5", "needs a unit"),
        (".5s", "decimal point without digits"),
        ("1.s", "decimal point without digits"),
        ("1.5ms", "not a whole number of milliseconds"),
        ("0.0001s", "not a whole number of milliseconds"),
        ("1.0000000001s", "more than 9 decimals"),
        ("30s1m", "`m` after `s`"),
        ("1m1m", "`m` after `m`"),
        ("1.5m30s", "only the last part may have decimals"),
        ("0m0s", "zero"),
        ("-1s", "must start each part with a number"),
        ("0s", "zero"),
        ("99999999999999999999d", "too long"),
        ("200000000000d", "too long"),
        // The largest whole number of days u128 holds, plus half a day.
        ("3938453320844195178974243141571.5d", "too long"),
        ("340282366920938463463374607431768211.5s", "too long"),
        ("60 s", "unknown unit ` s`"),
    ] {
        let err = parse_ms(input).unwrap_err();
        assert!(err.contains(says), "{input:?}: {err}");
    }
}

#[test]
fn no_input_panics() {
    // Every short string over a small alphabet, including multi-byte characters.
    let alphabet = [
        "", "0", "1", "9", "s", "m", "ms", "h", "d", "x", "é", " ", "-", ".",
    ];
    for a in alphabet {
        for b in alphabet {
            for c in alphabet {
                for d in alphabet {
                    let text = format!("{a}{b}{c}{d}");
                    match parse_ms(&text) {
                        Ok(ms) => assert!((1..=MAX_MS).contains(&ms)),
                        Err(message) => assert!(!message.is_empty()),
                    }
                }
            }
        }
    }
}

#[test]
fn random_inputs_never_panic_and_accepted_ones_round_trip() {
    let alphabet: Vec<char> = "0123456789smhdxé -.+_\u{0}🦀".chars().collect();
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    for _ in 0..100_000 {
        let len = rng.below(12);
        let text: String = (0..len).map(|_| alphabet[rng.below(alphabet.len())]).collect();
        match parse_ms(&text) {
            Ok(ms) => {
                assert!((1..=MAX_MS).contains(&ms), "{text:?}");
                let units: String = text
                    .chars()
                    .filter(|c| !c.is_ascii_digit() && *c != '.')
                    .collect();
                assert!(
                    ["ms", "s", "m", "h", "d"].iter().any(|u| units.contains(u)),
                    "{text:?}"
                );
                assert!(text.starts_with(|c: char| c.is_ascii_digit()), "{text:?}");
            }
            Err(message) => assert!(message.len() > 10, "{text:?}: {message}"),
        }
    }
}

#[test]
fn the_messages_are_these() {
    let accepted = "write a number and a unit (ms, s, m, h, d), e.g. \"60s\", \"1.5s\" or \"1m30s\"";
    assert_eq!(parse_ms(""), Err(format!("is empty; {accepted}")));
    assert_eq!(
        parse_ms("30s1m"),
        Err(
            "`30s1m` has `m` after `s`; write each unit once, largest first, e.g. \"1h15m\" or \"1m30s\""
                .into()
        )
    );
    assert_eq!(
        parse_ms("1.5m30s"),
        Err(format!(
            "`1.5m30s`: only the last part may have decimals; {accepted}"
        ))
    );
    assert_eq!(
        parse_ms("60"),
        Err("`60` needs a unit after `60`: ms, s, m, h or d, e.g. \"60s\"".into())
    );
    assert_eq!(
        parse_ms("1.5ms"),
        Err(
            "`1.5ms` is not a whole number of milliseconds; write it in a smaller unit, e.g. \"1500ms\""
                .into()
        )
    );
    assert_eq!(
        parse_ms("104249992d"),
        Err("`104249992d` is too long; the longest accepted is 2^53 ms (about 285 000 years)".into())
    );
    assert_eq!(parse_ms("104249991d"), Ok(104_249_991 * 86_400_000));
    assert_eq!(
        parse_ms("0s"),
        Err("`0s` is zero; it must be at least 1 ms".into())
    );
    // A text past 128 bytes is quoted by its start only, whatever its length.
    let long = format!("{}1s", "0".repeat(1 << 20));
    let refused = parse_ms(&long).unwrap_err();
    assert!(
        refused.starts_with(&format!("`{}...` is 1048578 bytes long", "0".repeat(32))),
        "{refused}"
    );
    assert!(refused.len() < 200, "{refused}");
    assert_eq!(
        parse_ms(&format!("{}1s", "0".repeat(126))),
        Ok(1_000),
        "128 bytes is read"
    );
}

/// What the rules say of a duration built of `parts` (digits, decimals, unit): its
/// milliseconds, or a phrase of the message refusing it, checked in the grammar's
/// order (each part's place, then its length, then the total).
fn model(parts: &[(&str, &str, &str)]) -> Result<u128, &'static str> {
    let mut total: u128 = 0;
    for (i, &(whole, fraction, unit)) in parts.iter().enumerate() {
        let rank = UNITS.iter().position(|(name, _)| *name == unit).unwrap();
        if i > 0 {
            let (_, earlier_fraction, earlier_unit) = parts[i - 1];
            if !earlier_fraction.is_empty() {
                return Err("only the last part may have decimals");
            }
            if rank <= UNITS.iter().position(|(name, _)| *name == earlier_unit).unwrap() {
                return Err("largest first");
            }
        }
        let digits = fraction.trim_start_matches('.');
        if digits.len() > 9 {
            return Err("more than 9 decimals");
        }
        let scale = u128::from(UNITS[rank].1);
        let denominator = 10u128.pow(digits.len() as u32);
        let exact = digits.parse::<u128>().unwrap_or(0) * scale;
        if exact % denominator != 0 {
            return Err("not a whole number of milliseconds");
        }
        total += whole.parse::<u128>().unwrap() * scale + exact / denominator;
        if total > u128::from(MAX_MS) {
            return Err("too long");
        }
    }
    if total == 0 {
        return Err("zero");
    }
    Ok(total)
}

#[test]
fn durations_built_part_by_part_follow_the_rules() {
    let units = ["d", "h", "m", "s", "ms"];
    let numbers = [
        "0",
        "1",
        "7",
        "30",
        "59",
        "60",
        "1000",
        "104249991",
        "104249992",
        "9007199254740992",
    ];
    let fractions = ["", ".5", ".25", ".001", ".0001", ".123456789", ".1234567891"];
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    let mut accepted = 0;
    for _ in 0..200_000 {
        let mut parts = Vec::new();
        let mut text = String::new();
        for _ in 0..1 + rng.below(4) {
            let number = numbers[rng.below(numbers.len())];
            // Mostly no decimals, so that many texts are accepted.
            let fraction = if rng.below(4) == 0 {
                fractions[rng.below(fractions.len())]
            } else {
                ""
            };
            let unit = units[rng.below(units.len())];
            text.push_str(&format!("{number}{fraction}{unit}"));
            parts.push((number, fraction, unit));
        }
        match (parse_ms(&text), model(&parts)) {
            (Ok(ms), Ok(expected)) => {
                assert_eq!(u128::from(ms), expected, "{text:?}");
                accepted += 1;
            }
            (Err(message), Err(says)) => assert!(message.contains(says), "{text:?}: {message}"),
            (got, expected) => panic!("{text:?}: {got:?}, the rules say {expected:?}"),
        }
    }
    // Both answers are exercised: the corpus is neither all refused nor all accepted.
    assert!(accepted > 10_000, "{accepted}");
    assert!(accepted < 190_000, "{accepted}");
}
