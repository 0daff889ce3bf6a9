//! Rules whose keys lie in different cluster slots cannot share one script call. They
//! are decided one slot after another, and when a later slot refuses, the permits the
//! earlier slots took are given back (their log members removed and values restored),
//! so the call stays all or nothing. Between taking and giving back, those permits are
//! held, never free: nothing can be over-granted in between, at worst briefly
//! under-granted.

use std::collections::HashMap;

use super::redis::RedisBackend;
use super::{Call, ConfigChange, Outcome};
use crate::keys::hash_slot;
use crate::{member, Error};

/// Whether every call's keys lie in one slot.
pub(crate) fn one_slot(calls: &[Call<'_>]) -> bool {
    let mut slots = calls.iter().map(|c| hash_slot(c.keys.config().as_bytes()));
    let first = slots.next();
    slots.all(|slot| Some(slot) == first)
}

/// Call indexes grouped by slot, groups in the order of their first rule.
fn groups(calls: &[Call<'_>]) -> Vec<Vec<usize>> {
    let mut order: Vec<Vec<usize>> = Vec::new();
    let mut by_slot: HashMap<u16, usize> = HashMap::new();
    for (i, call) in calls.iter().enumerate() {
        let slot = hash_slot(call.keys.config().as_bytes());
        let group = *by_slot.entry(slot).or_insert_with(|| {
            order.push(Vec::new());
            order.len() - 1
        });
        order[group].push(i);
    }
    order
}

type Members = Vec<[u8; member::MEMBER_LEN]>;

impl RedisBackend {
    pub(super) async fn acquire_across_slots(&self, calls: &[Call<'_>], now: u64) -> Result<Outcome, Error> {
        let mut taken: Vec<(Vec<usize>, Members)> = Vec::new();
        let mut rules = vec![(0u64, ConfigChange::Kept); calls.len()];
        let mut at_ms = now;
        for group in groups(calls) {
            let sub: Vec<Call<'_>> = group.iter().map(|&i| calls[i].clone()).collect();
            let (outcome, members) = match self.acquire_group(&sub, now).await {
                Ok(answer) => answer,
                Err(err) => {
                    self.give_back(calls, &taken).await;
                    return Err(err);
                }
            };
            at_ms = at_ms.max(outcome.at_ms);
            for (&i, rule) in group.iter().zip(&outcome.rules) {
                rules[i] = *rule;
            }
            if !outcome.granted {
                self.give_back(calls, &taken).await;
                // The earlier slots' permits are back: report them as available.
                for (group, _) in &taken {
                    for &i in group {
                        rules[i].0 += calls[i].permits;
                    }
                }
                return Ok(Outcome {
                    granted: false,
                    refused: outcome.refused.map(|r| group[r]),
                    retry_ms: outcome.retry_ms,
                    at_ms,
                    rules,
                });
            }
            taken.push((group, members));
        }
        Ok(Outcome {
            granted: true,
            refused: None,
            retry_ms: 0,
            at_ms,
            rules,
        })
    }

    /// Refunds what earlier slots took; what cannot be refunded now is retried in the
    /// background (it returns by itself when it leaves the window).
    async fn give_back(&self, calls: &[Call<'_>], taken: &[(Vec<usize>, Members)]) {
        for (group, members) in taken {
            let sub: Vec<Call<'_>> = group.iter().map(|&i| calls[i].clone()).collect();
            if self.refund(&sub, members).await.is_err() {
                self.spawn_refund(&sub, members.clone());
            }
        }
    }
}
