//! A call's rules merged by the limiter they name: rules naming one limiter are decided
//! as one, on the one of their configs that holds every other's limit (refused when
//! none does), and a call holds at most [`MAX_RULES_PER_CALL`] rules.

use super::Rule;
use crate::{Error, RateLimiterConfig, RateType};

/// Rules of one call that name the same limiter, decided as one: a limiter has one
/// config, and no rule's limit may be switched off by the others'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Merged {
    /// The first of the rules (its index is the one reported as refusing).
    pub first: usize,
    /// The rule whose config is enforced: one that holds every other's limit.
    pub config: usize,
    /// Permits taken: the largest of the rules'.
    pub permits: u64,
}

/// The most rules one call decides: in Redis a call is one script run (on a cluster,
/// one per slot), which holds the server while it runs, longer the more rules.
pub const MAX_RULES_PER_CALL: usize = 256;

/// `rules` refused when they are more than one call decides.
pub(crate) fn check_rule_count(rules: &[Rule]) -> Result<(), Error> {
    match rules.len() {
        0..=MAX_RULES_PER_CALL => Ok(()),
        n => Err(Error::TooManyRules {
            rules: n,
            most: MAX_RULES_PER_CALL,
        }),
    }
}

/// The merged calls of a decision, inline for a few.
pub(crate) type Merges = smallvec::SmallVec<[Merged; 4]>;

/// One [`Merged`] per distinct limiter name, in order of first appearance, decided on
/// the strictest config when it holds every other rule's limit, else on another that
/// does. Refused when none does ([`Error::InvalidConfig`]: any would let another rule's
/// limit go), and when a limiter's largest permits are more than the enforced rule's
/// rate (a token bucket's: its burst) lets one call take: its one config never grants
/// them, and taking fewer than a rule asks would count that rule short.
pub(crate) fn merge(rules: &[Rule]) -> Result<Merges, Error> {
    let mut merged = Merges::new();
    for (i, rule) in rules.iter().enumerate() {
        let same =
            |m: &Merged| rules[m.first].name == rule.name && rules[m.first].algorithm == rule.algorithm;
        match merged.iter_mut().find(|m| same(m)) {
            None => merged.push(Merged {
                first: i,
                config: i,
                permits: rule.permits,
            }),
            Some(m) => {
                if stricter(rule, &rules[m.config]) {
                    m.config = i;
                }
                m.permits = m.permits.max(rule.permits);
            }
        }
    }
    // The one config enforced must hold every coinciding rule's limit: a shorter window,
    // a smaller burst or per-client counting it lacks would let that rule's limit go.
    // (no list made: a call of distinct limiters, the usual one, compares each rule
    // with itself only)
    for m in &mut merged {
        let first = &rules[m.first];
        let of_group = |r: &Rule| r.name == first.name && r.algorithm == first.algorithm;
        let holds_all = |i: usize| rules.iter().filter(|r| of_group(r)).all(|r| holds(&rules[i], r));
        if holds_all(m.config) {
            continue;
        }
        let other = (0..rules.len())
            .filter(|&i| of_group(&rules[i]))
            .find(|&i| holds_all(i));
        match other {
            Some(i) => m.config = i,
            None => {
                return Err(Error::InvalidConfig {
                    name: rules[m.first].name().to_owned(),
                    problem: "rules of this call name this limiter (their keys' values made them one) with \
                              limits none of which holds the others': one limiter keeps one config, and any \
                              would let another's limit go (a shorter window or a smaller burst, or another \
                              counted per client); refused",
                })
            }
        }
    }
    for m in &merged {
        let enforced = &rules[m.config];
        if m.permits > enforced.most_permits() {
            let name = enforced.name().to_owned();
            return Err(match enforced.capacity() {
                Some(burst) => Error::PermitsExceedBurst {
                    name,
                    permits: m.permits,
                    burst,
                },
                None => Error::PermitsExceedRate {
                    name,
                    permits: m.permits,
                    rate: enforced.config.rate,
                },
            });
        }
    }
    Ok(merged)
}

/// Whether `a`'s config, enforced, holds `b`'s limit too: shared by every client, or
/// per client as `b` is; a sliding window of at most `b`'s rate over at least `b`'s
/// interval (every window of `b`'s lies within one of `a`'s); a token bucket of at most
/// `b`'s burst refilled at most as fast, or with a warm-up, the same bucket.
fn holds(a: &Rule, b: &Rule) -> bool {
    let (ca, cb) = (&a.config, &b.config);
    if ca.rate_type == RateType::PerClient && cb.rate_type == RateType::Overall {
        return false;
    }
    match (a.shape(), b.shape()) {
        // (a warm-up's cost depends on its coldness, which the rate and the warm-up set
        // together: only the same bucket holds one)
        (Some(shape_a), Some(shape_b)) if shape_a.warmup_ms > 0 || shape_b.warmup_ms > 0 => {
            shape_a == shape_b && ca.rate == cb.rate && ca.interval == cb.interval
        }
        (Some(shape_a), Some(shape_b)) => {
            let long_run = u128::from(ca.rate) * cb.interval.as_millis()
                <= u128::from(cb.rate) * ca.interval.as_millis();
            shape_a.burst <= shape_b.burst && long_run
        }
        _ => ca.rate <= cb.rate && ca.interval >= cb.interval,
    }
}

/// Whether `a` grants less than `b`: shared by every client rather than per client,
/// then a lower long-run rate (rate / interval), then a smaller rate (burst), then (for
/// token buckets) a smaller capacity.
fn stricter(a: &Rule, b: &Rule) -> bool {
    let (ca, cb) = (&a.config, &b.config);
    if stricter_config(ca, cb) || stricter_config(cb, ca) {
        return stricter_config(ca, cb);
    }
    a.most_permits() < b.most_permits()
}

fn stricter_config(a: &RateLimiterConfig, b: &RateLimiterConfig) -> bool {
    let shared = |c: &RateLimiterConfig| c.rate_type == RateType::Overall;
    if shared(a) != shared(b) {
        return shared(a);
    }
    let long_run = |x: &RateLimiterConfig, y: &RateLimiterConfig| u128::from(x.rate) * y.interval.as_millis();
    let (ab, ba) = (long_run(a, b), long_run(b, a));
    if ab != ba {
        return ab < ba;
    }
    a.rate < b.rate
}
