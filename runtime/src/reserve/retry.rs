//! A settle the backend did not take, sent again in the background until it lands or
//! its grants have left their windows (then counted as abandoned: never dropped
//! silently). Sending it again is safe: a window's grant is found by its log member
//! and settled once, a token bucket's settle leaves a mark that makes a second one a
//! no-op.

use std::borrow::Cow;
use std::time::Duration;

use crate::backend::SettleCall;
use crate::keys::LimiterKeys;
use crate::{BucketShape, Client, RateLimiterConfig};

/// The first pause before a settle is sent again; each failure doubles it, up to
/// [`MOST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MOST_PAUSE: Duration = Duration::from_secs(2);

/// One settle, owned by the task that sends it.
struct Owned {
    keys: LimiterKeys,
    rule: RateLimiterConfig,
    bucket: Option<BucketShape>,
    member: [u8; crate::member::MEMBER_LEN],
    at: u64,
    estimate: u64,
    actual: u64,
    room: u64,
    segment: u64,
    mark_ms: u64,
}

impl Owned {
    fn call(&self) -> SettleCall<'_> {
        SettleCall {
            keys: self.keys.borrowed(),
            rule: &self.rule,
            bucket: self.bucket,
            member: &self.member,
            at: self.at,
            estimate: self.estimate,
            actual: self.actual,
            room: self.room,
            segment: self.segment,
            mark_ms: self.mark_ms,
            name_hash: None,
        }
    }
}

/// Sends `calls` again on `client` until they land or `until` (epoch ms, the
/// client's clock) passes; `labels`, one per call, label the metric of one abandoned
/// (counted once per label).
pub(super) fn spawn(
    client: &Client,
    calls: &[SettleCall<'_>],
    mut labels: Vec<Cow<'static, str>>,
    until: u64,
) {
    labels.sort();
    labels.dedup();
    let owned: Vec<Owned> = calls
        .iter()
        .filter_map(|c| {
            Some(Owned {
                keys: LimiterKeys::new(c.keys.config(), client.client_id()).ok()?,
                rule: *c.rule,
                bucket: c.bucket,
                member: *c.member,
                at: c.at,
                estimate: c.estimate,
                actual: c.actual,
                room: c.room,
                segment: c.segment,
                mark_ms: c.mark_ms,
            })
        })
        .collect();
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        abandoned(&labels, "outside a Tokio runtime");
        return;
    };
    let unsent = Unsent::new(labels);
    let left = Duration::from_millis(until.saturating_sub(client.now_ms()));
    let deadline = tokio::time::Instant::now() + left;
    let client = client.clone();
    runtime.spawn(async move {
        let mut pause = FIRST_PAUSE;
        loop {
            tokio::time::sleep(pause).await;
            if tokio::time::Instant::now() >= deadline {
                return unsent.abandon("its grants left their windows first");
            }
            let calls: Vec<SettleCall<'_>> = owned.iter().map(Owned::call).collect();
            match client.backend().settle(&calls, client.now_ms()).await {
                Ok(_) => {
                    // (refusals kept since the first try are no longer Redis's answer)
                    for call in &calls {
                        client.forget_refusal(call.keys.config());
                    }
                    return unsent.sent();
                }
                Err(error) if error.is_backend_failure() => pause = (pause * 2).min(MOST_PAUSE),
                Err(error) => return unsent.abandon(&error.to_string()),
            }
        }
    });
}

/// A settle a task carries, counted abandoned if the task ends without saying what
/// became of it: the runtime running it shut down first.
pub(super) struct Unsent {
    labels: Vec<Cow<'static, str>>,
    open: bool,
}

impl Unsent {
    /// The settle of the rules `labels` names, under way.
    pub(super) fn new(labels: Vec<Cow<'static, str>>) -> Unsent {
        Unsent { labels, open: true }
    }

    /// Sent, or handed on to a retry of its own (which counts it if it must).
    pub(super) fn sent(mut self) {
        self.open = false;
    }

    /// Given up for `why`.
    fn abandon(mut self, why: &str) {
        self.open = false;
        abandoned(&self.labels, why);
    }
}

impl Drop for Unsent {
    fn drop(&mut self) {
        if self.open {
            for label in &self.labels {
                crate::observe::settle_abandoned(label.clone());
            }
            let rule = self.labels.join(",");
            tracing::warn!(
                rule,
                "a reservation's settle was abandoned (the runtime running it shut down \
                 before it was answered): it may have landed or not"
            );
        }
    }
}

fn abandoned(labels: &[Cow<'static, str>], why: &str) {
    for label in labels {
        crate::observe::settle_abandoned(label.clone());
    }
    let rule = labels.join(",");
    tracing::warn!(
        rule,
        "a reservation's settle was abandoned ({why}): what the call used beyond its \
         estimate is not counted, or what it did not use is not given back"
    );
}
