//! Text from Redis or from callers (limiter names, stored values, error messages that
//! quote them), as the human output shows it.

pub use redlimit_runtime::keys::shown;

/// The width `text` takes once [`shown`], in characters.
pub fn shown_width(text: &str) -> usize {
    shown(text).chars().count()
}

/// A message as the human output shows it, whose quoted names and stored values are
/// [`shown`] already (the runtime's errors show them so): what else could act on the
/// terminal escaped, its backslashes left as they are, so that a name is not escaped
/// twice (`a\nb` staying `a\nb`).
pub fn shown_message(message: &str) -> String {
    message.split('\\').map(shown).collect::<Vec<_>>().join("\\")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_escaped_once() {
        let error = redlimit_runtime::Error::ZeroPermits {
            name: "a\nb\\c\u{1b}".into(),
        };
        let message = format!("{error}; and \r here");
        assert_eq!(
            shown_message(&message),
            "rate limiter `a\\nb\\\\c\\e`: 0 permits requested; ask for at least 1; and \\r here"
        );
    }
}
