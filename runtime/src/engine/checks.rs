//! Traits the attribute's expansion goes through so that a mistake is reported in the
//! user's terms, at the user's token: a fallback of no accepted shape, a key
//! placeholder whose value has no `Display`, a key naming the request the layer serves
//! where the layer is not built.

use std::fmt::Display;
use std::future::Future;

use crate::keys::key_buf::KeyBuf;
use crate::{Error, RateLimited};

use super::Engine;

/// The shapes of `fallback` the attribute accepts, each a marker [`Fallback`] is
/// implemented under: the function's arguments, those and then the refusal, or none.
/// The marker is inferred from the fallback's own signature.
pub mod shapes {
    /// `fallback(args...)`: the function's arguments.
    #[derive(Debug)]
    pub struct Arguments;
    /// `fallback(args..., RateLimited)`: the arguments, then the refusal.
    #[derive(Debug)]
    pub struct ThenRefusal;
    /// `fallback()`: nothing (for a function that has parameters).
    #[derive(Debug)]
    pub struct Nothing;
}

/// A `fallback` called with the function's arguments, as one tuple, and the refusal,
/// in one of the accepted [`shapes`].
#[diagnostic::on_unimplemented(
    message = "the fallback has none of the accepted shapes: the function's arguments {Args}; those, then \
               a `RateLimited`; or no argument; each async, returning the function's type",
    label = "takes none of: {Args}, {Args} then `RateLimited`, ()",
    note = "a fallback stands in for the function when it is refused: it takes the function's \
            parameters, in order (then `redlimit::RateLimited` to read the refusal), or no \
            parameter at all, and returns the function's return type"
)]
pub trait Fallback<Args, Shape> {
    /// What calling it gives.
    type Future: Future;
    /// Calls it with the arguments and, in the shape that takes it, the refusal.
    fn call(self, args: Args, refused: RateLimited) -> Self::Future;
}

macro_rules! fallback_for_arity {
    ($($arg:ident),*) => {
        impl<F, Fut, $($arg),*> Fallback<($($arg,)*), shapes::Arguments> for F
        where
            F: FnOnce($($arg),*) -> Fut,
            Fut: Future,
        {
            type Future = Fut;
            #[allow(non_snake_case)]
            fn call(self, ($($arg,)*): ($($arg,)*), _: RateLimited) -> Fut {
                self($($arg),*)
            }
        }

        impl<F, Fut, $($arg),*> Fallback<($($arg,)*), shapes::ThenRefusal> for F
        where
            F: FnOnce($($arg,)* RateLimited) -> Fut,
            Fut: Future,
        {
            type Future = Fut;
            #[allow(non_snake_case)]
            fn call(self, ($($arg,)*): ($($arg,)*), refused: RateLimited) -> Fut {
                self($($arg,)* refused)
            }
        }
    };
}

/// `fallback()` for a function with parameters (with none, it is the arguments' shape).
macro_rules! fallback_of_nothing {
    ($($arg:ident),+) => {
        impl<F, Fut, $($arg),+> Fallback<($($arg,)+), shapes::Nothing> for F
        where
            F: FnOnce() -> Fut,
            Fut: Future,
        {
            type Future = Fut;
            fn call(self, _: ($($arg,)+), _: RateLimited) -> Fut {
                self()
            }
        }
    };
}

macro_rules! fallbacks {
    ($($arg:ident),*) => {
        fallback_for_arity!($($arg),*);
        fallback_of_nothing!($($arg),*);
    };
}

fallback_for_arity!();
fallbacks!(A1);
fallbacks!(A1, A2);
fallbacks!(A1, A2, A3);
fallbacks!(A1, A2, A3, A4);
fallbacks!(A1, A2, A3, A4, A5);
fallbacks!(A1, A2, A3, A4, A5, A6);
fallbacks!(A1, A2, A3, A4, A5, A6, A7);
fallbacks!(A1, A2, A3, A4, A5, A6, A7, A8);
fallbacks!(A1, A2, A3, A4, A5, A6, A7, A8, A9);
fallbacks!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10);
fallbacks!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11);
fallbacks!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12);

/// A value a key template's placeholder writes into the key.
#[diagnostic::on_unimplemented(
    message = "a key placeholder's value is a `{Self}`, which does not implement `Display`",
    label = "this key writes a `{Self}`",
    note = "placeholders are written into the key with `Display`: implement it for `{Self}`, \
            or name a field that has it, such as `{{id.0}}`"
)]
pub trait KeyPart {
    /// Writes the value, escaped, into `key`.
    fn write_to(&self, key: &mut KeyBuf);
}

impl<T: Display + ?Sized> KeyPart for T {
    fn write_to(&self, key: &mut KeyBuf) {
        key.value(self);
    }
}

/// A parameter's type that `#[rate_limit]` took for a primitive integer, by its name
/// (`u64`, `i32`, ...): its values are written as digits alone, which the attribute's
/// check of templates that may name one limiter relies on (`items:{n}` beside
/// `items:daily` passes for `n: u64`). Implemented for the primitive integers only,
/// so that a type of that name that is not one (an alias, a generic parameter)
/// fails to compile rather than write any text. Asserted on the value the key writes,
/// where the key writes it: an item of the body cannot make the check read another
/// type than the key's.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is named as a primitive integer type, but is not one",
    label = "`#[rate_limit]` took this parameter for an integer's digits, by its type's name",
    note = "`#[rate_limit]` tells a key template from another that counts differently by \
            such a parameter's digits: leave the primitive's name unshadowed, or give the \
            parameter a type of another name"
)]
pub trait IntegerKey {}

