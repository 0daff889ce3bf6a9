//! Responders: what the layer writes on a response. A refusal becomes a response
//! through a [`Respond`] (plain text, problem+json, a gRPC status, or your own); a
//! granted response gets the RateLimit fields of its tightest rule.

use http::{HeaderValue, Response};
use redlimit_runtime::engine::Granted;
use redlimit_runtime::{RateLimited, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING};

use super::fields::Fields;
use super::shared::Shared;

/// How a refusal becomes a response with body `B`.
pub trait Respond<B>: Clone + Send + Sync + 'static {
    /// The response to a refused request.
    fn refused(&self, limited: RateLimited) -> Response<B>;
}

/// Refusals as plain-text HTTP responses: 429 with `Retry-After` and the RateLimit
/// fields, 503 when the backend failed under
/// [`OnError::Deny`](redlimit_runtime::OnError::Deny), 500 when misconfigured.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlainText;

/// Refusals as RFC 9457 problem details (`application/problem+json`, as the axum
/// response `ProblemJson` writes them), same statuses and headers as [`PlainText`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ProblemDetails;

/// Refusals as gRPC statuses: `RESOURCE_EXHAUSTED` with `retry-after` metadata and a
/// `google.rpc.RetryInfo` detail; `UNAVAILABLE` when the backend failed under
/// [`OnError::Deny`](redlimit_runtime::OnError::Deny).
#[derive(Debug, Clone, Copy, Default)]
pub struct Grpc;

#[cfg(feature = "axum")]
impl Respond<axum::body::Body> for PlainText {
    fn refused(&self, limited: RateLimited) -> Response<axum::body::Body> {
        axum::response::IntoResponse::into_response(limited)
    }
}

#[cfg(feature = "axum")]
impl Respond<axum::body::Body> for ProblemDetails {
    fn refused(&self, limited: RateLimited) -> Response<axum::body::Body> {
        axum::response::IntoResponse::into_response(redlimit_runtime::ProblemJson(limited))
    }
}

#[cfg(feature = "tonic")]
impl Respond<tonic::body::Body> for Grpc {
    fn refused(&self, limited: RateLimited) -> Response<tonic::body::Body> {
        tonic::Status::from(limited).into_http()
    }
}

impl Shared {
    /// `RateLimit-Policy` and `RateLimit` of the tightest rule on a granted response.
    /// The rate and window are the ones decided: a run-time override's when one applied.
    pub(crate) fn success_fields(&self, granted: &Granted, headers: &mut impl Fields) {
        let Some((rule, remaining)) = granted.tightest else {
            return;
        };
        let (Some(keyed), Some(spec)) = (self.rules.get(rule), self.engine.rules().get(rule)) else {
            return;
        };
        let (rate, window) = granted.decided.unwrap_or((spec.rate, spec.interval));
        if self.success_fields {
            let policy = if (rate, window) == (spec.rate, spec.interval) {
                keyed.policy.clone()
            } else {
                let mut limit = spec.limit();
                limit.rate = rate;
                limit.window = window;
                HeaderValue::try_from(limit.policy_field()).ok()
            };
            if let Some(policy) = policy {
                headers.insert(RATELIMIT_POLICY, policy);
                let mut state = String::with_capacity(keyed.state.len() + 20);
                state.push_str(&keyed.state);
                state.push_str(itoa::Buffer::new().format(remaining));
                // From a String: no copy.
                if let Ok(value) = HeaderValue::try_from(state) {
                    headers.insert(RATELIMIT, value);
                }
            }
        }
        if self.x_ratelimit {
            headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(rate));
            headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(remaining));
        }
    }
}
