//! Refusals rendered for the protocols they travel in: HTTP responses ([`http`], made
//! once, written for axum there with cargo feature `axum` and for actix-web in
//! [`actix`] with feature `actix`), problem+json bodies ([`problem`], either feature)
//! and gRPC statuses for tonic ([`grpc`], feature `tonic`).
//!
//! These live in the runtime, not beside the layer in `redlimit-edge`, because of the
//! orphan rule: `impl IntoResponse for RateLimited`, `impl ResponseError for
//! RateLimited` and `impl From<RateLimited> for tonic::Status` need the crate that
//! defines `RateLimited` or the trait, and the runtime is the one that defines
//! `RateLimited`.
//!
//! Each public item and impl in them repeats its module's `#[cfg(feature = ...)]`: the
//! documentation of a crate that re-exports `RateLimited` (redlimit) shows the feature
//! an impl needs only from a cfg on the impl itself, not from one on a private module.

#[cfg(feature = "actix")]
pub(crate) mod actix;
#[cfg(feature = "tonic")]
pub(crate) mod grpc;
#[cfg(any(feature = "axum", feature = "actix"))]
pub(crate) mod http;
#[cfg(any(feature = "axum", feature = "actix"))]
pub(crate) mod problem;
