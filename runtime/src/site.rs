//! The call site of `#[rate_limit]` (and of the HTTP layer): a set of rules, the
//! decision before the call, the `on_error` policies, and the throttled failure log.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use once_cell::sync::Lazy;
use tokio::time::Instant;

use crate::observe::{RuleOutcome, SiteCounters};
use crate::overrides::Table;
use crate::{default_client, Client, Decision, Error, RateLimited, RateType, Rule};

/// What a rule does when the backend fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Decide on an in-process limiter with the same rule.
    Local,
    /// Let the call through.
    Allow,
    /// Refuse the call, with the failure as the cause.
    Deny,
}

/// One `#[rate_limit]` attribute, checked at compile time (or one rule of a layer,
/// checked when the layer is built).
#[derive(Debug, Clone)]
pub struct RuleSpec {
    /// The key template as written, the function's path, or a layer rule's name: a
    /// bounded name (`Cow::Borrowed` in the attribute's statics).
    pub name: Cow<'static, str>,
    /// Decided and reported, never refusing (to roll out a new limit safely).
    pub shadow: bool,
    /// Whether a refusal Redis gave may be answered again in process until its wait
    /// ends ([`Rule::local_refusals`]).
    pub local_refusals: bool,
    pub rate: u64,
    pub interval: Duration,
    pub mode: RateType,
    pub permits: u64,
    pub on_error: OnError,
    pub message: Option<Cow<'static, str>>,
    /// `Some`: a token bucket of this shape; `None`: a sliding window.
    pub bucket: Option<crate::BucketShape>,
}

impl RuleSpec {
    pub fn limit(&self) -> crate::Limit {
        crate::Limit {
            name: self.name.clone(),
            rate: self.rate,
            window: self.interval,
        }
    }
}

/// Every rule of one function (or layer), with its call-level settings and failure
/// log state.
#[derive(Debug)]
pub struct Site {
    rules: Cow<'static, [RuleSpec]>,
    timeout: Option<Duration>,
    function: &'static str,
    last_log_ms: AtomicU64,
    suppressed: AtomicU64,
    /// Failed calls since the last success, and when the first of them failed.
    failing: AtomicU64,
    failing_since_ms: AtomicU64,
    /// When a shadow rule's refusal was last logged, and those left out since.
    shadow_logged_ms: AtomicU64,
    shadow_suppressed: AtomicU64,
    counters: SiteCounters,
    /// Whether the rules are in this process's registry (see `registry`).
    registered: std::sync::atomic::AtomicBool,
    /// The rules' key templates, for their shapes, when not their names (a layer's).
    templates: Vec<String>,
}

impl Drop for Site {
    fn drop(&mut self) {
        if self.registered.load(Ordering::Relaxed) {
            crate::registry::forget(self.id());
        }
    }
}

/// Backend failures of one function are logged at most this often.
const LOG_EVERY_MS: u64 = 10_000;

/// The in-process limiters `on_error = "local"` decides on when no client could be
/// resolved (a client's own are [`Client::local`]'s).
static LOCAL: Lazy<Client> = Lazy::new(Client::memory);

impl Site {
    pub const fn new(rules: &'static [RuleSpec], timeout: Option<Duration>, function: &'static str) -> Self {
        Site {
            rules: Cow::Borrowed(rules),
            timeout,
            function,
            last_log_ms: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
            failing: AtomicU64::new(0),
            failing_since_ms: AtomicU64::new(0),
            shadow_logged_ms: AtomicU64::new(0),
            shadow_suppressed: AtomicU64::new(0),
            counters: SiteCounters::new(),
            registered: std::sync::atomic::AtomicBool::new(false),
            templates: Vec::new(),
        }
    }

    fn count(&self, rule: usize, outcome: RuleOutcome) {
        self.counters.count(&self.rules, rule, outcome);
    }

    /// A site whose rules are built at run time (a layer's).
    pub fn with_rules(rules: Vec<RuleSpec>, timeout: Option<Duration>, function: &'static str) -> Self {
        crate::registry::register(&rules);
        let mut site = Site::new(&[], timeout, function);
        site.rules = Cow::Owned(rules);
        site
    }

