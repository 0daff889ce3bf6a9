//! Traits the attribute's expansion goes through so that a mistake is reported in the
//! user's terms, at the user's token: a fallback of no accepted shape, a key
//! placeholder whose value has no `Display`.

use std::fmt::Display;
use std::future::Future;

use crate::keys::key_buf::KeyBuf;
use crate::RateLimited;

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
