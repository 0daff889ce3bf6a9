//! Refusals answered in process: once Redis refuses a call and says when it would
//! pass, the same call on the same limiter is refused by the client until then,
//! without a round trip. A grant is never made here.
//!
//! Only refusals that are exact in process are kept: a sliding window or a token
//! bucket without a warm-up, refused for `p` permits with `p - 1` left, so that the
//! very next permit to come back lets the call pass. Until that moment nothing about
//! the answer changes (no grant leaves the window earlier that would count, no whole
//! token refills), so the refusal, its `remaining` and its `retry_after` (the time left
//! of the wait Redis gave) are what Redis would answer, as long as no other client
//! gives permits back (this one's give-backs of ended batches land before its next
//! take of the limiter, but for batches closed to make room at its bound of batched
//! limiters), deletes the limiter or raises its rate meanwhile: then a call
//! Redis would grant may be refused, never for longer than the wait Redis gave. A call
//! for another number of permits, with another config, or of several rules goes to
//! Redis, and so does one at a time before the refusal's (a clock set back, which
//! Redis reads at the limiter's own time). Any grant this client makes on a limiter, and any change it makes to one,
//! drops what it kept of it. At most `MAX_ENTRIES` limiters are kept per client.
//!
//! At that bound a new refusal makes room: refusals whose wait is over go first, then
//! the eighth of the entries answered least recently (a batch, so that one scan of
//! the table pays for [`MAX_ENTRIES`] / 8 new refusals). The limiters that matter are
//! those called often, whose kept refusal saves a round trip on every call: a spray of
//! refusals on many limiters with long waits churns among its own entries, and evicts
//! an entry answered within the last `MAX_ENTRIES / 8` new refusals only by calling its
//! own entries more recently, each new one a script call of its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::keys::name_hash;
use crate::{Algorithm, Decision, Rule};

/// Limiters whose refusal one client keeps, at most.
pub(crate) const MAX_ENTRIES: usize = 10_000;

#[derive(Debug)]
struct Entry {
    /// The refused rule (its name is the limiter's), its name's hash.
    rule: Rule,
    hash: u64,
    permits: u64,
    left: u64,
    /// When Redis refused, and until when.
    at_ms: u64,
    until_ms: u64,
    /// When it was kept or last answered.
    used_ms: u64,
}

/// A client's refusals, by limiter name, hashed with the keyed
/// [`name_hash`] (names carry callers' values), which a rule keeps: a refusal
/// answered again hashes nothing.
#[derive(Debug)]
pub(crate) struct RefusalCache {
    on: bool,
    len: AtomicUsize,
    entries: Mutex<Entries>,
}

struct Entries(hashbrown::HashTable<Entry>);

impl std::fmt::Debug for Entries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entries").field("len", &self.0.len()).finish()
    }
}

impl RefusalCache {
    pub(crate) fn new(on: bool) -> Self {
        RefusalCache {
            on,
            len: AtomicUsize::new(0),
            entries: Mutex::new(Entries(hashbrown::HashTable::new())),
        }
    }

    fn eligible(&self, rule: &Rule) -> bool {
        self.on
            && rule.answers_refusals_locally()
            && (rule.counted_by() == Algorithm::SlidingWindow || rule.warmup_period().is_none())
    }

    fn lock(&self) -> MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The refusal of `rule` for `permits` at `now_ms`, when one is kept and its wait
    /// is not over.
    pub(crate) fn answer(&self, rule: &Rule, permits: u64, now_ms: u64) -> Option<Decision> {
        if self.len.load(Ordering::Relaxed) == 0 || !self.eligible(rule) {
            return None;
        }
        let hash = rule.name_hash();
        let mut entries = self.lock();
        let entry = entries.0.find_mut(hash, |e| e.rule.name() == rule.name())?;
        // (a clock behind the refusal: Redis decides a call up to a second behind at
        // the limiter's own time, which the wait left here would overstate)
        if entry.permits != permits || &entry.rule != rule || now_ms >= entry.until_ms || now_ms < entry.at_ms
        {
            return None;
        }
        entry.used_ms = now_ms;
        Some(Decision {
            allowed: false,
            remaining: entry.left,
            retry_after: Some(Duration::from_millis(entry.until_ms - now_ms)),
            refused_by: Some(0),
            at_ms: now_ms,
            tightest: Some(0),
        })
    }

