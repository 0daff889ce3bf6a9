//! The rules this process runs: the attribute's, each registered as it is first used,
//! and the layer's, when the layer is built. An override set from this process is
//! checked against the rules it reaches, with the rules' own checks.

use std::sync::RwLock;
use std::time::Duration;

use crate::limiter::{check_bucket, within_rate};
use crate::site::RuleSpec;
use crate::{Error, RateLimiterConfig, RateType};

/// What an override must fit in one rule.
#[derive(Debug, Clone)]
struct Registered {
    name: String,
    permits: u64,
    bucket: Option<crate::BucketShape>,
}

static RULES: RwLock<Vec<Registered>> = RwLock::new(Vec::new());

/// Registers `specs`, once per rule name and shape.
pub(crate) fn register(specs: &[RuleSpec]) {
    let mut rules = RULES.write().unwrap_or_else(|e| e.into_inner());
    for spec in specs {
        let known = rules
            .iter()
            .any(|r| r.name == spec.name && r.permits == spec.permits && r.bucket == spec.bucket);
        if !known {
            rules.push(Registered {
                name: spec.name.to_owned(),
                permits: spec.permits,
                bucket: spec.bucket,
            });
        }
    }
}

/// Whether a rule taking `permits` per call (a token bucket of `bucket`'s shape) can
/// decide at `rate` per `interval`: what is wrong, else `Ok`.
pub(crate) fn fits(
    name: &str,
    permits: u64,
    bucket: Option<crate::BucketShape>,
    rate: u64,
    interval: Duration,
) -> Result<(), Error> {
    let config = RateLimiterConfig::new(RateType::Overall, rate, interval);
    config.validate(name)?;
    match bucket {
        Some(shape) => check_bucket(name, shape, &config),
        None => within_rate(name, permits, rate),
    }
}

/// The first rule of this process named `rule` that cannot take `rate` per `interval`.
pub(crate) fn check_override(of: &str, rule: &str, rate: u64, interval: Duration) -> Result<(), Error> {
    let rules = RULES.read().unwrap_or_else(|e| e.into_inner());
    for r in rules.iter().filter(|r| r.name == rule) {
        if let Err(error) = fits(&r.name, r.permits, r.bucket, rate, interval) {
            return Err(Error::UnusableOverride {
                of: of.to_owned(),
                rule: r.name.clone(),
                reason: error.to_string(),
            });
        }
    }
    Ok(())
}
