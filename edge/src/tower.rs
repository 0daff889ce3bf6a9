//! A tower layer that rate-limits every request through it: one or more rules,
//! decided all-or-nothing in one round trip, keyed by what the request carries.
//!
//! ```
//! use std::time::Duration;
//! # use redlimit_edge as redlimit;
//! use redlimit::tower::{Key, LayerRule, RateLimitLayer};
//!
//! let layer = RateLimitLayer::builder()
//!     // 5 logins per minute per client address (behind trusted proxies, see below)
//!     .rule(LayerRule::new("login", 5, Duration::from_secs(60)).key(Key::client_ip()))
//!     // and 1 000 requests per second in all
//!     .rule(LayerRule::new("all", 1_000, Duration::from_secs(1)))
//!     .build()
//!     .unwrap();
//! # let _ = layer;
//! ```
//!
//! The limiter of a rule is `<client prefix><name>:<value>` (`rate_limit:login:
//! 198.51.100.7`), the value escaped as in the attribute's keys so that no caller can
//! reach another key; a rule keyed [`Key::global`] is `<prefix><name>`. A request a rule
//! finds no value for (no such header) shares one limiter with every other such
//! request of that rule: leaving a header out never escapes the limit.
//! A rule may refuse such requests instead, with 400 or 401 naming the header
//! ([`LayerRule::missing_key`]).
//!
//! The layer and its clones share their state: a limit on a router holds across all
//! its routes and every clone the server makes.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::request::Parts;
use http::{HeaderName, HeaderValue, Request, Response};
use redlimit_runtime::private::{check_bucket, Granted, KeyBuf, RuleSpec, Site};
use redlimit_runtime::{
    Algorithm, BucketShape, Client, Error, OnError, RateLimited, RateLimiterConfig, RateType, RATELIMIT,
    RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING,
};
use smallvec::SmallVec;
use tower_layer::Layer;
use tower_service::Service;

use crate::client_ip::{one_setting, ReadBy};
use crate::{ClientIp, TrustedProxies};

#[cfg(feature = "serde")]
pub use crate::config::LayerConfig;

/// A request's permits for a rule, computed from the request.
type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;
/// A request's key value for a rule, computed from the request.
type KeyFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// Where a rule's key comes from.
#[derive(Clone)]
pub struct Key(KeyKind);

#[derive(Clone)]
enum KeyKind {
    Global,
    ClientIp,
    Header(String),
    #[cfg(feature = "axum")]
    PathParam(String),
    /// The closure, and its type: what tells two closures' limiters apart.
    With(Arc<KeyFn>, std::any::TypeId),
}

impl Key {
    /// One limiter for every request.
    pub fn global() -> Key {
        Key(KeyKind::Global)
    }

    /// The client's address (without port; IPv6 grouped by prefix), from the peer and
    /// the forwarding header written by [`TrustedProxies`] (set with
    /// [`RateLimitLayerBuilder::trusted_proxies`], or as a request extension such as
    /// axum's `Extension` outside the layer; none trusted without either). The peer
    /// comes from axum's `ConnectInfo<SocketAddr>`, tonic's `TcpConnectInfo`, or a
    /// `SocketAddr` extension; a request with none of them is refused as misconfigured
    /// (500). The handler's [`ClientIp`] is the address the layer keyed by.
    pub fn client_ip() -> Key {
        Key(KeyKind::ClientIp)
    }

    /// A request header's value, such as `x-api-key`. Requests without it share one
    /// limiter (per rule); a value that is not UTF-8 is read lossily. Long values are
    /// digested, as in the attribute's keys.
    pub fn header(name: &str) -> Key {
        Key(KeyKind::Header(name.to_owned()))
    }

    /// A matched path parameter, such as `user_id` in `/users/{user_id}` (axum). Path
    /// parameters exist once a route matched: add the layer with `Router::route_layer`,
    /// `Router::layer` or on the route itself. Under `Router::layer`, a request no route
    /// matches goes on to the router's fallback (404) without this rule, the other
    /// rules still deciding. A matched route without the parameter (a misspelt name),
    /// and a layer outside the router, are refused as misconfigured (500), never let
    /// through unlimited; a parameter that is not UTF-8 shares one limiter with all such.
    #[cfg(feature = "axum")]
    pub fn path_param(name: &str) -> Key {
        Key(KeyKind::PathParam(name.to_owned()))
    }

