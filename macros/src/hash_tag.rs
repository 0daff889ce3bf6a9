//! Redis Cluster's hash-tag rule as it bears on a limiter's name: its five keys share
//! one slot exactly when the name has no brace, or its first `{` opens a non-empty
//! `{...}` tag.
//!
//! The runtime holds every name to the same rule at run time (`keys::check_name`);
//! the attribute needs it at compile time, to refuse such a key where it is written,
//! and may not depend on the runtime. So the rule is written twice, and the redlimit
//! package's tests/hash_tag_rule.rs compiles this file in beside the runtime to hold
//! the two to the same answer on every short name. That is why this file uses nothing
//! from the rest of the crate.

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
