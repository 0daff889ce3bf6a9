//! The call site of `#[rate_limit]`: a function's rules, the decision before its body,
//! the `on_error` policies, and the throttled failure log.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use once_cell::sync::Lazy;
use tokio::time::Instant;

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
    /// The key template as written, or the function's path: a bounded name.
    pub name: &'static str,
    /// Decided and reported, never refusing (to roll out a new limit safely).
    pub shadow: bool,
    pub rate: u64,
    pub interval: Duration,
    pub mode: RateType,
    pub permits: u64,
    pub on_error: OnError,
    pub message: Option<&'static str>,
}

impl RuleSpec {
    fn limit(&self) -> crate::refusal::Limit {
        crate::refusal::Limit {
            name: self.name,
            rate: self.rate,
            window: self.interval,
        }
    }
}

/// Every rule of one function, with its call-level settings and failure log state.
#[derive(Debug)]
pub struct Site {
    rules: &'static [RuleSpec],
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
            failing: AtomicU64::new(0),
            failing_since_ms: AtomicU64::new(0),
            shadow_logged_ms: AtomicU64::new(0),
            shadow_suppressed: AtomicU64::new(0),
        }
    }

    /// Shadow rules are decided after the enforced ones granted, on their own: each
    /// takes its permits when it has them, and a refusal is only reported (a warning
    /// at most once per 10 s per function, with the number left out).
    async fn shadow(&self, client: &Client, rules: &[Rule]) {
        let shadow: Vec<(usize, Rule)> = rules
            .iter()
            .enumerate()
            .filter(|(i, _)| self.rules[*i].shadow)
            .map(|(i, r)| (i, r.clone()))
            .collect();
        for (index, rule) in shadow {
            let refused = match client.check_rules(std::slice::from_ref(&rule)).await {
                Ok(decision) if !decision.allowed => decision.retry_after,
                // A shadow rule never refuses, not even when it cannot be decided.
                _ => continue,
            };
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
                    rule = self.rules[index].name,
                    retry_after_ms = refused.map_or(0, |d| d.as_millis() as u64),
                    suppressed,
                    "shadow rate limit would have refused this call; it was let through"
                );
            } else {
                self.shadow_suppressed.fetch_add(1, Ordering::Relaxed);
            }
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
        RateLimited {
            key: rules
                .get(refused)
                .map_or_else(String::new, |r| r.name().to_owned()),
            retry_after: decision.retry_after,
            message: self.rules[rule].message,
            rule,
            cause: None,
            limit: Some(self.rules[rule].limit()),
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
        RateLimited {
            key: rules.first().map_or_else(String::new, |r| r.name().to_owned()),
            retry_after: None,
            message: self.rules[first].message,
            rule: first,
            cause: Some(Arc::new(error)),
            limit: Some(self.rules[first].limit()),
        }
    }

    /// The `on_error` policies: any `deny` rule refuses; else the `local` rules are
    /// decided in process (all or nothing) and the `allow` rules pass.
    /// The local decision shares the call's deadline, so a failure part-way through a
    /// wait does not make the caller wait twice.
    async fn on_error(
        &self,
        keys: &[String],
        prefix: &str,
        error: Error,
        deadline: Option<Instant>,
    ) -> Result<(), RateLimited> {
        self.log_failure(&error);
        let rules = self.build_rules(prefix, keys);
        if let Some(rule) = self
            .rules
            .iter()
            .position(|r| r.on_error == OnError::Deny && !r.shadow)
        {
            return Err(RateLimited {
                key: rules[rule].name().to_owned(),
                retry_after: None,
                message: self.rules[rule].message,
                rule,
                cause: Some(Arc::new(error)),
                limit: Some(self.rules[rule].limit()),
            });
        }
        let local: Vec<usize> = (0..rules.len())
            .filter(|&i| self.rules[i].on_error == OnError::Local && !self.rules[i].shadow)
            .collect();
        if local.is_empty() {
            return Ok(());
        }
        let local_rules: Vec<Rule> = local.iter().map(|&i| rules[i].clone()).collect();
        match self.check(&LOCAL, &local_rules, deadline).await {
            Ok(decision) if decision.allowed => Ok(()),
            Ok(decision) => Err(self.refusal(&local_rules, &decision, |i| local[i])),
            // The rules cannot be enforced anywhere: refused, never let through.
            Err(local_error) => Err(self.misuse(&local_rules, local[0], local_error)),
        }
    }
}

/// Decides every rule of a call: `Ok` to run the body, `Err` with the refusal.
pub async fn decide(site: &'static Site, keys: &[String]) -> Result<(), RateLimited> {
    let deadline = site.timeout.map(|timeout| Instant::now() + timeout);
    let client = match default_client() {
        Ok(client) => client,
        Err(error) => return site.on_error(keys, crate::DEFAULT_PREFIX, error, deadline).await,
    };
    let rules = site.build_rules(client.prefix(), keys);
    let has_shadow = site.rules.iter().any(|r| r.shadow);
    // The enforced rules, and where each is among all of them.
    let (enforced, index): (Vec<Rule>, Vec<usize>) = if has_shadow {
        rules
            .iter()
            .enumerate()
            .filter(|(i, _)| !site.rules[*i].shadow)
            .map(|(i, r)| (r.clone(), i))
            .unzip()
    } else {
        (Vec::new(), Vec::new())
    };
    let enforced: &[Rule] = if has_shadow { &enforced } else { &rules };
    let decided = if enforced.is_empty() {
        Ok(None)
    } else {
        site.check(client, enforced, deadline).await.map(Some)
    };
    match decided {
        Ok(decision) => {
            if decision.is_some() {
                site.note_success();
            }
            match decision {
                Some(decision) if !decision.allowed => {
                    Err(site.refusal(enforced, &decision, |i| if has_shadow { index[i] } else { i }))
                }
                _ => {
                    if has_shadow {
                        site.shadow(client, &rules).await;
                    }
                    Ok(())
                }
            }
        }
        // on_error is for the backend failing; anything else refuses.
        Err(error) if error.is_backend_failure() => {
            site.on_error(keys, client.prefix(), error, deadline).await
        }
        Err(error) => {
            let first = if has_shadow { index[0] } else { 0 };
            Err(site.misuse(enforced, first, error))
        }
    }
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
        name: "tests::f",
        shadow: false,
        rate: 1,
        interval: Duration::from_secs(1),
        mode: RateType::Overall,
        permits: 1,
        on_error: OnError::Allow,
        message: None,
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