    /// A value computed from the request's head; `None` when it has none (those
    /// requests share one limiter, per rule).
    pub fn with<F>(key: F) -> Key
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        Key(KeyKind::With(Arc::new(key), std::any::TypeId::of::<F>()))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            KeyKind::Global => f.write_str("Key::global()"),
            KeyKind::ClientIp => f.write_str("Key::client_ip()"),
            KeyKind::Header(name) => write!(f, "Key::header({name:?})"),
            #[cfg(feature = "axum")]
            KeyKind::PathParam(name) => write!(f, "Key::path_param({name:?})"),
            KeyKind::With(..) => f.write_str("Key::with(..)"),
        }
    }
}

/// What a rule does with a request that has no value for its key: no such header, an
/// empty or all-whitespace one, `None` from [`Key::with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum MissingKey {
    /// All such requests share one limiter of the rule (the default): leaving the
    /// value out never escapes the limit.
    #[default]
    Share,
    /// Refused with 400 Bad Request, the body naming what is missing (`This request
    /// needs the x-api-key header`); nothing is spent.
    BadRequest,
    /// Refused the same way with 401 Unauthorized (for a key that is a credential).
    /// The response has no `WWW-Authenticate`: the scheme is the application's.
    Unauthorized,
}

/// One rule of a [`RateLimitLayer`], in the attribute's vocabulary: `rate` permits per
/// `interval` on the limiter `<name>:<key value>`.
#[derive(Clone)]
pub struct LayerRule {
    name: Cow<'static, str>,
    key: Key,
    rate: u64,
    interval: Duration,
    mode: RateType,
    permits: u64,
    cost: Option<Arc<CostFn>>,
    on_error: OnError,
    message: Option<Cow<'static, str>>,
    missing_key: MissingKey,
    shadow: bool,
    local_refusals: bool,
    exempt: HashSet<String>,
    algorithm: Algorithm,
    burst: Option<u64>,
    warmup: Option<Duration>,
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

/// A layer that cannot be built: what is wrong and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidLayer(String);

impl fmt::Display for InvalidLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidLayer {}

/// Builds a [`RateLimitLayer`].
#[derive(Debug, Default)]
pub struct RateLimitLayerBuilder {
    rules: Vec<LayerRule>,
    client: Option<Client>,
    trusted: Option<TrustedProxies>,
    timeout: Option<Duration>,
    no_success_fields: bool,
    x_ratelimit: bool,
}

impl RateLimitLayerBuilder {
    /// Adds a rule; every rule is decided on each request, all or nothing.
    pub fn rule(mut self, rule: LayerRule) -> Self {
        self.rules.push(rule);
        self
    }

    /// The client deciding the rules (default: redlimit's default client, from
    /// `REDIS_URL` or in process, resolved on the first request).
    pub fn client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
    }

    /// The proxies whose forwarding header [`Key::client_ip`] believes (else a
    /// `TrustedProxies` request extension; else none). The layer leaves the setting it
    /// read on each request: the handler's [`ClientIp`] is the client it keyed by. Two
    /// different settings on one request are refused as misconfigured (500): by the
    /// layer when it sees both (an extension outside it, another layer's), by
    /// `ClientIp` when the extension is inside the layer.
    pub fn trusted_proxies(mut self, trusted: TrustedProxies) -> Self {
        self.trusted = Some(trusted);
        self
    }

    /// Wait up to `timeout` for permits before refusing (default: refuse at once).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Whether granted responses carry `RateLimit-Policy` and `RateLimit` for the rule
    /// with the fewest permits left (default true).
    pub fn success_fields(mut self, on: bool) -> Self {
        self.no_success_fields = !on;
        self
    }

    /// Also adds `X-RateLimit-Limit` and `X-RateLimit-Remaining` to granted responses
    /// (with the success fields' rule), and `X-RateLimit-Limit`, `X-RateLimit-Remaining:
    /// 0` and `X-RateLimit-Reset` (seconds, as `Retry-After`) to 429s, beside the IETF
    /// fields, for clients that read those (default false).
    pub fn x_ratelimit_headers(mut self, on: bool) -> Self {
        self.x_ratelimit = on;
        self
    }

