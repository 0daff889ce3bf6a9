//! What a decision gives: a [`Decision`](decision::Decision) (being limited is an
//! outcome), a [`RateLimited`](refusal::RateLimited) refusal as the attribute and the
//! layer return it, and an [`Error`](error::Error) for failures and misuse.

pub(crate) mod decision;
pub(crate) mod error;
pub(crate) mod refusal;
