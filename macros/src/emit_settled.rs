//! What a function with a settled rule becomes: its rules reserved, then the body run
//! as a future of the function's result type (so `return` and `?` in it end the body,
//! not the settle), then every settled rule settled with what its `settle` function
//! reads from the result, then the result returned.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{Block, Path, Type};

use crate::emit::{respan, site, Prologue};
use crate::input::async_trait_block;
use crate::plan::Plan;
use crate::rule::RuleArgs;

/// The prologue reserving every rule, the body, the settle, and the result; inside the
/// `async move` block `#[async_trait]` leaves, when that is the body.
pub fn settled_body(plan: &Plan, output: &Type, prologue: Prologue, mut body: Block) -> TokenStream {
    let Prologue {
        engine,
        decided,
        binding,
        on_refusal,
    } = prologue;
    let krate = &plan.krate;
    let site = site();
    let decided_ident = format_ident!("__redlimit_decided", span = Span::mixed_site());
    let pending = format_ident!("__redlimit_pending", span = Span::mixed_site());
    let out = format_ident!("__redlimit_out", span = Span::mixed_site());
    let actuals = plan
        .rules
        .iter()
        .map(|rule| actual_expr(rule, krate, output, &out));
    let run = |stmts: &[syn::Stmt]| {
        quote! {
            #engine
            let #decided_ident: ::core::result::Result<#krate::__private::Pending, #krate::RateLimited> = #decided;
            let #pending = match #decided_ident {
                ::core::result::Result::Ok(#pending) => #pending,
                ::core::result::Result::Err(#binding) => { #on_refusal }
            };
            let #out: #output = #krate::__private::body::<#output, _>(async move { #(#stmts)* }).await;
            #pending.settle(&#site, &[#(#actuals),*]).await;
            #out
        }
    };
    if let Some(block) = async_trait_block(&mut body) {
        let inner = run(&block.stmts);
        block.stmts = vec![syn::Stmt::Expr(syn::Expr::Verbatim(quote! { { #inner } }), None)];
        let stmts = &body.stmts;
        return quote! { #(#stmts)* };
    }
    run(&body.stmts)
}

/// What rule `rule` is settled with: its `settle` function of the result, or 0 (not
/// read) for a rule that is not settled.
fn actual_expr(rule: &RuleArgs, krate: &Path, output: &Type, out: &syn::Ident) -> TokenStream {
    let Some(settle) = &rule.settle else {
        return quote!(0u64);
    };
    let span = settle.span();
    let krate = respan(krate.to_token_stream(), span);
    quote_spanned! {span=> #krate::__private::SettleFn::<#output, _>::actual(#settle, &#out) }
}
