//! Validation: what a layer's rule must be before the layer is built, and the error
//! that says what is wrong and what is accepted ([`InvalidLayer`]).

use std::fmt;

use http::HeaderName;
use redlimit_runtime::engine::check_bucket;
use redlimit_runtime::keys::check_name as check_limiter_name;
use redlimit_runtime::{RateLimiterConfig, MAX_PERMITS};

use super::key::{KeyKind, MissingKey};
use super::rule::LayerRule;

/// A layer that cannot be built: what is wrong and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidLayer(pub(super) String);

impl fmt::Display for InvalidLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidLayer {}

/// What `build` checks of one rule, its header name included (for rules read from
/// configuration, checked as they are read).
#[cfg_attr(not(feature = "serde"), allow(dead_code))]
pub(crate) fn check_rule_fully(rule: &LayerRule) -> Result<(), InvalidLayer> {
    check_rule(rule)?;
    if let KeyKind::Header(name) = &rule.key.0 {
        header_name(&rule.spec.name, name)?;
    }
    Ok(())
}

/// A header key's name, parsed once when the layer is built.
pub(super) fn header_name(rule: &str, name: &str) -> Result<HeaderName, InvalidLayer> {
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
        InvalidLayer(format!(
            "rule `{rule}`: `{name}` is not a header name; write e.g. \"x-api-key\""
        ))
    })
}

/// Everything of one rule but its header name: name, rate and interval, the token
/// bucket's settings, permits, `missing_key` and the exempt values.
pub(super) fn check_rule(rule: &LayerRule) -> Result<(), InvalidLayer> {
    let spec = &rule.spec;
    check_name(&spec.name)?;
    let invalid = |problem: String| InvalidLayer(format!("rule `{}`: {problem}", spec.name));
    if let Err(error) = RateLimiterConfig::new(spec.mode, spec.rate, spec.interval).validate(&spec.name) {
        return Err(invalid(error.to_string()));
    }
    let most = most_permits(rule).map_err(invalid)?.min(MAX_PERMITS);
    if spec.permits == 0 || spec.permits > most {
        return Err(invalid(format!(
            "permits = {} is not accepted: each request takes from 1 to {most} permits (the rate, or a \
             token bucket's burst, and at most {MAX_PERMITS}, what a grant's log field holds)",
            spec.permits
        )));
    }
    if let Err(error) = spec.check_batch() {
        return Err(invalid(error.to_string()));
    }
    if rule.missing_key != MissingKey::Share && rule.key.always_present() {
        return Err(invalid(format!(
            "missing_key = {:?} is for keys a request can lack (Key::header, Key::path_param, Key::with); \
             this rule is keyed by {:?}, which every request has",
            rule.missing_key, rule.key
        )));
    }
    #[cfg(any(feature = "axum", feature = "actix"))]
    if let KeyKind::PathParam(name) = &rule.key.0 {
        // (`:id` and `*rest` are how routes wrote them before braces.)
        if name.is_empty()
            || name.contains(['{', '}', '/'])
            || name.starts_with([':', '*'])
            || name.contains(char::is_whitespace)
        {
            return Err(invalid(format!(
                "Key::path_param({name:?}) names no path parameter a route can have: give the \
                 name the route writes in braces, e.g. \"id\" for /users/{{id}}"
            )));
        }
    }
    if let Some(problem) = settle_problem(rule) {
        return Err(invalid(problem));
    }
    // (blank as a request's value is: spaces and tabs are not part of one)
    if rule.exempt.iter().any(|value| value.trim().is_empty()) {
        return Err(invalid(
            "an empty exempt value, or one of whitespace only, would exempt every request that \
             has no value for the key; list the values themselves"
                .into(),
        ));
    }
    Ok(())
}

/// A rule's name: not empty, not in the library's own segment.
fn check_name(name: &str) -> Result<(), InvalidLayer> {
    if name.is_empty() {
        return Err(InvalidLayer(
            "a rule's name is empty: it names the rule's limiters, logs and RateLimit fields".into(),
        ));
    }
    // The rule's limiters are named `<name>` and `<name>:<escaped value>`, and no
    // escaped value holds a brace: the name alone decides whether their keys share a
    // cluster slot, and a name refused here would refuse every request.
    if let Err(error) = check_limiter_name(name) {
        return Err(InvalidLayer(format!("rule `{name}`: field `name`: {error}")));
    }
    let reserved = redlimit_runtime::LIBRARY_SEGMENT;
    if name
        .strip_prefix(reserved)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([':', '{', '}']))
    {
        return Err(InvalidLayer(format!(
            "rule `{name}`: a rule's name may not start with `{reserved}`: the library keeps its own keys \
             (run-time overrides, refusal reports) under that segment; choose another name"
        )));
    }
    // Further in, before `:` or at the end: the rule's limiters `<name>:<value>` would be
    // the library's keys of clients whose key prefix is the text before it (a rule
    // `rate_limit:redlimit` of a client without a prefix, sent the value `overrides`,
    // would write the override table of the clients on the default prefix).
    if name
        .match_indices(reserved)
        .any(|(at, _)| name[at + reserved.len()..].is_empty() || name[at + reserved.len()..].starts_with(':'))
    {
        return Err(InvalidLayer(format!(
            "rule `{name}`: a rule's name may not hold `{reserved}` before a `:` or at its end: its limiters \
             would be the library's own keys (run-time overrides, refusal reports) of clients whose key \
             prefix is the text before it; choose another name"
        )));
    }
    Ok(())
}

/// The most permits one request may take (the rate, or a token bucket's burst), once
/// the token bucket's settings are checked; `Err`: what is wrong with them.
fn most_permits(rule: &LayerRule) -> Result<u64, String> {
    let spec = &rule.spec;
    match (spec.bucket, rule.burst, rule.warmup) {
        (None, Some(_), _) => {
            Err("`burst` is a token bucket's capacity: add .algorithm(Algorithm::TokenBucket)".into())
        }
        (None, _, Some(_)) => {
            Err("`warmup` is a token bucket's: add .algorithm(Algorithm::TokenBucket)".into())
        }
        (None, None, None) => Ok(spec.rate),
        (Some(shape), ..) => {
            let config = RateLimiterConfig::new(spec.mode, spec.rate, spec.interval);
            check_bucket(&spec.name, shape, &config).map_err(|error| error.to_string())?;
            Ok(shape.burst)
        }
    }
}

/// What is wrong with a rule's settling, if anything: a cap without a settle, a settled
/// rule that batches, a settle header that is not a header name.
fn settle_problem(rule: &LayerRule) -> Option<String> {
    let spec = &rule.spec;
    match &rule.settle {
        None if spec.max_overdraft.is_some() => Some(
            "max_overdraft caps what a settled request is charged beyond its estimate: add \
             .settle(Settle::header(..)) or .settle(Settle::usage())"
                .into(),
        ),
        Some(_) if spec.batch > 1 => Some(format!(
            "batch = {} with settle: a batch's permits are served in process, with no grant of \
             their own to settle; a settled rule takes batch 1",
            spec.batch
        )),
        Some(settle) => settle
            .header_name()
            .and_then(|name| header_name(&spec.name, name).err())
            .map(|error| {
                error
                    .0
                    .trim_start_matches(&format!("rule `{}`: ", spec.name))
                    .to_owned()
            }),
        None => None,
    }
}
