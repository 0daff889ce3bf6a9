//! The arguments of one `#[rate_limit(...)]`: each `name = value` read on its own with
//! its span (`values.rs`), then checked together (`rule.rs`), every problem reported
//! at its token.

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Error, Expr, Ident, Token};

use crate::rule::{Given, RuleArgs, ALGORITHMS, MODES, POLICIES};
use crate::values;

pub const ACCEPTED: &str =
    "rate, interval, key, mode, permits, cost, settle, max_overdraft, timeout, fallback, on_error, message, shadow, local_refusals, batch, batch_lease, algorithm, burst, warmup, crate";

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
    let mut given = Given::new(attr_span);
    for Arg { name, value } in &args {
        if first_time(&mut given.written, name, errors) {
            read(&mut given, name, value, params, errors);
        }
    }
    given.check(errors);
    if errors.len() > before {
        return None;
    }
    given.build()
}

/// Whether `name` is written here for the first time; a duplicate is reported at its
/// second occurrence.
fn first_time(written: &mut Vec<Ident>, name: &Ident, errors: &mut Vec<Error>) -> bool {
    let text = name.to_string();
    if written.iter().any(|s| *s == text) {
        errors.push(Error::new(
            name.span(),
            format!("duplicate argument `{text}`; each is given once. Accepted arguments: {ACCEPTED}"),
        ));
        return false;
    }
    written.push(name.clone());
    true
}

/// What `shadow` and `local_refusals` say when they are not a bool.
const SHADOW_PROBLEM: &str =
    "`shadow` must be `true` or `false`: a shadow rule is decided and reported, never refusing";
const LOCAL_REFUSALS_PROBLEM: &str =
    "`local_refusals` must be `true` or `false`: whether a refusal Redis gave \
     is answered again in process until its wait ends";

/// Reads one argument's value into `given`, or reports an unknown argument.
fn read(given: &mut Given, name: &Ident, value: &Expr, params: &[String], errors: &mut Vec<Error>) {
    let span = value.span();
    match name.to_string().as_str() {
        "rate" => given.rate = values::integer("rate", value, errors),
        "interval" => given.interval = values::duration("interval", value, errors),
        "permits" => given.permits = values::permits(value, errors),
        "cost" => given.cost = Some(value.clone()),
        "settle" => given.settle = values::path("settle", value, errors),
        "max_overdraft" => {
            given.max_overdraft = values::whole("max_overdraft", value, errors).map(|n| (span, n))
        }
        "key" => given.key = values::key(value, params, errors),
        "mode" => given.mode = values::choice("mode", value, &MODES, errors),
        "on_error" => given.on_error = values::choice("on_error", value, &POLICIES, errors),
        "timeout" => given.timeout = values::duration("timeout", value, errors).map(|ms| (span, ms)),
        "fallback" => given.fallback = values::path("fallback", value, errors),
        "message" => given.message = values::message(value, errors),
        "shadow" => given.shadow = values::boolean(value, SHADOW_PROBLEM, errors),
        "local_refusals" => given.local_refusals = values::boolean(value, LOCAL_REFUSALS_PROBLEM, errors),
        "batch" => given.batch = values::integer("batch", value, errors).map(|k| (span, k)),
        "batch_lease" => {
            given.batch_lease = values::duration("batch_lease", value, errors).map(|ms| (span, ms))
        }
        "algorithm" => given.algorithm = values::choice("algorithm", value, &ALGORITHMS, errors),
        "burst" => given.burst = values::integer("burst", value, errors).map(|b| (span, b)),
        "warmup" => given.warmup = values::duration("warmup", value, errors).map(|ms| (span, ms)),
        "crate" => given.krate = values::path("crate", value, errors).map(|p| (span, p)),
        other => errors.push(Error::new(
            name.span(),
            format!("unknown argument `{other}`; accepted arguments: {ACCEPTED}"),
        )),
    }
}
