//! A call decided where it is made, for a call nothing can make wait (an in-process
//! client, no timeout, no shadow rule, no debug span): a layer's in-process requests
//! are decided here, with no future made for the decision.

use std::sync::atomic::Ordering;

use super::call::{CallKeys, Granted, Written};
use super::{Engine, Rules};
use crate::backend::memory::RuleDecision;
use crate::observe::Counted;
use crate::{Client, Decision, Error, RateLimited, Rule};

impl Engine {
    /// [`decide`](Engine::decide) where it is called, for a call that nothing can make
    /// wait: an in-process `client`, no `timeout`, the rules' own permits, no shadow
    /// rules, no debug span to record. `None`, before anything is built or decided, for
    /// any other call, which [`decide`](Engine::decide) then takes. Spares a call the
    /// futures of the general path (a layer's in-process requests take it).
    ///
    /// `keys` are a layer's, each written after `client`'s prefix: the prefix, the
    /// rule's name, alone or followed by `:` and a value written by [`KeyBuf`]'s value
    /// methods (escaped: no brace), so that a rule whose name passes for every such
    /// value is not checked again on every call. A decided call gives each key back as
    /// its limiter's name: its buffer, for the caller to write a next call's key into.
    /// `None` gives them back without the prefix, as [`decide`](Engine::decide) takes
    /// them. A key of another shape is taken as a caller's key is: the prefix put in
    /// front unless it is there, its name hashed and checked whole.
    pub fn decide_now(
        &self,
        client: &Client,
        keys: &mut [String],
        permits: Option<&[u64]>,
    ) -> Option<Result<Granted, RateLimited>> {
        if self.timeout.is_some()
            || permits.is_some()
            || !client.is_memory()
            || self.rules.iter().any(|r| r.shadow)
            || tracing::level_enabled!(tracing::Level::DEBUG)
        {
            for key in keys.iter_mut().filter(|key| key.starts_with(client.prefix())) {
                key.drain(..client.prefix().len());
            }
            return None;
        }
        // Every rule enforced, in the order given: decided on the rules as built (held
        // where they are made: no future carries them; one rule, the usual, without a
        // vector); then each name given back to its key, a buffer for the caller.
        if let ([key], 1) = (&mut *keys, self.rules.len()) {
            if let Some(decided) = self.decide_layer_rule(client, key) {
                return Some(decided);
            }
            let overrides = client.overrides().table();
            let overrides = Some((client, &*overrides));
            let rule = self.build_rule(0, client.prefix(), key, None, overrides, Written::Layer);
            let decided = self.decided_now(client, std::slice::from_ref(&rule));
            *key = rule.into_name();
            return decided;
        }
        let mut call = CallKeys {
            keys,
            permits: None,
            written: Written::Layer,
        };
        let overrides = client.overrides().table();
        let overrides = Some((client, &*overrides));
        let rules: Rules = self.build_rules(client.prefix(), &mut call, overrides);
        let decided = self.decided_now(client, &rules);
        for (key, rule) in call.keys.iter_mut().zip(rules) {
            *key = rule.into_name();
        }
        decided
    }

    /// [`decide_now`](Engine::decide_now)'s one rule, its `key` of a layer's shape,
    /// decided on the rule's own settings, with no rule built for the call: when no
    /// override is set, the rule's names and settings passed the checks once, and the
    /// rules are in the registry with no other function's overlapping them. A grant is
    /// answered here; anything else as [`decided_now`](Engine::decided_now) answers it,
    /// out of line. `None`, before anything is decided, for any other call.
    #[inline]
    pub(super) fn decide_layer_rule(
        &self,
        client: &Client,
        key: &str,
    ) -> Option<Result<Granted, RateLimited>> {
        let layer = self.layer_name(0, client.prefix())?;
        let settings = layer.settings.as_ref()?;
        if client.overrides().any()
            || !self.registered.load(Ordering::Relaxed)
            || crate::rules::registry::conflict_of(self.id()).is_some()
        {
            return None;
        }
        let hash = layer.hash_of(key)?;
        debug_assert!(
            crate::keys::check_name(key).is_ok() && crate::keys::library_key(client.prefix(), key).is_none(),
            "{key} is not a name a layer writes"
        );
        let memory = client.backend().in_process()?;
        match client.decide_named_in_process(memory, settings, key, hash) {
            Ok(RuleDecision::Usual(usual)) if usual.granted => {
                self.failures.succeeded(self.function);
                self.count(0, Counted::Allowed);
                let config = settings.config();
                Some(Ok(Granted {
                    tightest: Some((0, usual.left)),
                    decided: Some((config.rate, config.interval)),
                }))
            }
            decided => Some(self.layer_rule_answer(client, key, decided)),
        }
    }

    /// The answer to [`decide_layer_rule`](Engine::decide_layer_rule)'s decision other
    /// than a grant of the usual call: on the rule built for the call, as it would have
    /// been decided on.
    #[cold]
    #[inline(never)]
    pub(super) fn layer_rule_answer(
        &self,
        client: &Client,
        key: &str,
        decided: Result<RuleDecision, Error>,
    ) -> Result<Granted, RateLimited> {
        let rule = self.build_rule(
            0,
            client.prefix(),
            &mut key.to_owned(),
            None,
            None,
            Written::Layer,
        );
        let rules = std::slice::from_ref(&rule);
        self.answer_now(client, rules, client.other_answer(&rule, decided))
    }

    /// [`decide_now`](Engine::decide_now)'s decision of the call's rules as built (with
    /// the rules' own permits).
    #[inline]
    pub(super) fn decided_now(
        &self,
        client: &Client,
        rules: &[Rule],
    ) -> Option<Result<Granted, RateLimited>> {
        if let Some(overlapping) = self.overlapping(client, rules) {
            return Some(Err(overlapping));
        }
        Some(self.answer_now(client, rules, client.decide_in_process(rules)?))
    }

    /// The answer to the client's decision on a call's rules as built, decided at once.
    #[inline]
    pub(super) fn answer_now(
        &self,
        client: &Client,
        rules: &[Rule],
        decided: Result<Decision, Error>,
    ) -> Result<Granted, RateLimited> {
        match decided {
            Ok(decision) if !decision.allowed => Err(self.refused_by(client, rules, &decision, &|i| i)),
            Ok(decision) => {
                self.failures.succeeded(self.function);
                let own_permits = CallKeys::new(&mut [], None);
                Ok(self.granted(&own_permits, rules, Some(&decision), &|i| i))
            }
            // In process nothing fails as a backend does (a full table, a rule that
            // cannot be kept are misuse): refused, as `decide` refuses misuse.
            Err(error) => {
                debug_assert!(!error.is_backend_failure(), "{error}");
                Err(self.misuse(rules, 0, error))
            }
        }
    }
}