    /// The key template of each rule, in the attribute's syntax (`login:{ip}`), where
    /// the rules' names are not templates (a layer's): what the registry compares.
    pub fn with_templates(mut self, templates: Vec<String>) -> Self {
        self.templates = templates;
        self
    }

    /// Puts the rules in this process's registry, once: for override checks, and to
    /// find rules of other functions that overlap them.
    fn register(&self, prefix: &str) {
        crate::registry::register(&self.rules);
        let shapes: Vec<(String, crate::registry::Shape)> = self
            .rules
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                let template = self.templates.get(i).map_or(&*spec.name, String::as_str);
                (
                    spec.name.to_string(),
                    crate::registry::Shape::of_template(prefix, template),
                )
            })
            .collect();
        crate::registry::place(self.id(), &shapes);
        self.registered.store(true, Ordering::Relaxed);
    }

    /// This site in the registry: its address, stable while it lives.
    fn id(&self) -> usize {
        self as *const Site as usize
    }

    /// The rules, in the order given.
    pub fn rules(&self) -> &[RuleSpec] {
        &self.rules
    }

    /// Shadow rules are decided after the enforced ones granted, on their own: each
    /// takes its permits when it has them, and a refusal is only reported (a warning
    /// at most once per 10 s per function, with the number left out).
    async fn shadow(&self, client: &Client, rules: &[Rule], call: &Call<'_>) {
        let shadow: Vec<(usize, Rule)> = rules
            .iter()
            .enumerate()
            .filter(|(i, _)| self.rules[*i].shadow && call.applies(*i))
            .map(|(i, r)| (i, r.clone()))
            .collect();
        for (index, rule) in shadow {
            let refused = match client.check_rules(std::slice::from_ref(&rule)).await {
                Ok(decision) if !decision.allowed => decision.retry_after,
                // A shadow rule never refuses, not even when it cannot be decided.
                _ => continue,
            };
            self.count(index, RuleOutcome::ShadowLimited);
            let now = epoch_ms();
            let last = self.shadow_logged_ms.load(Ordering::Relaxed);
            if now.saturating_sub(last) >= LOG_EVERY_MS
                && self
                    .shadow_logged_ms
                    .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                let suppressed = self.shadow_suppressed.swap(0, Ordering::Relaxed);
                tracing::warn!(
                    function = self.function,
                    rule = &*self.rules[index].name,
                    retry_after_ms = refused.map_or(0, |d| d.as_millis() as u64),
                    suppressed,
                    "shadow rate limit would have refused this call; it was let through"
                );
            } else {
                self.shadow_suppressed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Every rule's limiter for this call (rules that do not apply included, with the
    /// permits 0 they never spend), at the overridden rate and interval where the
    /// client has an override for the limiter or its rule.
    fn build_rules(&self, prefix: &str, call: &Call<'_>, overrides: Option<(&Client, &Table)>) -> Vec<Rule> {
        let overrides = overrides.filter(|(_, table)| !table.is_empty());
        self.rules
            .iter()
            .zip(call.keys)
            .enumerate()
            .map(|(i, (spec, key))| {
                let mut name = String::with_capacity(prefix.len() + key.len());
                name.push_str(prefix);
                name.push_str(key);
                let permits = call.permits(i, spec);
                // An override the rule cannot take (set by hand in Redis) is ignored,
                // with a warning: the rule's own rate applies, never an error.
                let (rate, interval) = match overrides
                    .and_then(|(c, t)| Some((c, t.lookup(&spec.name, &name)?)))
                {
                    Some((client, (rate, interval))) => {
                        match crate::registry::fits(&spec.name, spec.permits, spec.bucket, rate, interval) {
                            Ok(()) => (rate, interval),
                            Err(error) => {
                                client
                                    .overrides()
                                    .warn_unusable(&spec.name, &error, client.now_ms());
                                (spec.rate, spec.interval)
                            }
                        }
                    }
                    None => (spec.rate, spec.interval),
                };
                let rule = Rule::new(name, rate, interval)
                    .mode(spec.mode)
                    .permits(permits)
                    .local_refusals(spec.local_refusals);
                match spec.bucket {
                    Some(shape) => rule
                        .algorithm(crate::Algorithm::TokenBucket)
                        .burst(shape.burst)
                        .warmup(Duration::from_millis(shape.warmup_ms)),
                    None => rule,
                }
            })
            .collect()
    }

    /// Rule `i`'s limit as decided: its name, and its rate and window after overrides.
    fn limit_of(&self, i: usize, rule: Option<&Rule>) -> crate::Limit {
        let mut limit = self.rules[i].limit();
        if let Some(rule) = rule {
            limit.rate = rule.config().rate;
            limit.window = rule.config().interval;
        }
        limit
    }

    /// The first enforced rule this call asks for more permits than its rate: no wait
    /// would let the call pass.
    fn never_passes(&self, call: &Call<'_>, rules: &[Rule]) -> Option<RateLimited> {
        call.permits?;
        let i = (0..rules.len()).find(|&i| {
            !self.rules[i].shadow && call.applies(i) && rules[i].permits_per_call() > rules[i].most_permits()
        })?;
        self.count(i, RuleOutcome::Limited);
        Some(RateLimited {
            key: rules[i].name().to_owned(),
            retry_after: None,
            message: self.rules[i].message.clone(),
            rule: i,
            cause: None,
            limit: Some(Box::new(self.limit_of(i, Some(&rules[i])))),
            x_ratelimit: false,
        })
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
                client.check_rules_for(rules, left).await
            }
            None => client.check_rules(rules).await,
        }
    }

    fn refusal(&self, rules: &[Rule], decision: &Decision, index: impl Fn(usize) -> usize) -> RateLimited {
        let refused = decision.refused_by.unwrap_or(0);
        let rule = index(refused);
        self.count(rule, RuleOutcome::Limited);
        RateLimited {
            key: rules
                .get(refused)
                .map_or_else(String::new, |r| r.name().to_owned()),
            retry_after: decision.retry_after,
            message: self.rules[rule].message.clone(),
            rule,
            cause: None,
            limit: Some(Box::new(self.limit_of(rule, rules.get(refused)))),
            x_ratelimit: false,
        }
    }

    fn log_failure(&self, error: &Error) {
        let now = epoch_ms();
        if self.failing.fetch_add(1, Ordering::Relaxed) == 0 {
            self.failing_since_ms.store(now, Ordering::Relaxed);
        }
        let last = self.last_log_ms.load(Ordering::Relaxed);
        let due = now.saturating_sub(last) >= LOG_EVERY_MS;
        if due
            && self
                .last_log_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let suppressed = self.suppressed.swap(0, Ordering::Relaxed);
            if error.is_backend_failure() {
                tracing::error!(
                    function = self.function,
                    suppressed,
                    "rate limiter backend failed, applying on_error: {error}"
                );
            } else {
                tracing::error!(
                    function = self.function,
                    suppressed,
                    "rate limiter misconfigured, refusing the call: {error}"
                );
            }
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// After failures, the first decision the backend makes again ends the outage in
    /// the log: one line, with how many calls failed over how long.
    fn note_success(&self) {
        if self.failing.load(Ordering::Relaxed) == 0 {
            return;
        }
        let failed = self.failing.swap(0, Ordering::Relaxed);
        if failed > 0 {
            let since = self.failing_since_ms.load(Ordering::Relaxed);
            let over = Duration::from_millis(epoch_ms().saturating_sub(since));
            tracing::warn!(
                function = self.function,
                failed_calls = failed,
                "rate limiter backend recovered after {failed} failed calls over {over:?}"
            );
        }
    }

    /// A call that cannot be decided for a reason other than the backend (a prefix
    /// that splits cluster slots, say): refused, never let through unlimited.
    /// `first` is the attribute index of `rules[0]`, the rule the refusal names.
    fn misuse(&self, rules: &[Rule], first: usize, error: Error) -> RateLimited {
        self.log_failure(&error);
        self.count(first, RuleOutcome::ErrorDenied);
        RateLimited {
            key: rules.first().map_or_else(String::new, |r| r.name().to_owned()),
            retry_after: None,
            message: self.rules[first].message.clone(),
            rule: first,
            cause: Some(Arc::new(error)),
            limit: Some(Box::new(self.rules[first].limit())),
            x_ratelimit: false,
        }
    }

    /// A call whose key for `rule` cannot be built from what the caller sent (a layer
    /// mounted where the value it reads never exists): refused and logged as a
    /// misconfiguration, never let through unlimited.
    pub fn refuse_misconfigured(&self, rule: usize, error: Error) -> RateLimited {
        self.log_failure(&error);
        self.count(rule, RuleOutcome::ErrorDenied);
        RateLimited {
            key: String::new(),
            retry_after: None,
            message: self.rules[rule].message.clone(),
            rule,
            cause: Some(Arc::new(error)),
            limit: Some(Box::new(self.rules[rule].limit())),
            x_ratelimit: false,
        }
    }

    /// A request without a value for `rule`'s key, under a rule that refuses such
    /// requests (a layer's): refused with `error` as the cause, nothing spent, nothing
    /// logged (it is the caller's doing, not the service's).
    pub fn refuse_without_key(&self, rule: usize, error: Error) -> RateLimited {
        RateLimited {
            key: String::new(),
            retry_after: None,
            message: self.rules[rule].message.clone(),
            rule,
            cause: Some(Arc::new(error)),
            limit: Some(Box::new(self.rules[rule].limit())),
            x_ratelimit: false,
        }
    }

    /// The `on_error` policies: any `deny` rule refuses; else the `local` rules are
    /// decided in process (all or nothing) and the `allow` rules pass.
    /// The local decision shares the call's deadline, so a failure part-way through a
    /// wait does not make the caller wait twice.
    async fn on_error(
        &self,
        call: &Call<'_>,
        rules: Vec<Rule>,
        error: Error,
        deadline: Option<Instant>,
        fallback: &Client,
    ) -> Result<(), RateLimited> {
        self.log_failure(&error);
        let enforced = |i: usize| !self.rules[i].shadow && call.applies(i);
        // `allow` is for an outage; a failure that persists until someone acts (state
        // another program wrote, credentials, a full server) is decided in process.
        let policy = |i: usize| match self.rules[i].on_error {
            OnError::Allow if !error.is_transient() => OnError::Local,
            policy => policy,
        };
        for i in (0..rules.len()).filter(|&i| enforced(i)) {
            let outcome = match policy(i) {
                OnError::Allow => RuleOutcome::ErrorAllowed,
                OnError::Deny => RuleOutcome::ErrorDenied,
                OnError::Local => RuleOutcome::ErrorLocal,
            };
            self.count(i, outcome);
        }
        if let Some(rule) = (0..rules.len()).find(|&i| policy(i) == OnError::Deny && enforced(i)) {
            return Err(RateLimited {
                key: rules[rule].name().to_owned(),
                retry_after: None,
                message: self.rules[rule].message.clone(),
                rule,
                cause: Some(Arc::new(error)),
                limit: Some(Box::new(self.limit_of(rule, rules.get(rule)))),
                x_ratelimit: false,
            });
        }
        let local: Vec<usize> = (0..rules.len())
            .filter(|&i| policy(i) == OnError::Local && enforced(i))
            .collect();
        if local.is_empty() {
            return Ok(());
        }
        let local_rules: Vec<Rule> = local.iter().map(|&i| rules[i].clone()).collect();
        match self.check(fallback, &local_rules, deadline).await {
            Ok(decision) if decision.allowed => Ok(()),
            Ok(decision) => Err(self.refusal(&local_rules, &decision, |i| local[i])),
            // The rules cannot be enforced anywhere: refused, never let through.
            Err(local_error) => Err(self.misuse(&local_rules, local[0], local_error)),
        }
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
        keys: &[String],
        permits: Option<&[u64]>,
    ) -> Result<Granted, RateLimited> {
        let span = tracing::debug_span!(
            "redlimit.decide",
            rules = %RuleNames(&self.rules),
            backend = tracing::field::Empty,
            outcome = tracing::field::Empty,
            remaining = tracing::field::Empty,
            retry_after_ms = tracing::field::Empty,
            waited_ms = tracing::field::Empty,
        );
        if span.is_disabled() {
            return self.decide_in_span(client, keys, permits).await;
        }
        let decided =
            tracing::Instrument::instrument(self.decide_in_span(client, keys, permits), span.clone()).await;
        match &decided {
            Ok(granted) => {
                span.record("outcome", "allowed");
                if let Some((_, remaining)) = granted.tightest {
                    span.record("remaining", remaining);
                }
            }
            Err(limited) => {
                span.record(
                    "outcome",
                    if limited.cause.is_some() {
                        "error_denied"
                    } else {
                        "limited"
                    },
                );
                if let Some(wait) = limited.retry_after {
                    span.record("retry_after_ms", wait.as_millis() as u64);
                }
            }
        }
        decided
    }

    async fn decide_in_span(
        &self,
        client: Option<&Client>,
        keys: &[String],
        permits: Option<&[u64]>,
    ) -> Result<Granted, RateLimited> {
        tracing::trace!(?keys, "redlimit keys");
        let call = Call { keys, permits };
        let deadline = self.timeout.map(|timeout| Instant::now() + timeout);
        let client = match client {
            Some(client) => client,
            None => match default_client() {
                Ok(client) => client,
                Err(error) => {
                    let rules = self.build_rules(crate::DEFAULT_PREFIX, &call, None);
                    if let Some(never) = self.never_passes(&call, &rules) {
                        return Err(never);
                    }
                    // A URL that names no server is misuse, not an outage: refused.
                    if !error.is_backend_failure() {
                        return Err(self.misuse(&rules, 0, error));
                    }
                    return self
                        .on_error(&call, rules, error, deadline, &LOCAL)
                        .await
                        .map(|()| Granted::default());
                }
            },
        };
        tracing::Span::current().record("backend", client.backend().label());
        let overrides = client.background_ready().await;
        let rules = self.build_rules(client.prefix(), &call, Some((client, &overrides)));
        if !self.registered.load(Ordering::Relaxed) {
            self.register(client.prefix());
        }
        if let Some(overlap) = crate::registry::conflict_of(self.id()) {
            return Err(self.misuse(&rules, 0, overlap));
        }
        if let Some(never) = self.never_passes(&call, &rules) {
            client.note_refused(never.key(), &self.rules[never.rule()].name);
            return Err(never);
        }
        // Every rule enforced and taking its own permits: the attribute's usual case,
        // decided on `rules` as built.
        let plain = permits.is_none() && !self.rules.iter().any(|r| r.shadow);
        // Otherwise the enforced rules, and where each is among all of them.
        let (enforced, index): (Vec<Rule>, Vec<usize>) = if plain {
            (Vec::new(), Vec::new())
        } else {
            rules
                .iter()
                .enumerate()
                .filter(|(i, _)| !self.rules[*i].shadow && call.applies(*i))
                .map(|(i, r)| (r.clone(), i))
                .unzip()
        };
        let (enforced, position): (&[Rule], &(dyn Fn(usize) -> usize + Sync)) = if plain {
            (&rules, &|i| i)
        } else {
            (&enforced, &|i| index[i])
        };
        let decided = if enforced.is_empty() {
            Ok(None)
        } else {
            self.check(client, enforced, deadline).await.map(Some)
        };
        match decided {
            Ok(decision) => {
                if decision.is_some() {
                    self.note_success();
                }
                match decision {
                    Some(decision) if !decision.allowed => {
                        let refusal = self.refusal(enforced, &decision, position);
                        client.note_refused(refusal.key(), &self.rules[refusal.rule()].name);
                        Err(refusal)
                    }
                    _ => {
                        for i in (0..rules.len()).filter(|&i| !self.rules[i].shadow && call.applies(i)) {
                            self.count(i, RuleOutcome::Allowed);
                        }
                        if !plain {
                            self.shadow(client, &rules, &call).await;
                        }
                        let tightest = decision.as_ref().and_then(|d| Some((d.tightest?, d.remaining)));
                        Ok(Granted {
                            tightest: tightest.map(|(i, remaining)| (position(i), remaining)),
                            decided: tightest
                                .and_then(|(i, _)| enforced.get(i))
                                .map(|rule| (rule.config().rate, rule.config().interval)),
                        })
                    }
                }
            }
            // on_error is for the backend failing; anything else refuses.
            Err(error) if error.is_backend_failure() => self
                .on_error(&call, rules, error, deadline, client.local())
                .await
                .map(|()| Granted::default()),
            Err(error) => Err(self.misuse(enforced, position(0), error)),
        }
    }
}

