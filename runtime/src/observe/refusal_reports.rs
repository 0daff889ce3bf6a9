//! The refusals each process reports to Redis once a second, for operators watching
//! a limiter (`redlimit watch`).
//!
//! Refusals of the attribute's and the layer's rules are counted in process and added,
//! by the client's background task (`backend::redis::shared::sync`, which also says when a
//! refusal is counted), to
//! `<prefix>redlimit:refused:<epoch second>` (a hash of counts by limiter name, kept 2
//! minutes). No call waits for this. What the reports cost Redis is bounded per
//! process, whatever keys callers send: each second, at most `MAX_REPORTED` limiters
//! (the first refused, not the busiest) and `MAX_REPORTED_BYTES` of their names get a
//! field of their own; the refusals of any other limiter are counted under its rule,
//! in the field `rule:<rule name>`.

use std::collections::HashMap;

/// Limiters whose refusals one process reports per second, at most, each in a field of
/// its own; other refusals are counted by rule.
pub(crate) const MAX_REPORTED: usize = 100;
/// The bytes of limiter names one process reports per second, at most.
pub(crate) const MAX_REPORTED_BYTES: usize = 16 * 1024;

/// How long the refusal counts of one second are kept.
pub(crate) const REPORT_TTL_MS: u64 = 120_000;

/// Refusals counted since the last report, by second and limiter (or rule), and the
/// fields and bytes of names each second has taken of the budget.
#[derive(Debug, Default)]
struct Refused {
    counts: HashMap<(u64, String), u64>,
    budget: HashMap<u64, (usize, usize)>,
}

/// A client's refusals not yet reported (Redis clients only).
#[derive(Debug, Default)]
pub(crate) struct RefusalReports {
    refused: std::sync::Mutex<Refused>,
}

impl RefusalReports {
    /// Counts a refusal at epoch second `second` of the limiter `name` of rule
    /// `rule`: under the limiter's name while the second's budget lasts, else under
    /// the rule's.
    pub(crate) fn note(&self, second: u64, name: &str, rule: &str) {
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        let Refused { counts, budget } = &mut *refused;
        if let Some(count) = counts.get_mut(&(second, name.to_owned())) {
            *count += 1;
            return;
        }
        if !budget.contains_key(&second) {
            budget.retain(|&s, _| s > second);
        }
        let (fields, bytes) = budget.entry(second).or_default();
        let field = if *fields < MAX_REPORTED && *bytes + name.len() <= MAX_REPORTED_BYTES {
            *fields += 1;
            *bytes += name.len();
            name.to_owned()
        } else {
            format!("rule:{rule}")
        };
        *counts.entry((second, field)).or_default() += 1;
    }

    /// The counts noted since the last call, by epoch second.
    pub(crate) fn take(&self) -> HashMap<u64, Vec<(String, u64)>> {
        let counts = std::mem::take(&mut self.refused.lock().unwrap_or_else(|e| e.into_inner()).counts);
        let mut by_second: HashMap<u64, Vec<(String, u64)>> = HashMap::new();
        for ((second, name), count) in counts {
            by_second.entry(second).or_default().push((name, count));
        }
        by_second
    }
}
