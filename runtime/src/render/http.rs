//! Refusals as HTTP responses (cargo features `axum` and `actix`): 429 with
//! `Retry-After` and the IETF RateLimit fields (draft-ietf-httpapi-ratelimit-headers),
//! or 503 when the refusal came from the backend failing under `on_error = "deny"`,
//! without the cause. The status, headers and body are made here once ([`Rendered`]);
//! axum's responses are written here, actix-web's in `actix.rs`.

#[cfg(feature = "axum")]
use axum_core::response::{IntoResponse, Response};
use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::StatusCode;
use std::fmt::Write;

#[cfg(feature = "axum")]
use crate::FromRateLimited;
use crate::RateLimited;

use crate::outcomes::refusal::{
    RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};

use crate::outcomes::refusal::seconds_up;

/// Marks a response made from a refusal (`RateLimited`'s own, `ProblemJson`'s), as a
/// response extension (axum's and actix-web's): the limit that refused decided it, so
/// a `RateLimitLayer` around the handler leaves its RateLimit fields (or their
/// absence) as they are.
#[cfg(any(feature = "axum", feature = "actix"))]
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct RefusalResponse;

/// A refusal's response as every framework writes it: its status, its headers (the
/// content type first) and its body.
#[derive(Debug)]
pub(super) struct Rendered {
    pub(super) status: StatusCode,
    pub(super) headers: HeaderMap,
    pub(super) body: String,
}

