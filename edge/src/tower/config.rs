//! Layer rules from configuration (cargo feature `serde`): a [`LayerRule`] or a whole
//! layer's [`LayerConfig`] read by any serde format (TOML, YAML, JSON, ...).
//!
//! The public items here repeat the module's `#[cfg(feature = "serde")]`: the
//! documentation of a crate that re-exports them (redlimit) shows the feature they
//! need only from a cfg on the item itself, not from one on a private module.

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use redlimit_runtime::{Algorithm, OnError, RateType};
use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};

use super::{check_rule_fully, InvalidLayer, Key, LayerRule, MissingKey, RateLimitLayerBuilder, Settle};

/// A layer's rules and settings as read from configuration (cargo feature `serde`), in
/// any format serde reads (TOML, YAML, JSON, ...). [`builder`](LayerConfig::builder)
/// makes the layer's builder, to which code adds what configuration cannot say (the
/// client, trusted proxies). A [`LayerRule`] alone reads the same fields, with its
/// `name` among them.
///
/// ```toml
/// # Optional layer settings.
/// timeout = "250ms"            # wait up to this for permits (default: refuse at once)
/// success_fields = true        # RateLimit-Policy and RateLimit on granted responses
/// x_ratelimit_headers = false  # X-RateLimit-Limit, -Remaining, -Reset too
/// problem_type = "quota_exceeded"  # a 429 as problem+json: the registered quota-exceeded
///                              # type naming the refusing rule (default), or "about_blank"
///
/// # One table per rule, named by its key; all decided on each request, all or nothing.
/// [rules.login]
/// rate = 5
/// interval = "1m"              # as the attribute's: ms, s, m, h, d ("1m30s", "1.5s")
/// key = "client_ip"            # "global" (default), "client_ip",
///                              # { header = "x-api-key" }, { path_param = "user_id" }
///
/// [rules.api]
/// rate = 100
/// interval = "1s"
/// key = { header = "x-api-key" }  # { secret_header = ".." }: a credential, written as
///                              # its digest (Key::secret); also { secret_path_param = ".." }
/// missing_key = "unauthorized" # "share" (default), "bad_request", "unauthorized"
/// message = "API quota exceeded"
/// exempt = ["partner-key"]
/// # Also: mode = "overall" | "per_client", permits = 1, on_error = "local" | "allow"
/// # | "deny", shadow = false, algorithm = "sliding_window" | "token_bucket",
/// # burst = 10, warmup = "30s", local_refusals = true, batch = 1,
/// # batch_lease = "250ms".
///
/// [rules.tokens]              # an LLM's tokens, known once it has answered
/// rate = 100_000
/// interval = "1m"
/// key = { header = "x-user" }
/// permits = 2_000              # the estimate each request reserves
/// settle = { header = "x-tokens-used" }  # or "usage": the handler's Usage
/// max_overdraft = 8_000        # at most this much charged past the estimate
/// ```
///
/// Every rule is checked as it is read, as [`RateLimitLayerBuilder::build`] checks it:
/// an error names the rule and the field, as in "rule \`api\`: field \`interval\`: ...".
/// An unknown field, a field given twice and a rule named twice are errors too.
#[cfg(feature = "serde")]
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerConfig {
    #[serde(deserialize_with = "rule_set")]
    rules: Vec<LayerRule>,
    #[serde(default, deserialize_with = "optional_duration")]
    timeout: Option<Duration>,
    #[serde(default = "yes")]
    success_fields: bool,
    #[serde(default)]
    x_ratelimit_headers: bool,
    #[serde(default, deserialize_with = "problem_type")]
    #[cfg_attr(not(any(feature = "axum", feature = "actix")), allow(dead_code))]
    problem_type: Option<ProblemTypeSpec>,
}

fn yes() -> bool {
    true
}

impl LayerConfig {
    /// The rules, in the order the format gave them (JSON and YAML keep the file's;
    /// the `toml` crate gives a table's keys by name unless its `preserve_order` is on).
    /// The order only says which rule a refusal names when several refuse.
    pub fn rules(&self) -> &[LayerRule] {
        &self.rules
    }

