//! The rule builder: [`LayerRule`], one rule of a layer in the attribute's vocabulary.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use redlimit_runtime::RuleSpec;
use redlimit_runtime::{Algorithm, BucketShape, OnError, RateType};

use super::key::{Key, MissingKey};
use super::settle::Settle;

/// A request's permits for a rule, computed from the request.
pub(super) type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;

/// One rule of a [`RateLimitLayer`](super::RateLimitLayer), in the attribute's
/// vocabulary: `rate` permits per `interval` on the limiter `<name>:<key value>`.
#[derive(Clone)]
pub struct LayerRule {
    /// The rule as the runtime decides it, the attribute's rules' description: name,
    /// rate, interval, mode, permits, `on_error`, message, shadow, local refusals, and
    /// a token bucket's shape (`None`: the sliding window).
    pub(super) spec: RuleSpec,
    /// A token bucket's burst and warm-up as set, whatever the algorithm: the spec's
    /// shape is made of them, and a sliding window refuses them when the layer is built.
    pub(super) burst: Option<u64>,
    pub(super) warmup: Option<Duration>,
    /// What the layer adds to the description: where the key comes from, the cost of
    /// a request, what a request without a key value gets, the values not limited.
    pub(super) key: Key,
    pub(super) cost: Option<Arc<CostFn>>,
    pub(super) missing_key: MissingKey,
    pub(super) exempt: HashSet<String>,
    /// Where a settled rule's actual amount comes from (`None`: not settled).
    pub(super) settle: Option<Settle>,
}

impl LayerRule {
    /// `rate` permits per `interval`, one limiter for every request (see
    /// [`key`](LayerRule::key)), shared by every process (overall mode), 1 permit per
    /// request, the in-process limiter while the backend fails (`on_error` local).
    /// `name` names the rule in keys, logs and the `RateLimit` fields: a `&'static
    /// str` or a `String` read from configuration.
    pub fn new(name: impl Into<Cow<'static, str>>, rate: u64, interval: Duration) -> LayerRule {
        LayerRule {
            spec: RuleSpec {
                name: name.into(),
                shadow: false,
                local_refusals: true,
                batch: 1,
                batch_lease: None,
                rate,
                interval,
                mode: RateType::Overall,
                permits: 1,
                on_error: OnError::Local,
                message: None,
                bucket: None,
                settled: false,
                max_overdraft: None,
                shape: None,
            },
            burst: None,
            warmup: None,
            key: Key::global(),
            cost: None,
            missing_key: MissingKey::Share,
            exempt: HashSet::new(),
            settle: None,
        }
    }

