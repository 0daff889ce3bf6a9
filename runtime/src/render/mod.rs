//! Refusals rendered for the protocols they travel in: HTTP responses for axum
//! ([`http`], cargo feature `axum`), problem+json bodies ([`problem`], same feature)
//! and gRPC statuses for tonic ([`grpc`], feature `tonic`).
//!
//! These live in the runtime, not beside the layer in `redlimit-edge`, because of the
//! orphan rule: `impl IntoResponse for RateLimited` and `impl From<RateLimited> for
//! tonic::Status` need the crate that defines `RateLimited` or the trait, and the
//! runtime is the one that defines `RateLimited`.
//!
//! Each public item and impl in them repeats its module's `#[cfg(feature = ...)]`: the
//! documentation of a crate that re-exports `RateLimited` (redlimit) shows the feature
//! an impl needs only from a cfg on the impl itself, not from one on a private module.

#[cfg(feature = "tonic")]
pub(crate) mod grpc;
#[cfg(feature = "axum")]
pub(crate) mod http;
#[cfg(feature = "axum")]
pub(crate) mod problem;
