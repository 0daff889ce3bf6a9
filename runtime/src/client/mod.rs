//! The client: a backend, a clock, a key prefix, timeouts and a client id.

pub(crate) mod builder;
pub(crate) mod clock;
pub(crate) mod default_client;
mod overrides;
mod shared;
pub(crate) mod waiting;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Once};
use std::task::Poll;
use std::time::Duration;

use crate::backend::decisions::{merged_calls, merged_decision, one_rule_decision};
use crate::backend::memory::{Hashes, RuleDecision};
use crate::backend::{Backend, RuleCall};
use crate::keys::Keys;
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
    /// The rate overrides in force (shared with a Redis backend, which refreshes
    /// them).
    overrides: Arc<crate::rules::overrides::Overrides>,
    /// The bound of the in-process limiters `on_error = "local"` decides on while
    /// this client's backend fails, and those limiters, made on first use.
    max_limiters: usize,
    local: once_cell::sync::OnceCell<Client>,
}

impl Client {
    /// Assembles a client; the builder's last step.
    pub(crate) fn assemble(parts: Parts, backend: Backend, target: String) -> Client {
        let Parts {
            prefix,
            client_id,
            clock,
            overrides,
            command_timeout,
            max_limiters,
        } = parts;
        Client {
            inner: Arc::new(Inner {
                backend,
                prefix,
                client_id,
                clock,
                command_timeout,
                target,
                overrides,
                max_limiters,
                local: once_cell::sync::OnceCell::new(),
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
    /// smallest rate), taking the largest of their permits once, when that config holds
    /// each rule's limit (shared, or per client as the rule is; a window of no higher
    /// rate over no shorter interval; a bucket of no larger burst refilled no faster,
    /// or with a warm-up the same bucket), else on another of them that does. So each
    /// rule still holds. A call naming one limiter under limits none of which holds the
    /// others' is refused with [`Error::InvalidConfig`], and one whose largest
    /// permits are more than that config grants at once (its rate, a token bucket's
    /// burst) with [`Error::PermitsExceedRate`] or [`Error::PermitsExceedBurst`],
    /// before anything is taken.
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
            if let (None, Backend::Memory(memory)) = (&remote, self.backend()) {
                decided = true;
                return self.poll_in_process(memory, rules);
            }
            self.poll_remote(&mut remote, &mut decided, rules, cx)
        })
    }

    /// [`check_rules`](Client::check_rules)' future on Redis: a refusal kept or a
    /// batch held answered on the first poll, else the script call, polled until it
    /// answers. Out of line, so that the in-process poll does not carry its frame.
    #[inline(never)]
    fn poll_remote<'a>(
        &'a self,
        remote: &mut Option<Remote<'a>>,
        decided: &mut bool,
        rules: &'a [Rule],
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Result<Decision, Error>> {
        let remote = match remote {
            Some(remote) => remote,
            None => {
                let Backend::Redis(redis) = self.backend() else {
                    unreachable!("an in-process future is answered on its first poll")
                };
                let now = self.now_ms();
                // A refusal kept, a batch held: answered without a round trip.
                if let Some(answer) = redis.answered_here(rules, now) {
                    *decided = true;
                    return Poll::Ready(Ok(answer));
                }
                remote.insert(Box::pin(redis.check_rules(rules, now)))
            }
        };
        let answer = std::task::ready!(remote.as_mut().poll(cx));
        *decided = true;
        Poll::Ready(answer)
    }

    /// [`check_rules`](Client::check_rules)' future in process, answered on its first
    /// poll, out of line: the usual call's decision is written where the poll returns
    /// it (a `Poll` of the answer is laid out as the answer), not made in the poll and
    /// then moved out of it; every other answer comes from a function of its own.
    #[inline(never)]
    fn poll_in_process(
        &self,
        memory: &crate::backend::memory::MemoryBackend,
        rules: &[Rule],
    ) -> Poll<Result<Decision, Error>> {
        let now = self.now_ms();
        let [rule] = rules else {
            return Poll::Ready(self.check_several_in_process(memory, rules, now));
        };
        match self.decide_rule_in_process(memory, rule, now) {
            Ok(RuleDecision::Usual(usual)) => Poll::Ready(Ok(usual.decision())),
            other => Poll::Ready(self.other_answer(rule, other)),
        }
    }

    /// The decision of one rule in process that the usual call did not make (made by
    /// the phases), or its error.
    #[cold]
    #[inline(never)]
    pub(crate) fn other_answer(
        &self,
        rule: &Rule,
        decided: Result<RuleDecision, Error>,
    ) -> Result<Decision, Error> {
        match decided? {
            RuleDecision::Usual(usual) => Ok(usual.decision()),
            RuleDecision::Phased(outcome) => Ok(one_rule_decision(rule, &outcome, || self.now_ms())),
        }
    }

    /// [`check_rules`](Client::check_rules) in process: nothing waits, so it is decided
    /// where it is called.
    #[inline(always)]
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
        crate::rules::rule::check_rule_count(rules)?;
        let keys = self.rules_keys(rules)?;
        let merged = crate::rules::rule::merge(rules)?;
        // (each limiter's name hashed as its first rule keeps it, not again)
        let hashes: Hashes = merged.iter().map(|m| rules[m.first].name_hash()).collect();
        let outcome = memory.decide_hashed(&merged_calls(rules, &keys, &merged), &hashes, now)?;
        Ok(merged_decision(rules, &merged, &outcome, || self.now_ms()))
    }

