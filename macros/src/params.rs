//! The names a function's parameters bind: what a key template may interpolate, and
//! what a fallback is called with.

use syn::{FnArg, Ident, Pat, Signature};

/// A parameter's name when it is a plain binding (`x: T`, `mut x: T`, `self`).
pub fn param_names(sig: &Signature) -> Vec<Option<Ident>> {
    sig.inputs
        .iter()
        .map(|arg| match arg {
            FnArg::Receiver(r) => Some(Ident::new("self", r.self_token.span)),
            FnArg::Typed(t) => match &*t.pat {
                Pat::Ident(p) if p.subpat.is_none() && p.by_ref.is_none() => Some(p.ident.clone()),
                _ => None,
            },
        })
        .collect()
}

/// Every name the parameters bind, patterns included (`Path(user_id): Path<u64>`,
/// `(a, b): (u32, u32)`, `Point { x, .. }: Point`): what a key template may use.
pub fn bound_names(sig: &Signature) -> Vec<String> {
    let mut names = Vec::new();
    for arg in &sig.inputs {
        match arg {
            FnArg::Receiver(_) => names.push("self".to_owned()),
            FnArg::Typed(t) => bind(&t.pat, &mut names),
        }
    }
    names
}

fn bind(pat: &Pat, names: &mut Vec<String>) {
    match pat {
        Pat::Ident(p) => {
            names.push(p.ident.to_string());
            if let Some((_, sub)) = &p.subpat {
                bind(sub, names);
            }
        }
        Pat::TupleStruct(p) => p.elems.iter().for_each(|e| bind(e, names)),
        Pat::Tuple(p) => p.elems.iter().for_each(|e| bind(e, names)),
        Pat::Struct(p) => p.fields.iter().for_each(|f| bind(&f.pat, names)),
        Pat::Slice(p) => p.elems.iter().for_each(|e| bind(e, names)),
        Pat::Reference(p) => bind(&p.pat, names),
        Pat::Type(p) => bind(&p.pat, names),
        Pat::Paren(p) => bind(&p.pat, names),
        _ => {}
    }
}
