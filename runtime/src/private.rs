//! What `#[rate_limit]` expands into calls. Not a public API: it changes with the macro.

use std::fmt::{self, Display, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use once_cell::sync::Lazy;

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

/// One `#[rate_limit]` attribute, checked at compile time.
#[derive(Debug)]
pub struct RuleSpec {
    pub rate: u64,
    pub interval: Duration,
    pub mode: RateType,
    pub permits: u64,
    pub on_error: OnError,
    pub message: Option<&'static str>,
}

/// Every rule of one function, with its call-level settings and failure log state.
#[derive(Debug)]
pub struct Site {
    rules: &'static [RuleSpec],
    timeout: Option<Duration>,
    function: &'static str,
    last_log_ms: AtomicU64,
    suppressed: AtomicU64,
}

/// Backend failures of one function are logged at most this often.
const LOG_EVERY_MS: u64 = 10_000;

/// The in-process limiters `on_error = "local"` decides on while the backend is down.
static LOCAL: Lazy<Client> = Lazy::new(Client::memory);

impl Site {
    pub const fn new(rules: &'static [RuleSpec], timeout: Option<Duration>, function: &'static str) -> Self {
        Site {
            rules,
            timeout,
            function,
            last_log_ms: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    fn build_rules(&self, prefix: &str, keys: &[String]) -> Vec<Rule> {
        self.rules
            .iter()
            .zip(keys)
            .map(|(spec, key)| {
                let mut name = String::with_capacity(prefix.len() + key.len());
                name.push_str(prefix);
                name.push_str(key);
                Rule::new(name, spec.rate, spec.interval)
                    .mode(spec.mode)
                    .permits(spec.permits)
            })
            .collect()
    }

    async fn check(&self, client: &Client, rules: &[Rule]) -> Result<Decision, Error> {
        match self.timeout {
            Some(timeout) => client.check_rules_for(rules, timeout).await,
            None => client.check_rules(rules).await,
        }
    }

    fn refusal(&self, rules: &[Rule], decision: &Decision, index: impl Fn(usize) -> usize) -> RateLimited {
        let refused = decision.refused_by.unwrap_or(0);
        let rule = index(refused);
        RateLimited {
            key: rules
                .get(refused)
                .map_or_else(String::new, |r| r.name().to_owned()),
            retry_after: decision.retry_after,
            message: self.rules[rule].message,
            rule,
            cause: None,
        }
    }

    fn log_failure(&self, error: &Error) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let last = self.last_log_ms.load(Ordering::Relaxed);
        let due = now.saturating_sub(last) >= LOG_EVERY_MS;
        if due
            && self
                .last_log_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let suppressed = self.suppressed.swap(0, Ordering::Relaxed);
            tracing::error!(
                function = self.function,
                suppressed,
                "rate limiter backend failed, applying on_error: {error}"
            );
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The `on_error` policies: any `deny` rule refuses; else the `local` rules are
    /// decided in process (all or nothing) and the `allow` rules pass.
    async fn on_error(&self, keys: &[String], prefix: &str, error: Error) -> Result<(), RateLimited> {
        self.log_failure(&error);
        let rules = self.build_rules(prefix, keys);
        if let Some(rule) = self.rules.iter().position(|r| r.on_error == OnError::Deny) {
            return Err(RateLimited {
                key: rules[rule].name().to_owned(),
                retry_after: None,
                message: self.rules[rule].message,
                rule,
                cause: Some(Arc::new(error)),
            });
        }
        let local: Vec<usize> = (0..rules.len())
            .filter(|&i| self.rules[i].on_error == OnError::Local)
            .collect();
        if local.is_empty() {
            return Ok(());
        }
        let local_rules: Vec<Rule> = local.iter().map(|&i| rules[i].clone()).collect();
        match self.check(&LOCAL, &local_rules).await {
            Ok(decision) if decision.allowed => Ok(()),
            Ok(decision) => Err(self.refusal(&local_rules, &decision, |i| local[i])),
            Err(local_error) => {
                // The rule cannot be enforced anywhere (a key that splits cluster
                // slots, say): fail open, loudly.
                self.log_failure(&local_error);
                Ok(())
            }
        }
    }
}

/// Decides every rule of a call: `Ok` to run the body, `Err` with the refusal.
pub async fn decide(site: &'static Site, keys: &[String]) -> Result<(), RateLimited> {
    let client = match default_client() {
        Ok(client) => client,
        Err(error) => return site.on_error(keys, crate::DEFAULT_PREFIX, error).await,
    };
    let rules = site.build_rules(client.prefix(), keys);
    match site.check(client, &rules).await {
        Ok(decision) if decision.allowed => Ok(()),
        Ok(decision) => Err(site.refusal(&rules, &decision, |i| i)),
        Err(error) => site.on_error(keys, client.prefix(), error).await,
    }
}

/// A key under construction: template text as written, argument values escaped.
pub struct KeyBuf(String);

impl KeyBuf {
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        KeyBuf(String::with_capacity(48))
    }

    /// Template text, as written.
    pub fn text(&mut self, text: &str) {
        self.0.push_str(text);
    }

    /// An argument's `Display`, with `%`, `{`, `}` and `:` percent-encoded so that no
    /// value can change the hash tag or pose as another key's separator.
    pub fn value(&mut self, value: &dyn Display) {
        let _ = write!(Escaper(&mut self.0), "{value}");
    }

    pub fn finish(self) -> String {
        self.0
    }
}

/// Requires `Display` with an error on the user's key, not inside generated code.
pub fn display<T: Display + ?Sized>(value: &T) -> &T {
    value
}

struct Escaper<'a>(&'a mut String);

impl Write for Escaper<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            match c {
                '%' => self.0.push_str("%25"),
                ':' => self.0.push_str("%3A"),
                '{' => self.0.push_str("%7B"),
                '}' => self.0.push_str("%7D"),
                c => self.0.push(c),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(parts: &[&dyn Display]) -> String {
        let mut key = KeyBuf::new();
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                key.text(":");
            }
            key.value(*part);
        }
        key.finish()
    }

    #[test]
    fn values_are_escaped_and_others_unchanged() {
        assert_eq!(key(&[&"a:b", &"c"]), "a%3Ab:c");
        assert_ne!(key(&[&"a:b", &"c"]), key(&[&"a", &"b:c"]));
        assert_eq!(key(&[&"{x}", &"100%"]), "%7Bx%7D:100%25");
        assert_eq!(key(&[&"user 42", &"Ünïcode"]), "user 42:Ünïcode");
        assert_eq!(key(&[&42u64]), "42");
    }
}

