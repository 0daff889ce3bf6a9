//! The rule builder: [`LayerRule`], one rule of a layer in the attribute's vocabulary.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use redlimit_runtime::{Algorithm, BucketShape, OnError, RateType};

use super::key::{Key, MissingKey};

/// A request's permits for a rule, computed from the request.
pub(super) type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;

/// One rule of a [`RateLimitLayer`](super::RateLimitLayer), in the attribute's
/// vocabulary: `rate` permits per `interval` on the limiter `<name>:<key value>`.
#[derive(Clone)]
pub struct LayerRule {
    pub(super) name: Cow<'static, str>,
    pub(super) key: Key,
    pub(super) rate: u64,
    pub(super) interval: Duration,
    pub(super) mode: RateType,
    pub(super) permits: u64,
    pub(super) cost: Option<Arc<CostFn>>,
    pub(super) on_error: OnError,
    pub(super) message: Option<Cow<'static, str>>,
    pub(super) missing_key: MissingKey,
    pub(super) shadow: bool,
    pub(super) local_refusals: bool,
    pub(super) exempt: HashSet<String>,
    pub(super) algorithm: Algorithm,
    pub(super) burst: Option<u64>,
    pub(super) warmup: Option<Duration>,
}

impl LayerRule {
    /// `rate` permits per `interval`, one limiter for every request (see
    /// [`key`](LayerRule::key)), shared by every process (overall mode), 1 permit per
    /// request, the in-process limiter while the backend fails (`on_error` local).
    /// `name` names the rule in keys, logs and the `RateLimit` fields: a `&'static
    /// str` or a `String` read from configuration.
    pub fn new(name: impl Into<Cow<'static, str>>, rate: u64, interval: Duration) -> LayerRule {
        LayerRule {
            name: name.into(),
            key: Key::global(),
            rate,
            interval,
            mode: RateType::Overall,
            permits: 1,
            cost: None,
            on_error: OnError::Local,
            message: None,
            missing_key: MissingKey::Share,
            shadow: false,
            local_refusals: true,
            exempt: HashSet::new(),
            algorithm: Algorithm::SlidingWindow,
            burst: None,
            warmup: None,
        }
    }

    /// The sliding window (default) or a token bucket (see [`burst`](LayerRule::burst)).
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// A token bucket's capacity (default: the rate).
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// A token bucket's warm-up: after the bucket has been idle, it grants about a
    /// third of its burst and refills at a third of the rate, rising to the full rate
    /// over about `warmup` as requests take tokens.
    pub fn warmup(mut self, warmup: Duration) -> Self {
        self.warmup = Some(warmup);
        self
    }

    /// Where the key's value comes from.
    pub fn key(mut self, key: Key) -> Self {
        self.key = key;
        self
    }

    /// Shared by every process ([`RateType::Overall`], the default) or per process.
    pub fn mode(mut self, mode: RateType) -> Self {
        self.mode = mode;
        self
    }

    /// Permits each request takes (default 1; at most the rate).
    pub fn permits(mut self, permits: u64) -> Self {
        self.permits = permits;
        self
    }

    /// Permits per request computed from the request (a cost): an expensive query
    /// takes more. A cost of 0 counts as 1 (no request is free; exempt keys are
    /// [`exempt`](LayerRule::exempt)); a cost above the rate is refused with 429 and
    /// no `Retry-After`, since no wait would let it pass.
    pub fn cost<F>(mut self, cost: F) -> Self
    where
        F: Fn(&Parts) -> u64 + Send + Sync + 'static,
    {
        self.cost = Some(Arc::new(cost));
        self
    }

    /// What the rule does when the backend fails (default [`OnError::Local`]).
    pub fn on_error(mut self, on_error: OnError) -> Self {
        self.on_error = on_error;
        self
    }

    /// The refusal's message (the 429's body).
    pub fn message(mut self, message: impl Into<Cow<'static, str>>) -> Self {
        self.message = Some(message.into());
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
        &self.name
    }

    /// Decide and report (a warning, at most once per 10 s), but never refuse: to roll
    /// out a new limit safely.
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// Whether a refusal Redis gave this rule may be answered again by the client,
    /// without a round trip, until its wait ends (default: yes, where the answer is
    /// exact; see `ClientBuilder::local_refusals`).
    pub fn local_refusals(mut self, on: bool) -> Self {
        self.local_refusals = on;
        self
    }

    /// Key values this rule does not apply to (an internal address, a partner's API
    /// key), compared with the value as read (a client address as its `Display`).
    pub fn exempt<I, S>(mut self, values: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.exempt.extend(values.into_iter().map(Into::into));
        self
    }
}

impl fmt::Debug for LayerRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerRule")
            .field("name", &self.name)
            .field("key", &self.key)
            .field("rate", &self.rate)
            .field("interval", &self.interval)
            .field("mode", &self.mode)
            .field("permits", &self.permits)
            .field("cost", &self.cost.as_ref().map(|_| ".."))
            .field("on_error", &self.on_error)
            .field("message", &self.message)
            .field("missing_key", &self.missing_key)
            .field("shadow", &self.shadow)
            .field("local_refusals", &self.local_refusals)
            .field("exempt", &self.exempt)
            .field("algorithm", &self.algorithm)
            .field("burst", &self.burst)
            .field("warmup", &self.warmup)
            .finish()
    }
}

impl LayerRule {
    /// A token-bucket rule's shape: its burst (default: the rate) and warm-up.
    pub(super) fn shape(&self) -> BucketShape {
        BucketShape::new(self.burst.unwrap_or(self.rate), self.warmup)
    }
}
