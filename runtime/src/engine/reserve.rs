//! A call whose rules include settled ones ([`RuleSpec::settled`](crate::RuleSpec)):
//! its rules reserved rather than decided, through the steps `Engine::decide` takes
//! (overrides, rules of other functions that overlap, calls no wait would let pass,
//! `timeout`, `on_error`, shadow rules, the span, the counters and the log), and the
//! reservations held while the function runs, then settled with what it used
//! ([`Pending::settle`]).
//!
//! Under `on_error = "local"` the in-process limiter that granted is the one settled;
//! under `allow` nothing was reserved, so nothing is settled. A settle the backend
//! does not take is sent again in the background (`reserve/retry.rs`).

use std::borrow::Cow;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::call::{CallKeys, Granted};
use super::{span, Engine, Rules};
use crate::{default_client, Client, Error, RateLimited, Reservation, Reserved, Rule};

/// What a call holds while the function runs: the reservations made for it, to settle
/// once its result is known. Dropped without settling, each keeps its estimates
/// counted.
#[derive(Debug, Default)]
#[must_use = "a call's reservations are settled once its result is known"]
pub struct Pending {
    held: Vec<Held>,
    granted: Granted,
}

/// One reservation of a call.
#[derive(Debug)]
struct Held {
    reservation: Reservation,
    /// The engine's index of each rule of the reservation, in its order.
    index: Vec<usize>,
    /// The engine's index of each settled rule of the reservation, in its order.
    settled: Vec<usize>,
    /// Whether its rules are shadow rules (never in a response's fields).
    shadow: bool,
}

impl Pending {
    /// Holds `reservation`, whose rules are the engine's rules `index`.
    fn hold(&mut self, engine: &Engine, reservation: Reservation, index: &[usize]) {
        let settled = index.iter().copied().filter(|&i| engine.rules[i].settled);
        self.held.push(Held {
            reservation,
            index: index.to_vec(),
            settled: settled.collect(),
            shadow: index.iter().all(|&i| engine.rules[i].shadow),
        });
    }

    /// The grant, as [`Engine::decide`] answers it: the enforced rule with the fewest
    /// permits left when it was reserved.
    pub fn granted(&self) -> Granted {
        self.granted
    }

    /// Settles every reservation with what the call used: `actual` holds one amount per
    /// rule of `engine` (only the settled rules' are read). A settle the backend does
    /// not take is logged (throttled) and sent again in the background.
    ///
    /// Answers the grant as it stands after the settle (the enforced rule with the
    /// fewest permits left, each settled rule's moved by what went back or was
    /// overdrawn), or `None` when a settle failed and what is left is not known.
    pub async fn settle(self, engine: &Engine, actual: &[u64]) -> Option<Granted> {
        if actual.len() != engine.rules.len() {
            // Not one amount per rule: every estimate stays counted.
            debug_assert!(false, "{} amounts for {} rules", actual.len(), engine.rules.len());
            return None;
        }
        // Every settle started before any is awaited: a caller gone while one is
        // answered leaves none unsent.
        let started: Vec<_> = self
            .held
            .into_iter()
            .map(|held| {
                let held_left: Vec<(usize, u64, (u64, Duration))> = held
                    .reservation
                    .left()
                    .map(|(first, n, rate, window)| (held.index[first], n, (rate, window)))
                    .collect();
                let amounts: crate::reserve::Amounts = held.settled.iter().map(|&i| actual[i]).collect();
                let settling = (!amounts.is_empty()).then(|| held.reservation.start_settle(amounts));
                (held.index, held.shadow, held_left, settling)
            })
            .collect();
        let mut left: Vec<(usize, u64, (u64, Duration))> = Vec::new();
        let mut known = true;
        for (index, shadow, mut held_left, settling) in started {
            let enforced = !shadow;
            if let Some(settling) = settling {
                match settling.await {
                    Ok(settled) => {
                        for rule in settled.rules {
                            let i = index[rule.rule];
                            if let Some(entry) = held_left.iter_mut().find(|e| e.0 == i) {
                                entry.1 = rule.remaining;
                            }
                        }
                    }
                    Err(error) => {
                        engine.settles.failed(engine.function, &error);
                        known = false;
                    }
                }
            }
            if enforced {
                left.extend(held_left);
            }
        }
        if !known {
            return None;
        }
        // The first of the fewest, in the engine's order, as a decision picks it.
        let tightest = left.iter().min_by_key(|(i, n, _)| (*n, *i));
        Some(match tightest {
            Some(&(i, n, decided)) => Granted {
                tightest: Some((i, n)),
                decided: Some(decided),
            },
            None => self.granted,
        })
    }
}

/// What a settled rule's estimate of 0 is: misuse (an attribute's `cost`), or a
/// request the rule does not apply to (a layer's exempt value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Zero {
    Refused,
    Exempt,
}