    /// Adds every rule of `rules`, in order (rules read from configuration).
    pub fn rules(mut self, rules: impl IntoIterator<Item = LayerRule>) -> Self {
        self.rules.extend(rules);
        self
    }

    /// Checks the rules: at least one; distinct names, not empty; rate, interval and
    /// permits as a limiter accepts them; header names valid; no empty exempt value.
    pub fn build(self) -> Result<RateLimitLayer, InvalidLayer> {
        if self.rules.is_empty() {
            return Err(InvalidLayer(
                "a RateLimitLayer needs at least one rule: add one with .rule(LayerRule::new(name, rate, interval))".into(),
            ));
        }
        let mut names = HashSet::new();
        let mut specs = Vec::with_capacity(self.rules.len());
        let mut rules = Vec::with_capacity(self.rules.len());
        let mut templates = Vec::with_capacity(self.rules.len());
        for rule in self.rules {
            check_rule(&rule)?;
            templates.push(template(&rule));
            if !names.insert(rule.name.clone()) {
                return Err(InvalidLayer(format!(
                    "two rules are named `{}`: their limiters would be the same keys; give each rule its own name",
                    rule.name
                )));
            }
            specs.push(RuleSpec {
                name: rule.name.clone(),
                shadow: rule.shadow,
                local_refusals: rule.local_refusals,
                rate: rule.rate,
                interval: rule.interval,
                mode: rule.mode,
                permits: rule.permits,
                on_error: rule.on_error,
                message: rule.message.clone(),
                bucket: match rule.algorithm {
                    Algorithm::TokenBucket => Some(shape(&rule)),
                    Algorithm::SlidingWindow => None,
                },
            });
            let key = match rule.key.0 {
                KeyKind::Global => Extract::Global,
                KeyKind::ClientIp => Extract::ClientIp,
                KeyKind::Header(name) => Extract::Header(header_name(&rule.name, &name)?),
                #[cfg(feature = "axum")]
                KeyKind::PathParam(name) => Extract::PathParam(name),
                KeyKind::With(f, _) => Extract::With(f),
            };
            let limit = specs[specs.len() - 1].limit();
            let policy = HeaderValue::from_str(&limit.policy_field()).ok();
            let missing = match (rule.missing_key, &key) {
                (MissingKey::Share, _) => None,
                (refuse, Extract::Header(header)) => Some((format!("the {header} header"), refuse)),
                #[cfg(feature = "axum")]
                (refuse, Extract::PathParam(param)) => Some((format!("the path parameter {param}"), refuse)),
                (refuse, Extract::With(_)) => Some(("a value for its key".to_owned(), refuse)),
                (_, Extract::Global | Extract::ClientIp) => unreachable!("refused by check_rule"),
            };
            // `"name";r=0` less its digits: what every `RateLimit` field starts with.
            let mut state = limit.state_field(0, None);
            state.pop();
            rules.push(Keyed {
                name: rule.name,
                policy,
                missing,
                state,
                key,
                cost: rule.cost,
                exempt: rule.exempt,
            });
        }
        let keys_client_ip = rules.iter().position(|r| matches!(r.key, Extract::ClientIp));
        #[cfg(feature = "axum")]
        let needs_path = rules.iter().any(|r| matches!(r.key, Extract::PathParam(_)));
        #[cfg(not(feature = "axum"))]
        let needs_path = false;
        // A path parameter's rule does not apply where no route matched.
        let per_request = needs_path || rules.iter().any(|r| r.cost.is_some() || !r.exempt.is_empty());
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                site: Site::with_rules(specs, self.timeout, "RateLimitLayer").with_templates(templates),
                rules,
                per_request,
                needs_path,
                client: self.client,
                reads_trust: keys_client_ip.is_some() || self.trusted.is_some(),
                keys_client_ip: keys_client_ip.is_some(),
                trust_rule: keys_client_ip.unwrap_or(0),
                trusted: self.trusted,
                untrusted: TrustedProxies::default(),
                success_fields: !self.no_success_fields,
                x_ratelimit: self.x_ratelimit,
            }),
            respond: PlainText,
        })
    }
}