    /// A builder with these rules and settings.
    pub fn builder(self) -> RateLimitLayerBuilder {
        let builder = RateLimitLayerBuilder::default()
            .rules(self.rules)
            .success_fields(self.success_fields)
            .x_ratelimit_headers(self.x_ratelimit_headers);
        #[cfg(any(feature = "axum", feature = "actix"))]
        let builder = match self.problem_type {
            Some(ProblemTypeSpec::QuotaExceeded) => {
                builder.problem_type(redlimit_runtime::ProblemType::QuotaExceeded)
            }
            Some(ProblemTypeSpec::AboutBlank) => {
                builder.problem_type(redlimit_runtime::ProblemType::AboutBlank)
            }
            None => builder,
        };
        match self.timeout {
            Some(timeout) => builder.timeout(timeout),
            None => builder,
        }
    }
}

/// The fields of one rule, each read at most once.
#[derive(Default)]
struct Fields {
    name: Option<String>,
    rate: Option<u64>,
    interval: Option<Duration>,
    key: Option<KeySpec>,
    mode: Option<ModeSpec>,
    permits: Option<u64>,
    on_error: Option<OnErrorSpec>,
    message: Option<String>,
    missing_key: Option<MissingKey>,
    shadow: Option<bool>,
    local_refusals: Option<bool>,
    batch: Option<u64>,
    batch_lease: Option<Duration>,
    exempt: Option<Vec<String>>,
    algorithm: Option<AlgorithmSpec>,
    burst: Option<u64>,
    warmup: Option<Duration>,
    settle: Option<SettleSpec>,
    max_overdraft: Option<u64>,
}

const FIELDS: &str = "rate, interval, key, mode, permits, on_error, message, missing_key, shadow, \
                      local_refusals, batch, batch_lease, exempt, algorithm, burst, warmup, settle, \
                      max_overdraft";

/// Where a settled rule's actual amount comes from: `{ header = "x-tokens-used" }` or
/// `"usage"`.
#[derive(serde::Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum SettleSpec {
    Header(String),
    Usage,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum KeySpec {
    Global,
    ClientIp,
    Header(String),
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    PathParam(String),
    /// A header whose values are secrets ([`Key::secret`]).
    SecretHeader(String),
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    SecretPathParam(String),
}

impl KeySpec {
    /// The key source this names; path parameters need the `axum` feature.
    fn into_key(self) -> Result<Key, Result<String, InvalidLayer>> {
        Ok(match self {
            KeySpec::Global => Key::global(),
            KeySpec::ClientIp => Key::client_ip(),
            KeySpec::Header(header) => Key::header(&header),
            KeySpec::SecretHeader(header) => Key::header(&header).secret(),
            #[cfg(feature = "axum")]
            KeySpec::PathParam(param) => Key::path_param(&param),
            #[cfg(feature = "axum")]
            KeySpec::SecretPathParam(param) => Key::path_param(&param).secret(),
            #[cfg(not(feature = "axum"))]
            KeySpec::PathParam(_) | KeySpec::SecretPathParam(_) => {
                return Err(Ok(
                    "field `key`: path_param keys are axum's: enable the `axum` feature".into(),
                ))
            }
        })
    }
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum ModeSpec {
    Overall,
    PerClient,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum OnErrorSpec {
    Local,
    Allow,
    Deny,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum AlgorithmSpec {
    SlidingWindow,
    TokenBucket,
}

/// The problem type of a 429 answered as problem+json, as configuration names it.
#[derive(Debug, Clone, Copy)]
enum ProblemTypeSpec {
    QuotaExceeded,
    AboutBlank,
}

/// `problem_type`: one of the two words, else an error naming both; refused without
/// the `axum` or `actix` feature, which answer problem+json.
fn problem_type<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<ProblemTypeSpec>, D::Error> {
    let text = String::deserialize(deserializer).map_err(|e| in_field("problem_type", e))?;
    let spec = match text.as_str() {
        "quota_exceeded" => ProblemTypeSpec::QuotaExceeded,
        "about_blank" => ProblemTypeSpec::AboutBlank,
        other => {
            return Err(in_field(
                "problem_type",
                format_args!(
                    "unknown problem type {other:?}; accepted: \"quota_exceeded\" (the default: the \
                     registered quota-exceeded type, naming the refusing rule), \"about_blank\""
                ),
            ))
        }
    };
    if cfg!(not(any(feature = "axum", feature = "actix"))) {
        return Err(in_field(
            "problem_type",
            "problem+json refusals are axum's and actix-web's: enable the `axum` or `actix` feature",
        ));
    }
    Ok(Some(spec))
}

/// A duration written as the attribute writes it: `"250ms"`, `"60s"`, `"1m30s"`.
struct Text(Duration);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor;

        impl TextVisitor {
            /// A number where a duration's text goes: said so, with what is accepted.
            fn bare<E: de::Error>(number: impl fmt::Display) -> E {
                E::custom(format_args!(
                    "`{number}` is a number without a unit; write the duration as text with \
                     its unit: ms, s, m, h or d, e.g. \"{number}s\""
                ))
            }
        }

        impl Visitor<'_> for TextVisitor {
            type Value = Text;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration as text with its unit, e.g. \"60s\" or \"1m30s\"")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Text, E> {
                parse_duration(text).map(Text).map_err(E::custom)
            }

            fn visit_u64<E: de::Error>(self, number: u64) -> Result<Text, E> {
                Err(Self::bare(number))
            }

            fn visit_i64<E: de::Error>(self, number: i64) -> Result<Text, E> {
                Err(Self::bare(number))
            }

            fn visit_f64<E: de::Error>(self, number: f64) -> Result<Text, E> {
                Err(Self::bare(number))
            }
        }

