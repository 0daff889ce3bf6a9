//! Text a caller may have written (limiter names and Redis keys, which hold the values
//! of callers' requests), as messages, logs and the CLI show it.

use std::borrow::Cow;
use std::fmt::Write;

/// `text` with every character that could act on a terminal or forge a line of a log
/// written as an escape: control characters (C0, DEL, C1: a CR LF that would start a
/// line of the caller's own, an ESC that would set a terminal's title or colours), the
/// marks that reorder text (bidirectional controls) and line or paragraph separators,
/// as `\n`, `\r`, `\t`, `\e` or `\u{..}`; a backslash as `\\`, so that an escape
/// cannot be forged. Text without any of these is shown as it is, unallocated. Every
/// message of [`Error`](crate::Error) and [`RateLimited`](crate::RateLimited) shows the
/// names and keys it quotes so.
///
/// ```
/// use redlimit_runtime::keys::shown;
///
/// assert_eq!(shown("rate_limit:user:42"), "rate_limit:user:42");
/// assert_eq!(shown("user:x\nERROR forged"), "user:x\\nERROR forged");
/// ```
pub fn shown(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{1b}' => out.push_str("\\e"),
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    c == '\\'
        || c.is_control()
        || matches!(c, '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        || matches!(c, '\u{2028}' | '\u{2029}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_and_reordering_marks_are_escaped() {
        assert_eq!(shown("rate_limit:user:42"), "rate_limit:user:42");
        assert!(matches!(shown("plain"), Cow::Borrowed(_)));
        assert_eq!(shown("x\r\nALERT"), "x\\r\\nALERT");
        assert_eq!(
            shown("\u{1b}]0;owned\u{7}\u{1b}[1;31m"),
            "\\e]0;owned\\u{7}\\e[1;31m"
        );
        assert_eq!(shown("a\u{85}b\u{9b}c\u{7f}"), "a\\u{85}b\\u{9b}c\\u{7f}");
        assert_eq!(shown("abc\u{202e}fed"), "abc\\u{202e}fed");
        assert_eq!(
            shown("a\u{61c}b"),
            "a\\u{61c}b",
            "the Arabic letter mark reorders too"
        );
        assert_eq!(shown("a\\nb"), "a\\\\nb", "a backslash cannot forge an escape");
        assert_eq!(shown("ключ:é"), "ключ:é");
        for c in (0..=0x10ffff).filter_map(char::from_u32) {
            let out = shown_owned(c);
            assert!(!out.chars().any(|c| c.is_control()), "{c:?} shown as {out:?}");
        }
    }

    fn shown_owned(c: char) -> String {
        shown(&c.to_string()).into_owned()
    }
}