#[cfg(any(feature = "axum", feature = "actix"))]
impl RateLimited {
    /// The status this refusal answers with: 429 when the limit refused, 503 when the
    /// backend failed under `on_error = "deny"` or the in-process limiters are at their
    /// bound ([`Error::MemoryFull`](crate::Error::MemoryFull)), 500 when the limiter is
    /// misconfigured; 400 (or 401) when a layer rule refuses requests without a key,
    /// and 400 when one sends its key header twice.
    pub fn status(&self) -> StatusCode {
        match &self.cause {
            None => StatusCode::TOO_MANY_REQUESTS,
            Some(cause)
                if matches!(
                    **cause,
                    crate::Error::MissingKey {
                        unauthorized: true,
                        ..
                    }
                ) =>
            {
                StatusCode::UNAUTHORIZED
            }
            Some(cause)
                if matches!(
                    **cause,
                    crate::Error::MissingKey { .. } | crate::Error::RepeatedKey { .. }
                ) =>
            {
                StatusCode::BAD_REQUEST
            }
            Some(cause) if cause.is_backend_failure() => StatusCode::SERVICE_UNAVAILABLE,
            Some(cause) if matches!(**cause, crate::Error::MemoryFull { .. }) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Some(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The response's headers: `Retry-After` and the RateLimit fields for a 429.
    fn headers(&self, headers: &mut HeaderMap) {
        if self.cause.is_some() {
            return;
        }
        let wait = self.retry_after.map(seconds_up);
        if let Some(wait) = wait {
            headers.insert(RETRY_AFTER, HeaderValue::from(wait));
        }
        if let Some(limit) = &self.limit {
            let policy = limit.policy_field();
            let state = limit.state_field(self.remaining, self.retry_after);
            for (field, value) in [(RATELIMIT_POLICY, policy), (RATELIMIT, state)] {
                if let Ok(value) = HeaderValue::from_str(&value) {
                    headers.insert(field, value);
                }
            }
            if self.x_ratelimit {
                headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(limit.rate));
                headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(self.remaining));
                if let Some(wait) = wait {
                    headers.insert(X_RATELIMIT_RESET, HeaderValue::from(wait));
                }
            }
        }
    }

    /// The plain-text body: what happened and when to come back, never the cause.
    pub(super) fn body(&self) -> String {
        match self.status() {
            StatusCode::TOO_MANY_REQUESTS => {
                let mut body = String::from(self.message.as_deref().unwrap_or("Too many requests"));
                if let Some(wait) = self.retry_after {
                    let _ = write!(body, "; retry in {} s", seconds_up(wait));
                }
                body.push('\n');
                body
            }
            StatusCode::SERVICE_UNAVAILABLE => "Service temporarily unavailable\n".to_owned(),
            _ => match self.cause.as_deref() {
                Some(crate::Error::MissingKey { what, .. }) => format!("This request needs {what}\n"),
                Some(crate::Error::RepeatedKey { what, .. }) => {
                    format!("This request sends {what} more than once; send it once\n")
                }
                // What the server's set-up lacks, in the library's own words (never a
                // value the request sent): the rule's name and the fixed problem text.
                Some(crate::Error::InvalidConfig { problem, .. }) => {
                    let rule = self.limit.as_ref().map_or("", |limit| &limit.name);
                    format!("Internal server error: rate limit rule `{rule}` is misconfigured: {problem}\n")
                }
                _ => "Internal server error\n".to_owned(),
            },
        }
    }

    /// The plain-text response: the status, `text/plain` and the headers, the body.
    pub(super) fn plain_text(&self) -> Rendered {
        self.rendered("text/plain; charset=utf-8", self.body())
    }

    /// The response with `content_type` and `body`, the status and headers of this
    /// refusal.
    pub(super) fn rendered(&self, content_type: &'static str, body: String) -> Rendered {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        self.headers(&mut headers);
        Rendered {
            status: self.status(),
            headers,
            body,
        }
    }
}

#[cfg(feature = "axum")]
impl IntoResponse for Rendered {
    /// The response, marked as a refusal's ([`RefusalResponse`]).
    fn into_response(self) -> Response {
        let mut response = (self.status, self.headers, self.body).into_response();
        response.extensions_mut().insert(RefusalResponse);
        response
    }
}

#[cfg(feature = "axum")]
impl IntoResponse for RateLimited {
    /// 429 with `Retry-After` (whole seconds, rounded up), `RateLimit-Policy` and
    /// `RateLimit`, and a short plain-text body (the rule's `message` when it has one);
    /// 503 without the cause when the backend failed under `on_error = "deny"`.
    fn into_response(self) -> Response {
        self.plain_text().into_response()
    }
}

#[cfg(feature = "axum")]
impl FromRateLimited for Response {
    fn from_rate_limited(limited: RateLimited) -> Self {
        limited.into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcomes::refusal::Limit;
    use std::sync::Arc;
    use std::time::Duration;

    fn refusal(retry: u64) -> RateLimited {
        RateLimited {
            key: "rate_limit:login:198.51.100.7".to_owned(),
            retry_after: Some(Duration::from_millis(retry)),
            message: None,
            rule: 0,
            cause: None,
            limit: Some(Box::new(Limit {
                name: "login:{ip}".into(),
                rate: 5,
                window: Duration::from_secs(60),
                burst: None,
            })),
            x_ratelimit: false,
            about_blank: false,
            remaining: 0,
        }
    }

    #[test]
    fn a_refusal_is_429_with_retry_after_rounded_up_and_the_ratelimit_fields() {
        let response = refusal(1_001).into_response();
        assert_eq!(response.status(), 429);
        let header = |name: &str| response.headers()[name].to_str().unwrap().to_owned();
        assert_eq!(header("retry-after"), "2");
        assert_eq!(header("ratelimit-policy"), "\"login:{ip}\";q=5;w=60");
        assert_eq!(header("ratelimit"), "\"login:{ip}\";r=0;t=2");
        assert_eq!(header("content-type"), "text/plain; charset=utf-8");
        assert_eq!(refusal(3_000).into_response().headers()["retry-after"], "3");
    }

    #[test]
    fn a_token_buckets_policy_says_its_burst() {
        let mut limited = refusal(1_000);
        if let Some(limit) = limited.limit.as_mut() {
            limit.burst = Some(12);
        }
        let response = limited.into_response();
        assert_eq!(
            response.headers()["ratelimit-policy"],
            "\"login:{ip}\";q=5;w=60;redlimit-burst=12"
        );
        assert!(response.extensions().get::<RefusalResponse>().is_some());
    }

    #[test]
    fn names_are_structured_field_strings() {
        assert_eq!(
            crate::outcomes::refusal::sf_string("a\"b\\c é"),
            "\"a\\\"b\\\\c _\""
        );
    }

    #[test]
    fn a_backend_failure_is_503_and_keeps_the_cause_to_itself() {
        let mut limited = refusal(0);
        limited.retry_after = None;
        limited.cause = Some(Arc::new(crate::Error::Backend {
            detail: "secret detail".to_owned(),
        }));
        let response = limited.clone().into_response();
        assert_eq!(response.status(), 503);
        assert!(response.headers().get("retry-after").is_none());
        assert!(!limited.body().contains("secret"));
    }
}
