//! The arguments of one `#[rate_limit(...)]`: parsed with their spans first, then
//! checked together, every problem reported at its token.

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Error, Expr, ExprLit, Ident, Lit, LitStr, Path, Token};

use crate::duration;
use crate::template::{self, Piece};

/// The most permits one call may take: the permits log stores them in 4 bytes.
const MAX_PERMITS: u64 = u32::MAX as u64;

pub const ACCEPTED: &str =
    "rate, interval, key, mode, permits, timeout, fallback, on_error, message, shadow, local_refusals, algorithm, burst, warmup, crate";

/// `name = value`, with `crate` accepted as a name.
pub struct Arg {
    pub name: Ident,
    pub value: Expr,
}

impl Parse for Arg {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let name = Ident::parse_any(input)?;
        if !input.peek(Token![=]) {
            return Err(Error::new(
                name.span(),
                format!("expected `{name} = value`; accepted arguments: {ACCEPTED}"),
            ));
        }
        input.parse::<Token![=]>()?;
        Ok(Arg {
            name,
            value: input.parse()?,
        })
    }
}

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

/// One attribute, checked.
pub struct RuleArgs {
    /// The attribute's arguments, for errors about the rule as a whole.
    pub span: Span,
    pub rate: u64,
    pub interval_ms: u64,
    pub key: Option<(LitStr, Vec<Piece>)>,
    pub mode: Mode,
    pub permits: u64,
    pub on_error: Policy,
    pub message: Option<LitStr>,
    /// Decided and reported, never refusing.
    pub shadow: bool,
    /// Whether a refusal Redis gave may be answered again in process (default true).
    pub local_refusals: bool,
    /// `Some((burst, warmup_ms))`: a token bucket holding at most `burst`, warming up
    /// over `warmup_ms` (0: no warm-up).
    pub bucket: Option<(u64, u64)>,
    pub timeout: Option<(Span, u64)>,
    pub fallback: Option<Path>,
    pub krate: Option<(Span, Path)>,
}

/// The most coldness a warming-up bucket counts (warm-up in ms times the rate); the
/// runtime's twin is `MAX_COLD` in runtime/src/limiter.rs.
const MAX_COLD: u64 = 1 << 45;

fn string(value: &Expr) -> Option<&LitStr> {
    match value {
        Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => Some(s),
        _ => None,
    }
}

fn integer(name: &str, value: &Expr, errors: &mut Vec<Error>) -> Option<u64> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        }) => match int.base10_parse::<u64>() {
            Ok(0) => {
                errors.push(Error::new(int.span(), format!("`{name}` must be at least 1")));
                None
            }
            Ok(n) if n > duration::MAX_EXACT => {
                errors.push(Error::new(int.span(), format!("`{name}` must be at most 2^53")));
                None
            }
            Ok(n) => Some(n),
            Err(_) => {
                errors.push(Error::new(
                    int.span(),
                    format!("`{name}` must be an integer from 1 to 2^53"),
                ));
                None
            }
        },
        other => {
            errors.push(Error::new(
                other.span(),
                format!("`{name}` must be an integer literal, e.g. `{name} = 5`"),
            ));
            None
        }
    }
}

fn duration(name: &str, value: &Expr, errors: &mut Vec<Error>) -> Option<u64> {
    let Some(text) = string(value) else {
        errors.push(Error::new(
            value.span(),
            format!("`{name}` must be a string such as \"60s\" (units: ms, s, m, h, d)"),
        ));
        return None;
    };
    duration::parse_ms(&text.value())
        .map_err(|problem| errors.push(Error::new(text.span(), format!("`{name}` {problem}"))))
        .ok()
}