impl Engine {
    /// Reserves every rule of one call, as [`decide`](Engine::decide) decides them:
    /// `Ok` with the reservations to settle once the call is over, `Err` with the
    /// refusal.
    ///
    /// `permits` holds one per rule: a settled rule's estimate for this call, or what
    /// another rule takes (0: it does not apply to this call). A settled rule's
    /// estimate of 0 is refused as misuse.
    pub async fn reserve(
        &self,
        client: Option<&Client>,
        keys: &mut [String],
        permits: &[u64],
    ) -> Result<Pending, RateLimited> {
        self.reserve_for(client, keys, permits, Zero::Refused).await
    }

    /// [`reserve`](Engine::reserve) for a request through a layer, where an estimate of
    /// 0 is a request the rule does not apply to (a value the rule exempts), as for any
    /// other rule: the layer counts a computed cost of 0 as 1.
    pub async fn reserve_request(
        &self,
        client: Option<&Client>,
        keys: &mut [String],
        permits: &[u64],
    ) -> Result<Pending, RateLimited> {
        self.reserve_for(client, keys, permits, Zero::Exempt).await
    }

    async fn reserve_for(
        &self,
        client: Option<&Client>,
        keys: &mut [String],
        permits: &[u64],
        zero: Zero,
    ) -> Result<Pending, RateLimited> {
        let call = CallKeys::new(keys, Some(permits));
        let with_grant = |(granted, mut pending): (Granted, Pending)| {
            pending.granted = granted;
            pending
        };
        if !tracing::level_enabled!(tracing::Level::DEBUG) {
            return self
                .reserve_in_span(client, call, zero, false)
                .await
                .map(with_grant);
        }
        let span = span::decide_span(&self.rules);
        if span.is_disabled() {
            return self
                .reserve_in_span(client, call, zero, false)
                .await
                .map(with_grant);
        }
        let reserved = self.reserve_in_span(client, call, zero, true);
        let reserved = Box::pin(tracing::Instrument::instrument(reserved, span.clone())).await;
        span::record(&span, reserved.as_ref().map(|(granted, _)| granted));
        reserved.map(with_grant)
    }

    /// `traced`: the span is recorded (a subscriber wants it).
    async fn reserve_in_span(
        &self,
        client: Option<&Client>,
        mut call: CallKeys<'_>,
        zero: Zero,
        traced: bool,
    ) -> Result<(Granted, Pending), RateLimited> {
        tracing::trace!(keys = ?call.keys, "redlimit keys");
        let deadline = self.timeout.map(crate::client::waiting::deadline_in);
        let client = match client {
            Some(client) => client,
            None => match default_client() {
                Ok(client) => client,
                Err(error) => {
                    return Box::pin(self.reserve_without_client(&mut call, error, zero, deadline)).await
                }
            },
        };
        if traced {
            tracing::Span::current().record("backend", client.backend().label());
        }
        let (rules, failed) = self
            .checked_rules(client, &mut call, zero == Zero::Refused)
            .await?;
        self.enforce_reserved(client, &call, rules, failed, deadline)
            .await
    }

    /// No client could be made: as [`decide`](Engine::decide) does, `on_error` on the
    /// process's own limiters for a backend failure, refused for anything else.
    async fn reserve_without_client(
        &self,
        call: &mut CallKeys<'_>,
        error: Error,
        zero: Zero,
        deadline: Option<Instant>,
    ) -> Result<(Granted, Pending), RateLimited> {
        let rules: Rules = self.build_rules(crate::DEFAULT_PREFIX, call, None);
        if let Some(refused) = (zero == Zero::Refused)
            .then(|| self.estimated_at_zero(call, &rules))
            .flatten()
            .or_else(|| self.never_passes(call, &rules))
        {
            return Err(refused);
        }
        if !error.is_backend_failure() {
            return Err(self.misuse(&rules, 0, error));
        }
        let local = self.on_error_reserved(call, rules, error, deadline, &super::LOCAL);
        local.await.map(|pending| (Granted::default(), pending))
    }

    /// Has `client` reserve the enforced rules (all or nothing); then the grant with
    /// the shadow rules after it, the refusal, or `on_error`.
    async fn enforce_reserved(
        &self,
        client: &Client,
        call: &CallKeys<'_>,
        rules: Rules,
        failed: Option<Error>,
        deadline: Option<Instant>,
    ) -> Result<(Granted, Pending), RateLimited> {
        let index: Vec<usize> = (0..rules.len())
            .filter(|&i| !self.rules[i].shadow && call.applies(i))
            .collect();
        let enforced: Vec<Rule> = index.iter().map(|&i| rules[i].clone()).collect();
        let position = |i: usize| index[i];
        let reserved = match (failed, enforced.is_empty()) {
            (Some(failed), _) => Err(failed),
            (None, true) => Ok(None),
            (None, false) => self
                .reserve_rules(client, &enforced, &index, deadline)
                .await
                .map(Some),
        };
        let reservation = match reserved {
            Ok(Some(Reserved::Refused(decision))) => {
                return Err(self.refused_by(client, &enforced, &decision, &position))
            }
            Ok(Some(Reserved::Granted(reservation))) => Some(reservation),
            Ok(None) => None,
            Err(error) if error.is_backend_failure() => {
                let local = self.on_error_reserved(call, rules, error, deadline, client.local());
                return Box::pin(local).await.map(|pending| (Granted::default(), pending));
            }
            Err(error) => return Err(self.misuse(&enforced, index[0], error)),
        };
        let mut pending = Pending::default();
        let decision = reservation.as_ref().map(|r| *r.decision());
        if let Some(reservation) = reservation {
            self.failures.succeeded(self.function);
            pending.hold(self, reservation, &index);
        }
        Box::pin(self.shadow_reserved(client, &rules, call, &mut pending)).await;
        Ok((
            self.granted(call, &enforced, decision.as_ref(), &position),
            pending,
        ))
    }

