//! Refusals as gRPC statuses (cargo feature `tonic`): `RESOURCE_EXHAUSTED` with the wait
//! in `retry-after` metadata (whole seconds) and in a `google.rpc.RetryInfo` detail, or
//! `UNAVAILABLE` without the cause when the backend failed under `on_error = "deny"`.
//! With `From<RateLimited> for Status`, a service method returning
//! `Result<Response<T>, Status>` can carry `#[rate_limit]`.

use tonic::metadata::MetadataValue;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::outcomes::refusal::seconds_up;
use crate::RateLimited;

#[cfg(feature = "tonic")]
impl From<RateLimited> for Status {
    fn from(limited: RateLimited) -> Status {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
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
