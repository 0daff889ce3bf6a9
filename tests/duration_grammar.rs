//! The duration grammar has two copies: the attribute reads `interval = "..."` at
//! compile time with macros/src/duration.rs (the macro crate may not depend on the
//! runtime), and the CLI and the layer's configuration read durations at run time
//! with `redlimit_runtime::duration`. This test compiles the attribute's copy in and
//! holds both to the same answer, and the same message, on every text of up to four
//! symbols over an alphabet of digits, units and stray characters, on durations built
//! part by part (in order, out of order, with decimals, near 2^53 ms), and on random
//! texts. It is a test of this package, which depends on both crates, so that neither
//! crate's own package reads a file outside itself.

#[path = "../macros/src/duration.rs"]
mod attribute_grammar;
// The attribute's copy brings its own unit tests, which use this generator.
#[path = "../macros/src/test_rng.rs"]
mod test_rng;

use redlimit_runtime::duration;
use test_rng::XorShift;

/// Both grammars on `text`: the same milliseconds, or the same message (the attribute
/// names the argument before an empty text's message, the runtime says "the duration").
fn agree(text: &str) {
    let attribute = attribute_grammar::parse_ms(text);
    let runtime = duration::parse_ms(text).map_err(|e| e.to_string());
    match (&attribute, &runtime) {
        (Ok(a), Ok(r)) => assert_eq!(a, r, "{text:?}"),
        (Err(a), Err(r)) if text.is_empty() => assert_eq!(format!("the duration {a}"), *r),
        (Err(a), Err(r)) => assert_eq!(a, r, "{text:?}"),
        _ => panic!("{text:?}: the attribute says {attribute:?}, the runtime {runtime:?}"),
    }
    if let Ok(ms) = runtime {
        assert_eq!(
            duration::parse(text).unwrap(),
            std::time::Duration::from_millis(ms),
            "{text:?}"
        );
    }
}

#[test]
fn the_same_longest_duration() {
    assert_eq!(duration::MAX_MS, attribute_grammar::MAX_EXACT);
}

#[test]
fn every_short_text() {
    let alphabet = [
        "", "0", "1", "5", "9", ".", "s", "m", "ms", "h", "d", "x", "é", " ", "-", "+",
    ];
    let mut seen = 0;
    for a in alphabet {
        for b in alphabet {
            for c in alphabet {
                for d in alphabet {
                    agree(&format!("{a}{b}{c}{d}"));
                    seen += 1;
                }
            }
        }
    }
    assert_eq!(seen, 16 * 16 * 16 * 16);
}

#[test]
fn durations_built_part_by_part() {
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
        let parts = 1 + rng.below(4);
        let mut text = String::new();
        for _ in 0..parts {
            text.push_str(numbers[rng.below(numbers.len())]);
            // Mostly no decimals, so that many texts are accepted.
            if rng.below(4) == 0 {
                text.push_str(fractions[rng.below(fractions.len())]);
            }
            text.push_str(units[rng.below(units.len())]);
        }
        agree(&text);
        accepted += usize::from(duration::parse_ms(&text).is_ok());
    }
    // Both answers are exercised: the corpus is neither all refused nor all accepted.
    assert!(accepted > 10_000, "{accepted}");
    assert!(accepted < 190_000, "{accepted}");
}

#[test]
fn random_texts() {
    let alphabet: Vec<char> = "0123456789smhdxé -.+_\u{0}🦀".chars().collect();
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    for _ in 0..200_000 {
        let len = rng.below(14);
        let text: String = (0..len).map(|_| alphabet[rng.below(alphabet.len())]).collect();
        agree(&text);
    }
}

#[test]
fn what_the_cli_accepted_before_is_refused_with_the_order_rule() {
    for text in ["30s1m", "1s1s", "1.5m30s"] {
        let message = duration::parse(text).unwrap_err().to_string();
        assert!(message.contains(text), "{message}");
        assert!(
            message.contains("largest first") || message.contains("only the last part"),
            "{message}"
        );
    }
}