    /// The keys of each of `rules`, checked as [`rule_keys`](Client::rule_keys) checks one.
    pub(crate) fn rules_keys<'r>(
        &'r self,
        rules: &'r [Rule],
    ) -> Result<smallvec::SmallVec<[Keys<'r>; 4]>, Error> {
        // (pushed one by one: a `collect` of results through `try_process` cost
        // about 300 instructions at two rules, the keys themselves a few)
        let mut keys = smallvec::SmallVec::with_capacity(rules.len());
        for rule in rules {
            keys.push(self.rule_keys(rule)?);
        }
        Ok(keys)
    }

    /// One rule in process, with the rule's kept hash; the usual call's answer is the
    /// decision as it is.
    #[inline(always)]
    fn check_rule_in_process(
        &self,
        memory: &crate::backend::memory::MemoryBackend,
        rule: &Rule,
        now: u64,
    ) -> Result<Decision, Error> {
        match self.decide_rule_in_process(memory, rule, now)? {
            RuleDecision::Usual(usual) => Ok(usual.decision()),
            RuleDecision::Phased(outcome) => Ok(one_rule_decision(rule, &outcome, || self.now_ms())),
        }
    }

    /// One rule decided in process, with the rule's kept hash.
    #[inline(always)]
    fn decide_rule_in_process(
        &self,
        memory: &crate::backend::memory::MemoryBackend,
        rule: &Rule,
        now: u64,
    ) -> Result<RuleDecision, Error> {
        // (a rule checked before, the usual one, gives its keys in registers; the
        // first call's checks answer out of line)
        let keys = if rule.is_checked() {
            Keys::checked_before(rule.name(), &self.inner.client_id)
        } else {
            self.first_keys(rule)?
        };
        memory.decide_one_rule(
            &rule_call(rule, keys),
            rule.name_hash(),
            Some(rule.window_ms()),
            now,
        )
    }

    /// A layer's one rule decided on this client's in-process backend `memory`, on
    /// the limiter `name` whose hash is `hash`, at the settings of `settings`: a rule
    /// whose settings passed the checks, as every name of its shape did. Spares a
    /// request the rule built for it alone. Out of line, as
    /// [`poll_in_process`](Client::poll_in_process) is: in a function of its own the
    /// decision's steps are inlined, where the caller's would call several of them.
    /// (The backend is found by the caller: a decision wrapped in an `Option` here
    /// was copied whole on its way out.)
    #[inline(never)]
    pub(crate) fn decide_named_in_process(
        &self,
        memory: &crate::backend::memory::MemoryBackend,
        settings: &Rule,
        name: &str,
        hash: u64,
    ) -> Result<RuleDecision, Error> {
        let call = rule_call(settings, Keys::checked_before(name, &self.inner.client_id));
        memory.decide_one_rule(&call, hash, Some(settings.window_ms()), self.now_ms())
    }

    /// The keys of a rule on its first call (or its first since a setter changed
    /// it): every check of its name and settings.
    #[cold]
    #[inline(never)]
    fn first_keys<'r>(&'r self, rule: &'r Rule) -> Result<Keys<'r>, Error> {
        self.rule_keys(rule)
    }

    /// [`check_rules`](Client::check_rules) decided where it is called, for an
    /// in-process client (`None` for any other).
    pub(crate) fn decide_in_process(&self, rules: &[Rule]) -> Option<Result<Decision, Error>> {
        let memory = self.backend().in_process()?;
        Some(self.check_rules_in_process(memory, rules, self.now_ms()))
    }

    /// Drops the refusal this client keeps of the limiter `name`, if any: it changed.
    pub(crate) fn forget_refusal(&self, name: &str) {
        self.backend().forget_refusal(name);
    }

    /// Permits `rule`'s limiter has left now, taking nothing (its config written as a
    /// call of the rule writes it); `None` when the backend cannot say.
    pub(crate) async fn left_of(&self, rule: &Rule) -> Option<u64> {
        // (a rule whose call asks too much is refused by its own checks)
        let rule = rule.clone().permits(1);
        let keys = self.rule_keys(&rule).ok()?;
        let calls = [RuleCall {
            keys,
            permits: 0,
            rule: Some(rule.config()),
            bucket: rule.shape(),
            reserved: None,
        }];
        let outcome = self.backend().acquire_unboxed(&calls, self.now_ms()).await.ok()?;
        outcome.rules.first().map(|r| r.left)
    }

    /// Like [`check_rules`](Client::check_rules), waiting up to `timeout` for the
    /// permits; answers the last refusal when they cannot come in time.
    pub async fn check_rules_for(&self, rules: &[Rule], timeout: Duration) -> Result<Decision, Error> {
        waiting::until_allowed(Some(waiting::deadline_in(timeout)), || self.check_rules(rules)).await
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
        self.inner.backend.is_memory()
    }

    /// The client's current time in epoch milliseconds.
    #[inline]
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

    /// The keys of `rule` ([`rules::checks::rule_keys`](crate::rules::checks::rule_keys)).
    #[inline]
    pub(crate) fn rule_keys<'r>(&'r self, rule: &'r Rule) -> Result<Keys<'r>, Error> {
        crate::rules::checks::rule_keys(rule, &self.inner.prefix, &self.inner.client_id)
    }
}

/// A decision on the backend, under way.
type Remote<'a> = Pin<Box<dyn Future<Output = Result<Decision, Error>> + Send + 'a>>;

/// What a client is made of beside its backend: the builder's last step gives them.
pub(crate) struct Parts {
    pub prefix: String,
    /// A UUID v4, new for every client.
    pub client_id: Arc<str>,
    /// `None`: the system clock.
    pub clock: Option<Arc<dyn Clock>>,
    pub overrides: Arc<crate::rules::overrides::Overrides>,
    pub command_timeout: Duration,
    pub max_limiters: usize,
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

/// The call of `rule` on its `keys`: its permits (at most what its limiter holds),
/// its config and its bucket's shape.
#[inline(always)]
fn rule_call<'r>(rule: &'r Rule, keys: Keys<'r>) -> RuleCall<'r> {
    RuleCall {
        keys,
        permits: rule.permits_per_call().min(rule.most_permits()),
        rule: Some(rule.config()),
        bucket: rule.shape(),
        reserved: None,
    }
}
