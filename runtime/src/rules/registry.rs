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
//! `login:{ip}` gives that address; rules of one shape at different sites on one store
//! (`Backend::store`) share their limiters only when they count them alike (`Counting`). Nor may a rule's name be one of the keys another
//! keeps beside its config (`{tenant:acme}:value` of a rule named `{tenant:acme}`).
//! Both rules of such a pair refuse every call with [`Error::OverlappingRules`], so
//! which was used first changes nothing. Rules of one function (or one layer) are
//! written together and may share limiters when they count them alike (one config:
//! algorithm, rate, interval, mode, burst and warm-up; the attribute checks it at
//! compile time, a layer when it is built:
//! [`Engine::coinciding_rules`](crate::engine::Engine::coinciding_rules)), but not one's
//! name be another's key.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::RwLock;
use std::time::Duration;

use crate::rules::fit::{check_bucket, within_rate};
use crate::RuleSpec;
use crate::{Error, RateLimiterConfig, RateType};

/// What an override must fit in one rule.
#[derive(Debug, Clone)]
struct Registered {
    name: String,
    permits: u64,
    bucket: Option<crate::BucketShape>,
}

static RULES: RwLock<Vec<Registered>> = RwLock::new(Vec::new());
/// Bumped at each rule registered: a client publishes the rules again when it moved.
static GENERATION: AtomicUsize = AtomicUsize::new(0);

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
            GENERATION.fetch_add(1, Ordering::Relaxed);
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

/// How many rules this process has registered so far.
pub(crate) fn generation() -> usize {
    GENERATION.load(Ordering::Relaxed)
}

/// This process's rules as fields of the table every process publishes to Redis
/// (`<prefix>redlimit:rules`), so that a process that runs none of them (the CLI) can
/// check an override too: `<name>|w:<permits>` for a sliding window,
/// `<name>|b:<permits>:<burst>:<warm-up ms>` for a token bucket.
pub(crate) fn published_fields() -> Vec<String> {
    let rules = RULES.read().unwrap_or_else(|e| e.into_inner());
    rules
        .iter()
        .map(|r| match r.bucket {
            None => format!("{}|w:{}", r.name, r.permits),
            Some(shape) => format!("{}|b:{}:{}:{}", r.name, r.permits, shape.burst, shape.warmup_ms),
        })
        .collect()
}

/// A published field read back; `None` for one this version does not know.
fn from_field(field: &str) -> Option<Registered> {
    let (name, shape) = field.rsplit_once('|')?;
    let number = |s: &str| s.parse::<u64>().ok();
    let (permits, bucket) = if let Some(permits) = shape.strip_prefix("w:") {
        (number(permits)?, None)
    } else {
        let mut parts = shape.strip_prefix("b:")?.split(':');
        let permits = number(parts.next()?)?;
        let burst = number(parts.next()?)?;
        let warmup_ms = number(parts.next()?)?;
        (permits, Some(crate::BucketShape { burst, warmup_ms }))
    };
    Some(Registered {
        name: name.to_owned(),
        permits,
        bucket,
    })
}

/// The first rule named `rule`, of this process or among `published` (fields of the
/// published table), that cannot take `rate` per `interval`.
pub(crate) fn check_override(
    of: &str,
    rule: &str,
    rate: u64,
    interval: Duration,
    published: &[String],
) -> Result<(), Error> {
    let mut rules = RULES.read().unwrap_or_else(|e| e.into_inner()).clone();
    rules.extend(published.iter().filter_map(|field| from_field(field)));
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

/// One segment of a limiter name: literal text, or a value (by its placeholder's name,
/// compared as the [`dimension`] it names).
#[derive(Debug, Clone, Eq)]
enum Segment {
    Text(String),
    Value(String),
}

impl PartialEq for Segment {
    fn eq(&self, other: &Segment) -> bool {
        match (self, other) {
            (Segment::Text(a), Segment::Text(b)) => a == b,
            (Segment::Value(a), Segment::Value(b)) => dimension(a) == dimension(b),
            _ => false,
        }
    }
}

/// What a placeholder's value is, by its name. The client address is one dimension
/// however a rule names it: `{client ip}` in a layer rule keyed by it and in the
/// registry's reading of an attribute's `{request.client_ip}`, that as written, and
/// `{ip}` as an attribute's `ClientIp` parameter named `ip` writes it. Rules of one
/// shape but for these names count one limiter per client, as the same rule would.
fn dimension(name: &str) -> &str {
    match name {
        "request.client_ip" | CLIENT_IP => "ip",
        other => other,
    }
}

/// The names a rule can produce: segments and the separators between them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shape {
    segments: Vec<Segment>,
    separators: Vec<char>,
}

