//! Logging a stored config that a rule rewrote: each rewrite, throttled per limiter and
//! over all limiters.
//!
//! All a rule knows is that the stored config differs from its own: something else
//! wrote it (the CLI's `set-rate`, the runtime API, Redisson, another rule). A config
//! that keeps changing means two writers disagree about one limiter; each rewrites it
//! in turn and neither limit holds as written. Every rewrite is reported, at most one
//! line per limiter per period and [`MOST_LINES`] over all limiters (two configs of a
//! rule keyed by a caller's value rewrite a limiter for each value sent), with the
//! number of rewrites the period left out.

use std::collections::HashMap;
use std::sync::Mutex;

use once_cell::sync::Lazy;

use crate::RateLimiterConfig;

/// At most one line per limiter this often.
const PERIOD_MS: u64 = 10_000;
/// At most this many lines per period over all limiters.
const MOST_LINES: u32 = 20;
/// Limiters remembered at once, so per-user limiters cannot grow the map unbounded.
const CAP: usize = 4096;

struct Seen {
    logged_at: u64,
    left_out: u64,
}

/// The lines of the current period over all limiters.
#[derive(Default)]
struct Period {
    start: u64,
    lines: u32,
    /// Rewrites left out because the period's lines were spent.
    left_out: u64,
}

#[derive(Default)]
struct Log {
    seen: HashMap<String, Seen>,
    period: Period,
}

static LOG: Lazy<Mutex<Log>> = Lazy::new(Default::default);

/// Reports that `rule` replaced its limiter's stored config `old` with its own at
/// `now` (ms).
pub(crate) fn changed(rule: &crate::Rule, old: &RateLimiterConfig, now: u64) {
    let (name, new) = (rule.name(), rule.config());
    crate::observe::config_changed();
    let (left_out, others_left_out) = {
        let mut log = LOG.lock().unwrap_or_else(|e| e.into_inner());
        let Log { seen, period } = &mut *log;
        if let Some(entry) = seen.get_mut(name) {
            if now.saturating_sub(entry.logged_at) < PERIOD_MS {
                entry.left_out += 1;
                return;
            }
        }
        // (a clock behind the period's start starts another)
        if now < period.start || now - period.start >= PERIOD_MS {
            *period = Period {
                start: now,
                lines: 0,
                left_out: period.left_out,
            };
        }
        if seen.len() >= CAP && !seen.contains_key(name) {
            seen.retain(|_, s| now.saturating_sub(s.logged_at) < PERIOD_MS);
            if seen.len() >= CAP {
                seen.clear();
            }
        }
        // (never logged: its first line may come at once)
        let entry = seen.entry(name.to_owned()).or_insert(Seen {
            logged_at: 0,
            left_out: 0,
        });
        if period.lines >= MOST_LINES {
            // counted against the limiter too: its next line says so
            period.left_out += 1;
            entry.left_out += 1;
            return;
        }
        period.lines += 1;
        entry.logged_at = now;
        (
            std::mem::take(&mut entry.left_out),
            std::mem::take(&mut period.left_out),
        )
    };
    if rule.is_overridden() {
        tracing::info!(
            limiter = name,
            from = %Shown(old),
            to = %Shown(new),
            rewrites_left_out = left_out,
            rewrites_left_out_overall = others_left_out,
            "the rule's rate is overridden at run time (`redlimit override`), so the rule wrote \
             the override's config over the stored one, keeping the window"
        );
        return;
    }
    tracing::warn!(
        limiter = name,
        from = %Shown(old),
        to = %Shown(new),
        rewrites_left_out = left_out,
        rewrites_left_out_overall = others_left_out,
        "the stored rate limiter config differs from the rule's, so the rule wrote its own \
         back, keeping the window; something else wrote the stored one (an override removed \
         since, `redlimit set-rate`, the runtime's set_rate, a Redisson client, or a rule of \
         another config on this limiter): change a rule's rate at run time with an override \
         (`redlimit override set`), and if this repeats, give rules that disagree keys of \
         their own"
    );
}

/// `5 per 60000 ms, overall, keep-alive 60000 ms`.
struct Shown<'a>(&'a RateLimiterConfig);

impl std::fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = self.0;
        let mode = match c.rate_type {
            crate::RateType::Overall => "overall",
            crate::RateType::PerClient => "per_client",
        };
        write!(f, "{} per {} ms, {mode}", c.rate, c.interval_ms())?;
        match c.keep_alive {
            Some(_) => write!(f, ", keep-alive {} ms", c.keep_alive_ms()),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::CountEvents;
    use crate::{Client, ManualClock, Rule};
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    #[test]
    fn every_rewrite_is_reported_throttled_per_limiter() {
        let warnings = CountEvents::new(tracing::Level::WARN);
        let count = warnings.counter();
        let _guard = tracing::subscriber::set_default(warnings);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let clock = ManualClock::new(1_000_000);
            let client = Client::builder().clock(clock.clone()).memory();
            let name = format!("flip:{}", client.client_id());
            let a = Rule::new(&name, 5, Duration::from_secs(60));
            let b = Rule::new(&name, 7, Duration::from_secs(60));
            client.check_rules(std::slice::from_ref(&a)).await.unwrap();
            assert_eq!(
                count.load(Ordering::SeqCst),
                0,
                "creating a config is not a rewrite"
            );
            client.check_rules(std::slice::from_ref(&b)).await.unwrap();
            assert_eq!(count.load(Ordering::SeqCst), 1, "the first rewrite");
            client.check_rules(std::slice::from_ref(&a)).await.unwrap();
            client.check_rules(std::slice::from_ref(&b)).await.unwrap();
            assert_eq!(
                count.load(Ordering::SeqCst),
                1,
                "within the period: counted, not logged"
            );
            assert_eq!(LOG.lock().unwrap().seen[name.as_str()].left_out, 2);
            clock.advance(Duration::from_millis(PERIOD_MS));
            client.check_rules(std::slice::from_ref(&a)).await.unwrap();
            assert_eq!(count.load(Ordering::SeqCst), 2, "the flip back, after the period");
            assert_eq!(LOG.lock().unwrap().seen[name.as_str()].left_out, 0);
            client.check_rules(&[a.clone().permits(2)]).await.unwrap();
            assert_eq!(count.load(Ordering::SeqCst), 2, "permits per call are not config");
            // Another limiter has its own period.
            let other = format!("{name}:other");
            client
                .check_rules(&[Rule::new(&other, 5, Duration::from_secs(1))])
                .await
                .unwrap();
            client
                .check_rules(&[Rule::new(&other, 6, Duration::from_secs(1))])
                .await
                .unwrap();
            assert_eq!(count.load(Ordering::SeqCst), 3);
        });
    }

    #[test]
    fn both_configs_are_named() {
        let old = RateLimiterConfig::new(crate::RateType::Overall, 5, Duration::from_secs(60))
            .with_keep_alive(Duration::from_secs(60));
        assert_eq!(
            Shown(&old).to_string(),
            "5 per 60000 ms, overall, keep-alive 60000 ms"
        );
    }
}
