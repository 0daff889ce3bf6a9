//! One rule as one `#[rate_limit(...)]` describes it: what the attribute wrote, each
//! value with its span, checked across its arguments into [`RuleArgs`].

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Error, Expr, Ident, LitStr, Path};

use crate::template::Piece;
use redlimit_syntax::MAX_EXACT;

/// The most coldness a warming-up bucket counts (warm-up in ms times the rate); the
/// runtime's twin is `MAX_COLD` in runtime/src/rules/fit.rs.
const MAX_COLD: u64 = 1 << 45;

/// `mode`: one bucket for every client, or one per client.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Overall,
    PerClient,
}

/// `on_error`: what the rule does when the backend fails.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Local,
    Allow,
    Deny,
}

/// `algorithm`: how the rule counts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    SlidingWindow,
    TokenBucket,
}

/// What `mode`, `on_error` and `algorithm` accept, as written.
pub const MODES: [(&str, Mode); 2] = [("overall", Mode::Overall), ("per_client", Mode::PerClient)];
pub const POLICIES: [(&str, Policy); 3] = [
    ("local", Policy::Local),
    ("allow", Policy::Allow),
    ("deny", Policy::Deny),
];
pub const ALGORITHMS: [(&str, Algorithm); 2] = [
    ("sliding_window", Algorithm::SlidingWindow),
    ("token_bucket", Algorithm::TokenBucket),
];

/// One attribute, checked.
pub struct RuleArgs {
    /// The attribute's arguments, for errors about the rule as a whole.
    pub span: Span,
    pub rate: u64,
    pub interval_ms: u64,
    pub key: Option<(LitStr, Vec<Piece>)>,
    pub mode: Mode,
    pub permits: u64,
    /// `cost`: the call's permits, an expression of the parameters evaluated before
    /// the call (a settled rule's estimate).
    pub cost: Option<Expr>,
    /// `settle`: the function reading what the call used from its result; the rule is
    /// settled.
    pub settle: Option<Path>,
    /// `max_overdraft`: the most a settle charges past the estimate.
    pub max_overdraft: Option<u64>,
    pub on_error: Policy,
    pub message: Option<LitStr>,
    /// Decided and reported, never refusing.
    pub shadow: bool,
    /// Whether a refusal Redis gave may be answered again in process (default true).
    pub local_refusals: bool,
    /// Permits taken from Redis at once and served in process (1: none), and the lease
    /// in ms (`None`: the runtime's default).
    pub batch: u64,
    pub batch_lease_ms: Option<u64>,
    /// Where `batch` was written, if it was.
    pub batch_span: Option<Span>,
    /// `Some((burst, warmup_ms))`: a token bucket holding at most `burst`, warming up
    /// over `warmup_ms` (0: no warm-up).
    pub bucket: Option<(u64, u64)>,
    pub timeout: Option<(Span, u64)>,
    pub fallback: Option<Path>,
    pub krate: Option<(Span, Path)>,
}

/// What one attribute wrote, each value read on its own: `None` for what was not
/// written or could not be read, with the span a later check reports at.
pub struct Given {
    /// The attribute's arguments.
    pub span: Span,
    /// Every argument name written, in order.
    pub written: Vec<Ident>,
    pub rate: Option<u64>,
    pub interval: Option<u64>,
    pub permits: Option<(Span, u64)>,
    pub cost: Option<Expr>,
    pub settle: Option<Path>,
    pub max_overdraft: Option<(Span, u64)>,
    pub key: Option<(LitStr, Vec<Piece>)>,
    pub mode: Option<Mode>,
    pub on_error: Option<Policy>,
    pub message: Option<LitStr>,
    pub shadow: Option<bool>,
    pub local_refusals: Option<bool>,
    pub batch: Option<(Span, u64)>,
    pub batch_lease: Option<(Span, u64)>,
    pub algorithm: Option<Algorithm>,
    pub burst: Option<(Span, u64)>,
    pub warmup: Option<(Span, u64)>,
    pub timeout: Option<(Span, u64)>,
    pub fallback: Option<Path>,
    pub krate: Option<(Span, Path)>,
}

impl Given {
    /// Nothing written yet.
    pub fn new(span: Span) -> Self {
        Given {
            span,
            written: Vec::new(),
            rate: None,
            interval: None,
            permits: None,
            cost: None,
            settle: None,
            max_overdraft: None,
            key: None,
            mode: None,
            on_error: None,
            message: None,
            shadow: None,
            local_refusals: None,
            batch: None,
            batch_lease: None,
            algorithm: None,
            burst: None,
            warmup: None,
            timeout: None,
            fallback: None,
            krate: None,
        }
    }

