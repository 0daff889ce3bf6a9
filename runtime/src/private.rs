//! What `#[rate_limit]` expands into: re-exports only. Not a public API: it changes
//! with the macro.

pub use crate::engine::checks::{
    body, integer_key, request_value, settle_shapes, shapes, Cost, Fallback, KeyPart, RequestValue,
    RequestValues, SettleFn,
};
pub use crate::engine::{decide, decide_with, reserve, Engine, Pending};
pub use crate::keys::key_buf::KeyBuf;
pub use crate::{OnError, RuleSpec};
pub use std::borrow::Cow;