#[cfg(test)]
mod log_tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata, Subscriber};

    #[derive(Clone, Default)]
    struct Errors(Arc<AtomicUsize>);

    impl Subscriber for Errors {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            if *event.metadata().level() == Level::ERROR {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    #[test]
    fn an_outage_is_logged_once_per_period_not_per_call() {
        static RULES: [RuleSpec; 1] = [RuleSpec {
            rate: 1,
            interval: Duration::from_secs(1),
            mode: RateType::Overall,
            permits: 1,
            on_error: OnError::Allow,
            message: None,
        }];
        static SITE: Site = Site::new(&RULES, None, "tests::f");
        let errors = Errors::default();
        let count = errors.0.clone();
        let _guard = tracing::subscriber::set_default(errors);
        for _ in 0..1000 {
            SITE.log_failure(&Error::Timeout {
                after: Duration::from_millis(1),
            });
        }
        assert_eq!(count.load(Ordering::SeqCst), 1);
        assert_eq!(SITE.suppressed.load(Ordering::SeqCst), 999);
        // The next period's log reports what was left out, and starts counting again.
        SITE.last_log_ms.store(0, Ordering::SeqCst);
        SITE.log_failure(&Error::Timeout {
            after: Duration::from_millis(1),
        });
        assert_eq!(count.load(Ordering::SeqCst), 2);
        assert_eq!(SITE.suppressed.load(Ordering::SeqCst), 0);
    }
}
