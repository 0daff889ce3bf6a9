//! The decision engine: what one call of a `#[rate_limit]` function, or one request
//! through the layer, goes through before it may go on.
//!
//! An [`Engine`] holds the rules of one function (or one layer) as [`RuleSpec`]s.
//! For each call it makes every rule's limiter for the call's keys, with run-time
//! overrides (`build.rs`), refuses what no wait would let pass, has the client decide
//! the enforced rules all or nothing, and on a backend failure applies each rule's
//! `on_error` (`on_error.rs`). Shadow rules are decided after a grant and only
//! reported (`shadow.rs`). A call with settled rules is reserved instead, through the
//! same steps, and settled once the function returns (`reserve.rs`). A call nothing
//! can make wait (a layer's in-process request) is decided where it is made
//! (`now.rs`). Around it: the `redlimit.decide` span (`span.rs`), the
//! outcome counters (`crate::observe`) and the throttled log (`log.rs`). Refusals are
//! made in `refuse.rs`.
//!
//! Not a stable API: the attribute's expansion and `redlimit-edge` use it, and it
//! changes with them.

mod build;
mod call;
pub(crate) mod checks;
mod log;
mod now;
mod on_error;
mod refuse;
mod reserve;
mod shadow;
mod span;

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use once_cell::sync::Lazy;
use tokio::time::Instant;

/// Keys built from a call's values, as the attribute and the layer build them.
pub use crate::keys::key_buf::KeyBuf;
/// A token bucket rule's shape checked against its config, as a layer checks its rules
/// when it is built.
pub use crate::rules::fit::check_bucket;
pub use call::Granted;
/// A value of the request the layer serves, as a key template names it.
pub use checks::RequestValue;
/// The placeholder of a layer's template keyed by the client address.
pub const CLIENT_IP_VALUE: &str = crate::rules::registry::CLIENT_IP;
pub use reserve::{reserve, Pending};

use crate::observe::{Counted, RuleCounters};
use crate::{default_client, Client, Decision, Error, RateLimited, Rule, RuleSpec};
use call::CallKeys;
use log::{FailureLog, SettleLog, ShadowLog};

/// A call's rules, one per rule of the engine. (A vector: kept inline, they would
/// make every call's future larger, and moving it costs more than the allocation.)
pub(crate) type Rules = Vec<Rule>;

/// Every rule of one function (or layer), with its call-level settings, counters and
/// log state.
#[derive(Debug)]
pub struct Engine {
    rules: Cow<'static, [RuleSpec]>,
    timeout: Option<Duration>,
    function: &'static str,
    failures: FailureLog,
    shadows: ShadowLog,
    settles: SettleLog,
    counters: RuleCounters,
    /// Whether the rules are in this process's registry (see `rules::registry`).
    registered: AtomicBool,
    /// The rules' key templates, for their shapes, when not their names (a layer's).
    templates: Vec<String>,
    /// Whether each rule's settings, at its own rate, window and permits, pass every
    /// check a client makes of a rule's: worked out on the first call (the rules never
    /// change), so that a call's rules are not checked again each time.
    checked: std::sync::OnceLock<Box<[bool]>>,
    /// What each rule's limiters written by a layer share under the key prefix of the
    /// first call with such keys: worked out once, for that prefix.
    layer_names: std::sync::OnceLock<build::LayerNames>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        if self.registered.load(Ordering::Relaxed) {
            crate::rules::registry::forget(self.id());
        }
    }
}

/// The in-process limiters `on_error = "local"` decides on when no client could be
/// resolved (a client's own are [`Client::local`]'s).
static LOCAL: Lazy<Client> = Lazy::new(Client::memory);

impl Engine {
    /// The engine of a function's attribute: its rules, its `timeout`, its path.
    pub const fn new(rules: &'static [RuleSpec], timeout: Option<Duration>, function: &'static str) -> Self {
        Engine {
            rules: Cow::Borrowed(rules),
            timeout,
            function,
            failures: FailureLog::new(),
            shadows: ShadowLog::new(),
            settles: SettleLog::new(),
            counters: RuleCounters::new(),
            registered: AtomicBool::new(false),
            templates: Vec::new(),
            checked: std::sync::OnceLock::new(),
            layer_names: std::sync::OnceLock::new(),
        }
    }