macro_rules! integer_keys {
    ($($t:ty),*) => { $(impl IntegerKey for $t {})* };
}
integer_keys!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize);

/// `value`, which compiles only when it is of a primitive integer type: see
/// `IntegerKey`. The key writes what it returns.
#[inline(always)]
pub const fn integer_key<T: IntegerKey>(value: &T) -> &T {
    value
}

/// A value of the request the layer serves, as a key template names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestValue {
    /// `{request.client_ip}`: the client address the layer read, behind its trusted
    /// proxies.
    ClientIp,
    /// `{request.identity}`: what the application set for the request
    /// (`redlimit::request::set_identity`).
    Identity,
}

impl RequestValue {
    /// The value as an error names it.
    pub fn described(self) -> &'static str {
        match self {
            RequestValue::ClientIp => "the request's client address ({request.client_ip})",
            RequestValue::Identity => "the request's identity ({request.identity})",
        }
    }
}

/// Where a key's request values come from: the request scope of the layer, with the
/// facade's `tower` feature (which `axum`, `actix` and `tonic` include).
#[diagnostic::on_unimplemented(
    message = "a key naming `{{request.client_ip}}` or `{{request.identity}}` reads the request \
               redlimit's layer serves, which needs redlimit's `tower` feature",
    label = "this key reads the request the layer serves",
    note = "enable redlimit's `tower` feature, or `axum`, `actix` or `tonic`, which include it: \
            the layer (RateLimitLayer, or its actix-web middleware) sets the request scope these \
            values are read from"
)]
pub trait RequestValues {
    /// Writes `value` of the request being served into `key`, escaped; `Err` says why
    /// the call has none.
    fn write(value: RequestValue, key: &mut KeyBuf) -> Result<(), &'static str>;
}

/// Writes `value` of the request being served into rule `rule`'s key, or refuses the
/// call as misuse (logged, counted, never a shared key).
pub fn request_value<R: RequestValues>(
    engine: &Engine,
    rule: usize,
    value: RequestValue,
    key: &mut KeyBuf,
) -> Result<(), RateLimited> {
    R::write(value, key).map_err(|reason| {
        let error = Error::MissingRequestValue {
            rule: engine.rules()[rule].name.to_string(),
            value: value.described(),
            reason,
        };
        engine.refuse_misconfigured(rule, error)
    })
}

/// What `cost = ...` may evaluate to: an unsigned integer, as permits.
#[diagnostic::on_unimplemented(
    message = "`cost` is a `{Self}`: a call's cost is an unsigned integer (u64, u32, u16, u8 or usize)",
    label = "this `cost` is a `{Self}`",
    note = "`cost` is worked out from the arguments before the call, as the permits the call takes \
            (a settled rule's estimate): convert it, e.g. `cost = u64::from(request.max_tokens)`"
)]
pub trait Cost {
    /// The permits, saturating at `u64::MAX` (refused as more than the rule's rate).
    fn permits(self) -> u64;
}

macro_rules! cost_from {
    ($($t:ty),*) => {$(
        impl Cost for $t {
            fn permits(self) -> u64 {
                u64::try_from(self).unwrap_or(u64::MAX)
            }
        }
    )*};
}

cost_from!(u64, u32, u16, u8, usize);

impl<T: Cost + Copy> Cost for &T {
    fn permits(self) -> u64 {
        (*self).permits()
    }
}

/// What `settle = ...` names: a function of the function's result (`&Out`) to the
/// amount the call used, a `u64` or a narrower unsigned integer; `Shape` (one of
/// [`settle_shapes`]) is inferred from its signature.
#[diagnostic::on_unimplemented(
    message = "`settle` takes `fn(&{Out}) -> u64`: the function's result, by reference, to what the call used",
    label = "this is not a `fn(&{Out}) -> u64`",
    note = "a settled rule learns what the call used from its result: name a function taking \
            `&{Out}`, the function's return type, and returning a u64"
)]
pub trait SettleFn<Out: ?Sized, Shape> {
    /// What the call used, read from its result.
    fn actual(self, out: &Out) -> u64;
}

/// The shapes of `settle` accepted, each a marker [`SettleFn`] is implemented under.
pub mod settle_shapes {
    /// `fn(&Out) -> u64`.
    #[derive(Debug)]
    pub struct Exact;
    /// `fn(&Out) -> R`, `R` an unsigned integer narrower than `u64`.
    #[derive(Debug)]
    pub struct Narrower<R>(std::marker::PhantomData<R>);
}

/// The unsigned integers narrower than `u64` a `settle` function may return.
pub trait Narrower: Cost {}

impl Narrower for u32 {}
impl Narrower for u16 {}
impl Narrower for u8 {}
impl Narrower for usize {}

impl<F: FnOnce(&Out) -> u64, Out: ?Sized> SettleFn<Out, settle_shapes::Exact> for F {
    fn actual(self, out: &Out) -> u64 {
        self(out)
    }
}

impl<F, Out, R> SettleFn<Out, settle_shapes::Narrower<R>> for F
where
    F: FnOnce(&Out) -> R,
    Out: ?Sized,
    R: Narrower,
{
    fn actual(self, out: &Out) -> u64 {
        self(out).permits()
    }
}

/// The body of a function with settled rules, as a future of its return type `Out`
/// (written out, so that `?` and `return` in the body convert to it).
pub fn body<Out, F: Future<Output = Out>>(body: F) -> F {
    body
}
