//! Readers of one argument's value: each says, at the value, what was wrong and what
//! is accepted, and gives `None` then.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Error, Expr, ExprLit, Lit, LitStr, Path};

use crate::template::{self, Piece};
use redlimit_syntax::duration;

/// The most permits one call may take: the permits log stores them in 4 bytes.
const MAX_PERMITS: u64 = u32::MAX as u64;

/// A string literal; `None` for anything else.
pub fn string(value: &Expr) -> Option<&LitStr> {
    match value {
        Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => Some(s),
        _ => None,
    }
}

/// An integer literal from 1 to 2^53.
pub fn integer(name: &str, value: &Expr, errors: &mut Vec<Error>) -> Option<u64> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        }) => match int.base10_parse::<u64>() {
            Ok(0) => {
                errors.push(Error::new(int.span(), format!("`{name}` must be at least 1")));
                None
            }
            Ok(n) if n > redlimit_syntax::MAX_EXACT => {
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

/// An integer literal from 0 to 2^53 (`max_overdraft = 0`: no excess charged).
pub fn whole(name: &str, value: &Expr, errors: &mut Vec<Error>) -> Option<u64> {
    if let Expr::Lit(ExprLit {
        lit: Lit::Int(int), ..
    }) = value
    {
        if int.base10_parse::<u64>().ok() == Some(0) {
            return Some(0);
        }
    }
    integer(name, value, errors)
}

/// `permits`: an integer that also fits the permits log's 4-byte field, with its span.
pub fn permits(value: &Expr, errors: &mut Vec<Error>) -> Option<(Span, u64)> {
    let permits = integer("permits", value, errors)?;
    if permits > MAX_PERMITS {
        errors.push(Error::new(
            value.span(),
            format!(
                "`permits` ({permits}) must be at most {MAX_PERMITS}: each grant is logged with \
                 its permits in a 4-byte field (the layout Redisson shares)"
            ),
        ));
        return None;
    }
    Some((value.span(), permits))
}

/// A duration string, in milliseconds (the grammar of `redlimit_syntax::duration`).
pub fn duration(name: &str, value: &Expr, errors: &mut Vec<Error>) -> Option<u64> {
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
pub fn choice<T: Copy>(
    name: &str,
    value: &Expr,
    accepted: &[(&str, T)],
    errors: &mut Vec<Error>,
) -> Option<T> {
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

/// `true` or `false`; anything else is reported with `problem`.
pub fn boolean(value: &Expr, problem: &str, errors: &mut Vec<Error>) -> Option<bool> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Bool(b), ..
        }) => Some(b.value),
        other => {
            errors.push(Error::new(other.span(), problem));
            None
        }
    }
}

/// A path written as a path or as a string (`crate = "::facade"`); `None` otherwise.
pub fn path_value(value: &Expr) -> Option<Path> {
    match value {
        Expr::Path(p) if p.qself.is_none() => Some(p.path.clone()),
        Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => s.parse::<Path>().ok(),
        _ => None,
    }
}

/// A path, or an error with an example fitting `name`.
pub fn path(name: &str, value: &Expr, errors: &mut Vec<Error>) -> Option<Path> {
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

/// `key`: a template whose placeholders name the function's parameters `params`.
pub fn key(value: &Expr, params: &[String], errors: &mut Vec<Error>) -> Option<(LitStr, Vec<Piece>)> {
    let Some(lit) = string(value) else {
        errors.push(Error::new(
            value.span(),
            "`key` must be a string template, e.g. \"order:{user_id}\"",
        ));
        return None;
    };
    match template::checked(&lit.value(), params) {
        Ok(pieces) => Some((lit.clone(), pieces)),
        Err(problem) => {
            errors.push(Error::new(lit.span(), problem));
            None
        }
    }
}

/// `message`: a string literal.
pub fn message(value: &Expr, errors: &mut Vec<Error>) -> Option<LitStr> {
    let found = string(value).cloned();
    if found.is_none() {
        errors.push(Error::new(value.span(), "`message` must be a string literal"));
    }
    found
}
