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
use crate::template::{Piece, RequestPart};

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
    /// The parameters taken for primitive integers by their types' names, where rules
    /// counting differently were told apart by their digits: each value a key writes
    /// of them is asserted to be one (`__private::integer_key`).
    pub integers: Vec<String>,
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
    let integers = integer_params(sig);
    check_coinciding_counts(&rules, &integers, &sig.ident.to_string(), &mut errors);
    let relied = relied_integers(&rules, &integers);
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
        integers: relied,
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

/// One segment of a template: literal text, a value of any text, a value that is an
/// integer's digits (a parameter of an integer type, `-` first when signed), or the
/// request's client address (`{request.client_ip}`).
#[derive(PartialEq)]
enum Segment {
    Text(String),
    Any,
    Digits { signed: bool },
    ClientIp,
}

/// The parameters of `sig` of a primitive integer type, by name, and whether signed:
/// their values are written as digits only.
fn integer_params(sig: &Signature) -> Vec<(String, bool)> {
    sig.inputs
        .iter()
        .filter_map(|arg| match arg {
            syn::FnArg::Typed(t) => match (&*t.pat, &*t.ty) {
                (syn::Pat::Ident(p), Type::Path(ty)) if ty.qself.is_none() => {
                    let name = ty.path.get_ident()?.to_string();
                    let signed = match name.as_str() {
                        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => false,
                        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => true,
                        _ => return None,
                    };
                    Some((p.ident.to_string(), signed))
                }
                _ => None,
            },
            syn::FnArg::Receiver(_) => None,
        })
        .collect()
}

/// The names of `integers` that a template writes, when some rules count differently
/// ([`check_coinciding_counts`] then read their values as digits alone).
fn relied_integers(rules: &[RuleArgs], integers: &[(String, bool)]) -> Vec<String> {
    let counting = |r: &RuleArgs| (r.rate, r.interval_ms, r.mode, r.bucket);
    if rules.iter().all(|r| counting(r) == counting(&rules[0])) {
        return Vec::new();
    }
    let written = |name: &str| {
        rules.iter().any(|r| {
            r.key.as_ref().is_some_and(|(_, pieces)| {
                pieces
                    .iter()
                    .any(|p| matches!(p, Piece::Value(path) if path.len() == 1 && path[0] == name))
            })
        })
    };
    integers
        .iter()
        .filter(|(name, _)| written(name))
        .map(|(name, _)| name.clone())
        .collect()
}

/// A template's segments, cut at `:`, `{` and `}` (which interpolated values never
/// hold; a value is a whole segment, the template's own check), and the separators
/// between them.
fn segments(pieces: &[Piece], integers: &[(String, bool)]) -> (Vec<Segment>, Vec<char>) {
    let (mut segments, mut separators) = (vec![Segment::Text(String::new())], Vec::new());
    for piece in pieces {
        match piece {
            Piece::Text(text) => {
                for c in text.chars() {
                    if matches!(c, ':' | '{' | '}') {
                        separators.push(c);
                        segments.push(Segment::Text(String::new()));
                    } else if let Some(Segment::Text(segment)) = segments.last_mut() {
                        segment.push(c);
                    }
                }
            }
            Piece::Value(path) => {
                let integer = match path.as_slice() {
                    [name] => integers.iter().find(|(n, _)| n == name),
                    _ => None,
                };
                *segments.last_mut().expect("a segment") = match integer {
                    Some(&(_, signed)) => Segment::Digits { signed },
                    None => Segment::Any,
                };
            }
            Piece::Request(part) => {
                *segments.last_mut().expect("a segment") = match part {
                    RequestPart::ClientIp => Segment::ClientIp,
                    RequestPart::Identity => Segment::Any,
                }
            }
        }
    }
    (segments, separators)
}

