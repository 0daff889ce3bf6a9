//! What the actix-web middleware writes on a response: a refusal through a
//! [`Respond`] (plain text, problem+json, or your own), a grant's RateLimit fields
//! into actix-web's headers (`http` 0.2's, the fields' names and values carried over as
//! bytes).

use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use actix_web::{HttpResponse, ResponseError};
use redlimit_runtime::{ProblemJson, RateLimited, RefusalResponse};

use crate::tower::{Fields, PlainText, ProblemDetails};

/// How a refusal becomes an actix-web response.
pub trait Respond: Clone + 'static {
    /// The response to a refused request.
    fn refused(&self, limited: RateLimited) -> HttpResponse;
}

/// Refusals as plain text, as a handler returning `Result<T, RateLimited>` answers them.
impl Respond for PlainText {
    fn refused(&self, limited: RateLimited) -> HttpResponse {
        limited.error_response()
    }
}

/// Refusals as `application/problem+json`, as [`ProblemJson`] answers them.
impl Respond for ProblemDetails {
    fn refused(&self, limited: RateLimited) -> HttpResponse {
        ProblemJson(limited).error_response()
    }
}

/// Whether the inner service's response already says the limit that decided it, as
/// the tower layer tells: `RateLimit` or `RateLimit-Policy` of its own, or a refusal
/// the library made (a `#[rate_limit]` function refused inside the handler, however
/// the handler returned it: the response is marked so). The middleware then adds none
/// of its fields.
pub(super) fn decided_inside<B>(response: &HttpResponse<B>) -> bool {
    if response.extensions().get::<RefusalResponse>().is_some() {
        return true;
    }
    response
        .headers()
        .keys()
        .any(|name| matches!(name.as_str(), "ratelimit" | "ratelimit-policy"))
}

impl Fields for HeaderMap {
    fn insert(&mut self, name: http::HeaderName, value: http::HeaderValue) {
        let Ok(value) = HeaderValue::from_bytes(value.as_bytes()) else {
            return;
        };
        // The fields' own names without a copy; any other by its bytes.
        let name = match name.as_str() {
            "ratelimit" => HeaderName::from_static("ratelimit"),
            "ratelimit-policy" => HeaderName::from_static("ratelimit-policy"),
            "x-ratelimit-limit" => HeaderName::from_static("x-ratelimit-limit"),
            "x-ratelimit-remaining" => HeaderName::from_static("x-ratelimit-remaining"),
            other => match HeaderName::from_bytes(other.as_bytes()) {
                Ok(name) => name,
                Err(_) => return,
            },
        };
        HeaderMap::insert(self, name, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_with_either_field_or_made_from_a_refusal_was_decided_inside() {
        assert!(!decided_inside(&HttpResponse::Ok().finish()));
        for field in ["ratelimit", "RateLimit-Policy"] {
            let own = HttpResponse::Ok().insert_header((field, "\"own\";r=1")).finish();
            assert!(decided_inside(&own), "{field}");
        }
        let mut refusal = HttpResponse::ServiceUnavailable().finish();
        refusal.extensions_mut().insert(RefusalResponse);
        assert!(decided_inside(&refusal));
    }
}