/// A token-bucket rule's shape: its burst (default: the rate) and warm-up.
fn shape(rule: &LayerRule) -> BucketShape {
    BucketShape::new(rule.burst.unwrap_or(rule.rate), rule.warmup)
}

/// A rule's limiters in the attribute's template syntax, for the registry that keeps
/// rules of different shapes from sharing names: the name as literal text, then the
/// key's value, named after its source (`login:{ip}` for [`Key::client_ip`], as an
/// attribute keyed by a `ClientIp` parameter named `ip` writes it).
fn template(rule: &LayerRule) -> String {
    let name = rule.name.replace('{', "{{").replace('}', "}}");
    let value = match &rule.key.0 {
        KeyKind::Global => return name,
        KeyKind::ClientIp => "ip".to_owned(),
        KeyKind::Header(header) => header.to_ascii_lowercase(),
        #[cfg(feature = "axum")]
        KeyKind::PathParam(param) => param.clone(),
        // each closure is a type of its own: two closures are two shapes (a value one
        // computes never reaches the limiters of another's), one closure built twice one
        KeyKind::With(_, closure) => {
            use std::hash::{Hash, Hasher};
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            closure.hash(&mut hasher);
            format!("with {:016x}", hasher.finish())
        }
    };
    format!("{name}:{{{value}}}")
}

/// What `build` checks of one rule, its header name included.
#[cfg_attr(not(feature = "serde"), allow(dead_code))]
pub(crate) fn check_rule_fully(rule: &LayerRule) -> Result<(), InvalidLayer> {
    check_rule(rule)?;
    if let KeyKind::Header(name) = &rule.key.0 {
        header_name(&rule.name, name)?;
    }
    Ok(())
}

fn header_name(rule: &str, name: &str) -> Result<HeaderName, InvalidLayer> {
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
        InvalidLayer(format!(
            "rule `{rule}`: `{name}` is not a header name; write e.g. \"x-api-key\""
        ))
    })
}

fn check_rule(rule: &LayerRule) -> Result<(), InvalidLayer> {
    let name = &*rule.name;
    let invalid = |problem: String| Err(InvalidLayer(format!("rule `{name}`: {problem}")));
    if name.is_empty() {
        return Err(InvalidLayer(
            "a rule's name is empty: it names the rule's limiters, logs and RateLimit fields".into(),
        ));
    }
    let reserved = redlimit_runtime::LIBRARY_SEGMENT;
    if name
        .strip_prefix(reserved)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([':', '{', '}']))
    {
        return invalid(format!(
            "a rule's name may not start with `{reserved}`: the library keeps its own keys (run-time overrides, \
             refusal reports) under that segment; choose another name"
        ));
    }
    if let Err(error) = RateLimiterConfig::new(rule.mode, rule.rate, rule.interval).validate(name) {
        return invalid(error.to_string());
    }
    let most = match (rule.algorithm, rule.burst, rule.warmup) {
        (Algorithm::SlidingWindow, Some(_), _) => {
            return invalid(
                "`burst` is a token bucket's capacity: add .algorithm(Algorithm::TokenBucket)".into(),
            )
        }
        (Algorithm::SlidingWindow, _, Some(_)) => {
            return invalid("`warmup` is a token bucket's: add .algorithm(Algorithm::TokenBucket)".into())
        }
        (Algorithm::SlidingWindow, None, None) => rule.rate,
        (Algorithm::TokenBucket, ..) => {
            let config = RateLimiterConfig::new(rule.mode, rule.rate, rule.interval);
            if let Err(error) = check_bucket(name, shape(rule), &config) {
                return invalid(error.to_string());
            }
            shape(rule).burst
        }
    };
    if rule.permits == 0 || rule.permits > most {
        return invalid(format!(
            "permits = {} is not accepted: each request takes from 1 to {most} permits (the rate, or a \
             token bucket's burst)",
            rule.permits
        ));
    }
    if rule.missing_key != MissingKey::Share && matches!(rule.key.0, KeyKind::Global | KeyKind::ClientIp) {
        return invalid(format!(
            "missing_key = {:?} is for keys a request can lack (Key::header, Key::path_param, Key::with); \
             this rule is keyed by {:?}, which every request has",
            rule.missing_key, rule.key
        ));
    }
    if rule.exempt.contains("") {
        return invalid(
            "an empty exempt value would exempt every request that has no value for the key; \
             list the values themselves"
                .into(),
        );
    }
    Ok(())
}

