//! What `__private::expand!` emits from a checked [`Plan`]: the prologue that decides
//! every rule in one call, then the body.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{token, Block, Expr, FnArg, Ident, Path, ReturnType, Signature, Stmt};

use crate::input::async_trait_block;
use crate::plan::Plan;
use crate::rule::{Mode, Policy, RuleArgs};
use crate::template::{Piece, RequestPart};

/// The errors, then the body unchanged, so the rest of the crate still type-checks.
pub fn errors_and_body(errors: Vec<syn::Error>, body: &Block) -> TokenStream {
    let errors = errors.into_iter().map(|e| e.to_compile_error());
    let stmts = &body.stmts;
    quote! { #(#errors)* #(#stmts)* }
}

/// The prologue that decides every rule, then the body (just the body when no rule
/// is left); with a settled rule, the body's result is settled before it is returned.
pub fn prologue_and_body(sig: &Signature, plan: &Plan, body: Block) -> TokenStream {
    if plan.rules.is_empty() {
        let stmts = &body.stmts;
        return quote! { #(#stmts)* };
    }
    let prologue = prologue(sig, plan);
    if let Some(output) = &plan.output {
        return crate::emit_settled::settled_body(plan, output, prologue, body);
    }
    let Prologue {
        engine,
        decided,
        binding,
        on_refusal,
    } = prologue;
    let decided_ident = format_ident!("__redlimit_decided", span = Span::mixed_site());
    let krate = &plan.krate;
    let prologue = quote! {
        {
            #engine
            let #decided_ident: ::core::result::Result<(), #krate::RateLimited> = #decided;
            if let ::core::result::Result::Err(#binding) = #decided_ident {
                #on_refusal
            }
        }
    };
    with_body(prologue, body)
}

/// A call's prologue in parts: the static `Engine` holding every rule, the expression
/// deciding (or reserving) them for this call's keys and costs, and what a refusal
/// binds and does (return from the function).
pub struct Prologue {
    pub engine: TokenStream,
    pub decided: TokenStream,
    pub binding: TokenStream,
    pub on_refusal: TokenStream,
}

/// The engine's static is named this.
pub fn site() -> Ident {
    format_ident!("__REDLIMIT_SITE", span = Span::mixed_site())
}

/// Every rule decided at once: `decide` with the rules' own permits, `decide_with`
/// when a rule has a `cost`, `reserve` when a rule is settled.
fn prologue(sig: &Signature, plan: &Plan) -> Prologue {
    let krate = &plan.krate;
    let fn_name = sig.ident.to_string();
    let site = site();
    let keys = format_ident!("__redlimit_keys", span = Span::mixed_site());
    let permits = format_ident!("__redlimit_permits", span = Span::mixed_site());
    let count = plan.rules.len();
    let specs = plan.rules.iter().map(|rule| rule_spec(rule, krate, &fn_name));
    let key_site = KeySite {
        krate,
        integers: &plan.integers,
        site: &site,
        label: syn::Lifetime {
            apostrophe: Span::mixed_site(),
            ident: format_ident!("__redlimit_keyed", span = Span::mixed_site()),
        },
    };
    let key_exprs = plan
        .rules
        .iter()
        .enumerate()
        .map(|(i, rule)| key_expr(rule, i, &key_site, &fn_name));
    let timeout = option(
        plan.timeout_ms
            .map(|ms| quote!(::core::time::Duration::from_millis(#ms))),
    );
    let (binding, on_refusal) = on_refusal(sig, plan);
    let costs = plan.rules.iter().map(|rule| cost_expr(rule, krate));
    let (decide, permits_of) = if plan.output.is_some() {
        let decide = quote!(#krate::__private::reserve(&#site, &mut #keys, &#permits).await);
        (decide, quote!(let #permits: [u64; #count] = [#(#costs),*];))
    } else if plan.rules.iter().any(|rule| rule.cost.is_some()) {
        let decide = quote!(#krate::__private::decide_with(&#site, &mut #keys, &#permits).await);
        (decide, quote!(let #permits: [u64; #count] = [#(#costs),*];))
    } else {
        (
            quote!(#krate::__private::decide(&#site, &mut #keys).await),
            quote!(),
        )
    };
    // A key reading the request can refuse before anything is decided: the keys are
    // built in a block that a refusal breaks out of.
    let label = plan.rules.iter().any(reads_request).then_some(&key_site.label);
    let label = label.map(|label| quote!(#label:));
    let decided = quote!(#label { let mut #keys = [#(#key_exprs),*]; #permits_of #decide });
    let engine = quote! {
        static #site: #krate::__private::Engine = #krate::__private::Engine::new(
            &[#(#specs),*],
            #timeout,
            ::core::concat!(::core::module_path!(), "::", #fn_name),
        );
    };
    Prologue {
        engine,
        decided,
        binding,
        on_refusal,
    }
}

/// What rule `rule` takes of this call: its `cost`, evaluated before the call, or its
/// own permits.
fn cost_expr(rule: &RuleArgs, krate: &Path) -> TokenStream {
    let Some(cost) = &rule.cost else {
        let permits = rule.permits;
        return quote!(#permits);
    };
    // An unsuffixed integer is a u64 (left alone it would be an i32, which no
    // `Cost` is).
    if let syn::Expr::Lit(syn::ExprLit {
        lit: syn::Lit::Int(int),
        ..
    }) = cost
    {
        if let (Ok(permits), "") = (int.base10_parse::<u64>(), int.suffix()) {
            return quote_spanned!(cost.span()=> #permits);
        }
    }
    let krate = respan(krate.to_token_stream(), cost.span());
    quote_spanned! {cost.span()=> #krate::__private::Cost::permits(#cost) }
}

/// Whether a rule's key names a value of the request the layer serves.
fn reads_request(rule: &RuleArgs) -> bool {
    rule.key
        .as_ref()
        .is_some_and(|(_, pieces)| pieces.iter().any(|p| matches!(p, Piece::Request(_))))
}

/// What a key reading the request refers to: the crate, the engine, the block a
/// refusal breaks out of.
struct KeySite<'a> {
    krate: &'a Path,
    site: &'a Ident,
    label: syn::Lifetime,
    /// The parameters whose values are written as an integer's digits (`Plan::integers`).
    integers: &'a [String],
}

/// One rule's `RuleSpec`, as the runtime reads it.
fn rule_spec(rule: &RuleArgs, krate: &Path, fn_name: &str) -> TokenStream {
    let RuleArgs {
        rate,
        interval_ms,
        permits,
        shadow,
        local_refusals,
        batch,
        ..
    } = rule;
    let settled = rule.settle.is_some();
    let max_overdraft = option(rule.max_overdraft.map(|n| quote!(#n)));
    let batch_lease = option(
        rule.batch_lease_ms
            .map(|ms| quote!(::core::time::Duration::from_millis(#ms))),
    );
    let mode = mode_variant(rule.mode);
    let policy = policy_variant(rule.on_error);
    let bucket = option(rule.bucket.map(|(burst, warmup_ms)| {
        quote!(#krate::BucketShape {
            burst: #burst,
            warmup_ms: #warmup_ms,
        })
    }));
    let message = option(
        rule.message
            .as_ref()
            .map(|m| quote!(#krate::__private::Cow::Borrowed(#m))),
    );
    let name = match &rule.key {
        Some((lit, _)) => {
            let text = lit.value();
            quote!(#text)
        }
        None => quote!(::core::concat!(::core::module_path!(), "::", #fn_name)),
    };
    let shape = option(registry_template(rule).map(|text| quote!(#krate::__private::Cow::Borrowed(#text))));
    quote! {
        #krate::__private::RuleSpec {
            name: #krate::__private::Cow::Borrowed(#name),
            shadow: #shadow,
            local_refusals: #local_refusals,
            batch: #batch,
            batch_lease: #batch_lease,
            rate: #rate,
            interval: ::core::time::Duration::from_millis(#interval_ms),
            mode: #krate::RateType::#mode,
            permits: #permits,
            on_error: #krate::__private::OnError::#policy,
            message: #message,
            bucket: #bucket,
            settled: #settled,
            max_overdraft: #max_overdraft,
            shape: #shape,
        }
    }
}

/// The key template as the registry of rules reads it (`RuleSpec::shape`), when the
/// key names the client address the layer read: written `{client ip}`, which no
/// parameter can name, so that it is compared as an address.
fn registry_template(rule: &RuleArgs) -> Option<String> {
    let (_, pieces) = rule.key.as_ref()?;
    if !pieces
        .iter()
        .any(|p| matches!(p, Piece::Request(RequestPart::ClientIp)))
    {
        return None;
    }
    let mut text = String::new();
    for piece in pieces {
        match piece {
            Piece::Text(literal) => text.push_str(&literal.replace('{', "{{").replace('}', "}}")),
            Piece::Value(path) => text.push_str(&format!("{{{}}}", path.join("."))),
            Piece::Request(RequestPart::ClientIp) => text.push_str("{client ip}"),
            Piece::Request(RequestPart::Identity) => text.push_str("{request.identity}"),
        }
    }
    Some(text)
}

/// The `RateType` variant of a mode.
fn mode_variant(mode: Mode) -> TokenStream {
    match mode {
        Mode::Overall => quote!(Overall),
        Mode::PerClient => quote!(PerClient),
    }
}

/// The `OnError` variant of a policy.
fn policy_variant(policy: Policy) -> TokenStream {
    match policy {
        Policy::Local => quote!(Local),
        Policy::Allow => quote!(Allow),
        Policy::Deny => quote!(Deny),
    }
}

/// `::core::option::Option::Some(value)`, or `None`.
fn option(value: Option<TokenStream>) -> TokenStream {
    match value {
        Some(value) => quote!(::core::option::Option::Some(#value)),
        None => quote!(::core::option::Option::None),
    }
}

/// What a refusal binds, and what it does: call the fallback, or return the refusal
/// converted into the function's return type.
fn on_refusal(sig: &Signature, plan: &Plan) -> (TokenStream, TokenStream) {
    let krate = &plan.krate;
    let refused = format_ident!("__redlimit_refused", span = Span::mixed_site());
    if let Some(path) = &plan.fallback {
        return (
            quote!(#refused),
            fallback_call(sig, &plan.names, krate, path, &refused),
        );
    }
    let span = match &sig.output {
        ReturnType::Type(_, ty) => ty.span(),
        ReturnType::Default => sig.ident.span(),
    };
    // The whole path carries the return type's span, so a missing impl is reported
    // there.
    let krate = respan(krate.to_token_stream(), span);
    let refusal = quote_spanned! {span=> return #krate::FromRateLimited::from_rate_limited(#refused); };
    (quote!(#refused), refusal)
}

/// The prologue before the body: inside the `async move` block `#[async_trait]`
/// leaves, or else before the body in a block of its own, so nothing in the body can
/// shadow what the prologue uses.
pub fn with_body(prologue: TokenStream, mut body: Block) -> TokenStream {
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

/// `return <fallback>(args).await`, `(args, refusal)` or `()` as the fallback's
/// signature takes them, through `__private::Fallback` with the parameter types
/// written out (`_` for `impl Trait`) and the shape inferred: a fallback of no
/// accepted shape fails the bound at its path, reported with the shapes accepted,
/// rather than being matched against its own signature.
fn fallback_call(
    sig: &Signature,
    names: &[Option<Ident>],
    krate: &Path,
    path: &Path,
    refused: &Ident,
) -> TokenStream {
    let args = names.iter().flatten();
    let holes = sig.inputs.iter().map(|arg| match arg {
        FnArg::Receiver(receiver) => receiver.ty.to_token_stream(),
        FnArg::Typed(typed) if names_a_type(&typed.ty) => typed.ty.to_token_stream(),
        FnArg::Typed(_) => quote!(_),
    });
    let krate = respan(krate.to_token_stream(), path.span());
    quote_spanned! {path.span()=>
        return #krate::__private::Fallback::<( #(#holes,)* ), _>::call(#path, (#(#args,)*), #refused).await;
    }
}

/// Whether `ty` can be written in an expression (`impl Trait` cannot).
fn names_a_type(ty: &syn::Type) -> bool {
    !ty.to_token_stream()
        .into_iter()
        .any(|token| matches!(&token, proc_macro2::TokenTree::Ident(i) if i == "impl"))
        && !matches!(ty, syn::Type::ImplTrait(_))
}

pub fn respan(tokens: TokenStream, span: Span) -> TokenStream {
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

/// The expression building rule `index`'s key (without the client's prefix); a value
/// of the request the call does not have breaks out of `at.label` with the refusal.
fn key_expr(rule: &RuleArgs, index: usize, at: &KeySite<'_>, fn_name: &str) -> TokenStream {
    let krate = at.krate;
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
            let value = quote_spanned!(span=> &#(#segments).*);
            // A value taken for an integer's digits is asserted to be one, as the key
            // writes it (whatever its type's name resolves to there).
            let value = match path.as_slice() {
                [name] if at.integers.contains(name) => {
                    quote_spanned!(span=> #krate::__private::integer_key(#value))
                }
                _ => value,
            };
            quote_spanned! {span=> #krate::__private::KeyPart::write_to(#value, &mut #buf); }
        }
        Piece::Request(part) => request_part(*part, index, at, &buf, span),
    });
    quote! {
        {
            let mut #buf = #krate::__private::KeyBuf::new();
            #(#parts)*
            #buf.finish()
        }
    }
}

/// Writes a value of the request into the key `buf`, or breaks out with the refusal;
/// spanned at the key, where a build without the layer is told which feature it needs.
fn request_part(part: RequestPart, index: usize, at: &KeySite<'_>, buf: &Ident, span: Span) -> TokenStream {
    let KeySite { site, label, .. } = at;
    let krate = respan(at.krate.to_token_stream(), span);
    let value = match part {
        RequestPart::ClientIp => quote_spanned!(span=> ClientIp),
        RequestPart::Identity => quote_spanned!(span=> Identity),
    };
    let refused = format_ident!("__redlimit_refused", span = Span::mixed_site());
    quote_spanned! {span=>
        if let ::core::result::Result::Err(#refused) = #krate::__private::request_value::<#krate::__private::Request>(
            &#site,
            #index,
            #krate::__private::RequestValue::#value,
            &mut #buf,
        ) {
            break #label ::core::result::Result::Err(#refused);
        }
    }
}
