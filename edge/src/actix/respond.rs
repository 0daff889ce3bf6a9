//! What the actix-web middleware writes on a response: a refusal through a
//! [`Respond`] (plain text, problem+json, or your own), a grant's RateLimit fields
//! into actix-web's headers (`http` 0.2's, the fields' names and values carried over as
//! bytes).

use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use actix_web::{HttpResponse, ResponseError};
use redlimit_runtime::{ProblemJson, RateLimited};

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
