//! Checking every `#[rate_limit]` of a function into a [`Plan`]: each attribute's
//! arguments (`args.rs`), then the rules across them and against the signature, every
//! error reported at once.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Error, Ident, Path, Signature, Type};

use crate::args;
use crate::input::Group;
use crate::params::{bound_names, param_names};
use crate::rule::RuleArgs;
use crate::template::Piece;

/// Everything the prologue needs, checked.
pub struct Plan {
    pub rules: Vec<RuleArgs>,
    pub krate: Path,
    pub timeout_ms: Option<u64>,
    pub fallback: Option<Path>,
    /// Each parameter's name when it is a plain binding.
    pub names: Vec<Option<Ident>>,
    /// The function's result type, when a rule is settled (its `settle` reads it).
    pub output: Option<Type>,
}

/// Checks the arguments of every attribute and the rules across them, all errors at
/// once, into a plan (with no rules when no attribute is left).
pub fn check(sig: &Signature, groups: Vec<Group>, is_async_trait: bool) -> Result<Plan, Vec<Error>> {
    let mut errors = Vec::new();
    let names = param_names(sig);
    let params = bound_names(sig);
    let rules: Vec<RuleArgs> = groups
        .into_iter()
        .filter_map(|Group { name, args }| args::parse(args, name.span(), &params, &mut errors))
        .collect();

    let krate = call_level(
        &rules,
        "crate",
        |r| r.krate.as_ref().map(|(s, p)| (*s, p.clone())),
        &mut errors,
    )
    .unwrap_or_else(|| syn::parse_quote!(::redlimit));
    let timeout_ms = call_level(&rules, "timeout", |r| r.timeout, &mut errors);
    let fallback = call_level(
        &rules,
        "fallback",
        |r| r.fallback.as_ref().map(|p| (p.span(), p.clone())),
        &mut errors,
    );

    check_distinct_templates(&rules, &mut errors);
    check_async(sig, is_async_trait, &mut errors);
    let output = crate::settled::check(sig, &rules, is_async_trait, &mut errors);
    if let Some(path) = &fallback {
        check_fallback_args(path, &names, &mut errors);
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(Plan {
        rules,
        krate,
        timeout_ms,
        fallback,
        names,
        output,
    })
}

/// The limiter is awaited before the body, so the function must be async (or be the
/// body `#[async_trait]` leaves).
fn check_async(sig: &Signature, is_async_trait: bool, errors: &mut Vec<Error>) {
    if sig.asyncness.is_none() && !is_async_trait {
        errors.push(Error::new(
            sig.fn_token.span,
            "#[rate_limit] needs an `async fn`: the limiter is awaited before the body runs",
        ));
    }
}

/// A fallback is called with the function's arguments, so each must have a name.
fn check_fallback_args(path: &Path, names: &[Option<Ident>], errors: &mut Vec<Error>) {
    if let Some(position) = names.iter().position(Option::is_none) {
        errors.push(Error::new(
            path.span(),
            format!(
                "`fallback` is called with the function's arguments, but parameter {} is a pattern; \
                 give every parameter a plain name",
                position + 1
            ),
        ));
    }
}

/// Rejects two rules whose templates are the same text up to placeholders
/// (`transfer:{from}` and `transfer:{to}`): a caller passing equal values would make
/// both name one limiter, which has one config.
fn check_distinct_templates(rules: &[RuleArgs], errors: &mut Vec<Error>) {
    let shape = |rule: &RuleArgs| -> Option<Vec<Option<String>>> {
        rule.key.as_ref().map(|(_, pieces)| {
            pieces
                .iter()
                .map(|piece| match piece {
                    Piece::Text(text) => Some(text.clone()),
                    Piece::Value(_) | Piece::Request(_) => None,
                })
                .collect()
        })
    };
    for (second, rule) in rules.iter().enumerate() {
        let this = shape(rule);
        let Some(first) = rules[..second].iter().position(|r| shape(r) == this) else {
            continue;
        };
        let message = match &rule.key {
            None => format!(
                "rules {} and {} both have no `key`, so both use the function's path: one limiter \
                 cannot hold two configs; give each rule its own `key`, e.g. `key = \"per_minute\"`",
                first + 1,
                second + 1
            ),
            Some((lit, _)) => {
                let earlier = rules[first]
                    .key
                    .as_ref()
                    .map_or_else(String::new, |(l, _)| l.value());
                format!(
                    "key \"{}\" is the same text as rule {}'s \"{earlier}\" up to placeholders, so a caller \
                     passing equal values makes both rules name one limiter, which has one config; \
                     give each rule its own text, e.g. \"{}\"",
                    lit.value(),
                    first + 1,
                    suggestion(&lit.value(), second + 1)
                )
            }
        };
        let span = rule.key.as_ref().map_or(rule.span, |(lit, _)| lit.span());
        errors.push(Error::new(span, message));
    }
}

/// `template` with its first placeholder's name written before it as text
/// (`transfer:{to}` becomes `transfer:to:{to}`), which sets it apart.
fn suggestion(template: &str, rule: usize) -> String {
    let open = template
        .match_indices('{')
        .map(|(at, _)| at)
        .find(|&at| !template[at..].starts_with("{{") && (at == 0 || !template[..at].ends_with('{')));
    let Some(at) = open else {
        return format!("{template}:rule{rule}");
    };
    let name = template[at + 1..]
        .split('}')
        .next()
        .and_then(|path| path.rsplit('.').next())
        .unwrap_or("rule");
    format!("{}{name}:{}", &template[..at], &template[at..])
}

/// A setting that applies to the whole call, given by at most one attribute.
fn call_level<T>(
    rules: &[RuleArgs],
    name: &str,
    get: impl Fn(&RuleArgs) -> Option<(Span, T)>,
    errors: &mut Vec<Error>,
) -> Option<T> {
    let mut found = rules.iter().filter_map(get);
    let first = found.next();
    for (span, _) in found {
        errors.push(Error::new(
            span,
            format!("`{name}` is already set by another #[rate_limit] on this function; set it once"),
        ));
    }
    first.map(|(_, value)| value)
}
