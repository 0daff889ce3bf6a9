//! The rules this process runs: the attribute's and the layer's, each registered as it
//! is first used (and a layer's when it is built). An override set from this process
//! is checked against the rules it reaches, with the rules' own checks; and no two
//! rules of different shapes may produce one limiter name.
//!
//! A rule's shape is the limiter names it can produce: its literal text, cut into
//! segments at `:`, `{` and `}` (which interpolated values never contain), with each
//! value a whole segment (the attribute's compile-time check). Two rules that can
//! produce one name and are not the same shape (the same literal segments, and values
//! of the same name in the same places) would let a value passed to one reach the
//! limiters of the other: `login:{user}` called with `192.0.2.55` spends what
//! `login:{ip}` gives that address. The rule used later of two such rules refuses every
//! call with [`Error::OverlappingRules`] (the one in use keeps deciding). Rules of one
//! function (or one layer) are written together and may share limiters.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::RwLock;
use std::time::Duration;

use crate::limiter::{check_bucket, within_rate};
use crate::site::RuleSpec;
use crate::{Error, RateLimiterConfig, RateType};

/// What an override must fit in one rule.
#[derive(Debug, Clone)]
struct Registered {
    name: String,
    permits: u64,
    bucket: Option<crate::BucketShape>,
}

static RULES: RwLock<Vec<Registered>> = RwLock::new(Vec::new());

/// Registers `specs`, once per rule name and shape.
pub(crate) fn register(specs: &[RuleSpec]) {
    let mut rules = RULES.write().unwrap_or_else(|e| e.into_inner());
    for spec in specs {
        let known = rules
            .iter()
            .any(|r| r.name == spec.name && r.permits == spec.permits && r.bucket == spec.bucket);
        if !known {
            rules.push(Registered {
                name: spec.name.to_string(),
                permits: spec.permits,
                bucket: spec.bucket,
            });
        }
    }
}

/// Whether a rule taking `permits` per call (a token bucket of `bucket`'s shape) can
/// decide at `rate` per `interval`: what is wrong, else `Ok`.
pub(crate) fn fits(
    name: &str,
    permits: u64,
    bucket: Option<crate::BucketShape>,
    rate: u64,
    interval: Duration,
) -> Result<(), Error> {
    let config = RateLimiterConfig::new(RateType::Overall, rate, interval);
    config.validate(name)?;
    match bucket {
        Some(shape) => check_bucket(name, shape, &config),
        None => within_rate(name, permits, rate),
    }
}

/// The first rule of this process named `rule` that cannot take `rate` per `interval`.
pub(crate) fn check_override(of: &str, rule: &str, rate: u64, interval: Duration) -> Result<(), Error> {
    let rules = RULES.read().unwrap_or_else(|e| e.into_inner());
    for r in rules.iter().filter(|r| r.name == rule) {
        if let Err(error) = fits(&r.name, r.permits, r.bucket, rate, interval) {
            return Err(Error::UnusableOverride {
                of: of.to_owned(),
                rule: r.name.clone(),
                reason: error.to_string(),
            });
        }
    }
    Ok(())
}

/// One segment of a limiter name: literal text, or a value (by its placeholder's name).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Text(String),
    Value(String),
}

/// The names a rule can produce: segments and the separators between them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shape {
    segments: Vec<Segment>,
    separators: Vec<char>,
}

const SEPARATORS: [char; 3] = [':', '{', '}'];

impl Shape {
    /// The shape of `prefix` + a key template (`{{`/`}}` literal braces, `{name}` a
    /// value) as the attribute checked it at compile time.
    pub(crate) fn of_template(prefix: &str, template: &str) -> Shape {
        let mut shape = Shape {
            segments: vec![Segment::Text(String::new())],
            separators: Vec::new(),
        };
        for c in prefix.chars() {
            shape.push_char(c);
        }
        let mut chars = template.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    shape.push_char('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    shape.push_char('}');
                }
                '{' => {
                    let name: String = chars.by_ref().take_while(|&c| c != '}').collect();
                    *shape.segments.last_mut().expect("a segment") = Segment::Value(name);
                }
                c => shape.push_char(c),
            }
        }
        shape
    }

    fn push_char(&mut self, c: char) {
        if SEPARATORS.contains(&c) {
            self.separators.push(c);
            self.segments.push(Segment::Text(String::new()));
        } else if let Some(Segment::Text(text)) = self.segments.last_mut() {
            text.push(c);
        }
    }

    /// Whether some limiter name is produced by both.
    fn overlaps(&self, other: &Shape) -> bool {
        self.separators == other.separators
            && self.segments.iter().zip(&other.segments).all(|pair| match pair {
                (Segment::Text(a), Segment::Text(b)) => a == b,
                _ => true,
            })
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, segment) in self.segments.iter().enumerate() {
            match segment {
                Segment::Text(text) => f.write_str(text)?,
                Segment::Value(name) => write!(f, "{{{name}}}")?,
            }
            if let Some(separator) = self.separators.get(i) {
                write!(f, "{separator}")?;
            }
        }
        Ok(())
    }
}