    /// What Redis decided for `rule` alone, taking `permits`, at `now_ms`: a refusal
    /// that is exact in process is kept (true); anything else drops what was kept.
    pub(crate) fn note(&self, rule: &Rule, permits: u64, decision: &Decision, now_ms: u64) -> bool {
        let keep = !decision.allowed
            && self.eligible(rule)
            && permits > 0
            && decision.remaining + 1 == permits
            && decision.at_ms == now_ms;
        match (keep, decision.retry_after) {
            (true, Some(wait)) if !wait.is_zero() => {
                let entry = Entry {
                    rule: rule.clone(),
                    hash: rule.name_hash(),
                    permits,
                    left: decision.remaining,
                    at_ms: now_ms,
                    until_ms: now_ms.saturating_add(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)),
                    used_ms: now_ms,
                };
                self.keep(entry, now_ms);
                true
            }
            _ => {
                self.forget_rule(rule);
                false
            }
        }
    }

    /// Keeps `entry` in place of what was kept of its limiter; at [`MAX_ENTRIES`],
    /// after making room (see the module's docs).
    fn keep(&self, entry: Entry, now_ms: u64) {
        let mut entries = self.lock();
        let table = &mut entries.0;
        let (hash, name) = (entry.hash, entry.rule.name());
        let held = table.find(hash, |e| e.rule.name() == name).is_some();
        if table.len() >= MAX_ENTRIES && !held {
            make_room(table, now_ms);
        }
        match table.entry(hash, |e| e.rule.name() == name, |e| e.hash) {
            hashbrown::hash_table::Entry::Occupied(mut kept) => *kept.get_mut() = entry,
            hashbrown::hash_table::Entry::Vacant(room) => {
                room.insert(entry);
            }
        }
        self.len.store(table.len(), Ordering::Relaxed);
    }

    /// Drops what was kept of the limiter `name` (a grant, or a change to it).
    pub(crate) fn forget(&self, name: &str) {
        if self.len.load(Ordering::Relaxed) > 0 {
            self.forget_hashed(name_hash(name), name);
        }
    }

    /// Drops what was kept of `rule`'s limiter, with the hash the rule keeps.
    pub(crate) fn forget_rule(&self, rule: &Rule) {
        if self.len.load(Ordering::Relaxed) > 0 {
            self.forget_hashed(rule.name_hash(), rule.name());
        }
    }

    #[cfg(test)]
    fn holds(&self, name: &str) -> bool {
        self.lock().0.iter().any(|e| e.rule.name() == name)
    }

    /// Drops everything kept.
    pub(crate) fn forget_all(&self) {
        if self.len.load(Ordering::Relaxed) > 0 {
            let mut entries = self.lock();
            entries.0.clear();
            self.len.store(0, Ordering::Relaxed);
        }
    }

    fn forget_hashed(&self, hash: u64, name: &str) {
        let mut entries = self.lock();
        if let Ok(kept) = entries.0.find_entry(hash, |e| e.rule.name() == name) {
            kept.remove();
        }
        self.len.store(entries.0.len(), Ordering::Relaxed);
    }
}

/// Drops the entries whose wait is over; when that leaves more than seven eighths of
/// [`MAX_ENTRIES`], also those answered least recently, down to seven eighths.
fn make_room(table: &mut hashbrown::HashTable<Entry>, now_ms: u64) {
    const KEPT: usize = MAX_ENTRIES - MAX_ENTRIES / 8;
    table.retain(|e| e.until_ms > now_ms);
    if table.len() <= KEPT {
        return;
    }
    let mut used: Vec<u64> = table.iter().map(|e| e.used_ms).collect();
    let (_, &mut cut, _) = used.select_nth_unstable(table.len() - KEPT);
    table.retain(|e| e.used_ms >= cut);
    // Entries last used in the same millisecond as the cut, as many as it takes.
    let mut over = table.len().saturating_sub(KEPT);
    table.retain(|e| {
        let drop = over > 0 && e.used_ms == cut;
        over -= usize::from(drop);
        !drop
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_max_entries_are_kept_and_expired_ones_go_first() {
        let cache = RefusalCache::new(true);
        let refused = Decision {
            allowed: false,
            remaining: 0,
            retry_after: Some(Duration::from_secs(60)),
            refused_by: Some(0),
            at_ms: 1_000,
            tightest: Some(0),
        };
        for i in 0..MAX_ENTRIES {
            let rule = Rule::new(format!("k:{i}"), 1, Duration::from_secs(60));
            cache.note(&rule, 1, &refused, 1_000);
        }
        assert_eq!(cache.lock().0.len(), MAX_ENTRIES);
        let late = Rule::new("late", 1, Duration::from_secs(60));
        cache.note(
            &late,
            1,
            &Decision {
                at_ms: 70_000,
                ..refused
            },
            70_000,
        );
        let entries = cache.lock();
        assert_eq!(entries.0.len(), 1, "the expired entries made room");
        assert!(entries.0.iter().any(|e| e.rule.name() == "late"));
    }

    #[test]
    fn a_spray_of_long_refusals_neither_pins_the_cache_nor_evicts_the_limiters_called() {
        let cache = RefusalCache::new(true);
        let refused = |at_ms: u64| Decision {
            allowed: false,
            remaining: 0,
            retry_after: Some(Duration::from_secs(600)),
            refused_by: Some(0),
            at_ms,
            tightest: Some(0),
        };
        let rule = |name: String| Rule::new(name, 1, Duration::from_secs(600));
        let victim = rule("victim".into());
        cache.note(&victim, 1, &refused(1_000), 1_000);
        // 40 000 limiters refused at 1 per 600 s, one a millisecond; the victim is
        // called every 100 of them.
        for i in 0..40_000u64 {
            let now = 1_001 + i;
            cache.note(&rule(format!("k:{i}")), 1, &refused(now), now);
            if i % 100 == 0 {
                assert!(cache.answer(&victim, 1, now).is_some(), "the victim at {i}");
            }
            assert!(cache.lock().0.len() <= MAX_ENTRIES);
        }
        assert!(cache.holds("k:39999"), "the newest refusals are kept");
        assert!(!cache.holds("k:0"), "the oldest unused ones made room");
    }
}
