//! What a built layer keeps, shared by all its clones and services: the runtime's
//! engine with the rules' descriptions, and beside each rule its key source and
//! per-request settings, made once from the [`LayerRule`]s when the layer is built.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use http::header::{AUTHORIZATION, PROXY_AUTHORIZATION};
use http::{HeaderName, HeaderValue};
use redlimit_runtime::engine::Engine;
use redlimit_runtime::Client;
use redlimit_runtime::RuleSpec;

use super::key::{KeyFn, KeyKind, MissingKey};
use super::rule::{CostFn, LayerRule};
use super::settle::{Settle, Source};
use super::validate::{check_rule, header_name, InvalidLayer};
use crate::TrustedProxies;

/// A rule's key and per-request settings, next to its [`RuleSpec`] in the engine.
pub(super) struct Keyed {
    pub(super) name: Cow<'static, str>,
    /// What its limiters with a value start with: the name and `:`.
    pub(super) keyed_start: String,
    /// Its limiter without a value, and what those with one start with, after the
    /// prefix of the layer's client (see `Shared::reads_prefixed`).
    pub(super) prefixed: (String, String),
    /// The rule's `RateLimit-Policy` field, on every response decided at the rule's
    /// own rate and interval.
    pub(super) policy: Option<HeaderValue>,
    /// What a request without a value lacks, and how it is refused; `None`: shared.
    pub(super) missing: Option<(String, MissingKey)>,
    /// The start of its `RateLimit` field, up to the remaining permits.
    pub(super) state: String,
    pub(super) key: Extract,
    /// Its values are secrets, written as their digest ([`Key::secret`](super::Key::secret)).
    pub(super) secret: bool,
    pub(super) cost: Option<Arc<CostFn>>,
    pub(super) exempt: HashSet<String>,
    /// Where a settled rule's actual amount comes from.
    pub(super) settle: Option<Source>,
}

/// A key source as the layer reads it: a header's name parsed once.
pub(super) enum Extract {
    Global,
    ClientIp,
    Header(KeyHeader),
    /// `Authorization` or `Proxy-Authorization`: read as one credential however its
    /// scheme is spelled.
    Credential(KeyHeader),
    #[cfg(any(feature = "axum", feature = "actix"))]
    PathParam(String),
    With(Arc<KeyFn>),
}

/// The header a key (or a settle) reads, its name made once for each server's header
/// map: a name looked up by its text is parsed on every lookup, and where `http` has
/// no constant of its own for it (`x-api-key`), copied into a new allocation by
/// actix-web's.
pub(crate) struct KeyHeader {
    name: HeaderName,
    /// The name as actix-web's header map takes it (`http` 0.2's type), when that
    /// parses it (it parses every name `http` 1 does; were one refused, the name is
    /// looked up by its text, as before, which finds what actix-web makes of it).
    #[cfg(feature = "actix")]
    actix: Option<actix_web::http::header::HeaderName>,
}

impl KeyHeader {
    pub(super) fn new(name: HeaderName) -> Self {
        KeyHeader {
            #[cfg(feature = "actix")]
            actix: actix_web::http::header::HeaderName::from_bytes(name.as_str().as_bytes()).ok(),
            name,
        }
    }

    /// The lines of this header in actix-web's `headers`.
    #[cfg(feature = "actix")]
    pub(crate) fn lines_in<'h>(
        &self,
        headers: &'h actix_web::http::header::HeaderMap,
    ) -> impl DoubleEndedIterator<Item = &'h actix_web::http::header::HeaderValue> {
        match &self.actix {
            Some(name) => headers.get_all(name),
            None => headers.get_all(self.name.as_str()),
        }
    }
}

impl std::fmt::Display for KeyHeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.name.fmt(f)
    }
}

impl std::ops::Deref for KeyHeader {
    type Target = HeaderName;

    fn deref(&self) -> &HeaderName {
        &self.name
    }
}

