//! The `on_error` policies, when the backend fails: any `deny` rule refuses; else the
//! `local` rules are decided in process (all or nothing) and the `allow` rules pass.

use tokio::time::Instant;

use super::call::CallKeys;
use super::Engine;
use crate::observe::Counted;
use crate::{Client, Error, OnError, RateLimited, Rule};

impl Engine {
    /// Applies the policies to a call the backend failed with `error`. The local
    /// decision shares the call's deadline, so a failure part-way through a wait does
    /// not make the caller wait twice.
    pub(super) async fn on_error(
        &self,
        call: &CallKeys<'_>,
        rules: super::Rules,
        error: Error,
        deadline: Option<Instant>,
        fallback: &Client,
    ) -> Result<(), RateLimited> {
        let local = self.policies(call, &rules, error)?;
        if local.is_empty() {
            return Ok(());
        }
        let local_rules: Vec<Rule> = local.iter().map(|&i| rules[i].clone()).collect();
        match self.check(fallback, &local_rules, deadline).await {
            Ok(decision) if decision.allowed => Ok(()),
            Ok(decision) => Err(self.refusal(&local_rules, &decision, |i| local[i])),
            // The rules cannot be enforced anywhere: refused, never let through.
            Err(local_error) => Err(self.misuse(&local_rules, local[0], local_error)),
        }
    }

    /// The policies' first step, for a call the backend failed with `error`: the
    /// failure logged, each enforced rule counted under its policy, the refusal of a
    /// `deny` rule; else the rules to decide in process (the `local` ones, by index).
    pub(super) fn policies(
        &self,
        call: &CallKeys<'_>,
        rules: &[Rule],
        error: Error,
    ) -> Result<Vec<usize>, RateLimited> {
        self.failures.failed(self.function, &error);
        let enforced: Vec<usize> = (0..rules.len())
            .filter(|&i| !self.rules[i].shadow && call.applies(i))
            .collect();
        let policy = |i: usize| self.policy(i, &error);
        for &i in &enforced {
            self.count(i, policy(i).outcome());
        }
        if let Some(&rule) = enforced.iter().find(|&&i| policy(i) == OnError::Deny) {
            return Err(self.denied(rules, rule, error));
        }
        Ok(enforced
            .into_iter()
            .filter(|&i| policy(i) == OnError::Local)
            .collect())
    }

    /// Rule `i`'s policy for `error`. `allow` is for an outage; a failure that
    /// persists until someone acts (state another program wrote, credentials, a full
    /// server) is decided in process.
    fn policy(&self, i: usize, error: &Error) -> OnError {
        match self.rules[i].on_error {
            OnError::Allow if !error.is_transient() => OnError::Local,
            policy => policy,
        }
    }
}

impl OnError {
    /// The outcome a rule under this policy is counted as.
    fn outcome(self) -> Counted {
        match self {
            OnError::Allow => Counted::ErrorAllowed,
            OnError::Deny => Counted::ErrorDenied,
            OnError::Local => Counted::ErrorLocal,
        }
    }
}
