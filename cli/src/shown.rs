//! Text from Redis or from callers (limiter names, stored values, error messages that
//! quote them), as the human output shows it.

pub use redlimit_runtime::keys::shown;

/// The width `text` takes once [`shown`], in characters.
pub fn shown_width(text: &str) -> usize {
    shown(text).chars().count()
}