/// Whether an integer's value, as the attribute writes it, can be `text`.
fn digits_can_be(text: &str, signed: bool) -> bool {
    let digits = match text.strip_prefix('-') {
        Some(rest) if signed => rest,
        _ => text,
    };
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Whether a client address, as a key writes it, can be `text`: an IP address, an IPv6
/// one with each `:` escaped `%3A` and, for a network, `/` and its prefix length after
/// it. (A literal such as `all` or `global` never is.)
fn client_ip_can_be(text: &str) -> bool {
    let text = text.replace("%3A", ":");
    let address = text.split_once('/').map_or(&*text, |(address, _)| address);
    address.parse::<std::net::IpAddr>().is_ok()
}

/// Whether some values make both templates one limiter name: the same separators, and
/// every pair of segments able to be the same text.
fn may_coincide(a: &[Piece], b: &[Piece], integers: &[(String, bool)]) -> bool {
    let ((a, a_separators), (b, b_separators)) = (segments(a, integers), segments(b, integers));
    a_separators == b_separators
        && a.iter().zip(&b).all(|pair| match pair {
            (Segment::Text(x), Segment::Text(y)) => x == y,
            (Segment::Text(text), Segment::Digits { signed })
            | (Segment::Digits { signed }, Segment::Text(text)) => digits_can_be(text, *signed),
            (Segment::Text(text), Segment::ClientIp) | (Segment::ClientIp, Segment::Text(text)) => {
                client_ip_can_be(text)
            }
            // (an address always has a `.` or an escaped `:`: never digits alone)
            (Segment::Digits { .. }, Segment::ClientIp) | (Segment::ClientIp, Segment::Digits { .. }) => {
                false
            }
            _ => true,
        })
}

/// Whether some values make the template a function's path, `<module path>::<function>`:
/// segments cut at `:` only, every other one empty (values never are: an empty one is
/// written `%00`), the last able to be the function's name.
fn may_be_path(pieces: &[Piece], function: &str, integers: &[(String, bool)]) -> bool {
    let (segments, separators) = segments(pieces, integers);
    separators.iter().all(|&c| c == ':')
        && segments.len() >= 3
        && segments.len() % 2 == 1
        && segments
            .iter()
            .enumerate()
            .all(|(i, segment)| match (i % 2, segment) {
                (1, Segment::Text(text)) => text.is_empty(),
                (1, _) => false,
                (_, Segment::Text(text)) => !text.is_empty(),
                (_, Segment::Digits { .. } | Segment::ClientIp) => false,
                (_, Segment::Any) => true,
            })
        && match segments.last() {
            Some(Segment::Text(text)) => text == function,
            last => matches!(last, Some(Segment::Any)),
        }
}

/// Rejects two rules whose templates name one limiter for some values (`x:p:{a}` and
/// `x:{b}:q` when `a` is `q` and `b` is `p`) but count it differently (rate, interval,
/// mode, algorithm, burst or warm-up): a limiter keeps the config of the call that
/// last wrote it, so a caller choosing the values would have the looser rule decide
/// the stricter's calls.
fn check_coinciding_counts(
    rules: &[RuleArgs],
    integers: &[(String, bool)],
    function: &str,
    errors: &mut Vec<Error>,
) {
    let counting = |r: &RuleArgs| (r.rate, r.interval_ms, r.mode, r.bucket);
    for (second, rule) in rules.iter().enumerate() {
        let Some((lit, pieces)) = &rule.key else { continue };
        // A rule without a key names the function's path, `<module path>::<name>`.
        let keyless = rules.iter().position(|r| {
            r.key.is_none() && counting(r) != counting(rule) && may_be_path(pieces, function, integers)
        });
        if let Some(first) = keyless {
            errors.push(Error::new(
                lit.span(),
                format!(
                    "key \"{}\" can be the function's path `<module>::{function}` for some values of its \
                     placeholders, the limiter of rule {}, which has no `key`, and the two count it \
                     differently (rate, interval, mode, algorithm, burst or warm-up): a limiter keeps the \
                     config of the call that last wrote it, so a caller choosing the values would have the \
                     looser rule decide the stricter's calls; give rule {} a `key` of its own",
                    lit.value(),
                    first + 1,
                    first + 1
                ),
            ));
            continue;
        }
        let earlier = rules[..second].iter().enumerate().find(|(_, r)| {
            // (the same text up to placeholders: the check above says so)
            r.key.as_ref().is_some_and(|(_, other)| {
                may_coincide(other, pieces, integers)
                    && segments(other, integers) != segments(pieces, integers)
                    && counting(r) != counting(rule)
            })
        });
        let Some((first, other)) = earlier else { continue };
        let earlier = other.key.as_ref().map_or_else(String::new, |(l, _)| l.value());
        errors.push(Error::new(
            lit.span(),
            format!(
                "key \"{}\" names the same limiter as rule {}'s \"{earlier}\" for some values of their \
                 placeholders, and the two count it differently (rate, interval, mode, algorithm, burst or \
                 warm-up): a limiter keeps the config of the call that last wrote it, so a caller choosing \
                 the values would have the looser rule decide the stricter's calls; give each rule text of \
                 its own, e.g. \"{}\", or the same limit",
                lit.value(),
                first + 1,
                suggestion(&lit.value(), second + 1)
            ),
        ));
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