    /// The `on_error` policies for a reservation the backend failed with `error`:
    /// `deny` refuses, `allow` passes with nothing reserved, `local` rules are
    /// reserved on `fallback`'s in-process limiters (and settled there).
    async fn on_error_reserved(
        &self,
        call: &CallKeys<'_>,
        rules: Rules,
        error: Error,
        deadline: Option<Instant>,
        fallback: &Client,
    ) -> Result<Pending, RateLimited> {
        let local = self.policies(call, &rules, error)?;
        let mut pending = Pending::default();
        if local.is_empty() {
            return Ok(pending);
        }
        let local_rules: Vec<Rule> = local.iter().map(|&i| rules[i].clone()).collect();
        match self.reserve_rules(fallback, &local_rules, &local, deadline).await {
            Ok(Reserved::Granted(reservation)) => {
                pending.hold(self, reservation, &local);
                Ok(pending)
            }
            Ok(Reserved::Refused(decision)) => Err(self.refusal(&local_rules, &decision, |i| local[i])),
            // The rules cannot be enforced anywhere: refused, never let through.
            Err(local_error) => Err(self.misuse(&local_rules, local[0], local_error)),
        }
    }

    /// Reserves `rules` (the engine's rules `index`) on `client`, labelled with their
    /// templates, waiting until `deadline` when the function has a `timeout` as a
    /// decision waits: the reservation kept is the attempt's that was granted.
    async fn reserve_rules(
        &self,
        client: &Client,
        rules: &[Rule],
        index: &[usize],
        deadline: Option<Instant>,
    ) -> Result<Reserved, Error> {
        let labels: Vec<Cow<'static, str>> = index.iter().map(|&i| self.rules[i].name.clone()).collect();
        let Some(deadline) = deadline else {
            return client.reserve_labelled(rules, Some(&labels)).await;
        };
        let granted: Mutex<Option<Reservation>> = Mutex::new(None);
        let (labels, slot) = (&labels, &granted);
        let attempt = move || async move {
            match client.reserve_labelled(rules, Some(labels)).await? {
                Reserved::Granted(reservation) => {
                    let decision = *reservation.decision();
                    *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(reservation);
                    Ok(decision)
                }
                Reserved::Refused(decision) => Ok(decision),
            }
        };
        let decision = crate::client::waiting::until_allowed(Some(deadline), attempt).await?;
        Ok(
            match granted.into_inner().unwrap_or_else(PoisonError::into_inner) {
                Some(reservation) => Reserved::Granted(reservation),
                None => Reserved::Refused(decision),
            },
        )
    }

    /// Each shadow rule that applies, after a grant: a settled one reserved on its own
    /// (held in `pending`, settled with the others), any other decided; a refusal is
    /// only reported, as [`shadow`](Engine::shadow) does.
    async fn shadow_reserved(
        &self,
        client: &Client,
        rules: &[Rule],
        call: &CallKeys<'_>,
        pending: &mut Pending,
    ) {
        let shadow = (0..rules.len()).filter(|&i| self.rules[i].shadow && call.applies(i));
        for i in shadow {
            let one = std::slice::from_ref(&rules[i]);
            let refused = if self.rules[i].settled {
                let label = std::slice::from_ref(&self.rules[i].name);
                match client.reserve_labelled(one, Some(label)).await {
                    Ok(Reserved::Granted(reservation)) => {
                        pending.hold(self, reservation, &[i]);
                        continue;
                    }
                    Ok(Reserved::Refused(decision)) => decision.retry_after,
                    // A shadow rule never refuses, not even when it cannot be decided.
                    Err(_) => continue,
                }
            } else {
                match client.check_rules(one).await {
                    Ok(decision) if !decision.allowed => decision.retry_after,
                    _ => continue,
                }
            };
            self.shadow_refused(i, refused);
        }
    }
}

/// Reserves every rule of an attribute's call on the default client: `Ok` to run the
/// body, holding what to settle once it returns; `Err` with the refusal.
pub async fn reserve(
    engine: &'static Engine,
    keys: &mut [String],
    permits: &[u64],
) -> Result<Pending, RateLimited> {
    engine.reserve(None, keys, permits).await
}