/// A rule's key and per-request settings, next to its [`RuleSpec`] in the site.
struct Keyed {
    name: Cow<'static, str>,
    /// The rule's `RateLimit-Policy` field, on every response decided at the rule's
    /// own rate and interval.
    policy: Option<HeaderValue>,
    /// What a request without a value lacks, and how it is refused; `None`: shared.
    missing: Option<(String, MissingKey)>,
    /// The start of its `RateLimit` field, up to the remaining permits.
    state: String,
    key: Extract,
    cost: Option<Arc<CostFn>>,
    exempt: HashSet<String>,
}

enum Extract {
    Global,
    ClientIp,
    Header(HeaderName),
    #[cfg(feature = "axum")]
    PathParam(String),
    With(Arc<KeyFn>),
}

/// What every clone of a layer and its services shares.
struct Shared {
    site: Site,
    rules: Vec<Keyed>,
    /// Some rule has a cost or exempt values: permits are computed per request.
    per_request: bool,
    /// Some rule is keyed by a path parameter.
    needs_path: bool,
    client: Option<Client>,
    /// Some rule is keyed by the client address, or the layer has its own trusted
    /// proxies: it reads the one setting of each request, and leaves it there.
    reads_trust: bool,
    /// Some rule is keyed by the client address.
    keys_client_ip: bool,
    /// The rule a request meeting two settings is refused for (the first keyed by the
    /// client address).
    trust_rule: usize,
    trusted: Option<TrustedProxies>,
    /// The setting when none is given: no proxy trusted.
    untrusted: TrustedProxies,
    success_fields: bool,
    x_ratelimit: bool,
}

/// A path parameter's layer outside the router, where no route has matched yet.
const OUTSIDE_ROUTER: &str = "no route has matched where the layer is: path parameters exist inside the \
                              Router; add the layer with Router::route_layer or Router::layer (directly, \
                              not inside another layer), or on a route";

/// The missing peer address, said to whoever runs the server.
const NO_PEER: &str = "the client address needs the peer's: serve axum with \
                       into_make_service_with_connect_info::<SocketAddr>(), or insert a SocketAddr extension";

/// A rule's value for a request: `Ok(None)` for a global rule, `Ok(Some(""))` when the
/// request carries none, `Err` when the layer cannot read it where it is mounted.
type Value<'a> = Result<Option<Cow<'a, str>>, NoValue>;

/// Why a rule has no value for a request.
#[derive(Debug, Clone, Copy)]
enum NoValue {
    /// The layer cannot read it where it is mounted: what to change.
    Misconfigured(&'static str),
    /// A path parameter of a request no route matched.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    NotRouted,
}

/// The client address when a rule is keyed by it: `Err` when the peer's is missing.
type ReadClient = Option<Result<ClientIp, &'static str>>;

/// A request's limiters, and its permits per rule when they are per request.
type Keys = (SmallVec<[String; 2]>, Vec<u64>);

impl Shared {
    /// The request's one trusted-proxy setting: this layer's, an extension's or an
    /// outer layer's, which must not differ; `None` when the layer reads none.
    fn trust(&self, parts: &Parts) -> Result<Option<TrustedProxies>, &'static str> {
        if !self.reads_trust {
            return Ok(None);
        }
        let setting = one_setting([
            self.trusted.as_ref(),
            parts.extensions.get::<TrustedProxies>(),
            parts.extensions.get::<ReadBy>().map(|read| &read.trusted),
        ])?;
        Ok(Some(setting.unwrap_or(&self.untrusted).clone()))
    }