    /// The rules across arguments, each broken one reported at the argument to change.
    pub fn check(&self, errors: &mut Vec<Error>) {
        self.check_required(errors);
        self.check_bucket_only(errors);
        self.check_permits_fit(errors);
        self.check_exact_counts(errors);
        self.check_batch(errors);
        self.check_cost(errors);
    }

    /// The rule, once [`check`](Self::check) and every reader found nothing wrong.
    pub fn build(self) -> Option<RuleArgs> {
        let rate = self.rate?;
        let bucket = self.token_bucket().then(|| {
            (
                self.burst.map_or(rate, |(_, b)| b),
                self.warmup.map_or(0, |(_, w)| w),
            )
        });
        Some(RuleArgs {
            span: self.span,
            rate,
            interval_ms: self.interval?,
            key: self.key,
            mode: self.mode.unwrap_or(Mode::Overall),
            permits: self.permits.map_or(1, |(_, p)| p),
            cost: self.cost,
            settle: self.settle,
            max_overdraft: self.max_overdraft.map(|(_, n)| n),
            on_error: self.on_error.unwrap_or(Policy::Local),
            message: self.message,
            shadow: self.shadow.unwrap_or(false),
            local_refusals: self.local_refusals.unwrap_or(true),
            batch: self.batch.map_or(1, |(_, k)| k),
            batch_lease_ms: self.batch_lease.map(|(_, ms)| ms),
            batch_span: self.batch.map(|(span, _)| span),
            bucket,
            timeout: self.timeout,
            fallback: self.fallback,
            krate: self.krate,
        })
    }

    fn token_bucket(&self) -> bool {
        self.algorithm == Some(Algorithm::TokenBucket)
    }

    fn has(&self, name: &str) -> bool {
        self.written.iter().any(|s| s == name)
    }

    /// What one call may take: the rate, or a token bucket's capacity (default: the rate).
    fn most(&self) -> Option<u64> {
        if self.token_bucket() {
            self.burst.map(|(_, b)| b).or(self.rate)
        } else {
            self.rate
        }
    }

    /// `rate` and `interval` must be written.
    fn check_required(&self, errors: &mut Vec<Error>) {
        if !self.has("rate") {
            errors.push(Error::new(
                self.span,
                "missing `rate`: add `rate = <permits per interval>`, e.g. `rate = 5`",
            ));
        }
        if !self.has("interval") {
            errors.push(Error::new(
                self.span,
                "missing `interval`: add `interval = \"<duration>\"`, e.g. `interval = \"60s\"`",
            ));
        }
    }

    /// `burst` and `warmup` belong to a token bucket.
    fn check_bucket_only(&self, errors: &mut Vec<Error>) {
        if let (Some((span, _)), false) = (self.burst, self.token_bucket()) {
            errors.push(Error::new(
                span,
                "`burst` is a token bucket's capacity: add `algorithm = \"token_bucket\"`, or remove `burst`",
            ));
        }
        if let (Some((span, _)), false) = (self.warmup, self.token_bucket()) {
            errors.push(Error::new(
                span,
                "`warmup` is a token bucket's: add `algorithm = \"token_bucket\"`, or remove `warmup`",
            ));
        }
    }

    /// A call's permits must fit what the rule ever grants at once.
    fn check_permits_fit(&self, errors: &mut Vec<Error>) {
        let (Some(most), Some((span, permits))) = (self.most(), self.permits) else {
            return;
        };
        if permits > most {
            let message = if self.token_bucket() {
                format!("`permits` ({permits}) exceeds the bucket's `burst` ({most}): no call could ever be granted")
            } else {
                format!("`permits` ({permits}) exceeds `rate` ({most}): no call could ever be granted")
            };
            errors.push(Error::new(span, message));
        }
    }

