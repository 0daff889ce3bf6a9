//! What is wrong with a limiter as read (problems: it is unhealthy) and what is worth
//! knowing about it (notes): keys of the wrong type or without a TTL, a value that
//! disagrees with its log, state left without a config, a bucket that is no bucket.

use super::read::{Config, KeyState};
use super::Inspection;
use crate::duration::show_ms;
use crate::words::count;

/// What is wrong with a token bucket's keys (problems) and worth knowing (notes).
fn diagnose_tokens(i: &mut Inspection) {
    for t in &i.token_buckets {
        if t.key.kind != "string" {
            i.problems.push(format!(
                "`{}` is a {}, not a token bucket's string",
                t.key.key, t.key.kind
            ));
        } else if t.state.is_none() {
            i.problems.push(format!(
                "`{}` holds {:?}, not a token bucket's state (rate:interval:burst:tokens:at); \
                 delete it (a missing bucket is a full one)",
                t.key.key,
                t.raw.as_deref().unwrap_or_default()
            ));
        } else if t.key.ttl_ms == -1 {
            i.problems.push(format!(
                "`{}` has no TTL: every write of a bucket sets one (until it is full again), \
                 so this key will never expire",
                t.key.key
            ));
        }
    }
    if i.config.is_some() && !i.token_buckets.is_empty() {
        i.notes.push(format!(
            "`{}` is both a sliding window (its config hash) and a token bucket: two rules of \
             different algorithms use this name",
            i.name
        ));
    }
}

/// Whether a key exists (TTL -2 is Redis's "no such key").
fn exists(k: &KeyState) -> bool {
    k.ttl_ms != -2
}

/// What is wrong (problems) and worth knowing (notes).
pub(super) fn diagnose(i: &mut Inspection) {
    diagnose_tokens(i);
    diagnose_config_key(i);
    let Some(config) = i.config.clone() else {
        return;
    };
    if let Some(problem) = &config.call_refuses {
        i.problems
            .push(format!("`{}` is a config every call refuses: {problem}", i.name));
    }
    diagnose_expiry(i, &config);
    for b in 0..i.buckets.len() {
        diagnose_window(i, b, &config);
    }
}

/// The config key: missing with state left behind, or not a config hash.
fn diagnose_config_key(i: &mut Inspection) {
    let any_state = i
        .buckets
        .iter()
        .any(|b| exists(&b.value_key) || exists(&b.log_key));
    match (&i.config, i.config_key.kind.as_str()) {
        (None, "none") if any_state => i.problems.push(format!(
            "no config at `{}`, but value or permits keys exist: state left behind (a deleted config, or keys that outlived it)",
            i.name
        )),
        (None, "none") => {}
        (None, "hash") => i.problems.push(format!("`{}` is a hash without rate and interval: not a limiter's config", i.name)),
        (None, kind) => i.problems.push(format!("`{}` is a {kind}, not a limiter's config hash", i.name)),
        _ => {}
    }
}

/// Keys without a TTL: a problem under a keep-alive, else a note.
fn diagnose_expiry(i: &mut Inspection, config: &Config) {
    let keep_alive = config.keep_alive_ms.unwrap_or(0) > 0;
    let no_ttl: Vec<String> = std::iter::once(&i.config_key)
        .chain(i.buckets.iter().flat_map(|b| [&b.value_key, &b.log_key]))
        .filter(|k| k.ttl_ms == -1)
        .map(|k| format!("`{}`", k.key))
        .collect();
    if !no_ttl.is_empty() && keep_alive {
        i.problems.push(format!(
            "{} without TTL although the limiter has a keep-alive of {}: they will never expire",
            no_ttl.join(", "),
            show_ms(config.keep_alive_ms.unwrap_or(0) as u64)
        ));
    } else if !no_ttl.is_empty() {
        i.notes.push(format!(
            "{} never expire (no keep-alive, Redisson's default): one limiter per user or client piles up",
            no_ttl.join(", ")
        ));
    }
}

/// One window (`i.buckets[b]`): its keys' types, its value against its log and rate,
/// members that are not grants.
fn diagnose_window(i: &mut Inspection, b: usize, config: &Config) {
    let (mut problems, mut notes) = (Vec::new(), Vec::new());
    let b = &i.buckets[b];
    for (key, expected) in [(&b.value_key, "string"), (&b.log_key, "zset")] {
        if exists(key) && key.kind != expected {
            problems.push(format!("`{}` is a {}, not a {expected}", key.key, key.kind));
        }
    }
    if let Some(value) = b.value {
        if value < 0 {
            // A debt, not damage (the sum below says whether the state is whole; what a
            // call finds is `available now`, and `check` says when one is granted).
            notes.push(format!(
                "`{}` is {value}: a debt of {} (grants settled beyond their estimates, or a rate lowered below what the window holds); `check` says when a call is granted again",
                b.value_key.key,
                count(value.unsigned_abs(), "permit", "permits"),
            ));
        }
        let sum = value.saturating_add(i64::try_from(b.log.permits).unwrap_or(i64::MAX));
        if b.log.undecodable == 0 && sum != config.rate {
            problems.push(format!(
                "value {value} + {} permits in the log = {sum}, not the rate {}: permits were lost or counted twice",
                b.log.permits, config.rate
            ));
        }
    } else if let Some(text) = &b.unread {
        problems.push(format!(
            "`{}` holds {text:?}, {}",
            b.value_key.key,
            crate::store::unread_value(text)
        ));
    } else if !exists(&b.value_key) && exists(&b.log_key) {
        notes.push(format!(
            "`{}` is missing: the next call rebuilds it from the log",
            b.value_key.key
        ));
    }
    if b.log.undecodable > 0 {
        problems.push(format!(
            "{} members of `{}` do not decode as grants or have scores that are no time",
            b.log.undecodable, b.log_key.key
        ));
    }
    i.problems.extend(problems);
    i.notes.extend(notes);
}