    /// An engine whose rules are built at run time (a layer's).
    pub fn with_rules(rules: Vec<RuleSpec>, timeout: Option<Duration>, function: &'static str) -> Self {
        crate::rules::registry::register(&rules);
        let mut engine = Engine::new(&[], timeout, function);
        engine.rules = Cow::Owned(rules);
        engine
    }

    /// The key template of each rule, in the attribute's syntax (`login:{ip}`), where
    /// the rules' names are not templates (a layer's): what the registry compares.
    pub fn with_templates(mut self, templates: Vec<String>) -> Self {
        self.templates = templates;
        self
    }

    /// The rules, in the order given.
    pub fn rules(&self) -> &[RuleSpec] {
        &self.rules
    }

    /// Two rules of this engine whose limiter names may coincide for some values but that
    /// count them differently (rate, interval, mode, algorithm, burst or warm-up), by
    /// index, first found: a limiter keeps the config of the call that last wrote it, so
    /// a caller choosing the values would have the looser rule decide the stricter's
    /// calls. A layer refuses to build with them (the attribute refuses such templates
    /// at compile time, knowing which values are an integer's digits).
    pub fn coinciding_rules(&self) -> Option<(usize, usize)> {
        let shapes: Vec<_> = (0..self.rules.len())
            .map(|i| self.shape_and_counting("", i))
            .collect();
        (0..shapes.len())
            .flat_map(|j| (0..j).map(move |i| (i, j)))
            .find(|&(i, j)| shapes[i].0.overlaps(&shapes[j].0) && shapes[i].1 != shapes[j].1)
    }

    /// Rule `i`'s shape under `prefix` and how it counts, for the registry.
    fn shape_and_counting(
        &self,
        prefix: &str,
        i: usize,
    ) -> (crate::rules::registry::Shape, crate::rules::registry::Counting) {
        use crate::rules::registry;
        let spec = &self.rules[i];
        let template = match self.templates.get(i) {
            Some(template) => template.as_str(),
            None => spec.shape.as_deref().unwrap_or(&spec.name),
        };
        let counting = registry::Counting {
            rate: spec.rate,
            interval: spec.interval,
            mode: spec.mode,
            bucket: spec.bucket,
        };
        (registry::Shape::of_template(prefix, template), counting)
    }

    fn count(&self, rule: usize, outcome: Counted) {
        let names = || self.rules.iter().map(|r| r.name.clone()).collect();
        self.counters.count(names, rule, outcome);
    }

    /// Puts the rules in this process's registry, once: for override checks, and to
    /// find rules of other functions that overlap them.
    fn register(&self, client: &Client) {
        use crate::rules::registry;
        registry::register(&self.rules);
        let shapes: Vec<(String, registry::Shape, registry::Counting)> = (0..self.rules.len())
            .map(|i| {
                let (shape, counting) = self.shape_and_counting(client.prefix(), i);
                (self.rules[i].name.to_string(), shape, counting)
            })
            .collect();
        registry::place(self.id(), &client.backend().store(), &shapes);
        self.registered.store(true, Ordering::Relaxed);
    }

    /// The refusal of a call whose rules overlap another function's (the rules put in
    /// the registry on the first call, under `client`'s prefix).
    #[inline]
    fn overlapping(&self, client: &Client, rules: &[Rule]) -> Option<RateLimited> {
        if !self.registered.load(Ordering::Relaxed) {
            self.register(client);
        }
        let overlap = crate::rules::registry::conflict_of(self.id())?;
        Some(self.misuse(rules, 0, overlap))
    }

    /// This engine in the registry: its address, stable while it lives.
    fn id(&self) -> usize {
        self as *const Engine as usize
    }

    /// Decides every rule of one call: `Ok` to go on, with the tightest enforced rule
    /// when the backend decided; `Err` with the refusal.
    ///
    /// `client` defaults to [`default_client`]. `permits`, one per rule, replaces the
    /// rules' own for this call (a cost per request); 0 means the rule does not apply
    /// to this call (an exempt key). A call asking a rule for more than its rate is
    /// refused at once, without `retry_after`: no wait would let it pass.
    pub async fn decide(
        &self,
        client: Option<&Client>,
        keys: &mut [String],
        permits: Option<&[u64]>,
    ) -> Result<Granted, RateLimited> {
        // No span at all when nothing could record a debug one (the usual production
        // set-up): making a disabled span still costs a dispatcher lookup.
        if !tracing::level_enabled!(tracing::Level::DEBUG) {
            return self
                .decide_in_span(client, CallKeys::new(keys, permits), false)
                .await;
        }
        let span = span::decide_span(&self.rules);
        if span.is_disabled() {
            return self
                .decide_in_span(client, CallKeys::new(keys, permits), false)
                .await;
        }
        // Boxed: the span's state would otherwise be moved with every call's future.
        Box::pin(self.decide_traced(span, client, CallKeys::new(keys, permits))).await
    }

