//! The refusals the engine answers: limited by a rule, a call no wait would let pass,
//! a misconfiguration or misuse (never let through unlimited), a request without its
//! key.

use std::sync::Arc;

use super::call::CallKeys;
use super::Engine;
use crate::observe::Counted;
use crate::{Decision, Error, RateLimited, Rule};

impl Engine {
    /// A refusal by rule `rule` (an index among the engine's rules) for the limiter
    /// `key`, naming `limit`.
    fn refused(&self, rule: usize, key: String, limit: crate::Limit) -> RateLimited {
        RateLimited {
            key,
            retry_after: None,
            message: self.rules[rule].message.clone(),
            rule,
            cause: None,
            limit: Some(Box::new(limit)),
            x_ratelimit: false,
            about_blank: false,
            remaining: 0,
        }
    }

    /// The first enforced rule this call asks for more permits than its rate: no wait
    /// would let the call pass.
    pub(super) fn never_passes(&self, call: &CallKeys<'_>, rules: &[Rule]) -> Option<RateLimited> {
        call.permits?;
        let i = (0..rules.len()).find(|&i| {
            !self.rules[i].shadow && call.applies(i) && rules[i].permits_per_call() > rules[i].most_permits()
        })?;
        self.count(i, Counted::Limited);
        Some(self.refused(i, rules[i].name().to_owned(), self.limit_of(i, Some(&rules[i]))))
    }

    /// The first enforced settled rule this call estimates at 0 permits: refused as the
    /// caller's misuse (counted `error_denied`, not logged), never reserved. A
    /// reservation of nothing would let the call through where the limiter has no room
    /// left, and its settle charge it all afterwards.
    pub(super) fn estimated_at_zero(&self, call: &CallKeys<'_>, rules: &[Rule]) -> Option<RateLimited> {
        let permits = call.permits?;
        let i =
            (0..rules.len()).find(|&i| self.rules[i].settled && !self.rules[i].shadow && permits[i] == 0)?;
        self.count(i, Counted::ErrorDenied);
        let error = Error::InvalidReservation {
            name: rules[i].name().to_owned(),
            problem: "the call's estimate (`cost`) is 0; a settled rule reserves what the call \
                      may use before it runs: give an estimate of at least 1"
                .to_owned(),
        };
        Some(RateLimited {
            cause: Some(Arc::new(error)),
            ..self.refused(i, rules[i].name().to_owned(), self.limit_of(i, Some(&rules[i])))
        })
    }

    /// The refusal `decision` gave for `rules`; `index` maps a position in `rules` to
    /// the engine's rule.
    pub(super) fn refusal(
        &self,
        rules: &[Rule],
        decision: &Decision,
        index: impl Fn(usize) -> usize,
    ) -> RateLimited {
        let refused = decision.refused_by.unwrap_or(0);
        let rule = index(refused);
        self.count(rule, Counted::Limited);
        let key = rules
            .get(refused)
            .map_or_else(String::new, |r| r.name().to_owned());
        RateLimited {
            retry_after: decision.retry_after,
            remaining: decision.remaining,
            ..self.refused(rule, key, self.limit_of(rule, rules.get(refused)))
        }
    }

    /// Rule `rule` refuses because the backend failed and its `on_error` is `deny`.
    pub(super) fn denied(&self, rules: &[Rule], rule: usize, error: Error) -> RateLimited {
        RateLimited {
            cause: Some(Arc::new(error)),
            ..self.refused(
                rule,
                rules[rule].name().to_owned(),
                self.limit_of(rule, rules.get(rule)),
            )
        }
    }

    /// A call that cannot be decided for a reason other than the backend (a prefix
    /// that splits cluster slots, say): refused, never let through unlimited.
    /// `first` is the engine's index of `rules[0]`, the rule the refusal names.
    pub(super) fn misuse(&self, rules: &[Rule], first: usize, error: Error) -> RateLimited {
        self.failures.failed(self.function, &error);
        self.count(first, Counted::ErrorDenied);
        let key = rules.first().map_or_else(String::new, |r| r.name().to_owned());
        RateLimited {
            cause: Some(Arc::new(error)),
            ..self.refused(first, key, self.rules[first].limit())
        }
    }

    /// A call whose key for `rule` cannot be built from what the caller sent (a layer
    /// mounted where the value it reads never exists): refused and logged as a
    /// misconfiguration, never let through unlimited.
    pub fn refuse_misconfigured(&self, rule: usize, error: Error) -> RateLimited {
        self.failures.failed(self.function, &error);
        self.count(rule, Counted::ErrorDenied);
        self.refuse_without_key(rule, error)
    }

    /// A request without a value for `rule`'s key, under a rule that refuses such
    /// requests (a layer's): refused with `error` as the cause, nothing spent, nothing
    /// logged (it is the caller's doing, not the service's).
    pub fn refuse_without_key(&self, rule: usize, error: Error) -> RateLimited {
        RateLimited {
            cause: Some(Arc::new(error)),
            ..self.refused(rule, String::new(), self.rules[rule].limit())
        }
    }
}
