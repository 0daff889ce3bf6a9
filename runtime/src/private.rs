//! What `#[rate_limit]` expands into: re-exports only. Not a public API: it changes
//! with the macro.

pub use crate::engine::checks::{request_value, shapes, Fallback, KeyPart, RequestValue, RequestValues};
pub use crate::engine::{decide, Engine};
pub use crate::keys::key_buf::KeyBuf;
pub use crate::{OnError, RuleSpec};
pub use std::borrow::Cow;
