//! A call's rules: each rule's limiter for the call's key, at the rate and window of
//! an override where one applies.

use std::time::Duration;

use super::call::{CallKeys, Written};
use super::Engine;
use crate::backend::memory::name::same_name;
use crate::rules::overrides::Table;
use crate::{Client, Rule, RuleSpec};

impl Engine {
    /// Every rule's limiter for this call (rules that do not apply included, with the
    /// permits 0 they never spend), at the overridden rate and interval where the
    /// client has an override for the limiter or its rule.
    pub(super) fn build_rules<C: FromIterator<Rule>>(
        &self,
        prefix: &str,
        call: &mut CallKeys<'_>,
        overrides: Option<(&Client, &Table)>,
    ) -> C {
        let (permits, written) = (call.permits, call.written);
        // One per rule (keys beyond the rules are not any rule's).
        self.rules
            .iter()
            .zip(call.keys.iter_mut())
            .enumerate()
            .map(|(i, (_, key))| self.build_rule(i, prefix, key, permits, overrides, written))
            .collect()
    }

    /// Rule `i`'s limiter for this call's `key`, which becomes its name: no second
    /// string (a key built for the call has room for the prefix, or starts with it:
    /// see [`Written`]).
    #[inline]
    pub(super) fn build_rule(
        &self,
        i: usize,
        prefix: &str,
        key: &mut String,
        permits: Option<&[u64]>,
        overrides: Option<(&Client, &Table)>,
        written: Written,
    ) -> Rule {
        let spec = &self.rules[i];
        let mut name = std::mem::take(key);
        // A layer's key is known by its shape: the rule's start, which its hash and
        // its checks are worked out from once. Any other (a key of the wrong shape, or
        // under another prefix) is taken as a caller's: the prefix put in front unless
        // it is there, its name hashed and checked whole.
        let layer = match written {
            Written::Layer => self
                .layer_name(i, prefix)
                .and_then(|layer| Some((layer.hash_of(&name)?, layer.pass))),
            Written::ByCaller => None,
        };
        if written == Written::ByCaller || (layer.is_none() && !name.starts_with(prefix)) {
            name.insert_str(0, prefix);
        }
        let (rate, interval) = match overrides.filter(|(_, table)| !table.is_empty()) {
            Some((client, table)) => rate_of(spec, &name, client, table),
            None => (spec.rate, spec.interval),
        };
        let permits = permits.map_or(spec.permits, |p| p[i]);
        let rule = spec.rule(name, permits, rate, interval);
        if let Some((hash, _)) = layer {
            rule.keep_hash(hash);
        }
        if (rate, interval) != (spec.rate, spec.interval) {
            rule.mark_overridden();
        } else if self.specs_checked()[i] && permits == spec.permits {
            if layer.is_some_and(|(_, pass)| pass) {
                debug_assert!(
                    crate::keys::check_name(rule.name()).is_ok()
                        && crate::keys::library_key(prefix, rule.name()).is_none(),
                    "{} is not a name a layer writes",
                    rule.name()
                );
                rule.mark_checked();
            } else {
                rule.mark_settings_checked();
            }
        }
        rule
    }

    /// What rule `i`'s limiters written by a layer share under `prefix`, worked out for
    /// the first prefix asked about; `None` under any other.
    #[inline]
    pub(super) fn layer_name(&self, i: usize, prefix: &str) -> Option<&LayerName> {
        let layer = self.layer_names.get_or_init(|| LayerNames {
            prefix: prefix.into(),
            rules: self
                .rules
                .iter()
                .zip(self.specs_checked())
                .map(|(spec, &checked)| LayerName::of_rule(prefix, spec, checked))
                .collect(),
        });
        // (compared as the table compares names: no `memcmp` call on every request)
        same_name(&layer.prefix, prefix).then(|| &layer.rules[i])
    }

    /// Whether each rule's settings at its own rate, window and permits pass a client's
    /// checks (see `Engine::checked`).
    fn specs_checked(&self) -> &[bool] {
        self.checked.get_or_init(|| {
            self.rules
                .iter()
                .map(|spec| {
                    let rule = spec.rule(String::new(), spec.permits, spec.rate, spec.interval);
                    crate::rules::checks::check_settings(&rule).is_ok()
                })
                .collect()
        })
    }