    fn value<'a>(
        &self,
        key: &'a Extract,
        parts: &'a Parts,
        path: &'a PathParams,
        client: &ReadClient,
    ) -> Value<'a> {
        // Path parameters are axum's.
        #[cfg(not(feature = "axum"))]
        let _ = path;
        match key {
            Extract::Global => Ok(None),
            Extract::ClientIp => match client {
                Some(Ok(client)) => Ok(Some(Cow::Owned(client.to_string()))),
                Some(Err(problem)) => Err(NoValue::Misconfigured(problem)),
                None => Err(NoValue::Misconfigured(NO_PEER)),
            },
            Extract::Header(name) => Ok(Some(
                parts
                    .headers
                    .get(name)
                    .map(|value| String::from_utf8_lossy(value.as_bytes()))
                    .unwrap_or_default(),
            )),
            #[cfg(feature = "axum")]
            Extract::PathParam(name) => path.get(name),
            Extract::With(f) => Ok(Some(Cow::Owned(f(parts).unwrap_or_default()))),
        }
    }

    /// `routed`: the layer is inside an axum `Router` (it wraps a route or the
    /// fallback), where a request without matched path parameters matched no route.
    async fn decide(&self, parts: &mut Parts, routed: bool) -> Result<Granted, RateLimited> {
        let path = PathParams::read(self.needs_path, parts).await;
        let trusted = self.trust(parts).map_err(|problem| {
            let error = Error::InvalidConfig {
                name: self.rules[self.trust_rule].name.to_string(),
                problem,
            };
            self.site.refuse_misconfigured(self.trust_rule, error)
        })?;
        let client = match &trusted {
            Some(trusted) if self.keys_client_ip => Some(
                peer_addr(parts)
                    .map(|peer| trusted.client_ip(peer.ip(), &parts.headers))
                    .ok_or(NO_PEER),
            ),
            _ => None,
        };
        let (keys, permits) = self.keys(parts, &path, &client, routed)?;
        if let Some(trusted) = trusted {
            let client = client.and_then(Result::ok);
            parts.extensions.insert(ReadBy { trusted, client });
        }
        let permits = self.per_request.then_some(permits.as_slice());
        self.site.decide(self.client.as_ref(), &keys, permits).await
    }

    /// Each rule's limiter for the request, and its permits when they are per request.
    fn keys(
        &self,
        parts: &Parts,
        path: &PathParams,
        client: &ReadClient,
        routed: bool,
    ) -> Result<Keys, RateLimited> {
        let mut keys = SmallVec::<[String; 2]>::new();
        let mut permits = Vec::with_capacity(if self.per_request { self.rules.len() } else { 0 });
        for (i, (rule, spec)) in self.rules.iter().zip(self.site.rules()).enumerate() {
            let problem = match self.value(&rule.key, parts, path, client) {
                Ok(value) => Ok(value),
                // No route matched: the request goes on to the router's fallback (404),
                // as without the layer; the other rules still apply.
                Err(NoValue::NotRouted) if routed => {
                    let mut key = KeyBuf::new();
                    key.text(&rule.name);
                    keys.push(key.finish());
                    permits.push(0);
                    continue;
                }
                Err(NoValue::NotRouted) => Err(OUTSIDE_ROUTER),
                Err(NoValue::Misconfigured(problem)) => Err(problem),
            };
            let value = match problem {
                Ok(value) => value,
                Err(problem) => {
                    let error = Error::InvalidConfig {
                        name: rule.name.to_string(),
                        problem,
                    };
                    return Err(self.site.refuse_misconfigured(i, error));
                }
            };
            if let (Some((what, refuse)), Some(value)) = (&rule.missing, &value) {
                if value.trim().is_empty() {
                    let error = Error::MissingKey {
                        rule: rule.name.to_string(),
                        what: what.clone(),
                        unauthorized: *refuse == MissingKey::Unauthorized,
                    };
                    return Err(self.site.refuse_without_key(i, error));
                }
            }
            let mut key = KeyBuf::new();
            key.text(&rule.name);
            if let Some(value) = &value {
                key.text(":");
                key.value_str(value);
            }
            keys.push(key.finish());
            if self.per_request {
                let exempt = value.is_some_and(|v| rule.exempt.contains(&*v));
                permits.push(match (&rule.cost, exempt) {
                    (_, true) => 0,
                    (Some(cost), false) => cost(parts).max(1),
                    (None, false) => spec.permits,
                });
            }
        }
        Ok((keys, permits))
    }
}

