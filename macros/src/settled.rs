//! Settled rules (`cost` and `settle`) checked against the function: the result type a
//! `settle` function reads, and the other rules of a function whose rules are reserved
//! together.

use proc_macro2::TokenTree;
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{
    Error, Expr, ExprLit, GenericArgument, Lit, PathArguments, ReturnType, Signature, Type, TypeParamBound,
};

use crate::rule::RuleArgs;

/// The function's result type when a rule is settled (`None` when none is), every
/// problem pushed to `errors`.
pub fn check(
    sig: &Signature,
    rules: &[RuleArgs],
    is_async_trait: bool,
    errors: &mut Vec<Error>,
) -> Option<Type> {
    let settle = rules.iter().find_map(|r| r.settle.as_ref())?;
    for rule in rules {
        if let (Some(span), true) = (rule.batch_span, rule.batch > 1) {
            errors.push(Error::new(
                span,
                "`batch` cannot be on a function with a settled rule (`settle`): its rules are \
                 reserved together, and a batch's permits, taken ahead and served in process, have \
                 no grant of their own to settle; remove `batch`",
            ));
        }
        if let (Some(cost), Some(_)) = (&rule.cost, &rule.settle) {
            if is_zero(cost) {
                errors.push(Error::new(
                    cost.span(),
                    "a settled rule's `cost` is its estimate, reserved before the call: at least 1",
                ));
            }
        }
    }
    let output = match &sig.output {
        ReturnType::Default => syn::parse_quote!(()),
        ReturnType::Type(_, ty) if is_async_trait => match async_trait_output(ty) {
            Some(output) => output,
            None => {
                errors.push(Error::new(
                    settle.span(),
                    "`settle` reads the function's result, but its type could not be read from \
                     the `Pin<Box<dyn Future<Output = T>>>` `#[async_trait]` wrote",
                ));
                return None;
            }
        },
        ReturnType::Type(_, ty) => (**ty).clone(),
    };
    if names_impl(&output) {
        errors.push(Error::new(
            settle.span(),
            "`settle` reads the function's result, so its type must be written out: the return \
             type cannot be an `impl Trait`",
        ));
        return None;
    }
    Some(output)
}

/// Whether `cost` is the literal 0.
fn is_zero(cost: &Expr) -> bool {
    matches!(cost, Expr::Lit(ExprLit { lit: Lit::Int(int), .. }) if int.base10_parse::<u64>().ok() == Some(0))
}

/// Whether `ty` names an `impl Trait` anywhere.
fn names_impl(ty: &Type) -> bool {
    fn any_impl(tokens: proc_macro2::TokenStream) -> bool {
        tokens.into_iter().any(|token| match token {
            TokenTree::Ident(ident) => ident == "impl",
            TokenTree::Group(group) => any_impl(group.stream()),
            _ => false,
        })
    }
    any_impl(ty.to_token_stream())
}

/// `T` of the `Pin<Box<dyn Future<Output = T> + ...>>` `#[async_trait]` leaves as the
/// return type.
fn async_trait_output(ty: &Type) -> Option<Type> {
    let Type::Path(path) = ty else { return None };
    let last = path.path.segments.last()?;
    let PathArguments::AngleBracketed(pin) = &last.arguments else {
        return None;
    };
    let Some(GenericArgument::Type(Type::Path(boxed))) = pin.args.first() else {
        return None;
    };
    let PathArguments::AngleBracketed(inner) = &boxed.path.segments.last()?.arguments else {
        return None;
    };
    let Some(GenericArgument::Type(Type::TraitObject(object))) = inner.args.first() else {
        return None;
    };
    object.bounds.iter().find_map(|bound| {
        let TypeParamBound::Trait(future) = bound else {
            return None;
        };
        let PathArguments::AngleBracketed(args) = &future.path.segments.last()?.arguments else {
            return None;
        };
        args.args.iter().find_map(|arg| match arg {
            GenericArgument::AssocType(assoc) if assoc.ident == "Output" => Some(assoc.ty.clone()),
            _ => None,
        })
    })
}
