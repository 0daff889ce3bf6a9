//! A rule as the attribute and the layer describe it: a key template's name, a rate
//! and window, the permits a call takes, what to do when the backend fails. One such
//! description per rule, made into a [`Rule`](crate::Rule) for each call's key.

use std::borrow::Cow;
use std::time::Duration;

use crate::RateType;

/// What a rule does when the backend fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Decide on an in-process limiter with the same rule.
    Local,
    /// Let the call through.
    Allow,
    /// Refuse the call, with the failure as the cause.
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
}

impl RuleSpec {
    /// The limit a refusal names: the rule's name, rate and window.
    pub fn limit(&self) -> crate::Limit {
        crate::Limit {
            name: self.name.clone(),
            rate: self.rate,
            window: self.interval,
        }
    }

    /// The rule's [`batch`](crate::Rule::batch) and its lease checked, as every call
    /// checks them (a layer checks them when it is built).
    pub fn check_batch(&self) -> Result<(), crate::Error> {
        let name = self.name.clone().into_owned();
        self.rule(name, self.permits, self.rate, self.interval)
            .check_batch()
    }

    /// The rule for one call: `name` (the prefix and the key), `permits`, at `rate` per
    /// `interval` (the rule's own, or an override's).
    pub(crate) fn rule(&self, name: String, permits: u64, rate: u64, interval: Duration) -> crate::Rule {
        let rule = crate::Rule::new(name, rate, interval)
            .mode(self.mode)
            .permits(permits)
            .local_refusals(self.local_refusals)
            .batch(self.batch);
        let rule = match self.batch_lease {
            Some(lease) => rule.batch_lease(lease),
            None => rule,
        };
        match self.bucket {
            Some(shape) => rule
                .algorithm(crate::Algorithm::TokenBucket)
                .burst(shape.burst)
                .warmup(Duration::from_millis(shape.warmup_ms)),
            None => rule,
        }
    }
}
