//! Durations: one or more `<number><unit>` parts, largest unit first: `"250ms"`,
//! `"60s"`, `"1m30s"`, `"1h15m"`, `"1.5s"` (decimals are allowed when the total is a
//! whole number of milliseconds).

/// The units accepted, with their length in milliseconds, largest first.
const UNITS: [(&str, u64); 5] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// What every rejection repeats: the forms accepted.
const ACCEPTED: &str = "write a number and a unit (ms, s, m, h, d), e.g. \"60s\", \"1.5s\" or \"1m30s\"";

/// The largest integer accepted anywhere in the attribute (rates, permits, durations
/// in ms): Redis scripts count in doubles, exact up to 2^53. The runtime's twin is
/// `MAX_RATE`.
pub const MAX_EXACT: u64 = 1 << 53;

/// Digits after a decimal point that are looked at; more cannot name whole milliseconds
/// of any unit.
const MAX_FRACTION_DIGITS: usize = 9;

/// Milliseconds, or a message saying what is wrong and what is accepted.
pub fn parse_ms(text: &str) -> Result<u64, String> {
    if text.is_empty() {
        return Err(format!("is empty; {ACCEPTED}"));
    }
    let mut rest = text;
    let mut total: u128 = 0;
    let mut previous: Option<Part<'_>> = None;
    while !rest.is_empty() {
        let (part, after) = next_part(text, rest)?;
        if let Some(earlier) = &previous {
            check_order(text, earlier, &part)?;
        }
        total = total
            .checked_add(part_ms(text, &part)?)
            .ok_or_else(|| too_long(text))?;
        if total > u128::from(MAX_EXACT) {
            return Err(too_long(text));
        }
        previous = Some(part);
        rest = after;
    }
    if total == 0 {
        return Err(format!("`{text}` is zero; it must be at least 1 ms"));
    }
    Ok(total as u64)
}

/// One `<number><unit>` part of a duration, such as `1.5` and `s`.
struct Part<'a> {
    /// The digits before the decimal point.
    whole: &'a str,
    /// The digits after it (empty without one).
    fraction: &'a str,
    unit: &'a str,
    /// The unit's position in [`UNITS`].
    rank: usize,
}

/// The part at the start of `rest` (a suffix of `text`), and what follows it.
fn next_part<'a>(text: &str, rest: &'a str) -> Result<(Part<'a>, &'a str), String> {
    let (whole, mut after) = split_digits(rest);
    let mut fraction = "";
    if let Some(tail) = after.strip_prefix('.') {
        (fraction, after) = split_digits(tail);
        if fraction.is_empty() || whole.is_empty() {
            return Err(format!(
                "`{text}` has a decimal point without digits on both sides; {ACCEPTED}"
            ));
        }
    }
    if whole.is_empty() {
        return Err(format!("`{text}` must start each part with a number; {ACCEPTED}"));
    }
    let unit_len = after.find(|c: char| c.is_ascii_digit()).unwrap_or(after.len());
    let (unit, after) = after.split_at(unit_len);
    if unit.is_empty() {
        return Err(format!(
            "`{text}` needs a unit after `{whole}`: ms, s, m, h or d, e.g. \"{whole}s\""
        ));
    }
    let Some(rank) = UNITS.iter().position(|(name, _)| *name == unit) else {
        return Err(format!(
            "`{text}` has an unknown unit `{unit}`; accepted units: ms, s, m, h, d"
        ));
    };
    let part = Part {
        whole,
        fraction,
        unit,
        rank,
    };
    Ok((part, after))
}

/// The leading ASCII digits of `text`, and the rest.
fn split_digits(text: &str) -> (&str, &str) {
    text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()))
}

/// Only the last part may have decimals, and each unit comes once, largest first.
fn check_order(text: &str, earlier: &Part<'_>, part: &Part<'_>) -> Result<(), String> {
    if !earlier.fraction.is_empty() {
        return Err(format!(
            "`{text}`: only the last part may have decimals; {ACCEPTED}"
        ));
    }
    if part.rank <= earlier.rank {
        return Err(format!(
            "`{text}` has `{}` after `{}`; write each unit once, largest first, e.g. \"1h15m\" or \"1m30s\"",
            part.unit, earlier.unit
        ));
    }
    Ok(())
}

/// A part's length in milliseconds, which must be whole.
fn part_ms(text: &str, part: &Part<'_>) -> Result<u128, String> {
    let scale = u128::from(UNITS[part.rank].1);
    let fraction = part.fraction;
    if fraction.len() > MAX_FRACTION_DIGITS {
        return Err(format!(
            "`{text}` has more than {MAX_FRACTION_DIGITS} decimals; write it in a smaller unit"
        ));
    }
    let whole: u128 = part.whole.parse().map_err(|_| too_long(text))?;
    let digits: u128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().map_err(|_| too_long(text))?
    };
    let denominator = 10u128.pow(fraction.len() as u32);
    let ms = whole.checked_mul(scale).ok_or_else(|| too_long(text))?;
    let exact = digits * scale;
    if exact % denominator != 0 {
        return Err(format!(
            "`{text}` is not a whole number of milliseconds; write it in a smaller unit, e.g. \"1500ms\""
        ));
    }
    ms.checked_add(exact / denominator).ok_or_else(|| too_long(text))
}

fn too_long(text: &str) -> String {
    format!("`{text}` is too long; the longest accepted is 2^53 ms (about 285 000 years)")
}

#[cfg(test)]
mod tests {
    use super::*;

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
                            Ok(ms) => assert!((1..=MAX_EXACT).contains(&ms)),
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
        let mut rng = crate::test_rng::XorShift(0x9e37_79b9_7f4a_7c15);
        for _ in 0..100_000 {
            let len = rng.below(12);
            let text: String = (0..len).map(|_| alphabet[rng.below(alphabet.len())]).collect();
            match parse_ms(&text) {
                Ok(ms) => {
                    assert!((1..=MAX_EXACT).contains(&ms), "{text:?}");
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
}