    /// The decision inside its span, recorded.
    async fn decide_traced(
        &self,
        span: tracing::Span,
        client: Option<&Client>,
        call: CallKeys<'_>,
    ) -> Result<Granted, RateLimited> {
        let decided = self.decide_in_span(client, call, true);
        let decided = tracing::Instrument::instrument(decided, span.clone()).await;
        span::record(&span, decided.as_ref());
        decided
    }

    /// `traced`: the decision's span is recorded (a subscriber wants it).
    async fn decide_in_span(
        &self,
        client: Option<&Client>,
        mut call: CallKeys<'_>,
        traced: bool,
    ) -> Result<Granted, RateLimited> {
        tracing::trace!(keys = ?call.keys, "redlimit keys");
        let deadline = self.timeout.map(crate::client::waiting::deadline_in);
        let client = match client {
            Some(client) => client,
            None => match default_client() {
                Ok(client) => client,
                // Boxed, here and below: the rare paths' state would otherwise be moved
                // along with every call's future.
                Err(error) => return Box::pin(self.without_client(&mut call, error, deadline)).await,
            },
        };
        if traced {
            tracing::Span::current().record("backend", client.backend().label());
        }
        let (rules, failed) = self.checked_rules(client, &mut call, false).await?;
        self.enforce(client, &call, rules, failed, deadline).await
    }

    /// The call's rules on `client`, its run-time overrides applied, once they pass the
    /// checks made before the backend: no rule of another function overlapping, no
    /// settled estimate of 0 (when `reserving`), no call that no wait would let pass.
    /// With them, the failure that decides the call without the backend: the client's
    /// first read of the overrides timed out (the server does not answer; a decision
    /// sent after it would wait a second timeout).
    async fn checked_rules(
        &self,
        client: &Client,
        call: &mut CallKeys<'_>,
        reserving: bool,
    ) -> Result<(Rules, Option<Error>), RateLimited> {
        let (overrides, failed) = match client.background_ready().await {
            Ok(overrides) => (overrides, None),
            Err(timeout) => (client.overrides().table(), Some(timeout)),
        };
        let rules: Rules = self.build_rules(client.prefix(), call, Some((client, &overrides)));
        if let Some(overlapping) = self.overlapping(client, &rules) {
            return Err(overlapping);
        }
        if let Some(zero) = reserving.then(|| self.estimated_at_zero(call, &rules)).flatten() {
            return Err(zero);
        }
        if let Some(mut never) = self.never_passes(call, &rules) {
            client.note_refused(never.key(), &self.rules[never.rule()].name);
            // What the key has left, which no wait brings to what the call asks.
            if failed.is_none() {
                never.remaining = client.left_of(&rules[never.rule()]).await.unwrap_or(0);
            }
            return Err(never);
        }
        Ok((rules, failed))
    }

    /// No client could be made (`REDIS_URL` names no server, say): `on_error` on the
    /// process's own limiters for a backend failure, refused for anything else.
    async fn without_client(
        &self,
        call: &mut CallKeys<'_>,
        error: Error,
        deadline: Option<Instant>,
    ) -> Result<Granted, RateLimited> {
        let rules: Rules = self.build_rules(crate::DEFAULT_PREFIX, call, None);
        if let Some(never) = self.never_passes(call, &rules) {
            return Err(never);
        }
        // A URL that names no server is misuse, not an outage: refused.
        if !error.is_backend_failure() {
            return Err(self.misuse(&rules, 0, error));
        }
        self.on_error(call, rules, error, deadline, &LOCAL)
            .await
            .map(|()| Granted::default())
    }