/// The matched path parameters, read once per request when a rule needs them.
#[cfg(feature = "axum")]
enum PathParams {
    Unread,
    Matched(axum::extract::RawPathParams),
    /// A parameter is not UTF-8: the handler rejects it anyway; such requests share
    /// one limiter.
    NotUtf8,
    /// No route matched (the router's fallback), or the layer is outside the router.
    Missing,
}

#[cfg(not(feature = "axum"))]
enum PathParams {
    Unread,
}

impl PathParams {
    #[cfg(feature = "axum")]
    async fn read(needed: bool, parts: &mut Parts) -> PathParams {
        use axum::extract::rejection::RawPathParamsRejection;
        use axum::extract::{FromRequestParts, RawPathParams};
        if !needed {
            return PathParams::Unread;
        }
        // The router's fallback, or no router yet: no route matched.
        if parts.extensions.get::<axum::extract::MatchedPath>().is_none() {
            return PathParams::Missing;
        }
        match RawPathParams::from_request_parts(parts, &()).await {
            Ok(params) => PathParams::Matched(params),
            Err(RawPathParamsRejection::InvalidUtf8InPathParam(_)) => PathParams::NotUtf8,
            Err(_) => PathParams::Missing,
        }
    }

    #[cfg(not(feature = "axum"))]
    async fn read(_: bool, _: &mut Parts) -> PathParams {
        PathParams::Unread
    }

    #[cfg(feature = "axum")]
    fn get(&self, name: &str) -> Value<'_> {
        let missing = "the path parameter is not in the route that matched: add the layer with \
                       Router::route_layer, or on the routes whose path has it";
        match self {
            PathParams::Matched(params) => params
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| Some(Cow::Borrowed(value)))
                .ok_or(NoValue::Misconfigured(missing)),
            PathParams::NotUtf8 => Ok(Some(Cow::Borrowed(""))),
            PathParams::Unread => Err(NoValue::Misconfigured(missing)),
            PathParams::Missing => Err(NoValue::NotRouted),
        }
    }
}

impl Shared {
    /// `RateLimit-Policy` and `RateLimit` of the tightest rule on a granted response.
    /// The rate and window are the ones decided: a run-time override's when one applied.
    fn success_fields(&self, granted: &Granted, headers: &mut http::HeaderMap) {
        let Some((rule, remaining)) = granted.tightest else {
            return;
        };
        let (Some(keyed), Some(spec)) = (self.rules.get(rule), self.site.rules().get(rule)) else {
            return;
        };
        let (rate, window) = granted.decided.unwrap_or((spec.rate, spec.interval));
        if self.success_fields {
            let policy = if (rate, window) == (spec.rate, spec.interval) {
                keyed.policy.clone()
            } else {
                let mut limit = spec.limit();
                limit.rate = rate;
                limit.window = window;
                HeaderValue::try_from(limit.policy_field()).ok()
            };
            if let Some(policy) = policy {
                headers.insert(RATELIMIT_POLICY, policy);
                let mut state = String::with_capacity(keyed.state.len() + 20);
                state.push_str(&keyed.state);
                state.push_str(itoa::Buffer::new().format(remaining));
                // From a String: no copy.
                if let Ok(value) = HeaderValue::try_from(state) {
                    headers.insert(RATELIMIT, value);
                }
            }
        }
        if self.x_ratelimit {
            headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(rate));
            headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(remaining));
        }
    }
}

/// The peer's address, from whichever server put it in the request.
fn peer_addr(parts: &Parts) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(addr)) =
        parts.extensions.get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(*addr);
    }
    #[cfg(feature = "tonic")]
    if let Some(info) = parts.extensions.get::<tonic::transport::server::TcpConnectInfo>() {
        if let Some(addr) = info.remote_addr() {
            return Some(addr);
        }
    }
    parts.extensions.get::<SocketAddr>().copied()
}

/// How a refusal becomes a response with body `B`.
pub trait Respond<B>: Clone + Send + Sync + 'static {
    /// The response to a refused request.
    fn refused(&self, limited: RateLimited) -> Response<B>;
}

/// Refusals as plain-text HTTP responses: 429 with `Retry-After` and the RateLimit
/// fields, 503 when the backend failed under [`OnError::Deny`], 500 when misconfigured.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlainText;

/// Refusals as RFC 9457 problems (`application/problem+json`), same statuses and
/// headers as [`PlainText`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ProblemJson;

