//! Refusals as actix-web responses (cargo feature `actix`): the status, headers and
//! body `http.rs` makes, written with actix-web's types. actix-web 4 is built on
//! `http` 0.2, not 1: the status crosses as its number, names and values as bytes.

use std::fmt;

use actix_web::body::BoxBody;
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, HttpResponseBuilder, Responder, ResponseError};

use super::http::{RefusalResponse, Rendered};
use crate::{FromRateLimited, ProblemJson, RateLimited};

impl Rendered {
    /// The same response as axum's, as actix-web's, marked as a refusal's
    /// ([`RefusalResponse`]).
    fn into_actix(self) -> HttpResponse {
        let mut response = HttpResponseBuilder::new(actix_status(self.status));
        for (name, value) in &self.headers {
            let name = HeaderName::from_bytes(name.as_str().as_bytes());
            let value = HeaderValue::from_bytes(value.as_bytes());
            // Both parse: what `http` 1 accepts, 0.2 accepts.
            if let (Ok(name), Ok(value)) = (name, value) {
                response.insert_header((name, value));
            }
        }
        let mut response = response.body(self.body);
        response.extensions_mut().insert(RefusalResponse);
        response
    }
}

/// An `http` 1 status as actix-web's.
fn actix_status(status: http::StatusCode) -> StatusCode {
    StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// A handler returning `Result<T, RateLimited>` (or `actix_web::Error`, which any
/// `ResponseError` becomes) answers a refusal as the axum response does: 429 with
/// `Retry-After` and the RateLimit fields, 503 or 500 without the cause.
#[cfg(feature = "actix")]
impl ResponseError for RateLimited {
    fn status_code(&self) -> StatusCode {
        actix_status(self.status())
    }

    fn error_response(&self) -> HttpResponse {
        self.plain_text().into_actix()
    }
}

#[cfg(feature = "actix")]
impl Responder for RateLimited {
    type Body = BoxBody;

    fn respond_to(self, _: &HttpRequest) -> HttpResponse {
        self.plain_text().into_actix()
    }
}

/// A handler returning `HttpResponse` answers a refusal with [`RateLimited`]'s own
/// response.
#[cfg(feature = "actix")]
impl FromRateLimited for HttpResponse {
    fn from_rate_limited(limited: RateLimited) -> Self {
        limited.plain_text().into_actix()
    }
}

/// The refusal's own message (actix-web's errors are displayed in its logs).
#[cfg(feature = "actix")]
impl fmt::Display for ProblemJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

#[cfg(feature = "actix")]
impl ResponseError for ProblemJson {
    fn status_code(&self) -> StatusCode {
        actix_status(self.0.status())
    }

    fn error_response(&self) -> HttpResponse {
        self.rendered().into_actix()
    }
}

#[cfg(feature = "actix")]
impl Responder for ProblemJson {
    type Body = BoxBody;

    fn respond_to(self, _: &HttpRequest) -> HttpResponse {
        self.rendered().into_actix()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Every refusal's response is marked, a 503 without fields too: a layer around the
    /// handler tells it from a grant by the mark.
    #[test]
    fn a_refusals_response_is_marked_whatever_its_status() {
        let mut limited = RateLimited {
            key: "rate_limit:a".to_owned(),
            retry_after: Some(std::time::Duration::from_secs(1)),
            message: None,
            rule: 0,
            cause: None,
            limit: None,
            x_ratelimit: false,
            about_blank: false,
            remaining: 0,
        };
        let marked = |response: HttpResponse| response.extensions().get::<RefusalResponse>().is_some();
        assert!(marked(limited.error_response()));
        limited.cause = Some(Arc::new(crate::Error::Backend {
            detail: "down".to_owned(),
        }));
        let unavailable = limited.error_response();
        assert_eq!(unavailable.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(unavailable.headers().get("ratelimit").is_none());
        assert!(marked(unavailable));
        assert!(marked(HttpResponse::from_rate_limited(limited.clone())));
        assert!(marked(ProblemJson(limited).error_response()));
        assert!(!marked(HttpResponse::Ok().finish()));
    }
}
