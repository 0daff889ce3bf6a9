//! The decision's span (`redlimit.decide`): the rules, the backend, the outcome.

use crate::{RateLimited, RuleSpec};

use super::call::Granted;

/// The span of one decision of `rules`.
pub(super) fn decide_span(rules: &[RuleSpec]) -> tracing::Span {
    tracing::debug_span!(
        "redlimit.decide",
        rules = %RuleNames(rules),
        backend = tracing::field::Empty,
        outcome = tracing::field::Empty,
        remaining = tracing::field::Empty,
        retry_after_ms = tracing::field::Empty,
        waited_ms = tracing::field::Empty,
    )
}

/// Records what was decided on `span`.
pub(super) fn record(span: &tracing::Span, decided: Result<&Granted, &RateLimited>) {
    match decided {
        Ok(granted) => {
            span.record("outcome", "allowed");
            if let Some((_, remaining)) = granted.tightest {
                span.record("remaining", remaining);
            }
        }
        Err(limited) => {
            let outcome = if limited.cause.is_some() {
                "error_denied"
            } else {
                "limited"
            };
            span.record("outcome", outcome);
            if let Some(wait) = limited.retry_after {
                span.record("retry_after_ms", wait.as_millis() as u64);
            }
        }
    }
}

/// The rules' names, comma-separated: a span field.
struct RuleNames<'a>(&'a [RuleSpec]);

impl std::fmt::Display for RuleNames<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, rule) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(&rule.name)?;
        }
        Ok(())
    }
}
