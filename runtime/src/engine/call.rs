//! One call as the engine sees it (its keys and permits), and what a call that may go
//! on learns.

use std::time::Duration;

/// One call's keys, one per rule, and the permits it takes of each when not the
/// rules' own. Building the call's rules takes the keys (each becomes its limiter's
/// name, the prefix put in front in place unless it is there).
pub(super) struct CallKeys<'a> {
    pub keys: &'a mut [String],
    pub permits: Option<&'a [u64]>,
    pub written: Written,
}

/// Who wrote a call's keys, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Written {
    /// Its caller (a key template's expansion, a name given by hand).
    ByCaller,
    /// A layer, after the client's prefix: each key is the prefix and its rule's
    /// name, alone or followed by `:` and a value `KeyBuf` escaped. Their names need
    /// not be checked again when the rule's are found good for every such value.
    Layer,
}

impl<'a> CallKeys<'a> {
    /// A call's keys, written by its caller (not a layer's escaped ones).
    pub fn new(keys: &'a mut [String], permits: Option<&'a [u64]>) -> Self {
        CallKeys {
            keys,
            permits,
            written: Written::ByCaller,
        }
    }

    /// Whether the rule applies to this call (0 permits: it does not).
    pub fn applies(&self, rule: usize) -> bool {
        self.permits.is_none_or(|p| p[rule] != 0)
    }
}

/// A call that may go on.
#[derive(Debug, Clone, Copy, Default)]
pub struct Granted {
    /// The enforced rule with the fewest permits left (its index among the engine's
    /// rules), and how many: `None` when no rule was decided by the backend (none
    /// applied, or `on_error` let the call through).
    pub tightest: Option<(usize, u64)>,
    /// That rule's rate and window as decided: its own, or a run-time override's.
    pub decided: Option<(u64, Duration)>,
}
