//! Problem bodies: the registered type with the refusing policy, `about:blank` as an
//! option and for every other status, one JSON document whatever a name or message
//! holds.

use super::*;
use crate::outcomes::refusal::Limit;
use std::sync::Arc;
use std::time::Duration;

fn refusal(name: &str) -> RateLimited {
    RateLimited {
        key: "rate_limit:login:198.51.100.7".to_owned(),
        retry_after: Some(Duration::from_millis(1_001)),
        message: None,
        rule: 0,
        cause: None,
        limit: Some(Box::new(Limit {
            name: name.to_owned().into(),
            rate: 5,
            window: Duration::from_secs(60),
            burst: None,
        })),
        x_ratelimit: false,
        about_blank: false,
        remaining: 0,
    }
}

fn body(problem: &ProblemJson) -> String {
    problem.body(problem.0.status())
}

#[test]
fn a_429_is_of_the_registered_type_naming_the_refusing_policy() {
    let body = body(&ProblemJson(refusal("login:{ip}")));
    assert_eq!(
        body,
        "{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\",\
         \"title\":\"Quota exceeded\",\"status\":429,\"detail\":\"Too many requests; retry in 2 s\",\
         \"violated-policies\":[\"login:{ip}\"],\"retry_after\":2}"
    );
    let response = ProblemJson(refusal("login:{ip}")).into_response();
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["content-type"], "application/problem+json");
    assert_eq!(response.headers()["ratelimit-policy"], "\"login:{ip}\";q=5;w=60");
}

#[test]
fn about_blank_is_the_problem_as_it_was() {
    let problem = ProblemJson(refusal("login:{ip}")).problem_type(ProblemType::AboutBlank);
    assert_eq!(
        body(&problem),
        "{\"type\":\"about:blank\",\"title\":\"Too Many Requests\",\"status\":429,\
         \"detail\":\"Too many requests; retry in 2 s\",\"retry_after\":2}"
    );
    let back = problem.problem_type(ProblemType::QuotaExceeded);
    assert!(body(&back).contains("\"violated-policies\""));
}

#[test]
fn other_statuses_stay_about_blank() {
    let mut limited = refusal("login:{ip}");
    limited.retry_after = None;
    limited.cause = Some(Arc::new(crate::Error::Backend {
        detail: "secret detail".to_owned(),
    }));
    let problem = ProblemJson(limited);
    let body = body(&problem);
    assert_eq!(
        body,
        "{\"type\":\"about:blank\",\"title\":\"Service Unavailable\",\"status\":503,\
         \"detail\":\"Service temporarily unavailable\"}"
    );
    let response = problem.into_response();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["content-type"], "application/problem+json");
    assert!(response
        .extensions()
        .get::<super::super::http::RefusalResponse>()
        .is_some());
}

/// A name with quotes, backslashes, commas, control characters and non-ASCII stays
/// one JSON string in `violated-policies`, the name the header's structured-field
/// string says once unescaped.
#[test]
fn a_hostile_name_is_one_string_in_the_body_and_in_the_header() {
    let name = "a \"quoted\", back\\slash\n\t\u{0}\u{7f} é 🦀";
    let problem = ProblemJson(refusal(name));
    let read: serde_json::Value = serde_json::from_str(&body(&problem)).unwrap();
    let policies = read["violated-policies"].as_array().unwrap();
    assert_eq!(policies.len(), 1, "{read}");
    let said = policies[0].as_str().unwrap();
    assert_eq!(said, "a \"quoted\", back\\slash____ _ _");
    let response = problem.into_response();
    let field = response.headers()["ratelimit-policy"].to_str().unwrap();
    let sf = crate::outcomes::refusal::sf_string(name);
    assert_eq!(field, format!("{sf};q=5;w=60"));
    let unescaped = sf[1..sf.len() - 1].replace("\\\"", "\"").replace("\\\\", "\\");
    assert_eq!(unescaped, said);
}

#[test]
fn a_problem_body_is_json_whatever_its_message_holds() {
    let message = "a \"quoted\" \\ back\\slash,\n a tab\t, \u{0}\u{1f}\u{7f} é 🦀 </script>";
    let body = json_string(message);
    let read: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(read, message, "{body}");
    assert_eq!(json_string("Too Many Requests"), "\"Too Many Requests\"");
}
