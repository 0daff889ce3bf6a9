//! The `#[rate_limit]` attribute of [redlimit](https://docs.rs/redlimit). Use it
//! through `redlimit::rate_limit`; its documentation lives there.
//!
//! The attribute only gathers: it collects the function's `#[rate_limit]` attributes
//! (its own, its siblings', and those a renamed import expanded before it) into one
//! `__private::expand!` call in the body, which checks every argument and emits the
//! prologue that decides all rules at once.

mod args;
mod duration;
mod emit;
mod input;
mod plan;
mod rule;
mod template;
mod values;

use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;
use quote::{quote, ToTokens};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{Attribute, ItemFn, Meta, Path, Stmt, Token};

/// Puts a distributed rate limit on an async function. See `redlimit::rate_limit`.
#[proc_macro_attribute]
pub fn rate_limit(args: TokenStream, item: TokenStream) -> TokenStream {
    let item2 = TokenStream2::from(item.clone());
    let mut function: ItemFn = match syn::parse2(item2.clone()) {
        Ok(function) => function,
        Err(_) => {
            let error = syn::Error::new(
                proc_macro2::Span::call_site(),
                "#[rate_limit] goes on an `async fn` with a body (a free function or a method)",
            )
            .to_compile_error();
            return quote!(#error #item2).into();
        }
    };

    // The arguments of every attribute, in source order.
    let mut groups = Vec::new();
    let mut body = (*function.block).clone();
    if let Some(earlier) = earlier_expansion(&body) {
        groups.extend(earlier.groups);
        body = earlier.body;
    }
    let named = |span: proc_macro2::Span, args: TokenStream2| input::Group {
        name: syn::Ident::new("rate_limit", span),
        args,
    };
    groups.push(named(proc_macro2::Span::call_site(), TokenStream2::from(args)));
    let (siblings, others): (Vec<Attribute>, Vec<Attribute>) =
        function.attrs.drain(..).partition(is_rate_limit);
    function.attrs = others;
    for attr in siblings {
        let span = attr
            .path()
            .segments
            .last()
            .map_or_else(proc_macro2::Span::call_site, |s| s.ident.span());
        let args = match attr.meta {
            Meta::List(list) => list.tokens,
            _ => TokenStream2::new(),
        };
        groups.push(named(span, args));
    }

    let krate = crate_path(&groups).unwrap_or_else(|| syn::parse_quote!(::redlimit));
    let input = input::Input {
        sig: function.sig.clone(),
        groups,
        body,
    };
    let invocation = input.invocation(&syn::parse_quote!(#krate::__private::expand));
    let ItemFn { attrs, vis, sig, .. } = &function;
    let mut out = TokenStream2::new();
    for attr in attrs {
        attr.to_tokens(&mut out);
    }
    quote!(#vis #sig { #invocation }).to_tokens(&mut out);
    out.into()
}

/// Checks every `#[rate_limit]` argument of a function and emits its prologue and body.
#[doc(hidden)]
#[proc_macro]
pub fn expand(input: TokenStream) -> TokenStream {
    match syn::parse::<input::Input>(input) {
        Ok(input) => expand_input(input).into(),
        Err(err) => err.to_compile_error().into(),
    }
}

/// Checks every attribute into a plan, then emits the prologue and the body; on
/// errors, the errors and the body unchanged, so the rest of the crate still
/// type-checks.
fn expand_input(input: input::Input) -> TokenStream2 {
    let input::Input {
        sig,
        groups,
        mut body,
    } = input;
    let is_async_trait = input::async_trait_block(&mut body).is_some();
    match plan::check(&sig, groups, is_async_trait) {
        Ok(plan) => emit::prologue_and_body(&sig, &plan, body),
        Err(errors) => emit::errors_and_body(errors, &body),
    }
}

fn is_rate_limit(attr: &Attribute) -> bool {
    attr.path()
        .segments
        .last()
        .is_some_and(|s| s.ident == "rate_limit")
}

/// The body an earlier `#[rate_limit]` left: one `...::__private::expand! { .. }`.
fn earlier_expansion(body: &syn::Block) -> Option<input::Input> {
    let [stmt] = &body.stmts[..] else { return None };
    let mac = match stmt {
        Stmt::Macro(m) => &m.mac,
        Stmt::Expr(syn::Expr::Macro(m), _) => &m.mac,
        _ => return None,
    };
    let segments: Vec<String> = mac.path.segments.iter().map(|s| s.ident.to_string()).collect();
    if !segments.ends_with(&["__private".to_owned(), "expand".to_owned()]) {
        return None;
    }
    syn::parse2(mac.tokens.clone()).ok()
}

/// The `crate = ...` argument of any attribute, read leniently (`expand!` reports
/// mistakes), to name the path `expand!` is called through.
fn crate_path(groups: &[input::Group]) -> Option<Path> {
    groups.iter().find_map(|group| {
        let args = Punctuated::<args::Arg, Token![,]>::parse_terminated
            .parse2(group.args.clone())
            .ok()?;
        args.into_iter()
            .find(|a| a.name == "crate")
            .and_then(|a| values::path_value(&a.value))
    })
}
