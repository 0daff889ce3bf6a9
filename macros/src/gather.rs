//! The attribute itself, which only gathers: every `#[rate_limit]` of a function (its
//! own, its siblings', and those a renamed import expanded before it) goes into one
//! `__private::expand!` call in the body, which checks them all at once.

use proc_macro2::{Span, TokenStream};
use quote::{quote, ToTokens};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{Attribute, Block, Expr, Ident, ItemFn, Meta, Path, Stmt, Token};

use crate::args::Arg;
use crate::input::{Group, Input};
use crate::values;

/// The function with its `#[rate_limit]` attributes taken off and its body replaced by
/// one `expand!` call carrying them all; on an item that is no function, an error and
/// the item unchanged.
pub fn gather(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut function: ItemFn = match syn::parse2(item.clone()) {
        Ok(function) => function,
        Err(_) => {
            let error = syn::Error::new(
                Span::call_site(),
                "#[rate_limit] goes on an `async fn` with a body (a free function or a method)",
            )
            .to_compile_error();
            return quote!(#error #item);
        }
    };
    let (groups, body) = take_groups(&mut function, args);
    let krate = crate_path(&groups).unwrap_or_else(|| syn::parse_quote!(::redlimit));
    let input = Input {
        sig: function.sig.clone(),
        groups,
        body,
    };
    let invocation = input.invocation(&syn::parse_quote!(#krate::__private::expand));
    let ItemFn { attrs, vis, sig, .. } = &function;
    let mut out = TokenStream::new();
    for attr in attrs {
        attr.to_tokens(&mut out);
    }
    quote!(#vis #sig { #invocation }).to_tokens(&mut out);
    out
}

/// The arguments of every attribute in source order, the sibling attributes taken off
/// `function`, and the body as the user wrote it.
fn take_groups(function: &mut ItemFn, args: TokenStream) -> (Vec<Group>, Block) {
    let mut groups = Vec::new();
    let mut body = (*function.block).clone();
    if let Some(earlier) = earlier_expansion(&body) {
        groups.extend(earlier.groups);
        body = earlier.body;
    }
    groups.push(group(Span::call_site(), args));
    let (siblings, others): (Vec<Attribute>, Vec<Attribute>) =
        function.attrs.drain(..).partition(is_rate_limit);
    function.attrs = others;
    groups.extend(siblings.into_iter().map(sibling_group));
    (groups, body)
}

/// A sibling `#[rate_limit(...)]`'s arguments, spanned by the attribute's name.
fn sibling_group(attr: Attribute) -> Group {
    let span = attr
        .path()
        .segments
        .last()
        .map_or_else(Span::call_site, |s| s.ident.span());
    let args = match attr.meta {
        Meta::List(list) => list.tokens,
        _ => TokenStream::new(),
    };
    group(span, args)
}

fn group(span: Span, args: TokenStream) -> Group {
    Group {
        name: Ident::new("rate_limit", span),
        args,
    }
}

fn is_rate_limit(attr: &Attribute) -> bool {
    attr.path()
        .segments
        .last()
        .is_some_and(|s| s.ident == "rate_limit")
}

/// The body an earlier `#[rate_limit]` left: one `...::__private::expand! { .. }`.
fn earlier_expansion(body: &Block) -> Option<Input> {
    let [stmt] = &body.stmts[..] else { return None };
    let mac = match stmt {
        Stmt::Macro(m) => &m.mac,
        Stmt::Expr(Expr::Macro(m), _) => &m.mac,
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
fn crate_path(groups: &[Group]) -> Option<Path> {
    groups.iter().find_map(|group| {
        let args = Punctuated::<Arg, Token![,]>::parse_terminated
            .parse2(group.args.clone())
            .ok()?;
        args.into_iter()
            .find(|a| a.name == "crate")
            .and_then(|a| values::path_value(&a.value))
    })
}