/// The rules' names, comma-separated: a span field.
struct RuleNames<'a>(&'a [RuleSpec]);

impl std::fmt::Display for RuleNames<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, rule) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(&rule.name)?;
        }
        Ok(())
    }
}

/// One call's keys, one per rule, and the permits it takes of each when not the
/// rules' own.
struct Call<'a> {
    keys: &'a [String],
    permits: Option<&'a [u64]>,
}

impl Call<'_> {
    fn permits(&self, rule: usize, spec: &RuleSpec) -> u64 {
        self.permits.map_or(spec.permits, |p| p[rule])
    }

    /// Whether the rule applies to this call (0 permits: it does not).
    fn applies(&self, rule: usize) -> bool {
        self.permits.is_none_or(|p| p[rule] != 0)
    }
}

/// A call that may go on.
#[derive(Debug, Clone, Copy, Default)]
pub struct Granted {
    /// The enforced rule with the fewest permits left (its index among the site's
    /// rules), and how many: `None` when no rule was decided by the backend (none
    /// applied, or `on_error` let the call through).
    pub tightest: Option<(usize, u64)>,
    /// That rule's rate and window as decided: its own, or a run-time override's.
    pub decided: Option<(u64, Duration)>,
}

/// Decides every rule of an attribute's call: `Ok` to run the body, `Err` with the
/// refusal.
pub async fn decide(site: &'static Site, keys: &[String]) -> Result<(), RateLimited> {
    site.decide(None, keys, None).await.map(|_| ())
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::CountEvents;

    static RULES: [RuleSpec; 1] = [RuleSpec {
        name: Cow::Borrowed("tests::f"),
        shadow: false,
        local_refusals: true,
        rate: 1,
        interval: Duration::from_secs(1),
        mode: RateType::Overall,
        permits: 1,
        on_error: OnError::Allow,
        message: None,
        bucket: None,
    }];

    fn timeout() -> Error {
        Error::Timeout {
            after: Duration::from_millis(1),
            connecting: false,
        }
    }

    #[test]
    fn an_outage_is_logged_once_per_period_not_per_call() {
        static SITE: Site = Site::new(&RULES, None, "tests::f");
        let errors = CountEvents::new(tracing::Level::ERROR);
        let count = errors.counter();
        let _guard = tracing::subscriber::set_default(errors);
        for _ in 0..1000 {
            SITE.log_failure(&timeout());
        }
        assert_eq!(count.load(Ordering::SeqCst), 1);
        assert_eq!(SITE.suppressed.load(Ordering::SeqCst), 999);
        // The next period's log reports what was left out, and starts counting again.
        SITE.last_log_ms.store(0, Ordering::SeqCst);
        SITE.log_failure(&timeout());
        assert_eq!(count.load(Ordering::SeqCst), 2);
        assert_eq!(SITE.suppressed.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn the_end_of_an_outage_is_logged_once() {
        static SITE: Site = Site::new(&RULES, None, "tests::g");
        let warnings = CountEvents::new(tracing::Level::WARN);
        let count = warnings.counter();
        let _guard = tracing::subscriber::set_default(warnings);
        SITE.note_success();
        assert_eq!(count.load(Ordering::SeqCst), 0, "no outage, nothing to report");
        for _ in 0..5 {
            SITE.log_failure(&timeout());
        }
        assert_eq!(
            count.load(Ordering::SeqCst),
            0,
            "failures are errors, not warnings"
        );
        SITE.note_success();
        assert_eq!(count.load(Ordering::SeqCst), 1, "one line for the recovery");
        assert_eq!(SITE.failing.load(Ordering::SeqCst), 0);
        SITE.note_success();
        assert_eq!(count.load(Ordering::SeqCst), 1, "and only one");
    }
}
