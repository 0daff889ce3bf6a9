//! Durations as the `#[rate_limit]` attribute writes them, read at run time: one or
//! more `<number><unit>` parts, largest unit first, each unit once: `"250ms"`, `"60s"`,
//! `"1m30s"`, `"1h15m"`, `"1.5s"` (decimals only in the last part, and only when the
//! total is a whole number of milliseconds), from 1 ms to 2^53 ms.
//!
//! The `redlimit` CLI's options and the layer's configuration files read durations
//! with [`parse`]. The grammar itself is `redlimit_syntax::duration`, which the
//! attribute checks at compile time: one text, one set of messages.
//!
//! ```
//! use std::time::Duration;
//! use redlimit_runtime::duration::parse;
//!
//! assert_eq!(parse("1m30s").unwrap(), Duration::from_secs(90));
//! assert_eq!(parse("1.5s").unwrap(), Duration::from_millis(1500));
//! let refused = parse("30s1m").unwrap_err().to_string();
//! assert!(refused.contains("largest first"), "{refused}");
//! ```

use std::fmt;
use std::time::Duration;

/// The longest duration accepted, in milliseconds: Redis scripts count in doubles,
/// exact up to 2^53.
pub use redlimit_syntax::duration::MAX_MS;

/// A text that is not a duration; its message says what is wrong and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidDuration {
    message: String,
}

impl fmt::Display for InvalidDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for InvalidDuration {}

/// `text` as a duration, or why it is not one.
pub fn parse(text: &str) -> Result<Duration, InvalidDuration> {
    parse_ms(text).map(Duration::from_millis)
}

/// `text` in milliseconds (1 to [`MAX_MS`]), or why it is not a duration.
pub fn parse_ms(text: &str) -> Result<u64, InvalidDuration> {
    redlimit_syntax::duration::parse_ms(text).map_err(|message| InvalidDuration {
        // The grammar leaves naming an empty text to its caller.
        message: if text.is_empty() {
            format!("the duration {message}")
        } else {
            message
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grammars_answers_and_messages() {
        assert_eq!(parse_ms("1m30s"), Ok(90_000));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        let empty = parse_ms("").unwrap_err().to_string();
        assert!(
            empty.starts_with("the duration is empty; write a number"),
            "{empty}"
        );
        for text in ["30s1m", "1.5ms", "60", "0s", "104249992d"] {
            assert_eq!(
                parse_ms(text).unwrap_err().to_string(),
                redlimit_syntax::duration::parse_ms(text).unwrap_err(),
                "{text}"
            );
        }
    }
}
