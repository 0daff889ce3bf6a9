//! What a settle did, rule by rule.

/// What a settle did, rule by rule (the settled rules, in their order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// One per settled rule.
    pub rules: Vec<RuleSettled>,
}

/// What a settle did to one rule's grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSettled {
    /// The rule's index among the reservation's rules.
    pub rule: usize,
    /// The limiter's name.
    pub name: String,
    /// The permits the reservation took.
    pub estimate: u64,
    /// The permits now counted for the call: the actual amount, at most the estimate
    /// plus the rule's [`max_overdraft`](crate::Rule::max_overdraft) (and at most
    /// [`MAX_PERMITS`](crate::MAX_PERMITS)); for a token bucket, at least 1.
    pub counted: u64,
    /// What the call used beyond what is counted (0 without a cap reached).
    pub uncharged: u64,
    /// False when there was nothing left to settle: a refund for a grant that had
    /// already left its window, a settle already made, or a limiter deleted or reset.
    /// (A grant that left its window has its excess charged at the settle's time.)
    pub applied: bool,
    /// The permits the limiter has left after the settle (0 in debt): as the backend
    /// read them when it settled (a window's value, which counts grants that left the
    /// window since the last decision back only at the next one, so it may be below
    /// what that decision finds), or, where it could not (a window without its value,
    /// a settle that changed nothing), what the grant left, plus what went back (up to
    /// the rate, or a bucket's burst), less the excess.
    pub remaining: u64,
}

impl Settled {
    /// Permits given back, over every rule.
    pub fn refunded(&self) -> u64 {
        self.applied().map(|r| r.estimate.saturating_sub(r.counted)).sum()
    }

    /// Permits charged beyond the estimates, over every rule.
    pub fn overdrawn(&self) -> u64 {
        self.applied().map(|r| r.counted.saturating_sub(r.estimate)).sum()
    }

    /// Permits used beyond every cap, not counted, over every rule.
    pub fn uncharged(&self) -> u64 {
        self.rules.iter().map(|r| r.uncharged).sum()
    }

    fn applied(&self) -> impl Iterator<Item = &RuleSettled> {
        self.rules.iter().filter(|r| r.applied)
    }
}
