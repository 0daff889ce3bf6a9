//! What `#[rate_limit]` expands into: re-exports only. Not a public API: it changes
//! with the macro.

pub use crate::checks::{Fallback, KeyPart};
pub use crate::key_buf::{KeyBuf, MAX_VALUE_LEN};
pub use crate::limiter::check_bucket;
pub use crate::site::{decide, Granted, OnError, RuleSpec, Site};
// For the CLI's `inspect`: the server's eviction policy, read as the client reads it.
pub use crate::backend::server::{read_eviction, Eviction};
pub use std::borrow::Cow;
