//! The client: a backend, a clock, a key prefix, timeouts and a client id.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use once_cell::sync::Lazy;

use crate::backend::{Backend, Call, ConfigChange};
use crate::{waiting, ClientBuilder, Clock, Decision, Error, LimiterKeys, RateLimiter, Rule};

/// The key prefix the attribute puts before its keys, as in the seeds' aspect.
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
    clock: Arc<dyn Clock>,
    command_timeout: Duration,
    target: String,
}

impl Client {
    /// Assembles a client; the builder's last step.
    pub(crate) fn assemble(
        backend: Backend,
        prefix: String,
        clock: Arc<dyn Clock>,
        command_timeout: Duration,
        target: String,
    ) -> Client {
        Client {
            inner: Arc::new(Inner {
                backend,
                prefix,
                client_id: Arc::from(uuid::Uuid::new_v4().to_string()),
                clock,
                command_timeout,
                target,
            }),
        }
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

    /// A limiter on the key `name`, used as given (no prefix), as Redisson's
    /// `getRateLimiter(name)`.
    pub fn rate_limiter(&self, name: impl Into<String>) -> RateLimiter {
        RateLimiter::new(self.clone(), name.into())
    }

    /// Decides all `rules` at once: granted only when every rule has the permits, and
    /// then every rule spends them; a refusal by any rule spends nothing anywhere.
    /// On Redis this is one script call. Missing configs are created and differing
    /// ones updated (see [`Rule`]).
    pub async fn check_rules(&self, rules: &[Rule]) -> Result<Decision, Error> {
        let keys = rules
            .iter()
            .map(|rule| self.rule_keys(rule))
            .collect::<Result<Vec<_>, _>>()?;
        check_conflicts(rules)?;
        let calls: Vec<Call<'_>> = rules
            .iter()
            .zip(&keys)
            .map(|(rule, keys)| Call {
                keys,
                permits: rule.permits_per_call(),
                rule: Some(rule.config()),
            })
            .collect();
        let outcome = self.backend().acquire(&calls, self.now_ms()).await?;
        for (rule, (_, change)) in rules.iter().zip(&outcome.rules) {
            if *change == ConfigChange::Changed {
                warn_config_changed(rule);
            }
        }
        Ok(Decision::from_outcome(&outcome))
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
        self.inner.clock.now_ms()
    }

    pub(crate) fn shared_client_id(&self) -> Arc<str> {
        self.inner.client_id.clone()
    }

    pub(crate) fn backend(&self) -> &Backend {
        &self.inner.backend
    }

    fn rule_keys(&self, rule: &Rule) -> Result<LimiterKeys, Error> {
        let keys = LimiterKeys::with_client(rule.name().to_owned(), self.inner.client_id.clone())?;
        rule.config().validate(rule.name())?;
        crate::limiter::check_permits(rule.name(), rule.permits_per_call(), Some(rule.config().rate))?;
        Ok(keys)
    }
}

fn check_conflicts(rules: &[Rule]) -> Result<(), Error> {
    for (second, rule) in rules.iter().enumerate() {
        if let Some(first) = rules[..second]
            .iter()
            .position(|r| r.name() == rule.name() && r.config() != rule.config())
        {
            return Err(Error::ConflictingRules {
                name: rule.name().to_owned(),
                first,
                second,
            });
        }
    }
    Ok(())
}

/// At most this many limiters are remembered as warned, so per-user limiters cannot
/// grow the set without bound.
const WARNED_CAP: usize = 4096;

fn warn_config_changed(rule: &Rule) {
    static WARNED: Lazy<Mutex<HashSet<String>>> = Lazy::new(Default::default);
    let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if warned.len() >= WARNED_CAP || !warned.insert(rule.name().to_owned()) {
        return;
    }
    let config = rule.config();
    tracing::warn!(
        limiter = rule.name(),
        rate = config.rate,
        interval_ms = config.interval_ms(),
        mode = ?config.rate_type,
        "the stored rate limiter config differed from the rule; it was updated, keeping the window"
    );
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

#[cfg(test)]
mod warning_tests {
    use super::*;
    use crate::test_support::CountEvents;
    use std::sync::atomic::Ordering;

    #[test]
    fn a_changed_config_is_reported_once_per_limiter() {
        let warnings = CountEvents::new(tracing::Level::WARN);
        let count = warnings.counter();
        let _guard = tracing::subscriber::set_default(warnings);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let client = Client::memory();
            let name = format!("warn:{}", client.client_id());
            let old = Rule::new(&name, 5, Duration::from_secs(1));
            let new = Rule::new(&name, 7, Duration::from_secs(1));
            client.check_rules(std::slice::from_ref(&old)).await.unwrap();
            assert_eq!(
                count.load(Ordering::SeqCst),
                0,
                "creating a config is not a change"
            );
            for rule in [&new, &old, &new] {
                client.check_rules(std::slice::from_ref(rule)).await.unwrap();
            }
            assert_eq!(
                count.load(Ordering::SeqCst),
                1,
                "three changes of one limiter, one warning"
            );
            let other = Rule::new(format!("{name}:other"), 5, Duration::from_secs(1));
            client.check_rules(std::slice::from_ref(&other)).await.unwrap();
            client.check_rules(&[other.permits(2)]).await.unwrap();
            assert_eq!(count.load(Ordering::SeqCst), 1, "permits per call are not config");
            client
                .check_rules(&[Rule::new(format!("{name}:other"), 6, Duration::from_secs(1))])
                .await
                .unwrap();
            assert_eq!(count.load(Ordering::SeqCst), 2);
        });
    }
}
