//! Shadow rules: decided after the enforced ones granted, on their own, and reported,
//! never refusing.

use super::call::CallKeys;
use super::Engine;
use crate::observe::Counted;
use crate::{Client, Rule};

impl Engine {
    /// Each shadow rule that applies takes its permits when it has them; a refusal is
    /// only reported (a warning at most once per 10 s per function, with the number
    /// left out).
    pub(super) async fn shadow(&self, client: &Client, rules: &[Rule], call: &CallKeys<'_>) {
        let shadow = (0..rules.len()).filter(|&i| self.rules[i].shadow && call.applies(i));
        for index in shadow {
            let refused = match client.check_rules(std::slice::from_ref(&rules[index])).await {
                Ok(decision) if !decision.allowed => decision.retry_after,
                // A shadow rule never refuses, not even when it cannot be decided.
                _ => continue,
            };
            self.shadow_refused(index, refused);
        }
    }

    /// Shadow rule `index` would have refused: counted, and reported (throttled).
    pub(super) fn shadow_refused(&self, index: usize, retry_after: Option<std::time::Duration>) {
        self.count(index, Counted::ShadowLimited);
        self.shadows
            .refused(self.function, &self.rules[index].name, retry_after);
    }
}