/// One of `accepted` (text, value), or an error listing them.
fn choice<T: Copy>(name: &str, value: &Expr, accepted: &[(&str, T)], errors: &mut Vec<Error>) -> Option<T> {
    let listed = accepted
        .iter()
        .map(|(a, _)| format!("\"{a}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let Some(text) = string(value) else {
        errors.push(Error::new(
            value.span(),
            format!("`{name}` must be one of {listed}"),
        ));
        return None;
    };
    let found = accepted.iter().find(|(a, _)| *a == text.value()).map(|&(_, v)| v);
    if found.is_none() {
        errors.push(Error::new(
            text.span(),
            format!("unknown {name} \"{}\"; accepted: {listed}", text.value()),
        ));
    }
    found
}

/// A path written as a path or as a string (`crate = "::facade"`); `None` otherwise.
pub fn path_value(value: &Expr) -> Option<Path> {
    match value {
        Expr::Path(p) if p.qself.is_none() => Some(p.path.clone()),
        Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => s.parse::<Path>().ok(),
        _ => None,
    }
}

fn path(name: &str, value: &Expr, errors: &mut Vec<Error>) -> Option<Path> {
    let found = path_value(value);
    if found.is_none() {
        let example = if name == "crate" {
            "`crate = ::redlimit`".to_owned()
        } else {
            format!("`{name} = my_fn`")
        };
        errors.push(Error::new(
            value.span(),
            format!("`{name}` must be a path, e.g. {example}"),
        ));
    }
    found
}

/// Parses and checks one attribute; errors go to `errors`, `None` when unusable.
pub fn parse(
    tokens: TokenStream,
    attr_span: Span,
    params: &[String],
    errors: &mut Vec<Error>,
) -> Option<RuleArgs> {
    let args = match Punctuated::<Arg, Token![,]>::parse_terminated.parse2(tokens) {
        Ok(args) => args,
        Err(err) => {
            errors.push(err);
            return None;
        }
    };
    let before = errors.len();
    let mut seen: Vec<Ident> = Vec::new();
    let mut rule = RuleArgs {
        span: attr_span,
        rate: 0,
        interval_ms: 0,
        key: None,
        mode: Mode::Overall,
        permits: 1,
        on_error: Policy::Local,
        message: None,
        shadow: false,
        local_refusals: true,
        bucket: None,
        timeout: None,
        fallback: None,
        krate: None,
    };
    let (mut rate, mut interval, mut permits) = (None, None, None);
    let (mut token_bucket, mut burst, mut warmup) = (false, None, None);
    for Arg { name, value } in &args {
        let text = name.to_string();
        if seen.iter().any(|s| *s == text) {
            errors.push(Error::new(
                name.span(),
                format!("duplicate argument `{text}`; each is given once. Accepted arguments: {ACCEPTED}"),
            ));
            continue;
        }
        seen.push(name.clone());
        match text.as_str() {
            "rate" => rate = integer("rate", value, errors),
            "interval" => interval = duration("interval", value, errors),
            "permits" => {
                permits = integer("permits", value, errors).map(|p| (value.span(), p));
                if let Some((span, p)) = permits.filter(|&(_, p)| p > MAX_PERMITS) {
                    errors.push(Error::new(
                        span,
                        format!(
                            "`permits` ({p}) must be at most {MAX_PERMITS}: each grant is logged with \
                             its permits in a 4-byte field (the layout Redisson shares)"
                        ),
                    ));
                    permits = None;
                }
            }
            "key" => match string(value) {
                Some(lit) => match template::parse(&lit.value())
                    .and_then(|pieces| template::check_params(&pieces, params).map(|()| pieces))
                    .and_then(|pieces| template::check_slot(&pieces).map(|()| pieces))
                    .and_then(|pieces| template::check_segments(&pieces).map(|()| pieces))
                {
                    Ok(pieces) => rule.key = Some((lit.clone(), pieces)),
                    Err(problem) => errors.push(Error::new(lit.span(), problem)),
                },
                None => errors.push(Error::new(
                    value.span(),
                    "`key` must be a string template, e.g. \"order:{user_id}\"",
                )),
            },
            "mode" => {
                let modes = [("overall", Mode::Overall), ("per_client", Mode::PerClient)];
                if let Some(mode) = choice("mode", value, &modes, errors) {
                    rule.mode = mode;
                }
            }
            "on_error" => {
                let policies = [
                    ("local", Policy::Local),
                    ("allow", Policy::Allow),
                    ("deny", Policy::Deny),
                ];
                if let Some(policy) = choice("on_error", value, &policies, errors) {
                    rule.on_error = policy;
                }
            }
            "timeout" => rule.timeout = duration("timeout", value, errors).map(|ms| (value.span(), ms)),
            "fallback" => rule.fallback = path("fallback", value, errors),
            "message" => match string(value) {
                Some(lit) => rule.message = Some(lit.clone()),
                None => errors.push(Error::new(value.span(), "`message` must be a string literal")),
            },
            "shadow" => match value {
                Expr::Lit(ExprLit { lit: Lit::Bool(b), .. }) => rule.shadow = b.value,
                other => errors.push(Error::new(
                    other.span(),
                    "`shadow` must be `true` or `false`: a shadow rule is decided and reported, never refusing",
                )),
            },
            "local_refusals" => match value {
                Expr::Lit(ExprLit { lit: Lit::Bool(b), .. }) => rule.local_refusals = b.value,
                other => errors.push(Error::new(
                    other.span(),
                    "`local_refusals` must be `true` or `false`: whether a refusal Redis gave is answered \
                     again in process until its wait ends",
                )),
            },
            "algorithm" => {
                let algorithms = [("sliding_window", false), ("token_bucket", true)];
                if let Some(bucket) = choice("algorithm", value, &algorithms, errors) {
                    token_bucket = bucket;
                }
            }
            "burst" => burst = integer("burst", value, errors).map(|b| (value.span(), b)),
            "warmup" => warmup = duration("warmup", value, errors).map(|ms| (value.span(), ms)),
            "crate" => rule.krate = path("crate", value, errors).map(|p| (value.span(), p)),
            other => errors.push(Error::new(
                name.span(),
                format!("unknown argument `{other}`; accepted arguments: {ACCEPTED}"),
            )),
        }
    }
    let has = |name: &str| seen.iter().any(|s| s == name);
    if !has("rate") {
        errors.push(Error::new(
            attr_span,
            "missing `rate`: add `rate = <permits per interval>`, e.g. `rate = 5`",
        ));
    }
    if !has("interval") {
        errors.push(Error::new(
            attr_span,
            "missing `interval`: add `interval = \"<duration>\"`, e.g. `interval = \"60s\"`",
        ));
    }
    if let (Some((span, _)), false) = (burst, token_bucket) {
        errors.push(Error::new(
            span,
            "`burst` is a token bucket's capacity: add `algorithm = \"token_bucket\"`, or remove `burst`",
        ));
    }
    if let (Some((span, _)), false) = (warmup, token_bucket) {
        errors.push(Error::new(
            span,
            "`warmup` is a token bucket's: add `algorithm = \"token_bucket\"`, or remove `warmup`",
        ));
    }
    // What one call may take: the rate, or a token bucket's capacity (default: the rate).
    let most = if token_bucket {
        burst.map(|(_, b)| b).or(rate)
    } else {
        rate
    };
    if let (Some(most), Some((span, permits))) = (most, permits) {
        if permits > most {
            let message = if token_bucket {
                format!("`permits` ({permits}) exceeds the bucket's `burst` ({most}): no call could ever be granted")
            } else {
                format!("`permits` ({permits}) exceeds `rate` ({most}): no call could ever be granted")
            };
            errors.push(Error::new(span, message));
        }
    }
    if let (true, Some(capacity), Some(interval)) = (token_bucket, most, interval) {
        if u128::from(capacity) * u128::from(interval) > u128::from(duration::MAX_EXACT) {
            errors.push(Error::new(
                burst.map_or(attr_span, |(span, _)| span),
                "the bucket's `burst` times the interval in milliseconds must be at most 2^53: its tokens \
                 are counted exactly in 1/interval-ms units; use a smaller burst or interval",
            ));
        }
    }
    if let (true, Some(capacity), Some(interval), Some((span, _))) = (token_bucket, most, interval, warmup) {
        if 4 * u128::from(capacity) * u128::from(interval) > u128::from(duration::MAX_EXACT) {
            errors.push(Error::new(
                span,
                "with a `warmup`, the bucket's `burst` times the interval in milliseconds must be at most \
                 2^51: a cold bucket may owe up to twice its capacity, counted exactly; use a smaller burst \
                 or interval",
            ));
        }
    }
    if let (Some(rate), Some((span, ms))) = (rate, warmup.filter(|_| token_bucket)) {
        if u128::from(ms) * u128::from(rate) > u128::from(MAX_COLD) {
            errors.push(Error::new(
                span,
                "`warmup` in milliseconds times `rate` must be at most 2^45: a bucket counts its \
                 coldness exactly in 1/interval-ms units of a token; use a shorter warm-up",
            ));
        }
    }
    if errors.len() > before {
        return None;
    }
    rule.rate = rate?;
    rule.interval_ms = interval?;
    rule.permits = permits.map_or(1, |(_, p)| p);
    rule.bucket = token_bucket.then(|| (burst.map_or(rule.rate, |(_, b)| b), warmup.map_or(0, |(_, w)| w)));
    Some(rule)
}