    /// Has `client` decide the enforced rules of `rules` (all or nothing); then the
    /// grant, the refusal, or `on_error`.
    async fn enforce(
        &self,
        client: &Client,
        call: &CallKeys<'_>,
        rules: Rules,
        failed: Option<Error>,
        deadline: Option<Instant>,
    ) -> Result<Granted, RateLimited> {
        // Every rule enforced and taking its own permits: the attribute's usual case,
        // decided on `rules` as built. Otherwise the enforced rules, and where each is
        // among all of them.
        let as_built = call.permits.is_none() && !self.rules.iter().any(|r| r.shadow);
        let (enforced, index): (Vec<Rule>, Vec<usize>) = if as_built {
            (Vec::new(), Vec::new())
        } else {
            rules
                .iter()
                .enumerate()
                .filter(|(i, _)| !self.rules[*i].shadow && call.applies(*i))
                .map(|(i, r)| (r.clone(), i))
                .unzip()
        };
        let (enforced, position): (&[Rule], &(dyn Fn(usize) -> usize + Sync)) = if as_built {
            (&rules, &|i| i)
        } else {
            (&enforced, &|i| index[i])
        };
        let decided = match failed {
            Some(failed) => Err(failed),
            None if enforced.is_empty() => Ok(None),
            None => self.check(client, enforced, deadline).await.map(Some),
        };
        match decided {
            Ok(Some(decision)) if !decision.allowed => {
                Err(self.refused_by(client, enforced, &decision, position))
            }
            Ok(decision) => {
                if decision.is_some() {
                    self.failures.succeeded(self.function);
                }
                if !as_built {
                    // Boxed: only engines with shadow rules (or costs) carry its state.
                    Box::pin(self.shadow(client, &rules, call)).await;
                }
                Ok(self.granted(call, enforced, decision.as_ref(), position))
            }
            // on_error is for the backend failing; anything else refuses.
            Err(error) if error.is_backend_failure() => {
                Box::pin(self.on_error(call, rules, error, deadline, client.local()))
                    .await
                    .map(|()| Granted::default())
            }
            Err(error) => Err(self.misuse(enforced, position(0), error)),
        }
    }

    /// The refusal of `decision` on the `enforced` rules, counted and reported.
    fn refused_by(
        &self,
        client: &Client,
        enforced: &[Rule],
        decision: &Decision,
        position: &dyn Fn(usize) -> usize,
    ) -> RateLimited {
        self.failures.succeeded(self.function);
        let refusal = self.refusal(enforced, decision, position);
        client.note_refused(refusal.key(), &self.rules[refusal.rule()].name);
        refusal
    }

    /// A grant: every enforced rule counted as allowed, and the tightest of them.
    #[inline]
    fn granted(
        &self,
        call: &CallKeys<'_>,
        enforced: &[Rule],
        decision: Option<&Decision>,
        position: &dyn Fn(usize) -> usize,
    ) -> Granted {
        for i in (0..self.rules.len()).filter(|&i| !self.rules[i].shadow && call.applies(i)) {
            self.count(i, Counted::Allowed);
        }
        let tightest = decision.and_then(|d| Some((d.tightest?, d.remaining)));
        Granted {
            tightest: tightest.map(|(i, remaining)| (position(i), remaining)),
            decided: tightest
                .and_then(|(i, _)| enforced.get(i))
                .map(|rule| (rule.config().rate, rule.config().interval)),
        }
    }

    /// Decides `rules`, waiting until `deadline` when the function has a `timeout`.
    async fn check(
        &self,
        client: &Client,
        rules: &[Rule],
        deadline: Option<Instant>,
    ) -> Result<Decision, Error> {
        match deadline {
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                Box::pin(client.check_rules_for(rules, left)).await
            }
            None => client.check_rules(rules).await,
        }
    }
}

/// Decides every rule of an attribute's call: `Ok` to run the body, `Err` with the
/// refusal.
pub async fn decide(engine: &'static Engine, keys: &mut [String]) -> Result<(), RateLimited> {
    engine.decide(None, keys, None).await.map(|_| ())
}

/// Decides every rule of an attribute's call with its `cost`s: `permits` holds one per
/// rule (a `cost`, or the rule's own permits; 0: the rule does not apply).
pub async fn decide_with(
    engine: &'static Engine,
    keys: &mut [String],
    permits: &[u64],
) -> Result<(), RateLimited> {
    engine.decide(None, keys, Some(permits)).await.map(|_| ())
}