/// What every clone of a layer and its services shares.
pub(crate) struct Shared {
    pub(super) engine: Engine,
    pub(super) rules: Vec<Keyed>,
    /// Some rule has a cost or exempt values, or is settled, or is keyed by a path
    /// parameter: permits are computed per request.
    pub(super) per_request: bool,
    /// Each rule takes its own permits whenever it applies (no cost, exempt value or
    /// settle): permits are per request only where a path parameter's rule does not
    /// apply, to a request no route matched.
    pub(super) permits_own: bool,
    /// Some rule is settled: a request's rules are reserved, then settled.
    pub(crate) settles: bool,
    /// Some rule is settled by the handler's [`Usage`](super::Usage).
    pub(super) records_usage: bool,
    /// Some rule is keyed by a path parameter.
    pub(super) needs_path: bool,
    /// Some rule's key or cost is a function of the request's head (`Parts`).
    pub(super) reads_head: bool,
    pub(crate) client: Option<Client>,
    /// Some rule is keyed by the client address, or the layer has its own trusted
    /// proxies: it reads the one setting of each request, and leaves it there.
    pub(super) reads_trust: bool,
    /// Some rule is keyed by the client address.
    pub(super) keys_client_ip: bool,
    /// The rule a request meeting two settings is refused for (the first keyed by the
    /// client address).
    pub(super) trust_rule: usize,
    pub(super) trusted: Option<TrustedProxies>,
    /// The setting when none is given: no proxy trusted.
    pub(super) untrusted: TrustedProxies,
    pub(crate) success_fields: bool,
    pub(crate) x_ratelimit: bool,
    /// The problem type of a 429 as problem+json.
    #[cfg(any(feature = "axum", feature = "actix"))]
    pub(super) problem_type: redlimit_runtime::ProblemType,
    /// The layer decides in process without a timeout: nothing a decision awaits ever
    /// waits, so each request is decided where the service is called.
    pub(crate) decides_at_once: bool,
}

/// The layer's settings besides its rules, as its builder collected them.
pub(super) struct Settings {
    pub(super) client: Option<Client>,
    pub(super) trusted: Option<TrustedProxies>,
    pub(super) timeout: Option<Duration>,
    pub(super) success_fields: bool,
    pub(super) x_ratelimit: bool,
    #[cfg(any(feature = "axum", feature = "actix"))]
    pub(super) problem_type: redlimit_runtime::ProblemType,
}

impl Shared {
    /// Checks each rule, refuses two of one name, and keeps what each request needs.
    pub(super) fn new(rules: Vec<LayerRule>, settings: Settings) -> Result<Shared, InvalidLayer> {
        let mut names = HashSet::new();
        let mut specs = Vec::with_capacity(rules.len());
        let mut keyed = Vec::with_capacity(rules.len());
        let mut templates = Vec::with_capacity(rules.len());
        for rule in rules {
            check_rule(&rule)?;
            templates.push(template(&rule));
            if !names.insert(rule.spec.name.clone()) {
                return Err(InvalidLayer(format!(
                    "two rules are named `{}`: their limiters would be the same keys; give each rule its own name",
                    rule.spec.name
                )));
            }
            let (spec, rule) = compile(rule)?;
            specs.push(spec);
            keyed.push(rule);
        }
        let mut rules = keyed;
        if let Some(client) = &settings.client {
            for rule in &mut rules {
                rule.prefixed = (
                    format!("{}{}", client.prefix(), rule.name),
                    format!("{}{}", client.prefix(), rule.keyed_start),
                );
            }
        }
        let keys_client_ip = rules.iter().position(|r| matches!(r.key, Extract::ClientIp));
        #[cfg(any(feature = "axum", feature = "actix"))]
        let needs_path = rules.iter().any(|r| matches!(r.key, Extract::PathParam(_)));
        #[cfg(not(any(feature = "axum", feature = "actix")))]
        let needs_path = false;
        // A path parameter's rule does not apply where no route matched.
        let reads_head = (rules.iter()).any(|r| r.cost.is_some() || matches!(r.key, Extract::With(_)));
        let settles = rules.iter().any(|r| r.settle.is_some());
        let records_usage = rules.iter().any(|r| matches!(r.settle, Some(Source::Usage)));
        let permits_own = !settles && !rules.iter().any(|r| r.cost.is_some() || !r.exempt.is_empty());
        let per_request = !permits_own || needs_path;
        // A reservation is held until the response is back: it takes the general path.
        let decides_at_once =
            !settles && settings.timeout.is_none() && settings.client.as_ref().is_some_and(Client::is_memory);
        let engine = Engine::with_rules(specs, settings.timeout, "RateLimitLayer").with_templates(templates);
        if let Some((i, j)) = engine.coinciding_rules() {
            return Err(InvalidLayer(format!(
                "rules `{}` and `{}` name the same limiter for some key values, and count it differently \
                 (rate, interval, mode, algorithm, burst or warm-up): a limiter keeps the config of the call \
                 that last wrote it, so a client sending that value would have the looser rule decide the \
                 stricter's requests; give each rule a name no other rule's limiters take, or the same limit",
                rules[i].name, rules[j].name
            )));
        }
        Ok(Shared {
            decides_at_once,
            engine,
            rules,
            per_request,
            permits_own,
            settles,
            records_usage,
            needs_path,
            reads_head,
            client: settings.client,
            reads_trust: keys_client_ip.is_some() || settings.trusted.is_some(),
            keys_client_ip: keys_client_ip.is_some(),
            trust_rule: keys_client_ip.unwrap_or(0),
            trusted: settings.trusted,
            untrusted: TrustedProxies::default(),
            success_fields: settings.success_fields,
            x_ratelimit: settings.x_ratelimit,
            #[cfg(any(feature = "axum", feature = "actix"))]
            problem_type: settings.problem_type,
        })
    }
}

