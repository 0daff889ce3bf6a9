//! Refusals as gRPC statuses (cargo feature `tonic`): `RESOURCE_EXHAUSTED` with the wait
//! in `retry-after` metadata (whole seconds) and in a `google.rpc.RetryInfo` detail, and
//! the RateLimit fields of the limit that refused as metadata (as an HTTP 429 has them
//! as headers), or `UNAVAILABLE` without the cause when the backend failed under
//! `on_error = "deny"`. With `From<RateLimited> for Status`, a service method returning
//! `Result<Response<T>, Status>` can carry `#[rate_limit]`. Every such status is
//! marked as a refusal's ([`RefusalStatus`]).

use std::fmt;
use std::sync::Arc;

use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::outcomes::refusal::seconds_up;
use crate::RateLimited;

/// Marks a status made from a refusal, as its source: the limit that refused decided
/// it, so a `RateLimitLayer` around the service leaves its metadata as it is (tonic's
/// server keeps the status in the extensions of the response it makes of it).
#[cfg(feature = "tonic")]
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct RefusalStatus;

#[cfg(feature = "tonic")]
impl fmt::Display for RefusalStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("refused by a rate limit")
    }
}

#[cfg(feature = "tonic")]
impl std::error::Error for RefusalStatus {}

#[cfg(feature = "tonic")]
impl From<RateLimited> for Status {
    fn from(limited: RateLimited) -> Status {
        let mut status = status(&limited);
        status.set_source(Arc::new(RefusalStatus));
        status
    }
}

/// The RateLimit fields of the limit that refused, as an HTTP 429 carries them (and
/// the `X-RateLimit-*` ones when the refusal asks for them).
fn fields(limited: &RateLimited, metadata: &mut MetadataMap) {
    let Some(limit) = &limited.limit else {
        return;
    };
    let policy = limit.policy_field();
    let state = limit.state_field(limited.remaining, limited.retry_after);
    for (name, value) in [("ratelimit-policy", policy), ("ratelimit", state)] {
        // Structured-field strings: printable ASCII, always a valid value.
        if let Ok(value) = MetadataValue::try_from(&value) {
            metadata.insert(name, value);
        }
    }
    if limited.x_ratelimit {
        metadata.insert("x-ratelimit-limit", MetadataValue::from(limit.rate));
        metadata.insert("x-ratelimit-remaining", MetadataValue::from(limited.remaining));
        if let Some(wait) = limited.retry_after {
            metadata.insert("x-ratelimit-reset", MetadataValue::from(seconds_up(wait)));
        }
    }
}

/// The status a refusal is.
fn status(limited: &RateLimited) -> Status {
    match &limited.cause {
        None => {
            let wait = limited.retry_after;
            let mut message = limited
                .message
                .as_deref()
                .unwrap_or("rate limit exceeded")
                .to_owned();
            if let Some(wait) = wait {
                message.push_str(&format!("; retry in {} s", seconds_up(wait)));
            }
            let mut status = Status::with_error_details(
                Code::ResourceExhausted,
                message,
                ErrorDetails::with_retry_info(wait),
            );
            if let Some(wait) = wait {
                status
                    .metadata_mut()
                    .insert("retry-after", MetadataValue::from(seconds_up(wait)));
            }
            fields(limited, status.metadata_mut());
            status
        }
        Some(cause) => match &**cause {
            crate::Error::MissingKey {
                what, unauthorized, ..
            } => {
                let message = format!("this request needs {what}");
                if *unauthorized {
                    Status::unauthenticated(message)
                } else {
                    Status::invalid_argument(message)
                }
            }
            crate::Error::RepeatedKey { what, .. } => {
                Status::invalid_argument(format!("this request sends {what} more than once"))
            }
            cause if cause.is_backend_failure() || matches!(cause, crate::Error::MemoryFull { .. }) => {
                Status::unavailable("service temporarily unavailable")
            }
            _ => Status::internal("internal error"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn refusal() -> RateLimited {
        RateLimited {
            key: "rate_limit:rpc:7".to_owned(),
            retry_after: Some(Duration::from_millis(2_500)),
            message: None,
            rule: 0,
            cause: None,
            limit: None,
            x_ratelimit: false,
            about_blank: false,
            remaining: 0,
        }
    }

    #[test]
    fn a_refusal_is_resource_exhausted_with_the_wait_in_metadata_and_retry_info() {
        let status = Status::from(refusal());
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(status.metadata().get("retry-after").unwrap(), "3");
        let retry = status.get_details_retry_info().expect("a RetryInfo detail");
        assert_eq!(retry.retry_delay, Some(Duration::from_millis(2_500)));
        assert!(status.message().contains("retry in 3 s"), "{}", status.message());
    }

    #[test]
    fn a_refusal_carries_the_fields_of_its_limit_and_is_marked() {
        let mut limited = refusal();
        limited.limit = Some(Box::new(crate::outcomes::refusal::Limit {
            name: "rpc:{id}".into(),
            rate: 5,
            window: Duration::from_secs(60),
            burst: None,
        }));
        let status = Status::from(limited.clone());
        let field = |name| {
            status
                .metadata()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        assert_eq!(
            field("ratelimit-policy").as_deref(),
            Some("\"rpc:{id}\";q=5;w=60")
        );
        assert_eq!(field("ratelimit").as_deref(), Some("\"rpc:{id}\";r=0;t=3"));
        assert_eq!(field("x-ratelimit-limit"), None);
        let source = std::error::Error::source(&status).expect("a source");
        assert!(source.is::<RefusalStatus>());
        limited.x_ratelimit = true;
        let status = Status::from(limited);
        let field = |name| {
            status
                .metadata()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        assert_eq!(field("x-ratelimit-limit").as_deref(), Some("5"));
        assert_eq!(field("x-ratelimit-remaining").as_deref(), Some("0"));
        assert_eq!(field("x-ratelimit-reset").as_deref(), Some("3"));
    }

    #[test]
    fn a_backend_failure_is_unavailable_without_the_cause() {
        let mut limited = refusal();
        limited.retry_after = None;
        limited.cause = Some(Arc::new(crate::Error::Backend {
            detail: "secret detail".to_owned(),
        }));
        let status = Status::from(limited);
        assert_eq!(status.code(), Code::Unavailable);
        assert!(!status.message().contains("secret"));
        assert!(status.metadata().get("retry-after").is_none());
        let source = std::error::Error::source(&status).expect("a source");
        assert!(source.is::<RefusalStatus>(), "marked as a refusal's too");
    }

    #[test]
    fn the_in_process_bound_is_unavailable_without_the_cause() {
        let mut limited = refusal();
        limited.retry_after = None;
        limited.cause = Some(Arc::new(crate::Error::MemoryFull {
            name: "rate_limit:rpc:secret-key".to_owned(),
            max: 10,
        }));
        let status = Status::from(limited);
        assert_eq!(status.code(), Code::Unavailable);
        assert!(!status.message().contains("secret"));
    }
}
