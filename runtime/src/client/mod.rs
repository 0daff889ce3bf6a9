//! The client: a backend, a clock, a key prefix, timeouts and a client id.

mod background;
pub(crate) mod batches;
pub(crate) mod builder;
pub(crate) mod clock;
pub(crate) mod default_client;
mod overrides;
pub(crate) mod refusal_cache;
mod resets;
pub(crate) mod waiting;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Once};
use std::task::Poll;
use std::time::Duration;

use crate::backend::memory::OneRule;
use crate::backend::{Backend, Call, ConfigChange, Outcome, RuleOutcome};
use crate::keys::Keys;
use crate::rules::config_log;
use crate::rules::rule::Merged;
use crate::{ClientBuilder, Clock, Decision, Error, Rule};

/// The key prefix the attribute puts before its keys (the prefix Java services using
/// the pattern of `trySetRate` then `tryAcquire` commonly give their limiters).
pub const DEFAULT_PREFIX: &str = "rate_limit:";
/// How long one Redis command may take before the call fails over: a request path
/// must not hang on a sick server.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_millis(250);
/// How long establishing a connection may take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// A handle on limiter state in Redis or in this process. Cheap to clone: clones
/// share the connection, the client id and the in-process state.
///
/// ```no_run
/// # async fn run() -> Result<(), redlimit_runtime::Error> {
/// use redlimit_runtime::{Client, Rule};
/// use std::time::Duration;
///
/// let client = Client::connect("redis://127.0.0.1:6379/").await?;
/// let decision = client
///     .check_rules(&[Rule::new("rate_limit:login:alice", 5, Duration::from_secs(60))])
///     .await?;
/// if !decision.allowed {
///     println!("try again in {:?}", decision.retry_after);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Backend,
    prefix: String,
    client_id: Arc<str>,
    /// `None`: the system clock.
    clock: Option<Arc<dyn Clock>>,
    command_timeout: Duration,
    target: String,
    overrides: crate::rules::overrides::Overrides,
    refusal_reports: crate::observe::refusal_reports::RefusalReports,
    background: background::Background,
    /// The bound of the in-process limiters `on_error = "local"` decides on while
    /// this client's backend fails, and those limiters, made on first use.
    max_limiters: usize,
    local: once_cell::sync::OnceCell<Client>,
    /// Refusals answered again without a round trip (Redis clients).
    refusals: crate::client::refusal_cache::RefusalCache,
    /// Batches of permits served in process (Redis clients, rules with a batch).
    batches: batches::Batches,
    /// How far the stream of limiters reset was read.
    resets: resets::Cursor,
}

impl Drop for Inner {
    fn drop(&mut self) {
        batches::give_back_all(&self.batches, &self.backend, &self.client_id);
    }
}

impl Client {
    /// Assembles a client; the builder's last step.
    pub(crate) fn assemble(
        backend: Backend,
        prefix: String,
        clock: Option<Arc<dyn Clock>>,
        command_timeout: Duration,
        target: String,
        max_limiters: usize,
        local_refusals: bool,
    ) -> Client {
        let local_refusals = local_refusals && matches!(backend, Backend::Redis(_));
        let batches = batches::Batches::new(matches!(backend, Backend::Redis(_)));
        Client {
            inner: Arc::new(Inner {
                backend,
                prefix,
                client_id: Arc::from(uuid::Uuid::new_v4().to_string()),
                clock,
                command_timeout,
                target,
                overrides: Default::default(),
                refusal_reports: Default::default(),
                background: Default::default(),
                max_limiters,
                local: once_cell::sync::OnceCell::new(),
                refusals: crate::client::refusal_cache::RefusalCache::new(local_refusals),
                batches,
                resets: Default::default(),
            }),
        }
    }

    /// The in-process limiters `on_error = "local"` decides on while this client's
    /// backend fails: on this client's clock, holding at most its `max_limiters`.
    pub(crate) fn local(&self) -> &Client {
        self.inner.local.get_or_init(|| {
            ClientBuilder::default()
                .max_limiters(self.inner.max_limiters)
                .shared_clock(self.inner.clock.clone())
                .memory()
        })
    }
}

impl Client {
    /// Settings beyond the defaults.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// Connects to the Redis server at `url` with the default settings
    /// (`redis+cluster://host:port,host:port/` for a cluster).
    pub async fn connect(url: &str) -> Result<Client, Error> {
        Client::builder().connect(url).await
    }

