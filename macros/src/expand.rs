//! `__private::expand!`: turns a function body and all its `#[rate_limit]` arguments
//! (see `input.rs`) into the prologue that decides every rule in one call, then the
//! body.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{token, Block, Expr, FnArg, Ident, Path, ReturnType, Signature, Stmt};

use crate::args::{Mode, Policy, RuleArgs};
use crate::input::{async_trait_block, Input};
use crate::plan::{check, Plan};
use crate::template::Piece;

/// Checks every attribute, then emits the prologue and the body; on errors, the
/// errors and the body unchanged, so the rest of the crate still type-checks.
pub fn expand(input: Input) -> TokenStream {
    let Input {
        sig,
        groups,
        mut body,
    } = input;
    let is_async_trait = async_trait_block(&mut body).is_some();
    match check(&sig, groups, is_async_trait) {
        Ok(plan) => emit(&sig, &plan, body),
        Err(errors) => {
            let errors = errors.into_iter().map(|e| e.to_compile_error());
            let stmts = &body.stmts;
            quote! { #(#errors)* #(#stmts)* }
        }
    }
}
/// The prologue that decides every rule, then the body.
fn emit(sig: &Signature, plan: &Plan, mut body: Block) -> TokenStream {
    let Plan {
        rules,
        krate,
        timeout_ms,
        fallback,
        names,
    } = plan;
    if rules.is_empty() {
        let stmts = &body.stmts;
        return quote! { #(#stmts)* };
    }
    let fn_name = sig.ident.to_string();
    let site = format_ident!("__REDLIMIT_SITE", span = Span::mixed_site());
    let keys = format_ident!("__redlimit_keys", span = Span::mixed_site());
    let refused = format_ident!("__redlimit_refused", span = Span::mixed_site());
    let specs = rules.iter().map(|rule| {
        let RuleArgs {
            rate,
            interval_ms,
            permits,
            ..
        } = rule;
        let mode = match rule.mode {
            Mode::Overall => quote!(Overall),
            Mode::PerClient => quote!(PerClient),
        };
        let policy = match rule.on_error {
            Policy::Local => quote!(Local),
            Policy::Allow => quote!(Allow),
            Policy::Deny => quote!(Deny),
        };
        let shadow = rule.shadow;
        let local_refusals = rule.local_refusals;
        let bucket = match rule.bucket {
            Some((burst, warmup_ms)) => quote!(::core::option::Option::Some(#krate::BucketShape {
                burst: #burst,
                warmup_ms: #warmup_ms,
            })),
            None => quote!(::core::option::Option::None),
        };
        let message = match &rule.message {
            Some(m) => quote!(::core::option::Option::Some(#krate::__private::Cow::Borrowed(#m))),
            None => quote!(::core::option::Option::None),
        };
        let name = match &rule.key {
            Some((lit, _)) => {
                let text = lit.value();
                quote!(#text)
            }
            None => quote!(::core::concat!(::core::module_path!(), "::", #fn_name)),
        };
        quote! {
            #krate::__private::RuleSpec {
                name: #krate::__private::Cow::Borrowed(#name),
                shadow: #shadow,
                local_refusals: #local_refusals,
                rate: #rate,
                interval: ::core::time::Duration::from_millis(#interval_ms),
                mode: #krate::RateType::#mode,
                permits: #permits,
                on_error: #krate::__private::OnError::#policy,
                message: #message,
                bucket: #bucket,
            }
        }
    });
    let key_exprs = rules.iter().map(|rule| key_expr(rule, krate, &fn_name));
    let timeout = match timeout_ms {
        Some(ms) => quote!(::core::option::Option::Some(::core::time::Duration::from_millis(#ms))),
        None => quote!(::core::option::Option::None),
    };
    let (binding, on_refusal) = match fallback {
        Some(path) => (quote!(_), fallback_call(sig, names, krate, path)),
        None => {
            let span = match &sig.output {
                ReturnType::Type(_, ty) => ty.span(),
                ReturnType::Default => sig.ident.span(),
            };
            // The whole path carries the return type's span, so a missing impl is
            // reported there.
            let krate = respan(krate.to_token_stream(), span);
            let refusal =
                quote_spanned! {span=> return #krate::FromRateLimited::from_rate_limited(#refused); };
            (quote!(#refused), refusal)
        }
    };
    let prologue = quote! {
        {
            static #site: #krate::__private::Site = #krate::__private::Site::new(
                &[#(#specs),*],
                #timeout,
                ::core::concat!(::core::module_path!(), "::", #fn_name),
            );
            let #keys = [#(#key_exprs),*];
            if let ::core::result::Result::Err(#binding) = #krate::__private::decide(&#site, &#keys).await {
                #on_refusal
            }
        }
    };
    if let Some(block) = async_trait_block(&mut body) {
        let stmts = &block.stmts;
        let inner = quote! { #prologue #(#stmts)* };
        block.stmts = vec![Stmt::Expr(Expr::Verbatim(quote! { { #inner } }), None)];
        let stmts = &body.stmts;
        return quote! { #(#stmts)* };
    }
    let stmts = &body.stmts;
    let brace = token::Brace::default();
    let mut block = TokenStream::new();
    brace.surround(&mut block, |tokens| {
        for stmt in stmts {
            stmt.to_tokens(tokens);
        }
    });
    quote! { #prologue #block }
}

/// `return <fallback>(args).await`, through `__private::Fallback` with the parameter
/// types written out (`_` for `impl Trait`): a fallback taking other arguments fails
/// the bound at its path, reported with the signature expected, rather than being
/// matched against its own signature.
fn fallback_call(sig: &Signature, names: &[Option<Ident>], krate: &Path, path: &Path) -> TokenStream {
    let args = names.iter().flatten();
    let holes = sig.inputs.iter().map(|arg| match arg {
        FnArg::Receiver(receiver) => receiver.ty.to_token_stream(),
        FnArg::Typed(typed) if names_a_type(&typed.ty) => typed.ty.to_token_stream(),
        FnArg::Typed(_) => quote!(_),
    });
    let krate = respan(krate.to_token_stream(), path.span());
    quote_spanned! {path.span()=>
        return #krate::__private::Fallback::<( #(#holes,)* )>::call(#path, (#(#args,)*)).await;
    }
}

/// Whether `ty` can be written in an expression (`impl Trait` cannot).
fn names_a_type(ty: &syn::Type) -> bool {
    !ty.to_token_stream()
        .into_iter()
        .any(|token| matches!(&token, proc_macro2::TokenTree::Ident(i) if i == "impl"))
        && !matches!(ty, syn::Type::ImplTrait(_))
}

fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let proc_macro2::TokenTree::Group(group) = &token {
                let mut inner = proc_macro2::Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(span);
                token = inner.into();
            }
            token.set_span(span);
            token
        })
        .collect()
}
/// The expression building one rule's key (without the client's prefix).
fn key_expr(rule: &RuleArgs, krate: &Path, fn_name: &str) -> TokenStream {
    let buf = format_ident!("__redlimit_key", span = Span::mixed_site());
    let Some((lit, pieces)) = &rule.key else {
        return quote! {
            {
                let mut #buf = #krate::__private::KeyBuf::new();
                #buf.text(::core::concat!(::core::module_path!(), "::", #fn_name));
                #buf.finish()
            }
        };
    };
    let span = lit.span();
    let parts = pieces.iter().map(|piece| match piece {
        Piece::Text(text) => quote! { #buf.text(#text); },
        Piece::Value(path) => {
            let segments = path.iter().map(|segment| match segment.parse::<u32>() {
                Ok(index) => syn::Index { index, span }.into_token_stream(),
                Err(_) => Ident::new(segment, span).into_token_stream(),
            });
            quote_spanned! {span=> #krate::__private::KeyPart::write_to(&#(#segments).*, &mut #buf); }
        }
    });
    quote! {
        {
            let mut #buf = #krate::__private::KeyBuf::new();
            #(#parts)*
            #buf.finish()
        }
    }
}