        deserializer.deserialize_str(TextVisitor)
    }
}

fn optional_duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
    Text::deserialize(deserializer)
        .map(|t| Some(t.0))
        .map_err(|e| de::Error::custom(format_args!("field `timeout`: {e}")))
}

/// A duration in the attribute's grammar (`redlimit_runtime::duration`).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    redlimit_runtime::duration::parse(text).map_err(|e| e.to_string())
}

/// `field `<field>`: <error>`.
fn in_field<E: de::Error>(field: &str, error: impl fmt::Display) -> E {
    E::custom(format_args!("field `{field}`: {error}"))
}

impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FieldsVisitor;

        impl<'de> Visitor<'de> for FieldsVisitor {
            type Value = Fields;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a rule: a table of {FIELDS}")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields, A::Error> {
                let mut fields = Fields::default();
                while let Some(field) = map.next_key::<String>()? {
                    macro_rules! read {
                        ($slot:ident) => {{
                            if fields.$slot.is_some() {
                                return Err(in_field(&field, "given twice"));
                            }
                            fields.$slot = Some(map.next_value().map_err(|e| in_field(&field, e))?);
                        }};
                        ($slot:ident as duration) => {{
                            if fields.$slot.is_some() {
                                return Err(in_field(&field, "given twice"));
                            }
                            let Text(duration) = map.next_value().map_err(|e| in_field(&field, e))?;
                            fields.$slot = Some(duration);
                        }};
                    }
                    match field.as_str() {
                        "name" => read!(name),
                        "rate" => read!(rate),
                        "interval" => read!(interval as duration),
                        "key" => read!(key),
                        "mode" => read!(mode),
                        "permits" => read!(permits),
                        "on_error" => read!(on_error),
                        "message" => read!(message),
                        "missing_key" => read!(missing_key),
                        "shadow" => read!(shadow),
                        "local_refusals" => read!(local_refusals),
                        "batch" => read!(batch),
                        "batch_lease" => read!(batch_lease as duration),
                        "exempt" => read!(exempt),
                        "algorithm" => read!(algorithm),
                        "burst" => read!(burst),
                        "warmup" => read!(warmup as duration),
                        "settle" => read!(settle),
                        "max_overdraft" => read!(max_overdraft),
                        _ => {
                            return Err(in_field(
                                &field,
                                format_args!("unknown; a rule's fields are {FIELDS}"),
                            ))
                        }
                    }
                }
                Ok(fields)
            }
        }

        deserializer.deserialize_map(FieldsVisitor)
    }
}

impl Fields {
    /// The rule, checked as the layer's builder checks it: `Err(Ok(..))` for what a
    /// field says, `Err(Err(..))` for what the builder refuses (its error names the rule).
    fn into_rule(mut self, name: String) -> Result<LayerRule, Result<String, InvalidLayer>> {
        let missing = |text: &str| Ok(text.to_owned());
        let rate = self
            .rate
            .ok_or_else(|| missing("field `rate` is missing: permits per interval, e.g. rate = 5"))?;
        let interval = self
            .interval
            .ok_or_else(|| missing("field `interval` is missing: the window, e.g. interval = \"60s\""))?;
        let mut rule = LayerRule::new(name, rate, interval);
        if let Some(key) = self.key.take() {
            rule = rule.key(key.into_key()?);
        }
        let rule = self.with_choices(rule);
        let rule = self.with_values(rule);
        check_rule_fully(&rule).map_err(Err)?;
        Ok(rule)
    }

