//! Refusals as RFC 9457 problems (`application/problem+json`, cargo feature `axum` or
//! `actix`):
//! [`ProblemJson`], and the [`ProblemType`] a 429 is of: the quota-exceeded type the
//! IETF RateLimit-headers draft registers, naming the refusing policy, or
//! `about:blank`.

#[cfg(feature = "axum")]
use axum_core::response::{IntoResponse, Response};
use http::StatusCode;
use std::fmt::Write;

use super::http::Rendered;
use crate::outcomes::refusal::{policy_name, seconds_up};
use crate::RateLimited;

/// The problem type a 429 as problem+json is of ([`ProblemJson::problem_type`]). Other
/// statuses (503, 500, 400, 401) are always `about:blank`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProblemType {
    /// `https://iana.org/assignments/http-problem-types#quota-exceeded`, titled
    /// `Quota exceeded`, with the extension member `violated-policies`: the names of
    /// the policies that refused, as the `RateLimit-Policy` field names them. The
    /// default.
    #[default]
    QuotaExceeded,
    /// `about:blank`, titled `Too Many Requests` (the status's reason phrase), without
    /// `violated-policies`.
    AboutBlank,
}

/// The registered problem type of a refusal by a quota (a rate limit's policy).
const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// A refusal as an RFC 9457 problem (`application/problem+json`), with the same
/// status and headers as [`RateLimited`]'s own response. A 429 is of the problem type
/// [`ProblemType::QuotaExceeded`] unless set otherwise ([`ProblemJson::problem_type`]):
///
/// ```json
/// {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",
///  "title":"Quota exceeded","status":429,"detail":"Too many requests; retry in 60 s",
///  "violated-policies":["login:{ip}"],"retry_after":60}
/// ```
#[derive(Debug, Clone)]
pub struct ProblemJson(pub RateLimited);

impl ProblemJson {
    /// The problem type a 429 is of (default [`ProblemType::QuotaExceeded`]).
    pub fn problem_type(self, problem_type: ProblemType) -> Self {
        ProblemJson(self.0.problem_type(problem_type))
    }
}

impl RateLimited {
    /// The problem type a 429 is of when this refusal is answered as problem+json
    /// ([`ProblemJson`], a layer's `problem_json()` responder); default
    /// [`ProblemType::QuotaExceeded`].
    pub fn problem_type(mut self, problem_type: ProblemType) -> Self {
        self.about_blank = problem_type == ProblemType::AboutBlank;
        self
    }
}

impl From<RateLimited> for ProblemJson {
    fn from(limited: RateLimited) -> Self {
        ProblemJson(limited)
    }
}

/// `text` as a JSON string, quotes included.
fn json_string(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

impl ProblemJson {
    /// The problem's body: `type`, `title`, `status`, `detail`, then for a 429
    /// `violated-policies` (of the registered type) and `retry_after` (when known).
    fn body(&self, status: StatusCode) -> String {
        let limited = &self.0;
        let quota = status == StatusCode::TOO_MANY_REQUESTS && !limited.about_blank;
        let (kind, title) = if quota {
            (QUOTA_EXCEEDED, "Quota exceeded")
        } else {
            ("about:blank", status.canonical_reason().unwrap_or("Error"))
        };
        let detail = limited.body();
        let mut body = format!(
            "{{\"type\":{},\"title\":{},\"status\":{},\"detail\":{}",
            json_string(kind),
            json_string(title),
            status.as_u16(),
            json_string(detail.trim_end())
        );
        if quota {
            body.push_str(",\"violated-policies\":[");
            if let Some(limit) = &limited.limit {
                body.push_str(&json_string(&policy_name(&limit.name)));
            }
            body.push(']');
        }
        if let (None, Some(wait)) = (&limited.cause, limited.retry_after) {
            let _ = write!(body, ",\"retry_after\":{}", seconds_up(wait));
        }
        body.push('}');
        body
    }
}

impl ProblemJson {
    /// The problem's response: the refusal's status and headers, its JSON body.
    pub(super) fn rendered(&self) -> Rendered {
        let status = self.0.status();
        self.0.rendered("application/problem+json", self.body(status))
    }
}

#[cfg(feature = "axum")]
impl IntoResponse for ProblemJson {
    fn into_response(self) -> Response {
        self.rendered().into_response()
    }
}

#[cfg(test)]
mod tests;
