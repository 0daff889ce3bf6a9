//! The answer to "may I?": a plain value, not an error.

use std::time::Duration;

/// The outcome of one decision over a limiter or a set of rules.
///
/// Being refused is a normal outcome: `allowed` is false and `retry_after` says how
/// long until enough permits leave the window for the same request to pass (assuming
/// no one else takes them first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// Whether the permits were granted (and spent).
    pub allowed: bool,
    /// Permits still available after this decision; over several rules, the smallest.
    pub remaining: u64,
    /// When refused: the time until the refusal would pass, exact for any number of
    /// permits (the moment enough grants leave the window).
    pub retry_after: Option<Duration>,
    /// When refused: the index of the first rule, in the order given, that refused.
    pub refused_by: Option<usize>,
    /// The time of the decision in epoch milliseconds: the client's clock, or the
    /// newest grant's time when that is up to 1 s later (a call overtaken on its way to
    /// Redis). A grant's score in the permits log.
    pub at_ms: u64,
    /// The index of the rule, in the order given, with the fewest permits left (the
    /// first of them on a tie): the one `remaining` is about.
    pub tightest: Option<usize>,
}