/// A checked rule as the engine decides it, and as the layer keys it.
fn compile(rule: LayerRule) -> Result<(RuleSpec, Keyed), InvalidLayer> {
    let LayerRule {
        spec,
        key,
        cost,
        missing_key,
        exempt,
        settle,
        ..
    } = rule;
    let secret = key.1 .0;
    if secret && matches!(key.0, KeyKind::Global) {
        return Err(InvalidLayer(format!(
            "rule `{}`: Key::global() has no value to keep secret: key it by the value that is \
             a secret (Key::header(\"authorization\").secret())",
            spec.name
        )));
    }
    let key = match key.0 {
        KeyKind::Global => Extract::Global,
        KeyKind::ClientIp => Extract::ClientIp,
        KeyKind::Header(name) => match header_name(&spec.name, &name)? {
            name if name == AUTHORIZATION || name == PROXY_AUTHORIZATION => {
                Extract::Credential(KeyHeader::new(name))
            }
            name => Extract::Header(KeyHeader::new(name)),
        },
        #[cfg(any(feature = "axum", feature = "actix"))]
        KeyKind::PathParam(name) => Extract::PathParam(name),
        KeyKind::With(f, _) => Extract::With(f),
    };
    let limit = spec.limit();
    let policy = HeaderValue::from_str(&limit.policy_field()).ok();
    let missing = match (missing_key, &key) {
        (MissingKey::Share, _) => None,
        (refuse, Extract::Header(header) | Extract::Credential(header)) => {
            Some((format!("the {header} header"), refuse))
        }
        #[cfg(any(feature = "axum", feature = "actix"))]
        (refuse, Extract::PathParam(param)) => Some((format!("the path parameter {param}"), refuse)),
        (refuse, Extract::With(_)) => Some(("a value for its key".to_owned(), refuse)),
        (_, Extract::Global | Extract::ClientIp) => unreachable!("refused by check_rule"),
    };
    // `"name";r=0` less its digits: what every `RateLimit` field starts with.
    let mut state = limit.state_field(0, None);
    state.pop();
    // Exempt values of a header as its value is read: without the spaces and tabs
    // around them, and a binary header's without its base64 padding.
    let exempt: HashSet<String> = exempt
        .into_iter()
        .map(|value| match &key {
            Extract::Header(name) => {
                super::per_request::unpadded(name, value.trim_matches([' ', '\t'])).to_owned()
            }
            Extract::Credential(_) => {
                super::per_request::credentials(value.trim_matches([' ', '\t'])).into_owned()
            }
            _ => value,
        })
        .collect();
    if exempt.contains("") {
        return Err(InvalidLayer(format!(
            "rule `{}`: an exempt value that is only padding (`=`) of the binary header it is \
             read from would, read so, be empty and exempt every request without a value; list \
             the values themselves",
            spec.name
        )));
    }
    let keyed = Keyed {
        keyed_start: format!("{}:", spec.name),
        prefixed: Default::default(),
        name: spec.name.clone(),
        policy,
        missing,
        state,
        key,
        secret,
        cost,
        exempt,
        settle: settle.as_ref().and_then(Settle::source),
    };
    Ok((spec, keyed))
}

/// A rule's limiters in the attribute's template syntax, for the registry that keeps
/// rules of different shapes from sharing names: the name as literal text, then the
/// key's value, named after its source (`login:{ip}` for a rule keyed by the client
/// address).
fn template(rule: &LayerRule) -> String {
    let name = rule.spec.name.replace('{', "{{").replace('}', "}}");
    match rule.key.template_value() {
        None => name,
        Some(value) => format!("{name}:{{{value}}}"),
    }
}
