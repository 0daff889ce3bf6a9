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
    if rule.overdraft_cap().is_some() && !rule.is_settled() {
        return Err(Error::InvalidConfig {
            name: rule.name().to_owned(),
            problem: "max_overdraft caps what a settle charges beyond a settled rule's estimate: \
                      add .settled(), or remove it",
        });
    }
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

/// Whether every limiter a layer names for a rule named `name`, under the clients' key
/// `prefix`, passes [`first_rule_keys`]' checks of its name: `name` alone, and `name`,
/// `:` and any value `KeyBuf` escaped (which holds no brace). Text without a brace
/// after a name changes neither its hash tag nor whether it has a good one; and the
/// library's keys are `<prefix>redlimit` and what follows it after `:`, so `:` and
/// anything after a name that is none of them (neither `redlimit`, nor `redlimit:`
/// and more, nor a shorter start of `redlimit`, which `:` does not go on) make none;
/// and a name followed by `:` is not one hash tag and nothing else. So when `prefix`
/// and `name` pass, every such limiter does.
pub(crate) fn escaped_names_pass(prefix: &str, name: &str) -> bool {
    let limiter = format!("{prefix}{name}");
    crate::keys::check_name(&limiter).is_ok()
        && crate::keys::library_key(prefix, &limiter).is_none()
        && crate::keys::shares_keys_with(&limiter).is_none()
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
    // A name that is one hash tag keeps its permits in the keys of the name without it
    // (`{N}` and `N`): a rule on either, under its own config, would count the other's.
    if let Some(other) = crate::keys::shares_keys_with(rule.name()) {
        return Err(Error::SharedKeys {
            name: rule.name().to_owned(),
            other: other.to_owned(),
        });
    }
    if !rule.settings_checked() {
        check_settings(rule)?;
    }
    rule.mark_checked();
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::escaped_names_pass;
    use crate::keys::key_buf::KeyBuf;
    use crate::keys::{check_name, library_key, shares_keys_with};

    /// Every limiter a layer writes for a rule whose name passes under a prefix passes
    /// the checks of a name, over hostile prefixes, names and values; and the names
    /// that do not pass are refused by those checks themselves.
    #[test]
    fn a_name_that_passes_escaped_passes_with_every_value() {
        let prefixes = ["rate_limit:", "", "{", "}", "{app}:", "a{", "redlimit", "x:"];
        let names = [
            "api",
            "redlimit",
            "redlimit:x",
            "redlimitx",
            "redlimi",
            "red",
            "{",
            "}",
            "{}",
            "{t}",
            "a{b",
            "a}b",
            "api:{tenant}",
            ":redlimit",
            "redlimit{",
            "redlimit}",
            "re:dlimit",
        ];
        let values: [&[u8]; 12] = [
            b"",
            b"redlimit",
            b":overrides",
            b"overrides",
            b"{",
            b"}",
            b"{x}",
            b"%3A",
            b":refused:1",
            b"\xff{",
            b"resets",
            &[b'a'; 200],
        ];
        let mut passed = 0;
        for prefix in prefixes {
            for name in names {
                let base = format!("{prefix}{name}");
                let alone_passes = check_name(&base).is_ok()
                    && library_key(prefix, &base).is_none()
                    && shares_keys_with(&base).is_none();
                if !escaped_names_pass(prefix, name) {
                    assert!(!alone_passes, "{prefix:?} {name:?}: its name alone passes");
                    continue;
                }
                passed += 1;
                assert!(alone_passes, "{base}");
                for value in values {
                    let mut key = KeyBuf::new();
                    key.text(&base);
                    key.text(":");
                    key.value_bytes(value);
                    let limiter = key.finish();
                    assert!(check_name(&limiter).is_ok(), "{limiter}");
                    assert_eq!(library_key(prefix, &limiter), None, "{limiter}");
                    assert_eq!(shares_keys_with(&limiter), None, "{limiter}");
                }
            }
        }
        assert!(passed > 40, "{passed}");
        // A name that is one hash tag shares its keys with the name without it.
        assert!(!escaped_names_pass("", "{t}"));
        assert!(escaped_names_pass("rate_limit:", "{t}"));
        assert!(escaped_names_pass("rate_limit:", "redlimitx"));
        assert!(!escaped_names_pass("rate_limit:", "redlimit"));
        assert!(!escaped_names_pass("rate_limit:", "redlimit:x"));
        assert!(!escaped_names_pass("{", "api"));
    }
}