const SEPARATORS: [char; 3] = [':', '{', '}'];

/// The placeholder of the client address the layer read, in a layer's template (a
/// rule keyed by it) and the registry's reading of an attribute's
/// (`RuleSpec::shape`): a name no parameter or field can have.
pub(crate) const CLIENT_IP: &str = "client ip";

/// Whether a client address, as a key writes it, can be `text`: an IP address, an IPv6
/// one with each `:` escaped `%3A` and, for a network, `/` and its prefix length after
/// it. (The attribute's check at compile time reads `{request.client_ip}` so too.)
fn client_ip_can_be(text: &str) -> bool {
    let text = text.replace("%3A", ":");
    let address = text.split_once('/').map_or(&*text, |(address, _)| address);
    address.parse::<std::net::IpAddr>().is_ok()
}

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

    /// This shape followed by `other` (the last segment and `other`'s first joined).
    fn then(mut self, other: &Shape) -> Shape {
        let mut segments = other.segments.iter();
        if let (Some(Segment::Text(last)), Some(Segment::Text(first))) =
            (self.segments.last_mut(), segments.next())
        {
            last.push_str(first);
        }
        self.segments.extend(segments.cloned());
        self.separators.extend(other.separators.iter().copied());
        self
    }

    /// The keys a limiter of this name keeps beside its config (Redisson's layout): its
    /// value and log, a token bucket's state, each per client too, and a settle's mark,
    /// each `NAME:<role>` when the name has a hash tag, else `{NAME}:<role>`. A name
    /// another rule produces must be none of these either.
    fn stored_keys(&self) -> Vec<Shape> {
        let wrapped = !self.separators.contains(&'{');
        let base = if wrapped {
            Shape::of_template("", "{{")
                .then(self)
                .then(&Shape::of_template("", "}}"))
        } else {
            self.clone()
        };
        [
            ":value",
            ":permits",
            ":bucket",
            ":value:{client}",
            ":permits:{client}",
            ":bucket:{client}",
            ":settled:{grant}",
        ]
        .iter()
        .map(|suffix| base.clone().then(&Shape::of_template("", suffix)))
        .collect()
    }

    /// Whether some limiter name is produced by both.
    /// A value named [`CLIENT_IP`] (a layer's rule keyed by the client address, an
    /// attribute's `{request.client_ip}`) names only a literal segment that is an
    /// address (`login:all` beside `login:{client ip}` never coincide).
    pub(crate) fn overlaps(&self, other: &Shape) -> bool {
        self.separators == other.separators
            && self.segments.iter().zip(&other.segments).all(|pair| match pair {
                (Segment::Text(a), Segment::Text(b)) => a == b,
                (Segment::Text(text), Segment::Value(name)) | (Segment::Value(name), Segment::Text(text))
                    if name == CLIENT_IP =>
                {
                    client_ip_can_be(text)
                }
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

/// How a rule counts the limiters it names: its algorithm (a token bucket's burst and
/// warm-up), rate, interval and mode. Rules of one site whose names may coincide must
/// count alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counting {
    pub rate: u64,
    pub interval: Duration,
    pub mode: RateType,
    pub bucket: Option<crate::BucketShape>,
}

/// A rule's shape and the keys it keeps, the engine (a function's or a layer's) it belongs to,
/// how it counts, and the rule it overlaps, if any.
#[derive(Debug)]
struct Placed {
    engine: usize,
    /// What holds the limiters of the client the engine first decided on
    /// (`Backend::store`): rules of one shape counting differently conflict on one
    /// store (two in-process clients keep their own limiters; every Redis client is
    /// taken as one store; another process keeps its own registry).
    store: String,
    rule: String,
    shape: Shape,
    counting: Counting,
    keys: Vec<Shape>,
    conflict: Option<(String, String)>,
}

impl Placed {
    /// Whether a value passed to one of the two could reach the other's keys: one's
    /// name is one of the other's stored keys, or (rules of different sites) their
    /// names coincide without being one shape counted alike (a limiter keeps the config
    /// of the call that last wrote it: a caller calling each in turn would have the
    /// looser decide the stricter's calls).
    fn overlaps(&self, other: &Placed) -> bool {
        let names = self.engine != other.engine
            && self.shape.overlaps(&other.shape)
            && (self.shape != other.shape || (self.counting != other.counting && self.store == other.store));
        names
            || other.keys.iter().any(|key| key.overlaps(&self.shape))
            || self.keys.iter().any(|key| key.overlaps(&other.shape))
    }
}

static SHAPES: RwLock<Vec<Placed>> = RwLock::new(Vec::new());
/// How many rules overlap another: while 0, a decision looks no further.
static CONFLICTS: AtomicUsize = AtomicUsize::new(0);

/// Places the rules of `engine` (an address, stable while the engine lives), each with its
/// shape, and marks every pair of rules that overlap.
pub(crate) fn place(engine: usize, store: &str, rules: &[(String, Shape, Counting)]) {
    let mut placed = SHAPES.write().unwrap_or_else(|e| e.into_inner());
    for (rule, shape, counting) in rules {
        if !placed
            .iter()
            .any(|p| p.engine == engine && &p.rule == rule && &p.shape == shape && &p.counting == counting)
        {
            let keys = shape.stored_keys();
            placed.push(Placed {
                engine,
                store: store.to_owned(),
                rule: rule.clone(),
                shape: shape.clone(),
                counting: *counting,
                keys,
                conflict: None,
            });
        }
    }
    mark_conflicts(&mut placed);
}

/// Forgets the rules of a engine that is gone (a dropped layer).
pub(crate) fn forget(engine: usize) {
    let mut placed = SHAPES.write().unwrap_or_else(|e| e.into_inner());
    let before = placed.len();
    placed.retain(|p| p.engine != engine);
    if placed.len() != before {
        mark_conflicts(&mut placed);
    }
}

/// Each rule's conflict: the first other rule it overlaps. Both rules of a pair are
/// refused, so which of them was used first changes nothing.
fn mark_conflicts(placed: &mut [Placed]) {
    let mut count = 0;
    for i in 0..placed.len() {
        let conflict = (0..placed.len())
            .filter(|&j| j != i)
            .find(|&j| placed[i].overlaps(&placed[j]))
            .map(|j| (placed[j].rule.clone(), placed[j].shape.to_string()));
        count += usize::from(conflict.is_some());
        placed[i].conflict = conflict;
    }
    CONFLICTS.store(count, Ordering::Relaxed);
}

/// The first rule of `engine` that overlaps another engine's rule, as the error its calls
/// are refused with.
#[inline]
pub(crate) fn conflict_of(engine: usize) -> Option<Error> {
    if CONFLICTS.load(Ordering::Relaxed) == 0 {
        return None;
    }
    placed_conflict_of(engine)
}

/// [`conflict_of`] when some rule of the process overlaps another: looked up in the
/// registry, out of line.
#[cold]
#[inline(never)]
fn placed_conflict_of(engine: usize) -> Option<Error> {
    let placed = SHAPES.read().unwrap_or_else(|e| e.into_inner());
    let p = placed
        .iter()
        .find(|p| p.engine == engine && p.conflict.is_some())?;
    let (other, other_shape) = p.conflict.clone()?;
    Some(Error::OverlappingRules {
        rule: p.rule.clone(),
        shape: p.shape.to_string(),
        other,
        other_shape,
    })
}

#[cfg(test)]
mod tests;
