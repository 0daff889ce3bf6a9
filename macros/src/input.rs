//! The input of `__private::expand!`, which the attribute writes and `expand!` reads:
//! `SIGNATURE ; [ name(ARGS) name(ARGS) ... ] ; { BODY }`, where each `name` is an
//! identifier carrying the span of its attribute, for errors about a rule as a whole
//! (a missing `rate`, say).

use proc_macro2::TokenStream;
use quote::quote;
use syn::parse::{Parse, ParseStream};
use syn::{Block, Expr, Ident, Path, Signature, Stmt, Token};

/// One attribute's arguments, with an identifier spanning the attribute.
pub struct Group {
    pub name: Ident,
    pub args: TokenStream,
}

/// A function and the arguments of all its `#[rate_limit]` attributes.
pub struct Input {
    pub sig: Signature,
    pub groups: Vec<Group>,
    pub body: Block,
}

impl Parse for Input {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let sig = input.parse()?;
        input.parse::<Token![;]>()?;
        let list;
        syn::bracketed!(list in input);
        let mut groups = Vec::new();
        while !list.is_empty() {
            let name: Ident = list.parse()?;
            let group;
            syn::parenthesized!(group in list);
            groups.push(Group {
                name,
                args: group.parse()?,
            });
        }
        input.parse::<Token![;]>()?;
        Ok(Input {
            sig,
            groups,
            body: input.parse()?,
        })
    }
}

impl Input {
    /// The tokens of `path!{ ... }` carrying this input.
    pub fn invocation(&self, path: &Path) -> TokenStream {
        let Input { sig, groups, body } = self;
        let groups = groups.iter().map(|Group { name, args }| quote!(#name(#args)));
        quote! { #path! { #sig ; [ #(#groups)* ] ; #body } }
    }
}

/// The `Box::pin(async move { ... })` body `#[async_trait]` leaves, if that is the body.
pub fn async_trait_block(body: &mut Block) -> Option<&mut Block> {
    let [Stmt::Expr(Expr::Call(call), None)] = &mut body.stmts[..] else {
        return None;
    };
    let Expr::Path(func) = &*call.func else {
        return None;
    };
    if func.path.segments.last()?.ident != "pin" || call.args.len() != 1 {
        return None;
    }
    match call.args.first_mut()? {
        Expr::Async(block) => Some(&mut block.block),
        _ => None,
    }
}
