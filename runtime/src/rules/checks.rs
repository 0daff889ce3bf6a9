//! A rule checked before its first decision: its permits against its rate and the
//! permits log, its settings together, and its keys (a limiter's, never one of the
//! library's own). Checked once per rule, and again whenever a setter changed it.

use crate::keys::Keys;
use crate::rules::fit::{check_bucket, within_rate};
use crate::{Error, Rule};

/// Permits must be at least 1, at most the rate, and fit Redisson's 4-byte log field.
pub(crate) fn check_permits(name: &str, permits: u64, rate: Option<u64>) -> Result<(), Error> {
    if permits == 0 {
        return Err(Error::ZeroPermits {
            name: name.to_owned(),
        });
    }
    if let Some(rate) = rate {
        within_rate(name, permits, rate)?;
    }
    if permits > crate::MAX_PERMITS {
        return Err(Error::InvalidConfig {
            name: name.to_owned(),
            problem: "permits above 4294967295 do not fit the permits log's 4-byte field",
        });
    }
    Ok(())
}

/// Every check of a rule's settings: its config, a sliding window without a bucket's
/// settings, its permits within what one call may take.
pub(crate) fn check_settings(rule: &Rule) -> Result<(), Error> {
    rule.config().validate(rule.name())?;
    rule.check_batch()?;
    if rule.counted_by() == crate::Algorithm::SlidingWindow && rule.has_bucket_settings() {
        return Err(Error::InvalidConfig {
            name: rule.name().to_owned(),
            problem: "burst and warm-up are a token bucket's: add .algorithm(Algorithm::TokenBucket), \
                      or remove them",
        });
    }
    match rule.shape() {
        None => check_permits(rule.name(), rule.permits_per_call(), Some(rule.config().rate))?,
        Some(shape) => {
            let burst = shape.burst;
            check_bucket(rule.name(), shape, rule.config())?;
            check_permits(rule.name(), rule.permits_per_call(), None)?;
            if rule.permits_per_call() > burst {
                return Err(Error::PermitsExceedBurst {
                    name: rule.name().to_owned(),
                    permits: rule.permits_per_call(),
                    burst,
                });
            }
        }
    }
    Ok(())
}

/// The keys of `rule` for the client `client_id` with the key prefix `prefix`, once its
/// name and settings are known good: checked on its first call and whenever a setter
/// changed it, not on every call.
#[inline]
pub(crate) fn rule_keys<'r>(rule: &'r Rule, prefix: &str, client_id: &'r str) -> Result<Keys<'r>, Error> {
    if rule.is_checked() {
        return Ok(Keys::checked_before(rule.name(), client_id));
    }
    first_rule_keys(rule, prefix, client_id)
}

fn first_rule_keys<'r>(rule: &'r Rule, prefix: &str, client_id: &'r str) -> Result<Keys<'r>, Error> {
    let keys = Keys::new(rule.name(), client_id)?;
    // A name a caller's value makes can land on the library's own keys (the
    // override table, the stream of resets): refused, as the handles refuse it.
    if let Some(what) = crate::keys::library_key(prefix, rule.name()) {
        return Err(Error::NotALimiter {
            key: rule.name().to_owned(),
            role: "config",
            found: format!("is {what} of the clients with the key prefix `{prefix}`"),
        });
    }
    if !rule.settings_checked() {
        check_settings(rule)?;
    }
    rule.mark_checked();
    Ok(keys)
}
