//! Durations written as an integer and a unit: `"250ms"`, `"60s"`, `"5m"`, `"1h"`, `"1d"`.

/// The units accepted, with their length in milliseconds.
const UNITS: [(&str, u64); 5] = [
    ("ms", 1),
    ("s", 1_000),
    ("m", 60_000),
    ("h", 3_600_000),
    ("d", 86_400_000),
];

/// The longest duration accepted, in ms: Redis scripts count in doubles, exact to 2^53.
pub const MAX_MS: u64 = 1 << 53;

/// Milliseconds, or a message saying what is wrong and what is accepted.
pub fn parse_ms(text: &str) -> Result<u64, String> {
    if text.is_empty() {
        return Err("is empty; write an integer and a unit, e.g. \"60s\" (units: ms, s, m, h, d)".into());
    }
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    if number.is_empty() {
        return Err(format!(
            "`{text}` must start with an integer, e.g. \"60s\" (units: ms, s, m, h, d)"
        ));
    }
    if unit.is_empty() {
        return Err(format!(
            "`{text}` needs a unit: ms, s, m, h or d, e.g. \"{number}s\""
        ));
    }
    let Some(&(_, scale)) = UNITS.iter().find(|(name, _)| *name == unit) else {
        return Err(format!(
            "`{text}` has an unknown unit `{unit}`; accepted units: ms, s, m, h, d"
        ));
    };
    let too_long = || format!("`{text}` is too long; the longest accepted is 2^53 ms (about 285 000 years)");
    let number: u64 = number.parse().map_err(|_| too_long())?;
    let ms = number.checked_mul(scale).ok_or_else(too_long)?;
    if ms > MAX_MS {
        return Err(too_long());
    }
    if ms == 0 {
        return Err(format!("`{text}` is zero; it must be at least 1 ms"));
    }
    Ok(ms)
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
    fn rejected_with_a_reason() {
        for (input, says) in [
            ("", "empty"),
            ("s", "must start with an integer"),
            ("60", "needs a unit"),
            ("60sec", "unknown unit `sec`"),
            ("1.5s", "unknown unit `.5s`"),
            ("-1s", "must start with an integer"),
            ("0s", "zero"),
            ("99999999999999999999d", "too long"),
            ("200000000000d", "too long"),
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
        let mut rng = crate::template::tests::XorShift(0x9e37_79b9_7f4a_7c15);
        for _ in 0..100_000 {
            let len = rng.below(12);
            let text: String = (0..len).map(|_| alphabet[rng.below(alphabet.len())]).collect();
            match parse_ms(&text) {
                Ok(ms) => {
                    assert!((1..=MAX_MS).contains(&ms), "{text:?}");
                    let unit = text.trim_start_matches(|c: char| c.is_ascii_digit());
                    assert!(["ms", "s", "m", "h", "d"].contains(&unit), "{text:?}");
                }
                Err(message) => assert!(message.len() > 10, "{text:?}: {message}"),
            }
        }
    }
}