    /// Connects to a Redis Cluster through any of its nodes, with the default settings.
    pub async fn connect_cluster(nodes: &[&str]) -> Result<Client, Error> {
        Client::builder().connect_cluster(nodes).await
    }

    /// A client on the in-process backend with the default settings.
    pub fn memory() -> Client {
        Client::builder().memory()
    }

    /// `REDIS_URL` from the environment (connecting lazily), else the in-process
    /// backend, with one warning per process that limits are then per process.
    /// With `REDIS_URL` set it must be called inside a Tokio runtime.
    pub fn from_env() -> Result<Client, Error> {
        match std::env::var("REDIS_URL") {
            Ok(url) if !url.trim().is_empty() => Client::builder().connect_lazy(url.trim()),
            _ => {
                static WARN: Once = Once::new();
                WARN.call_once(|| {
                    tracing::warn!(
                        "REDIS_URL is not set: rate limits are kept in this process only, \
                         so each process enforces them on its own"
                    );
                });
                Ok(Client::memory())
            }
        }
    }

    /// Decides all `rules` at once: granted only when every rule has the permits, and
    /// then every rule spends them; a refusal by any rule spends nothing anywhere.
    /// On Redis this is one script call. Missing configs are created and differing
    /// ones updated (see [`Rule`]).
    ///
    /// Rules that name the same limiter (two templates a caller filled with equal
    /// values, say) are decided as one: on the strictest of their configs (shared by
    /// every client before per client, then the lowest long-run rate, then the
    /// smallest rate), taking the largest of their permits once, capped at that rate.
    /// So each rule still holds and a coincidence never refuses every call.
    ///
    /// A decision that needs no round trip (in process, a refusal this client keeps, or
    /// a grant from a batch it holds) is made on the future's first poll, without
    /// another future inside. The future answers once: polled again after its answer,
    /// it panics rather than decide again.
    pub fn check_rules<'a>(
        &'a self,
        rules: &'a [Rule],
    ) -> impl Future<Output = Result<Decision, Error>> + Send + 'a {
        let mut remote: Option<Remote<'a>> = None;
        let mut decided = false;
        std::future::poll_fn(move |cx| {
            // As an `async fn`'s future: polled again once it has answered, it would
            // decide again (and spend again), so it refuses to.
            assert!(!decided, "a check_rules future polled after it completed");
            let remote = match &mut remote {
                Some(remote) => remote,
                None => {
                    let now = self.now_ms();
                    if let Backend::Memory(memory) = self.backend() {
                        decided = true;
                        return Poll::Ready(self.check_rules_in_process(memory, rules, now));
                    }
                    if let Some(answer) = self.answered_here(rules, now) {
                        decided = true;
                        return Poll::Ready(Ok(answer));
                    }
                    remote.insert(Box::pin(self.check_rules_remote(rules, now)))
                }
            };
            let answer = std::task::ready!(remote.as_mut().poll(cx));
            decided = true;
            Poll::Ready(answer)
        })
    }

    /// A call of one rule answered from what this client holds, at `now`: granted
    /// from an open batch, or refused again as Redis refused it.
    fn answered_here(&self, rules: &[Rule], now: u64) -> Option<Decision> {
        let [rule] = rules else { return None };
        let permits = rule.permits_per_call().min(rule.most_permits());
        if rule.batch_size() > 1 {
            if let Some(served) = self.serve_batched(rule, permits) {
                return Some(served);
            }
        }
        self.inner.refusals.answer(rule, permits, now)
    }

    /// [`check_rules`](Client::check_rules) on the backend, at `now`.
    async fn check_rules_remote(&self, rules: &[Rule], now: u64) -> Result<Decision, Error> {
        if let [rule] = rules {
            return self.check_rule(rule, now).await;
        }
        let keys = self.rules_keys(rules)?;
        let merged = crate::rules::rule::merge(rules);
        let calls = merged_calls(rules, &keys, &merged);
        let outcome = self.backend().acquire_in_box(&calls, now).await?;
        Ok(self.merged_decision(rules, &merged, &outcome))
    }

    /// [`check_rules`](Client::check_rules) in process: nothing waits, so it is decided
    /// where it is called.
    #[inline]
    fn check_rules_in_process(
        &self,
        memory: &crate::backend::memory::MemoryBackend,
        rules: &[Rule],
        now: u64,
    ) -> Result<Decision, Error> {
        if let [rule] = rules {
            return self.check_rule_in_process(memory, rule, now);
        }
        self.check_several_in_process(memory, rules, now)
    }

    /// Several rules in process: kept out of line, so that the one-rule path, the
    /// usual one, stays small where it is inlined.
    #[inline(never)]
    fn check_several_in_process(
        &self,
        memory: &crate::backend::memory::MemoryBackend,
        rules: &[Rule],
        now: u64,
    ) -> Result<Decision, Error> {
        let keys = self.rules_keys(rules)?;
        let merged = crate::rules::rule::merge(rules);
        let outcome = memory.decide_calls(&merged_calls(rules, &keys, &merged), now)?;
        Ok(self.merged_decision(rules, &merged, &outcome))
    }

    fn rules_keys<'r>(&'r self, rules: &'r [Rule]) -> Result<Vec<Keys<'r>>, Error> {
        rules.iter().map(|rule| self.rule_keys(rule)).collect()
    }

    /// The decision of several rules, as their callers number them, from the outcome
    /// of their merged calls: config changes logged, refusals kept of them dropped on
    /// a grant.
    fn merged_decision(&self, rules: &[Rule], merged: &[Merged], outcome: &Outcome) -> Decision {
        for (m, rule) in merged.iter().zip(&outcome.rules) {
            if let ConfigChange::Changed(previous) = &rule.config {
                let rule = &rules[m.config];
                config_log::changed(rule, previous, self.now_ms());
            }
        }
        let mut decision = outcome.decision();
        if decision.allowed {
            for rule in rules {
                self.inner.refusals.forget_rule(rule);
            }
        }
        decision.refused_by = decision.refused_by.map(|i| merged[i].first);
        decision.tightest = decision.tightest.map(|i| merged[i].first);
        decision
    }

    /// [`check_rules`](Client::check_rules) of one rule on Redis, not answered from
    /// the refusals kept: nothing to merge, nothing to collect.
    async fn check_rule(&self, rule: &Rule, now: u64) -> Result<Decision, Error> {
        let permits = rule.permits_per_call().min(rule.most_permits());
        let mut now = now;
        if rule.batch_size() > 1 {
            // Boxed: taking a batch holds a lock and two round trips' state, which
            // every decision's future would otherwise carry.
            if let Some(decided) = Box::pin(self.check_batched(rule, permits)).await {
                return decided;
            }
            now = self.now_ms();
        }
        let keys = self.rule_keys(rule)?;
        let calls = [Call {
            keys,
            permits,
            rule: Some(rule.config()),
            bucket: rule.shape(),
        }];
        let outcome = self.backend().acquire_in_box(&calls, now).await?;
        let decision = self.one_rule_decision(rule, &outcome);
        if self.inner.refusals.note(rule, permits, &decision, now) {
            // Kept refusals end when their limiter is reset anywhere: announcements
            // are read in the background.
            self.start_background();
        }
        Ok(decision)
    }

    /// The decision of `rule` alone from its outcome, a change of its stored config
    /// logged.
    pub(crate) fn one_rule_decision(&self, rule: &Rule, outcome: &Outcome) -> Decision {
        if let Some(RuleOutcome {
            config: ConfigChange::Changed(previous),
            ..
        }) = outcome.rules.first()
        {
            config_log::changed(rule, previous, self.now_ms());
        }
        outcome.decision()
    }

    /// One rule in process, with the rule's kept hash; the usual call's answer is the
    /// decision as it is.
    #[inline]
    fn check_rule_in_process(
        &self,
        memory: &crate::backend::memory::MemoryBackend,
        rule: &Rule,
        now: u64,
    ) -> Result<Decision, Error> {
        let call = Call {
            keys: self.rule_keys(rule)?,
            permits: rule.permits_per_call().min(rule.most_permits()),
            rule: Some(rule.config()),
            bucket: rule.shape(),
        };
        match memory.decide_one_rule(&call, rule.name_hash(), now)? {
            OneRule::Usual(usual) => Ok(usual.decision()),
            OneRule::Other(outcome) => Ok(self.one_rule_decision(rule, &outcome)),
        }
    }

    /// [`check_rules`](Client::check_rules) decided where it is called, for an
    /// in-process client (`None` for any other).
    pub(crate) fn decide_in_process(&self, rules: &[Rule]) -> Option<Result<Decision, Error>> {
        let Backend::Memory(memory) = self.backend() else {
            return None;
        };
        Some(self.check_rules_in_process(memory, rules, self.now_ms()))
    }

    /// Drops the refusal this client keeps of the limiter `name`, if any: it changed.
    pub(crate) fn forget_refusal(&self, name: &str) {
        self.inner.refusals.forget(name);
    }

    /// Permits `rule`'s limiter has left now, taking nothing (its config written as a
    /// call of the rule writes it); `None` when the backend cannot say.
    pub(crate) async fn left_of(&self, rule: &Rule) -> Option<u64> {
        // (a rule whose call asks too much is refused by its own checks)
        let rule = rule.clone().permits(1);
        let keys = self.rule_keys(&rule).ok()?;
        let calls = [Call {
            keys,
            permits: 0,
            rule: Some(rule.config()),
            bucket: rule.shape(),
        }];
        let outcome = self.backend().acquire_in_box(&calls, self.now_ms()).await.ok()?;
        outcome.rules.first().map(|r| r.left)
    }

    /// Drops every refusal this client keeps.
    pub(crate) fn forget_every_refusal(&self) {
        self.inner.refusals.forget_all();
    }

    pub(crate) fn resets_cursor(&self) -> &resets::Cursor {
        &self.inner.resets
    }

    /// Like [`check_rules`](Client::check_rules), waiting up to `timeout` for the
    /// permits; answers the last refusal when they cannot come in time.
    pub async fn check_rules_for(&self, rules: &[Rule], timeout: Duration) -> Result<Decision, Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        waiting::until_allowed(Some(deadline), || self.check_rules(rules)).await
    }

    /// Waits until all `rules` grant.
    pub async fn acquire_rules(&self, rules: &[Rule]) -> Result<Decision, Error> {
        waiting::until_allowed(None, || self.check_rules(rules)).await
    }

    /// The key prefix for attribute keys (default `rate_limit:`).
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// This client's id (a UUID v4, new for every client): the suffix of its
    /// per_client keys.
    pub fn client_id(&self) -> &str {
        &self.inner.client_id
    }

    /// The command timeout.
    pub fn command_timeout(&self) -> Duration {
        self.inner.command_timeout
    }

    /// True for the in-process backend.
    pub fn is_memory(&self) -> bool {
        matches!(self.inner.backend, Backend::Memory(_))
    }

    /// The client's current time in epoch milliseconds.
    pub fn now_ms(&self) -> u64 {
        match &self.inner.clock {
            None => crate::client::clock::SystemClock.now_ms(),
            Some(clock) => clock.now_ms(),
        }
    }

    pub(crate) fn shared_client_id(&self) -> Arc<str> {
        self.inner.client_id.clone()
    }

    pub(crate) fn backend(&self) -> &Backend {
        &self.inner.backend
    }

    pub(crate) fn overrides(&self) -> &crate::rules::overrides::Overrides {
        &self.inner.overrides
    }

    pub(crate) fn refusal_reports(&self) -> &crate::observe::refusal_reports::RefusalReports {
        &self.inner.refusal_reports
    }

    pub(crate) fn background(&self) -> &background::Background {
        &self.inner.background
    }

    /// A handle that does not keep the client alive (for its background refresh).
    pub(crate) fn downgrade(&self) -> WeakClient {
        WeakClient(Arc::downgrade(&self.inner))
    }

    /// The keys of `rule` ([`rules::checks::rule_keys`](crate::rules::checks::rule_keys)).
    #[inline]
    fn rule_keys<'r>(&'r self, rule: &'r Rule) -> Result<Keys<'r>, Error> {
        crate::rules::checks::rule_keys(rule, &self.inner.prefix, &self.inner.client_id)
    }
}

/// A decision on the backend, under way.
type Remote<'a> = Pin<Box<dyn Future<Output = Result<Decision, Error>> + Send + 'a>>;

/// One call per distinct limiter of `rules` ([`Merged`]).
fn merged_calls<'r>(rules: &'r [Rule], keys: &[Keys<'r>], merged: &[Merged]) -> Vec<Call<'r>> {
    merged
        .iter()
        .map(|m| Call {
            keys: keys[m.first],
            permits: m.permits,
            rule: Some(rules[m.config].config()),
            bucket: rules[m.config].shape(),
        })
        .collect()
}

/// A [`Client`] that may have been dropped.
pub(crate) struct WeakClient(std::sync::Weak<Inner>);

impl WeakClient {
    pub(crate) fn upgrade(&self) -> Option<Client> {
        self.0.upgrade().map(|inner| Client { inner })
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("backend", &self.inner.target)
            .field("prefix", &self.inner.prefix)
            .field("client_id", &self.inner.client_id)
            .field("command_timeout", &self.inner.command_timeout)
            .finish()
    }
}
