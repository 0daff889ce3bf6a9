//! Durations as the `#[rate_limit]` attribute writes them: one or more
//! `<number><unit>` parts, largest unit first, each unit once: `"250ms"`, `"60s"`,
//! `"1m30s"`, `"1h15m"`, `"1.5s"` (decimals only in the last part, and only when the
//! total is a whole number of milliseconds), from 1 ms to 2^53 ms.
//!
//! The one text of the grammar: the attribute reads `interval = "..."` with
//! [`parse_ms`] at compile time, the runtime's `duration` module at run time (for the
//! CLI's options and the layer's configuration files).
//!
//! ```
//! use redlimit_syntax::duration::parse_ms;
//!
//! assert_eq!(parse_ms("1m30s"), Ok(90_000));
//! assert_eq!(parse_ms("1.5s"), Ok(1_500));
//! assert!(parse_ms("30s1m").unwrap_err().contains("largest first"));
//! ```

/// The units accepted, with their length in milliseconds, largest first.
pub const UNITS: [(&str, u64); 5] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// What every rejection repeats: the forms accepted.
const ACCEPTED: &str = "write a number and a unit (ms, s, m, h, d), e.g. \"60s\", \"1.5s\" or \"1m30s\"";

/// The longest duration accepted, in milliseconds ([`MAX_EXACT`](crate::MAX_EXACT)).
pub const MAX_MS: u64 = crate::MAX_EXACT;

/// The longest text read as a duration: any valid one is far shorter, and a message
/// quotes the text it refuses, which must not be a megabyte of it.
pub const MAX_TEXT: usize = 128;

/// Digits after a decimal point that are looked at; more cannot name whole milliseconds
/// of any unit.
const MAX_FRACTION_DIGITS: usize = 9;

/// `text` in milliseconds (1 to [`MAX_MS`]), or a message saying what is wrong and
/// what is accepted. The message of an empty text starts with "is empty": the caller
/// names what is empty before it (the attribute its argument, the runtime "the
/// duration"); every other message names the text itself.
pub fn parse_ms(text: &str) -> Result<u64, String> {
    if text.is_empty() {
        return Err(format!("is empty; {ACCEPTED}"));
    }
    if text.len() > MAX_TEXT {
        let start: String = text.chars().take(32).collect();
        return Err(format!(
            "`{start}...` is {} bytes long; a duration is at most {MAX_TEXT}: {ACCEPTED}",
            text.len()
        ));
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
        if total > u128::from(MAX_MS) {
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
mod tests;