/// A rule's shape, the site (function or layer) it belongs to, and whether it
/// overlaps another site's rule.
#[derive(Debug)]
struct Placed {
    site: usize,
    rule: String,
    shape: Shape,
    conflict: Option<(String, String)>,
}

static SHAPES: RwLock<Vec<Placed>> = RwLock::new(Vec::new());
/// How many rules overlap another: while 0, a decision looks no further.
static CONFLICTS: AtomicUsize = AtomicUsize::new(0);

/// Places the rules of `site` (an address, stable while the site lives), each with its
/// shape, and marks every pair of different sites' rules that can produce one name
/// without being one shape.
pub(crate) fn place(site: usize, rules: &[(String, Shape)]) {
    let mut placed = SHAPES.write().unwrap_or_else(|e| e.into_inner());
    for (rule, shape) in rules {
        if !placed
            .iter()
            .any(|p| p.site == site && &p.rule == rule && &p.shape == shape)
        {
            placed.push(Placed {
                site,
                rule: rule.clone(),
                shape: shape.clone(),
                conflict: None,
            });
        }
    }
    mark_conflicts(&mut placed);
}

/// Forgets the rules of a site that is gone (a dropped layer).
pub(crate) fn forget(site: usize) {
    let mut placed = SHAPES.write().unwrap_or_else(|e| e.into_inner());
    let before = placed.len();
    placed.retain(|p| p.site != site);
    if placed.len() != before {
        mark_conflicts(&mut placed);
    }
}

/// Each rule's conflict: the first rule placed before it, of another site, that can
/// produce one of its names without being its shape. Only the later rule is refused,
/// so that a rule in use keeps deciding when another one appears.
fn mark_conflicts(placed: &mut [Placed]) {
    let mut count = 0;
    for i in 0..placed.len() {
        let (earlier, rest) = placed.split_at_mut(i);
        let this = &mut rest[0];
        let conflict = earlier
            .iter()
            .find(|other| {
                other.site != this.site && other.shape.overlaps(&this.shape) && other.shape != this.shape
            })
            .map(|other| (other.rule.clone(), other.shape.to_string()));
        count += usize::from(conflict.is_some());
        this.conflict = conflict;
    }
    CONFLICTS.store(count, Ordering::Relaxed);
}

/// The first rule of `site` that overlaps another site's rule, as the error its calls
/// are refused with.
pub(crate) fn conflict_of(site: usize) -> Option<Error> {
    if CONFLICTS.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let placed = SHAPES.read().unwrap_or_else(|e| e.into_inner());
    let p = placed.iter().find(|p| p.site == site && p.conflict.is_some())?;
    let (other, other_shape) = p.conflict.clone()?;
    Some(Error::OverlappingRules {
        rule: p.rule.clone(),
        shape: p.shape.to_string(),
        other,
        other_shape,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_overlap_only_where_a_value_can_write_the_other_rules_text() {
        let shape = |t: &str| Shape::of_template("rate_limit:", t);
        assert_eq!(
            shape("{{tenant:{t.id}}}:search").to_string(),
            "rate_limit:{tenant:{t.id}}:search"
        );
        let overlap = |a: &str, b: &str| shape(a).overlaps(&shape(b));
        assert!(overlap("login:{user}", "login:{ip}"));
        assert!(overlap("login:{user}", "login:admin"));
        assert!(overlap("a:{x}:c", "a:b:{y}"));
        assert!(!overlap("login:{ip}", "signup:{ip}"));
        assert!(!overlap("order:{id}", "order:{id}:items"));
        assert!(
            !overlap("{{t:{x}}}:a", "t:{x}:a"),
            "braces are separators of their own"
        );
        assert_eq!(
            shape("login:{ip}"),
            shape("login:{ip}"),
            "one shape: shared on purpose"
        );
        assert_ne!(shape("login:{ip}"), shape("login:{user}"));
    }

    #[test]
    fn rules_of_different_shapes_that_overlap_refuse_until_one_is_gone() {
        let shape = |t: &str| Shape::of_template("p:", t);
        let (a, b, c) = (0x1000usize, 0x2000usize, 0x3000usize);
        place(a, &[("reg:{ip}".into(), shape("reg:{ip}"))]);
        place(c, &[("reg:{ip}".into(), shape("reg:{ip}"))]);
        assert!(
            conflict_of(a).is_none() && conflict_of(c).is_none(),
            "one shape in two sites"
        );
        place(b, &[("reg:{user}".into(), shape("reg:{user}"))]);
        let error = conflict_of(b).unwrap().to_string();
        assert!(
            error.contains("reg:{user}") && error.contains("reg:{ip}"),
            "{error}"
        );
        assert!(conflict_of(a).is_none(), "the rule in use keeps deciding");
        forget(a);
        assert!(conflict_of(b).is_some(), "c is of a's shape");
        forget(c);
        assert!(conflict_of(b).is_none(), "nothing left to overlap");
        forget(b);
    }
}