    /// The sliding window (default) or a token bucket (see [`burst`](LayerRule::burst)).
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.spec.bucket = match algorithm {
            Algorithm::SlidingWindow => None,
            Algorithm::TokenBucket => Some(self.shape()),
        };
        self
    }

    /// A token bucket's capacity (default: the rate).
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self.reshape()
    }

    /// A token bucket's warm-up: after the bucket has been idle, it grants about a
    /// third of its burst and refills at a third of the rate, rising to the full rate
    /// over about `warmup` as requests take tokens.
    pub fn warmup(mut self, warmup: Duration) -> Self {
        self.warmup = Some(warmup);
        self.reshape()
    }

    /// Where the key's value comes from.
    pub fn key(mut self, key: Key) -> Self {
        self.key = key;
        self
    }

    /// Shared by every process ([`RateType::Overall`], the default) or per process.
    pub fn mode(mut self, mode: RateType) -> Self {
        self.spec.mode = mode;
        self
    }

    /// Permits each request takes (default 1; at most the rate).
    pub fn permits(mut self, permits: u64) -> Self {
        self.spec.permits = permits;
        self
    }

    /// Permits per request computed from the request (a cost): an expensive query
    /// takes more. A cost of 0 counts as 1 (no request is free; exempt keys are
    /// [`exempt`](LayerRule::exempt)); a cost above the rate is refused with 429 and
    /// no `Retry-After`, since no wait would let it pass. In actix-web `cost` reads
    /// the head as [`Key::with`](super::Key::with) does.
    pub fn cost<F>(mut self, cost: F) -> Self
    where
        F: Fn(&Parts) -> u64 + Send + Sync + 'static,
    {
        self.cost = Some(Arc::new(cost));
        self
    }

    /// Settles the rule with what the request actually used, once the response says
    /// it: the request's permits ([`permits`](LayerRule::permits) or
    /// [`cost`](LayerRule::cost)) are an estimate reserved before the inner service
    /// runs, and `settle` says where the actual amount comes from (a response header,
    /// or the [`Usage`](super::Usage) the handler records while its body streams).
    /// What was not used goes back; what was used beyond the estimate is charged even
    /// past the limit, a debt later requests wait out (see
    /// [`max_overdraft`](LayerRule::max_overdraft)).
    pub fn settle(mut self, settle: Settle) -> Self {
        self.settle = Some(settle);
        self.spec.settled = true;
        self
    }

    /// The most a settled request may be charged beyond its estimate (default: no
    /// cap): what it used past that is not counted. Every window then holds at most
    /// the rate plus this much for each request in it that overdrew.
    pub fn max_overdraft(mut self, most: u64) -> Self {
        self.spec.max_overdraft = Some(most);
        self
    }

    /// What the rule does when the backend fails (default [`OnError::Local`]).
    pub fn on_error(mut self, on_error: OnError) -> Self {
        self.spec.on_error = on_error;
        self
    }

    /// The refusal's message (the 429's body).
    pub fn message(mut self, message: impl Into<Cow<'static, str>>) -> Self {
        self.spec.message = Some(message.into());
        self
    }

    /// What to do with a request that has no value for the key (default
    /// [`MissingKey::Share`]: one limiter for all of them). For keys a request can
    /// lack: a header, a path parameter, [`Key::with`].
    pub fn missing_key(mut self, missing_key: MissingKey) -> Self {
        self.missing_key = missing_key;
        self
    }

    /// The rule's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// Decide and report (a warning, at most once per 10 s), but never refuse: to roll
    /// out a new limit safely.
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.spec.shadow = shadow;
        self
    }

    /// Whether a refusal Redis gave this rule may be answered again by the client,
    /// without a round trip, until its wait ends (default: yes, where the answer is
    /// exact; see `ClientBuilder::local_refusals`).
    pub fn local_refusals(mut self, on: bool) -> Self {
        self.spec.local_refusals = on;
        self
    }

    /// Takes up to `k` permits from Redis in one grant and serves them in this process
    /// for at most a short lease, giving back what it did not use (default 1: no
    /// batching; at most the rate; a sliding window only). Every window of `interval -
    /// lease` then holds at most `rate` requests, and every window of `interval` at most
    /// `rate + N * k` for `N` clients batching it (see `Rule::batch`).
    pub fn batch(mut self, k: u64) -> Self {
        self.spec.batch = k;
        self
    }

    /// How long a batch is served: more than zero and less than the interval
    /// (default: a tenth of the interval, at most 1 s).
    pub fn batch_lease(mut self, lease: Duration) -> Self {
        self.spec.batch_lease = Some(lease);
        self
    }

    /// Key values this rule does not apply to (an internal address, a partner's API
    /// key), compared with the value as read (a client address as its `Display`; an
    /// `Authorization` or `Proxy-Authorization` value as [`Key::header`](super::Key::header)
    /// reads it). A secret key's exempt values are shown by `Debug` as their number only.
    pub fn exempt<I, S>(mut self, values: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.exempt.extend(values.into_iter().map(Into::into));
        self
    }
}

impl LayerRule {
    /// A token bucket's shape from the burst (default: the rate) and warm-up as set.
    fn shape(&self) -> BucketShape {
        BucketShape::new(self.burst.unwrap_or(self.spec.rate), self.warmup)
    }

    /// The spec's shape again after its burst or warm-up changed, if a token bucket.
    fn reshape(mut self) -> Self {
        if self.spec.bucket.is_some() {
            self.spec.bucket = Some(self.shape());
        }
        self
    }

    /// The algorithm the spec counts with.
    fn algorithm_of(&self) -> Algorithm {
        match self.spec.bucket {
            Some(_) => Algorithm::TokenBucket,
            None => Algorithm::SlidingWindow,
        }
    }
}

impl fmt::Debug for LayerRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let spec = &self.spec;
        f.debug_struct("LayerRule")
            .field("name", &spec.name)
            .field("key", &self.key)
            .field("rate", &spec.rate)
            .field("interval", &spec.interval)
            .field("mode", &spec.mode)
            .field("permits", &spec.permits)
            .field("cost", &self.cost.as_ref().map(|_| ".."))
            .field("on_error", &spec.on_error)
            .field("message", &spec.message)
            .field("missing_key", &self.missing_key)
            .field("shadow", &spec.shadow)
            .field("local_refusals", &spec.local_refusals)
            .field("batch", &spec.batch)
            .field("batch_lease", &spec.batch_lease)
            .field("exempt", &Exempt(&self.exempt, self.key.1 .0))
            .field("algorithm", &self.algorithm_of())
            .field("burst", &self.burst)
            .field("warmup", &self.warmup)
            .field("settle", &self.settle)
            .field("max_overdraft", &spec.max_overdraft)
            .finish()
    }
}

/// A rule's exempt values as `Debug` shows them: a secret key's as their number only
/// (each is a credential).
struct Exempt<'a>(&'a HashSet<String>, bool);

impl fmt::Debug for Exempt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.1 {
            true => write!(f, "{} secret values", self.0.len()),
            false => self.0.fmt(f),
        }
    }
}