/// Refusals as gRPC statuses: `RESOURCE_EXHAUSTED` with `retry-after` metadata and a
/// `google.rpc.RetryInfo` detail; `UNAVAILABLE` when the backend failed under
/// [`OnError::Deny`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Grpc;

#[cfg(feature = "axum")]
impl Respond<axum::body::Body> for PlainText {
    fn refused(&self, limited: RateLimited) -> Response<axum::body::Body> {
        axum::response::IntoResponse::into_response(limited)
    }
}

#[cfg(feature = "axum")]
impl Respond<axum::body::Body> for ProblemJson {
    fn refused(&self, limited: RateLimited) -> Response<axum::body::Body> {
        axum::response::IntoResponse::into_response(redlimit_runtime::ProblemJson(limited))
    }
}

#[cfg(feature = "tonic")]
impl Respond<tonic::body::Body> for Grpc {
    fn refused(&self, limited: RateLimited) -> Response<tonic::body::Body> {
        tonic::Status::from(limited).into_http()
    }
}

/// Rate-limits every request through it (see the module's docs). Cheap to clone:
/// clones share the rules' state.
#[derive(Clone)]
pub struct RateLimitLayer<R = PlainText> {
    shared: Arc<Shared>,
    respond: R,
}

impl RateLimitLayer {
    /// A layer's rules and settings.
    pub fn builder() -> RateLimitLayerBuilder {
        RateLimitLayerBuilder::default()
    }
}

impl<R> RateLimitLayer<R> {
    /// Refusals as `application/problem+json`.
    pub fn problem_json(self) -> RateLimitLayer<ProblemJson> {
        RateLimitLayer {
            shared: self.shared,
            respond: ProblemJson,
        }
    }

    /// Refusals as gRPC statuses, for `tonic::transport::Server::layer`.
    pub fn grpc(self) -> RateLimitLayer<Grpc> {
        RateLimitLayer {
            shared: self.shared,
            respond: Grpc,
        }
    }

    /// Refusals made by your own [`Respond`].
    pub fn respond_with<T>(self, respond: T) -> RateLimitLayer<T> {
        RateLimitLayer {
            shared: self.shared,
            respond,
        }
    }
}

impl<R> fmt::Debug for RateLimitLayer<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("rules", &self.shared.site.rules())
            .finish_non_exhaustive()
    }
}

impl<S, R: Clone> Layer<S> for RateLimitLayer<R> {
    type Service = RateLimit<S, R>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            shared: self.shared.clone(),
            respond: self.respond.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around another.
#[derive(Clone)]
pub struct RateLimit<S, R = PlainText> {
    inner: S,
    shared: Arc<Shared>,
    respond: R,
}

impl<S: fmt::Debug, R> fmt::Debug for RateLimit<S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, R, B, ResBody> Service<Request<B>> for RateLimit<S, R>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    R: Respond<ResBody>,
    B: Send + 'static,
    ResBody: 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The clone that was polled ready serves this request; the fresh one waits
        // for the next poll_ready.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        let respond = self.respond.clone();
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            match shared.decide(&mut parts, behind_router::<S>()).await {
                Ok(granted) => {
                    let mut response = inner.call(Request::from_parts(parts, body)).await?;
                    if shared.success_fields || shared.x_ratelimit {
                        shared.success_fields(&granted, response.headers_mut());
                    }
                    Ok(response)
                }
                Err(limited) => Ok(respond.refused(limited.x_ratelimit(shared.x_ratelimit))),
            }
        })
    }
}

/// Whether the layer wraps what an axum `Router` routes to (`Router::layer`,
/// `route_layer`, a `MethodRouter`'s layer): there, a request without path parameters
/// matched no route. Anywhere else (around the whole router, inside another layer) no
/// route has matched yet, and a path parameter's rule refuses as misconfigured.
#[cfg(feature = "axum")]
fn behind_router<S: 'static>() -> bool {
    std::any::TypeId::of::<S>() == std::any::TypeId::of::<axum::routing::Route>()
}

#[cfg(not(feature = "axum"))]
#[allow(clippy::extra_unused_type_parameters)]
fn behind_router<S: 'static>() -> bool {
    false
}
