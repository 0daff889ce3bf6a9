//! Redis Cluster's hash-tag rule: which part of a key decides its slot, and, as it
//! bears on a limiter's name, whether its five keys share one slot: exactly when the
//! name has no brace, or its first `{` opens a non-empty `{...}` tag.
//!
//! The attribute refuses a key template that breaks the rule where it is written, at
//! compile time; the runtime refuses such a limiter name at run time
//! (`keys::check_name`, which also refuses the empty name) and computes slots with
//! [`hashed_part`].
//!
//! ```
//! use redlimit_syntax::hash_tag::{hashed_part, split, Split};
//!
//! assert_eq!(split("{user:1}:api"), None);
//! assert_eq!(split("user:{}"), Some(Split::EmptyTag));
//! assert_eq!(hashed_part(b"{user:1}:value"), b"user:1");
//! ```

/// Why a name's keys would fall into different cluster slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// A `}` but no `{`.
    CloseWithoutOpen,
    /// The first `{` is closed at once: `{}` is no tag, the whole key is hashed.
    EmptyTag,
    /// The first `{` is never closed.
    Unclosed,
}

/// `None` when a name's keys share one slot, else why they would not.
pub fn split(name: &str) -> Option<Split> {
    match name.find('{') {
        None if name.contains('}') => Some(Split::CloseWithoutOpen),
        None => None,
        Some(open) => match name[open + 1..].find('}') {
            Some(0) => Some(Split::EmptyTag),
            Some(_) => None,
            None => Some(Split::Unclosed),
        },
    }
}

/// The bytes of `key` Redis Cluster hashes for its slot: those between its first `{`
/// and the first `}` after it, when there are any; else the whole key.
pub fn hashed_part(key: &[u8]) -> &[u8] {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        match rest.iter().position(|&b| b == b'}') {
            Some(close) if close > 0 => Some(&rest[..close]),
            _ => None,
        }
    });
    tagged.unwrap_or(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason() {
        assert_eq!(split("a"), None);
        assert_eq!(split(""), None);
        assert_eq!(split("{a}"), None);
        assert_eq!(split("x{a}{"), None);
        assert_eq!(split("a}"), Some(Split::CloseWithoutOpen));
        assert_eq!(split("{}a"), Some(Split::EmptyTag));
        assert_eq!(split("{a"), Some(Split::Unclosed));
    }

    /// A name's keys share its slot exactly when the rule says so: each key is the
    /// name with text after it, or the name in braces when it has none.
    #[test]
    fn the_rule_is_whether_the_keys_hash_alike() {
        let alphabet = ['{', '}', 'a', ':'];
        let mut names = vec![String::new()];
        for _ in 0..6 {
            names = names
                .iter()
                .flat_map(|name| alphabet.iter().map(move |c| format!("{name}{c}")))
                .collect();
            for name in &names {
                let keys: Vec<String> = if name.contains('{') {
                    vec![name.clone(), format!("{name}:value"), format!("{name}:permits:c")]
                } else {
                    vec![format!("{{{name}}}"), format!("{{{name}}}:value")]
                };
                let alike = keys
                    .iter()
                    .all(|key| hashed_part(key.as_bytes()) == hashed_part(keys[0].as_bytes()));
                let config_alike = hashed_part(name.as_bytes()) == hashed_part(keys[1].as_bytes());
                assert_eq!(split(name).is_none(), alike && config_alike, "{name:?}");
            }
        }
    }
}
