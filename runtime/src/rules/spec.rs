//! A rule as the attribute and the layer describe it: a key template's name, a rate
//! and window, the permits a call takes, what to do when the backend fails. One such
//! description per rule, made into a [`Rule`](crate::Rule) for each call's key.

use std::borrow::Cow;
use std::time::Duration;

use crate::RateType;

/// What a rule does when the backend fails (the errors
/// [`Error::is_backend_failure`](crate::Error::is_backend_failure) accepts). Any other
/// error (a misuse) refuses the call whatever the policy. Failures are logged with
/// `tracing`, at most once per 10 s per function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Decide on an in-process limiter with the same rule: each process enforces the
    /// rate on its own until the backend is back (the default).
    Local,
    /// Let the call through when the failure passes by itself (a timeout, a server
    /// unreachable or answering errors: [`Error::is_transient`](crate::Error::is_transient));
    /// a failure that lasts until someone acts (refused credentials, an unknown
    /// database, state another program wrote, a full server) is decided in process,
    /// as [`Local`](OnError::Local) does, so that no configuration mistake switches the
    /// limit off. Such a refusal is an ordinary one: its limit reached in process,
    /// no [`cause`](crate::RateLimited::cause).
    Allow,
    /// Refuse the call, with the failure as the [`cause`](crate::RateLimited::cause)
    /// and no `retry_after`.
    Deny,
}

/// One `#[rate_limit]` attribute, checked at compile time (or one rule of a layer,
/// checked when the layer is built).
#[derive(Debug, Clone)]
pub struct RuleSpec {
    /// The key template as written, the function's path, or a layer rule's name: a
    /// bounded name (`Cow::Borrowed` in the attribute's statics).
    pub name: Cow<'static, str>,
    /// Decided and reported, never refusing (to roll out a new limit safely).
    pub shadow: bool,
    /// Whether a refusal Redis gave may be answered again in process until its wait
    /// ends ([`Rule::local_refusals`](crate::Rule::local_refusals)).
    pub local_refusals: bool,
    /// Permits taken from Redis at once and served in process (1: none), and the
    /// lease they are served for (`None`: the default), see
    /// [`Rule::batch`](crate::Rule::batch).
    pub batch: u64,
    pub batch_lease: Option<Duration>,
    pub rate: u64,
    pub interval: Duration,
    pub mode: RateType,
    pub permits: u64,
    pub on_error: OnError,
    pub message: Option<Cow<'static, str>>,
    /// `Some`: a token bucket of this shape; `None`: a sliding window.
    pub bucket: Option<crate::BucketShape>,
    /// Its permits are a call's estimate, settled with what the call used
    /// ([`Rule::settled`](crate::Rule::settled)); decided through
    /// `Engine::reserve`, never `Engine::decide`.
    pub settled: bool,
    /// The most a settle charges past the estimate
    /// ([`Rule::max_overdraft`](crate::Rule::max_overdraft); `None`: no cap).
    pub max_overdraft: Option<u64>,
    /// The key template as the registry of rules reads it, when it differs from
    /// `name`: the attribute's, with the client address the layer read written
    /// `{client ip}` (a placeholder no parameter can name), so that it is compared as
    /// an address, which no literal such as `all` can be.
    pub shape: Option<Cow<'static, str>>,
}

impl RuleSpec {
    /// The limit a refusal names: the rule's name, rate and window, and a token
    /// bucket's burst.
    pub fn limit(&self) -> crate::Limit {
        crate::Limit {
            name: self.name.clone(),
            rate: self.rate,
            window: self.interval,
            burst: self.bucket.map(|shape| shape.burst),
        }
    }

    /// The rule's [`batch`](crate::Rule::batch) and its lease checked, as every call
    /// checks them (a layer checks them when it is built).
    pub fn check_batch(&self) -> Result<(), crate::Error> {
        let name = self.name.clone().into_owned();
        self.batched(self.unbatched(name, self.permits, self.rate, self.interval))
            .check_batch()
    }

    /// The rule for one call: `name` (the prefix and the key), `permits`, at `rate` per
    /// `interval` (the rule's own, or an override's). A batch that does not fit an
    /// override's rate or interval is left out: the rule then decides every call in
    /// Redis, rather than refusing every call as misconfigured.
    pub(crate) fn rule(&self, name: String, permits: u64, rate: u64, interval: Duration) -> crate::Rule {
        let rule = self.unbatched(name, permits, rate, interval);
        if self.batch == 1 && self.batch_lease.is_none() {
            return rule;
        }
        let rule = self.batched(rule);
        match rule.check_batch() {
            Ok(()) => rule,
            Err(_) => rule.batch(1).without_batch_lease(),
        }
    }

    /// The spec's batch and lease on `rule`.
    fn batched(&self, rule: crate::Rule) -> crate::Rule {
        let rule = rule.batch(self.batch);
        match self.batch_lease {
            Some(lease) => rule.batch_lease(lease),
            None => rule,
        }
    }

    /// The rule for one call, without the spec's batch.
    fn unbatched(&self, name: String, permits: u64, rate: u64, interval: Duration) -> crate::Rule {
        crate::Rule::of_spec(name, self, permits, rate, interval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(batch: u64, batch_lease: Option<Duration>) -> RuleSpec {
        RuleSpec {
            name: Cow::Borrowed("hot"),
            shadow: false,
            local_refusals: true,
            batch,
            batch_lease,
            rate: 100,
            interval: Duration::from_secs(1),
            mode: RateType::Overall,
            permits: 1,
            on_error: OnError::Local,
            message: None,
            bucket: None,
            settled: false,
            max_overdraft: None,
            shape: None,
        }
    }

    #[test]
    fn a_token_buckets_limit_carries_its_burst() {
        assert_eq!(spec(1, None).limit().burst, None);
        let mut bucket = spec(1, None);
        bucket.bucket = Some(crate::BucketShape::new(40, None));
        assert_eq!(bucket.limit().burst, Some(40));
        assert_eq!(
            bucket.limit().policy_field(),
            "\"hot\";q=100;w=1;redlimit-burst=40"
        );
    }

    #[test]
    fn a_batch_an_override_no_longer_fits_is_left_out() {
        let lease = Some(Duration::from_millis(200));
        let sec = Duration::from_secs(1);
        let rule = spec(10, lease).rule("k".into(), 1, 100, sec);
        assert_eq!((rule.batch_size(), rule.batch_lease_ms()), (10, 200));
        // An override lowered the rate below the batch, or the interval below the lease.
        for (rate, interval) in [(5, sec), (100, Duration::from_millis(200))] {
            let rule = spec(10, lease).rule("k".into(), 1, rate, interval);
            assert_eq!(rule.batch_size(), 1, "{rate} per {interval:?}");
            assert!(rule.check_batch().is_ok());
        }
        assert!(spec(10, lease).check_batch().is_ok());
        assert!(
            spec(101, None).check_batch().is_err(),
            "the spec itself is checked as written"
        );
    }
}
