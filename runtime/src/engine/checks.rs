//! Traits the attribute's expansion goes through so that a mistake is reported in the
//! user's terms, at the user's token: a fallback that does not take the function's
//! arguments, a key placeholder whose value has no `Display`.

use std::fmt::Display;
use std::future::Future;

use crate::keys::key_buf::KeyBuf;

/// A `fallback` called with the function's arguments, as one tuple.
#[diagnostic::on_unimplemented(
    message = "the fallback must take the function's arguments {Args}, in order, and be async",
    label = "called with {Args}",
    note = "a fallback is called with the arguments of the function it stands in for: give it the \
            same parameters and return type"
)]
pub trait Fallback<Args> {
    /// What calling it gives.
    type Future: Future;
    /// Calls it.
    fn call(self, args: Args) -> Self::Future;
}

macro_rules! fallback_for_arity {
    ($($arg:ident),*) => {
        impl<F, Fut, $($arg),*> Fallback<($($arg,)*)> for F
        where
            F: FnOnce($($arg),*) -> Fut,
            Fut: Future,
        {
            type Future = Fut;
            #[allow(non_snake_case)]
            fn call(self, ($($arg,)*): ($($arg,)*)) -> Fut {
                self($($arg),*)
            }
        }
    };
}

fallback_for_arity!();
fallback_for_arity!(A1);
fallback_for_arity!(A1, A2);
fallback_for_arity!(A1, A2, A3);
fallback_for_arity!(A1, A2, A3, A4);
fallback_for_arity!(A1, A2, A3, A4, A5);
fallback_for_arity!(A1, A2, A3, A4, A5, A6);
fallback_for_arity!(A1, A2, A3, A4, A5, A6, A7);
fallback_for_arity!(A1, A2, A3, A4, A5, A6, A7, A8);
fallback_for_arity!(A1, A2, A3, A4, A5, A6, A7, A8, A9);
fallback_for_arity!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10);
fallback_for_arity!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11);
fallback_for_arity!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12);

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
