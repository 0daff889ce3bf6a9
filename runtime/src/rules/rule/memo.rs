//! What a client keeps of a rule's checks and hash ([`Memo`]), beside the rule and
//! not part of what it is.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// What a client learns of a rule on its first call and keeps for the next ones, so
/// that a rule built once and called many times is checked and hashed once: that its
/// name passed [`check_name`](crate::keys::check_name) ([`NAME`]) and its settings
/// every check of them ([`SETTINGS`]), and its name's hash
/// ([`name_hash`](crate::keys::name_hash); 0: not computed yet). Every setter clears
/// [`SETTINGS`]; the name never changes. With the settings, their window and
/// keep-alive in whole ms, which every decision reads. Not part of what a rule is: two
/// rules that differ only here are equal.
#[derive(Default)]
pub(super) struct Memo {
    pub(super) checked: AtomicU8,
    pub(super) hash: AtomicU64,
    pub(super) window_ms: [AtomicU64; 2],
}

/// [`Memo`]'s bit for a name found good.
pub(super) const NAME: u8 = 1;
/// [`Memo`]'s bit for a rate and window taken from an override.
pub(super) const OVERRIDDEN: u8 = 4;
/// [`Memo`]'s bit for settings found good.
pub(super) const SETTINGS: u8 = 2;

impl Clone for Memo {
    fn clone(&self) -> Self {
        Memo {
            // (Acquire: the window kept before the bits were set comes with them)
            checked: AtomicU8::new(self.checked.load(Ordering::Acquire)),
            hash: AtomicU64::new(self.hash.load(Ordering::Relaxed)),
            window_ms: self
                .window_ms
                .each_ref()
                .map(|ms| AtomicU64::new(ms.load(Ordering::Relaxed))),
        }
    }
}

impl PartialEq for Memo {
    fn eq(&self, _: &Memo) -> bool {
        true
    }
}

impl Eq for Memo {}
