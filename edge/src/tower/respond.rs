//! Responders: what the layer writes on a response. A refusal becomes a response
//! through a [`Respond`] (plain text, problem+json, a gRPC status, or your own); a
//! granted response gets the RateLimit fields of its tightest rule, unless what it
//! answers was decided inside (see [`decided_inside`]).

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

/// Whether the inner service's response already says the limit that decided it: it
/// carries `RateLimit` or `RateLimit-Policy` (a handler's own, an inner layer's), or it
/// is a refusal the library made (a `#[rate_limit]` function refused inside the
/// handler, its response marked so; on tonic, a status made from the refusal, which
/// tonic's server keeps in the response's extensions). The layer's fields would then
/// speak of a limit that did not decide it, over the one that did: it adds none of them.
pub(super) fn decided_inside<B>(response: &Response<B>) -> bool {
    #[cfg(feature = "axum")]
    if response
        .extensions()
        .get::<redlimit_runtime::RefusalResponse>()
        .is_some()
    {
        return true;
    }
    #[cfg(feature = "tonic")]
    if response
        .extensions()
        .get::<tonic::Status>()
        .and_then(std::error::Error::source)
        .is_some_and(|source| source.is::<redlimit_runtime::RefusalStatus>())
    {
        return true;
    }
    // One pass over the response's names, compared without hashing: cheaper than a
    // lookup of each field, as a response has few names.
    response
        .headers()
        .keys()
        .any(|name| name == RATELIMIT || name == RATELIMIT_POLICY)
}

impl Shared {
    /// A refusal with the layer's settings for its response: the `X-RateLimit-*`
    /// headers, the problem type.
    pub(crate) fn answered(&self, limited: RateLimited) -> RateLimited {
        #[cfg(any(feature = "axum", feature = "actix"))]
        let limited = limited.problem_type(self.problem_type);
        limited.x_ratelimit(self.x_ratelimit)
    }

    /// Whether granted responses get fields: the RateLimit ones or `X-RateLimit-*`.
    pub(crate) fn writes_fields(&self) -> bool {
        self.success_fields || self.x_ratelimit
    }

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
                let mut digits = itoa::Buffer::new();
                let digits = digits.format(remaining);
                // Exactly as long as it is: a value made of it takes the buffer as it
                // is, with no copy and no second allocation.
                let mut state = String::with_capacity(keyed.state.len() + digits.len());
                state.push_str(&keyed.state);
                state.push_str(digits);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_with_either_field_or_made_from_a_refusal_was_decided_inside() {
        assert!(!decided_inside(&Response::new(())));
        for field in [RATELIMIT, RATELIMIT_POLICY] {
            let mut own = Response::new(());
            own.headers_mut()
                .insert(field, HeaderValue::from_static("\"own\";r=1"));
            assert!(decided_inside(&own));
        }
        // A refusal without the fields (a 503 under `on_error = "deny"`): its mark.
        #[cfg(feature = "axum")]
        {
            let mut refusal = Response::new(());
            refusal.extensions_mut().insert(redlimit_runtime::RefusalResponse);
            assert!(decided_inside(&refusal));
        }
        // A gRPC status made from a refusal (an UNAVAILABLE under `on_error = "deny"`
        // has no fields either), as tonic's server leaves it on its response; any
        // other status is the layer's grant.
        #[cfg(feature = "tonic")]
        {
            let mut refused = tonic::Status::unavailable("service temporarily unavailable");
            refused.set_source(std::sync::Arc::new(redlimit_runtime::RefusalStatus));
            assert!(decided_inside(&refused.into_http::<()>()));
            assert!(!decided_inside(
                &tonic::Status::not_found("no such thing").into_http::<()>()
            ));
        }
    }
}
