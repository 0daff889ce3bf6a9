//! The `#[rate_limit]` attribute of [redlimit](https://docs.rs/redlimit). Use it
//! through `redlimit::rate_limit`; its documentation lives there.
//!
//! The attribute only gathers (`gather.rs`): it collects the function's
//! `#[rate_limit]` attributes into one `__private::expand!` call in the body
//! (`input.rs` is that call's syntax). `expand!` then goes one way:
//!
//! - parse: each attribute's `name = value` list (`args.rs`), each value on its own
//!   (`values.rs`, with the duration grammar of `redlimit-syntax` and the key
//!   templates of `template.rs`, whose braces follow Redis Cluster's rule in
//!   `redlimit_syntax::hash_tag`), into what the attribute
//!   wrote;
//! - plan: each attribute checked across its arguments into a rule (`rule.rs`), and
//!   the rules checked together against the signature (`plan.rs`, with the
//!   parameters' names from `params.rs`, and `settled.rs` for `cost` and `settle`);
//! - emit: the prologue that decides all rules at once, then the body (`emit.rs`);
//!   with a settled rule, the body as a future, then the settle (`emit_settled.rs`).

mod args;
mod emit;
mod emit_settled;
mod gather;
mod input;
mod params;
mod plan;
mod rule;
mod settled;
mod template;
#[cfg(test)]
mod test_rng;
mod values;

use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;

/// Puts a distributed rate limit on an async function. See `redlimit::rate_limit`.
#[proc_macro_attribute]
pub fn rate_limit(args: TokenStream, item: TokenStream) -> TokenStream {
    gather::gather(args.into(), item.into()).into()
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