    /// The settings chosen among words: mode, on_error, algorithm.
    fn with_choices(&mut self, mut rule: LayerRule) -> LayerRule {
        if let Some(mode) = self.mode.take() {
            rule = rule.mode(match mode {
                ModeSpec::Overall => RateType::Overall,
                ModeSpec::PerClient => RateType::PerClient,
            });
        }
        if let Some(on_error) = self.on_error.take() {
            rule = rule.on_error(match on_error {
                OnErrorSpec::Local => OnError::Local,
                OnErrorSpec::Allow => OnError::Allow,
                OnErrorSpec::Deny => OnError::Deny,
            });
        }
        if let Some(algorithm) = self.algorithm.take() {
            rule = rule.algorithm(match algorithm {
                AlgorithmSpec::SlidingWindow => Algorithm::SlidingWindow,
                AlgorithmSpec::TokenBucket => Algorithm::TokenBucket,
            });
        }
        rule
    }

    /// The settings given as values: permits, message, missing_key, shadow,
    /// local_refusals, batch, batch_lease, exempt, burst, warmup, settle, max_overdraft.
    fn with_values(self, mut rule: LayerRule) -> LayerRule {
        if let Some(permits) = self.permits {
            rule = rule.permits(permits);
        }
        if let Some(message) = self.message {
            rule = rule.message(message);
        }
        if let Some(missing_key) = self.missing_key {
            rule = rule.missing_key(missing_key);
        }
        if let Some(shadow) = self.shadow {
            rule = rule.shadow(shadow);
        }
        if let Some(on) = self.local_refusals {
            rule = rule.local_refusals(on);
        }
        if let Some(k) = self.batch {
            rule = rule.batch(k);
        }
        if let Some(lease) = self.batch_lease {
            rule = rule.batch_lease(lease);
        }
        if let Some(exempt) = self.exempt {
            rule = rule.exempt(exempt);
        }
        if let Some(burst) = self.burst {
            rule = rule.burst(burst);
        }
        if let Some(warmup) = self.warmup {
            rule = rule.warmup(warmup);
        }
        if let Some(settle) = self.settle {
            rule = rule.settle(match settle {
                SettleSpec::Header(name) => Settle::header(&name),
                SettleSpec::Usage => Settle::usage(),
            });
        }
        if let Some(most) = self.max_overdraft {
            rule = rule.max_overdraft(most);
        }
        rule
    }
}

/// One rule with its `name` among its fields (`name = "login"`).
#[cfg(feature = "serde")]
impl<'de> Deserialize<'de> for LayerRule {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut fields = Fields::deserialize(deserializer)?;
        let Some(name) = fields.name.take() else {
            return Err(de::Error::custom(
                "field `name` is missing: the rule's name, e.g. name = \"login\"",
            ));
        };
        fields.into_rule(name).map_err(|error| match error {
            Ok(field) => de::Error::custom(field),
            Err(checked) => de::Error::custom(checked),
        })
    }
}

/// `rules`: a table of rules by name, in the order written.
fn rule_set<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<LayerRule>, D::Error> {
    struct RulesVisitor;

    impl<'de> Visitor<'de> for RulesVisitor {
        type Value = Vec<LayerRule>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a table of rules by name ([rules.login] rate = 5 interval = \"60s\")")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<LayerRule>, A::Error> {
            let mut rules = Vec::new();
            let mut names = HashSet::new();
            while let Some(name) = map.next_key::<String>()? {
                let in_rule =
                    |error: &dyn fmt::Display| de::Error::custom(format_args!("rule `{name}`: {error}"));
                if !names.insert(name.clone()) {
                    return Err(in_rule(&"defined twice; give each rule its own name"));
                }
                let fields: Fields = map.next_value().map_err(|e| in_rule(&e))?;
                if fields.name.as_ref().is_some_and(|n| *n != name) {
                    return Err(in_rule(
                        &"field `name` differs from the rule's table name; remove it",
                    ));
                }
                rules.push(fields.into_rule(name.clone()).map_err(|error| match error {
                    Ok(field) => in_rule(&field),
                    Err(checked) => de::Error::custom(checked),
                })?);
            }
            if rules.is_empty() {
                return Err(de::Error::custom(
                    "`rules` is empty: a layer needs at least one rule ([rules.<name>] rate = .. interval = ..)",
                ));
            }
            Ok(rules)
        }
    }

    deserializer.deserialize_map(RulesVisitor)
}

#[cfg(test)]
mod tests;