    /// A token bucket's counts must stay exact in the doubles Redis scripts count in.
    fn check_exact_counts(&self, errors: &mut Vec<Error>) {
        if let (true, Some(capacity), Some(interval)) = (self.token_bucket(), self.most(), self.interval) {
            if u128::from(capacity) * u128::from(interval) > u128::from(MAX_EXACT) {
                errors.push(Error::new(
                    self.burst.map_or(self.span, |(span, _)| span),
                    "the bucket's `burst` times the interval in milliseconds must be at most 2^53: its tokens \
                     are counted exactly in 1/interval-ms units; use a smaller burst or interval",
                ));
            }
        }
        if let (true, Some(capacity), Some(interval), Some((span, _))) =
            (self.token_bucket(), self.most(), self.interval, self.warmup)
        {
            if 4 * u128::from(capacity) * u128::from(interval) > u128::from(MAX_EXACT) {
                errors.push(Error::new(
                    span,
                    "with a `warmup`, the bucket's `burst` times the interval in milliseconds must be at most \
                     2^51: a cold bucket may owe up to twice its capacity, counted exactly; use a smaller burst \
                     or interval",
                ));
            }
        }
        if let (Some(rate), Some((span, ms))) = (self.rate, self.warmup.filter(|_| self.token_bucket())) {
            if u128::from(ms) * u128::from(rate) > u128::from(MAX_COLD) {
                errors.push(Error::new(
                    span,
                    "`warmup` in milliseconds times `rate` must be at most 2^45: a bucket counts its \
                     coldness exactly in 1/interval-ms units of a token; use a shorter warm-up",
                ));
            }
        }
    }

    /// `settle` needs `cost`; `cost` replaces `permits`; a settled rule is not
    /// batched.
    fn check_cost(&self, errors: &mut Vec<Error>) {
        if let (Some(settle), None) = (&self.settle, &self.cost) {
            errors.push(Error::new(
                settle.span(),
                "`settle` needs `cost`: a settled rule reserves an estimate worked out from the \
                 arguments before the call, e.g. `cost = max_tokens`, then settles what the call \
                 used; add `cost = <expression of the parameters>`",
            ));
        }
        if let (Some((span, _)), None) = (self.max_overdraft, &self.settle) {
            errors.push(Error::new(
                span,
                "`max_overdraft` caps what a settle charges past the estimate: add `settle = ...` \
                 (and `cost`), or remove `max_overdraft`",
            ));
        }
        if let (Some(cost), Some(_)) = (&self.cost, self.permits) {
            errors.push(Error::new(
                cost.span(),
                "`cost` and `permits` both set what a call takes: keep `cost` (worked out from \
                 each call's arguments) or `permits` (the same for every call)",
            ));
        }
    }

    /// `batch` fits the rule: at most the rate and the permits log's 4-byte field, a
    /// sliding window's; `batch_lease` only with a batch, shorter than the interval.
    fn check_batch(&self, errors: &mut Vec<Error>) {
        if let (Some((span, k)), Some(rate)) = (self.batch, self.rate) {
            if k > rate || k > u64::from(u32::MAX) {
                errors.push(Error::new(
                    span,
                    format!(
                        "`batch` ({k}) exceeds `rate` ({rate}): a batch is at most the permits one interval \
                         grants (and at most 4294967295, the permits log's 4-byte field)"
                    ),
                ));
            }
        }
        if let (Some((span, k)), true) = (self.batch, self.token_bucket()) {
            if k > 1 {
                errors.push(Error::new(
                    span,
                    "`batch` is for the sliding window: a token bucket's grants are not served in \
                     batches; remove `batch` or `algorithm = \"token_bucket\"`",
                ));
            }
        }
        let batching = self.batch.is_some_and(|(_, k)| k > 1);
        if let (Some((span, _)), false) = (self.batch_lease, batching) {
            errors.push(Error::new(
                span,
                "`batch_lease` is how long a batch is served: add `batch = <k>` with k above 1, or remove \
                 `batch_lease`",
            ));
        }
        let lease = self.batch_lease.map(|(_, ms)| ms);
        if let (true, Some(interval)) = (batching, self.interval) {
            let lease_ms = lease.unwrap_or((interval / 10).clamp(1, 1_000));
            if lease_ms >= interval {
                let message = match self.batch_lease {
                    Some(_) => format!(
                        "`batch_lease` ({lease_ms} ms) must be shorter than `interval` ({interval} ms): a \
                         batch is served for part of a window"
                    ),
                    None => format!(
                        "`batch` needs an `interval` of at least 2 ms ({interval} ms here): a batch is served \
                         for a lease shorter than the interval (default: a tenth of it, at least 1 ms)"
                    ),
                };
                let at = self
                    .batch_lease
                    .or(self.batch)
                    .map_or(self.span, |(span, _)| span);
                errors.push(Error::new(at, message));
            }
        }
    }
}