    /// Rule `i`'s limit as decided: its name, and its rate and window after overrides.
    pub(super) fn limit_of(&self, i: usize, rule: Option<&Rule>) -> crate::Limit {
        let mut limit = self.rules[i].limit();
        if let Some(rule) = rule {
            limit.rate = rule.config().rate;
            limit.window = rule.config().interval;
        }
        limit
    }
}

/// What a layer's limiters of each rule share under one key prefix.
pub(super) struct LayerNames {
    prefix: Box<str>,
    rules: Box<[LayerName]>,
}

impl std::fmt::Debug for LayerNames {
    /// The prefix and whether each rule's names pass: not the hashers, whose keys are
    /// what keeps a caller from choosing names that collide.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerNames")
            .field("prefix", &self.prefix)
            .field(
                "pass",
                &self.rules.iter().map(|rule| rule.pass).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// What a layer's limiters of one rule share under a prefix: each is the prefix and
/// the rule's name, alone or followed by `:` and a value `KeyBuf` escaped.
pub(super) struct LayerName {
    /// Every such limiter passes every check of a name
    /// (`rules::checks::escaped_names_pass`): they need not be checked on each call.
    pass: bool,
    /// When every such limiter and the rule's own settings pass the checks: the rule
    /// at its own rate, window and permits (its name empty), whose settings decide a
    /// limiter of the rule where no override applies.
    pub(super) settings: Option<Rule>,
    /// What each limiter with a value starts with: the prefix, the name and `:`.
    start: Box<str>,
    /// The hash of the limiter without a value.
    alone: u64,
    /// The name hasher, the prefix, the name and `:` read: each limiter's hash costs
    /// its value's bytes only.
    keyed: std::hash::DefaultHasher,
}

impl LayerName {
    /// `checked`: the rule's settings pass the checks (see `Engine::specs_checked`).
    fn of_rule(prefix: &str, spec: &RuleSpec, checked: bool) -> LayerName {
        let mut layer = LayerName::new(prefix, &spec.name);
        if layer.pass && checked {
            let rule = spec.rule(String::new(), spec.permits, spec.rate, spec.interval);
            rule.mark_settings_checked();
            layer.settings = Some(rule);
        }
        layer
    }

    /// The rule's names under `prefix`, without its settings.
    fn new(prefix: &str, name: &str) -> LayerName {
        let alone = format!("{prefix}{name}");
        let mut keyed = crate::keys::name_hasher();
        std::hash::Hasher::write(&mut keyed, alone.as_bytes());
        std::hash::Hasher::write(&mut keyed, b":");
        LayerName {
            pass: crate::rules::checks::escaped_names_pass(prefix, name),
            settings: None,
            alone: crate::keys::name_hash(&alone),
            start: format!("{alone}:").into(),
            keyed,
        }
    }

    /// The hash of `limiter` (its [`name_hash`](crate::keys::name_hash)) when it is one
    /// of the rule's under the prefix: the start and a value, or the start's text
    /// alone; `None` for any other name.
    #[inline]
    pub(super) fn hash_of(&self, limiter: &str) -> Option<u64> {
        // (the start compared as the table compares names: no `memcmp` call)
        let start = limiter
            .get(..self.start.len())
            .filter(|head| same_name(head, &self.start));
        match start.map(|head| &limiter[head.len()..]) {
            Some(value) => {
                let mut hasher = self.keyed.clone();
                std::hash::Hasher::write(&mut hasher, value.as_bytes());
                Some(std::hash::Hasher::finish(&hasher))
            }
            None => (limiter.len() + 1 == self.start.len() && self.start.starts_with(limiter))
                .then_some(self.alone),
        }
    }
}

/// The rate and window of `spec` for the limiter `name`: an override's, or the rule's
/// own. An override the rule cannot take (set by hand in Redis) is ignored, with a
/// warning: the rule's own rate applies, never an error.
fn rate_of(spec: &RuleSpec, name: &str, client: &Client, table: &Table) -> (u64, Duration) {
    let Some((rate, interval)) = table.lookup(&spec.name, name) else {
        return (spec.rate, spec.interval);
    };
    match crate::rules::registry::fits(&spec.name, spec.permits, spec.bucket, rate, interval) {
        Ok(()) => (rate, interval),
        Err(error) => {
            client
                .overrides()
                .warn_unusable(&spec.name, &error, client.now_ms());
            (spec.rate, spec.interval)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LayerName;
    use crate::keys::name_hash;

    /// A layer's limiter hashed from the rule's start read once is hashed as its whole
    /// name is, whatever the lengths of the prefix, the name and the value (every
    /// split of SipHash's 8-byte blocks), alone or with a value.
    #[test]
    fn a_limiter_hashed_from_its_rule_s_start_is_hashed_as_its_whole_name() {
        let values = ["a", "%00", "user-42", "é漢🦀", "0123456", "01234567", "012345678"];
        for prefix in ["", "p", "rate_limit:", "a-prefix-of-16b:"] {
            for name in ["x", "api", "a-longer-name"] {
                let layer = LayerName::new(prefix, name);
                let alone = format!("{prefix}{name}");
                assert_eq!(layer.hash_of(&alone), Some(name_hash(&alone)), "{alone}");
                for value in values.iter().map(|v| v.to_string()).chain(["v".repeat(200)]) {
                    let limiter = format!("{alone}:{value}");
                    assert_eq!(layer.hash_of(&limiter), Some(name_hash(&limiter)), "{limiter}");
                }
                // Names of another shape are not the rule's: hashed whole by the caller.
                let unprefixed = (!prefix.is_empty()).then(|| format!("{name}:v"));
                let others = [format!("{alone}x:v"), format!("{alone}x"), String::new()];
                for other in others.into_iter().chain(unprefixed) {
                    assert_eq!(layer.hash_of(&other), None, "{other}");
                }
            }
        }
    }

    /// Keys given to the layer's path that are not of a layer's shape (no prefix, or
    /// another rule's start) are decided as a caller's keys are: on the limiter
    /// `decide` names, one limiter whichever path decides it (a hash taken from the
    /// wrong start would file it apart and double its rate).
    #[tokio::test]
    async fn keys_not_of_a_layer_s_shape_are_decided_as_a_caller_s() {
        use crate::{Client, OnError, RateType, RuleSpec};
        use std::time::Duration;
        let spec = RuleSpec {
            name: "api".into(),
            shadow: false,
            local_refusals: true,
            batch: 1,
            batch_lease: None,
            rate: 2,
            interval: Duration::from_secs(60),
            mode: RateType::Overall,
            permits: 1,
            on_error: OnError::Deny,
            message: None,
            bucket: None,
            settled: false,
            max_overdraft: None,
            shape: None,
        };
        let engine = super::Engine::with_rules(vec![spec], None, "layer-shape-test");
        let client = Client::memory();
        let now = |key: &str| {
            let mut keys = [key.to_owned()];
            let decided = engine
                .decide_now(&client, &mut keys, None)
                .expect("decided at once");
            (decided.is_ok(), keys[0].clone())
        };
        assert_eq!(now("rate_limit:api:v"), (true, "rate_limit:api:v".to_owned()));
        assert_eq!(
            now("api:v"),
            (true, "rate_limit:api:v".to_owned()),
            "the prefix put in front"
        );
        let general = engine
            .decide(Some(&client), &mut ["api:v".to_owned()], None)
            .await;
        assert!(
            general.is_err(),
            "one limiter: its rate of 2 spent by the two above"
        );
        // Another rule's start, under the prefix: its own limiter, hashed whole, so
        // the general path finds it spent.
        let other = "rate_limit:apix:v";
        assert_eq!(
            [now(other), now(other)],
            [(true, other.to_owned()), (true, other.to_owned())]
        );
        let general = engine
            .decide(Some(&client), &mut ["apix:v".to_owned()], None)
            .await;
        assert!(general.is_err(), "one limiter: {other} spent by the two above");
    }

    /// The Debug of the engine's layer names says nothing of the hash's keys.
    #[test]
    fn the_layer_names_debug_shows_no_hasher() {
        let names = super::LayerNames {
            prefix: "rate_limit:".into(),
            rules: Box::new([LayerName::new("rate_limit:", "api")]),
        };
        let shown = format!("{names:?}");
        assert_eq!(shown, "LayerNames { prefix: \"rate_limit:\", pass: [true], .. }");
    }
}
