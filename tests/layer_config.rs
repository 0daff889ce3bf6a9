//! Layer rules from configuration (cargo features `axum` and `serde`): the example's
//! TOML file served on a real axum server on loopback, and files a layer must refuse,
//! each refused with an error that names the rule and the field.
#![cfg(all(feature = "axum", feature = "serde"))]

use redlimit_test_support as support;

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use redlimit::axum::TrustedProxies;
use redlimit::tower::{LayerConfig, LayerRule};
use redlimit::Client;
use support::http::{send, serve};

/// The rules of `examples/layer_from_toml.rs`, as it reads them.
fn example_config() -> LayerConfig {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/layer_rules.toml")).unwrap();
    toml::from_str(&text).unwrap()
}

fn call<'a>(ip: &'a str, key: &'a str) -> [(&'static str, &'a str); 2] {
    [("x-forwarded-for", ip), ("x-api-key", key)]
}

#[tokio::test]
async fn the_examples_toml_file_limits_as_written() {
    let config = example_config();
    let mut names: Vec<&str> = config.rules().iter().map(LayerRule::name).collect();
    // (toml gives a table's keys by name, unless its `preserve_order` is on)
    names.sort_unstable();
    assert_eq!(names, ["api", "login"]);
    let client = Client::memory();
    let layer = config
        .builder()
        .client(client.clone())
        .trusted_proxies(TrustedProxies::new(["127.0.0.1"]).unwrap())
        .build()
        .unwrap();
    let addr = serve(Router::new().route("/", get(|| async { "hello" })).layer(layer)).await;

    // missing_key = "unauthorized"
    let keyless = send(addr, "GET", "/", &[("x-forwarded-for", "198.51.100.1")]).await;
    assert_eq!(keyless.status, 401);
    assert_eq!(keyless.body, "This request needs the x-api-key header\n");

    // login: 5 per minute per client address, with the file's message;
    // x_ratelimit_headers = true.
    for left in (0..5).rev() {
        let reply = send(addr, "GET", "/", &call("198.51.100.1", "k1")).await;
        assert_eq!(reply.status, 200);
        if left < 5 {
            assert!(reply.header("x-ratelimit-remaining").is_some(), "{reply:?}");
        }
    }
    let refused = send(addr, "GET", "/", &call("198.51.100.1", "k1")).await;
    assert_eq!(refused.status, 429);
    assert!(
        refused.body.starts_with("Too many login attempts; retry in "),
        "{}",
        refused.body
    );
    assert_eq!(refused.header("x-ratelimit-limit"), Some("5"));

    // api: 20 per minute per key, the exempt key taking nothing.
    for i in 0..20 {
        let ip = format!("198.51.100.{}", 10 + i / 5);
        assert_eq!(send(addr, "GET", "/", &call(&ip, "k2")).await.status, 200, "{i}");
    }
    assert_eq!(
        send(addr, "GET", "/", &call("198.51.100.50", "k2")).await.status,
        429
    );
    assert_eq!(
        send(addr, "GET", "/", &call("198.51.100.51", "internal-monitoring"))
            .await
            .status,
        200
    );
    assert_eq!(
        client
            .rate_limiter("rate_limit:api:k2")
            .available_permits()
            .await
            .unwrap(),
        0
    );
}

#[test]
fn layer_settings_from_the_file() {
    let config: LayerConfig = toml::from_str(
        r#"
        timeout = "250ms"
        success_fields = false
        [rules.a]
        rate = 1
        interval = "1m30s"
        algorithm = "token_bucket"
        burst = 3
        warmup = "10s"
        mode = "per_client"
        on_error = "deny"
        shadow = true
        key = { header = "x-api-key" }
        "#,
    )
    .unwrap();
    let rule = format!("{:?}", config.rules()[0]);
    for part in [
        "rate: 1",
        "interval: 90s",
        "TokenBucket",
        "burst: Some(3)",
        "warmup: Some(10s)",
        "PerClient",
        "Deny",
        "shadow: true",
        "Key::header(\"x-api-key\")",
    ] {
        assert!(rule.contains(part), "{part} in {rule}");
    }
    config.builder().build().unwrap();
}

/// `problem_type` from the file: a 429 answered as problem+json is of the type it
/// names (the registered quota-exceeded type without it); an unknown value, or one
/// that is not a string, is refused naming the field and the accepted values.
#[tokio::test]
async fn the_problem_type_from_the_file() {
    let quota = "https://iana.org/assignments/http-problem-types#quota-exceeded";
    for (setting, expected) in [
        ("", quota),
        ("problem_type = \"quota_exceeded\"", quota),
        ("problem_type = \"about_blank\"", "about:blank"),
    ] {
        let text = format!("{setting}\n[rules.a]\nrate = 1\ninterval = \"1m\"\n");
        let config: LayerConfig = toml::from_str(&text).unwrap();
        let layer = config.builder().client(Client::memory()).build().unwrap();
        let app = Router::new().route("/", get(|| async { "hello" }));
        let addr = serve(app.layer(layer.problem_json())).await;
        assert_eq!(send(addr, "GET", "/", &[]).await.status, 200);
        let refused = send(addr, "GET", "/", &[]).await;
        assert_eq!(refused.status, 429);
        let body: serde_json::Value = serde_json::from_str(&refused.body).unwrap();
        assert_eq!(body["type"], expected, "{setting:?}: {body}");
    }
    let rule = "[rules.a]\nrate = 1\ninterval = \"1m\"\n";
    let unknown = refused(&format!("problem_type = \"teapot\"\n{rule}"));
    assert!(
        unknown
            .contains("field `problem_type`: unknown problem type \"teapot\"; accepted: \"quota_exceeded\"")
            && unknown.contains("\"about_blank\""),
        "{unknown}"
    );
    let number = refused(&format!("problem_type = 3\n{rule}"));
    assert!(number.contains("field `problem_type`: invalid type"), "{number}");
}

/// `toml::from_str`'s error text for `text`.
fn refused(text: &str) -> String {
    match toml::from_str::<LayerConfig>(text) {
        Ok(config) => panic!("accepted: {config:?}"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn attack_files_a_layer_must_refuse_name_the_rule_and_the_field() {
    let rule = |name: &str, body: &str| format!("[rules.{name}]\n{body}\n");
    let cases: Vec<(String, &[&str])> = vec![
        // Huge rates: above what Redis counts exactly, beyond u64, a float.
        (
            rule("big", "rate = 9007199254740993\ninterval = \"1s\""),
            &["rule `big`", "rate is above 2^53"],
        ),
        (
            rule("huge", "rate = 99999999999999999999\ninterval = \"1s\""),
            &["rate"],
        ),
        (
            rule("float", "rate = 1e30\ninterval = \"1s\""),
            &["rule `float`", "field `rate`"],
        ),
        (
            rule("neg", "rate = -1\ninterval = \"1s\""),
            &["rule `neg`", "field `rate`"],
        ),
        (
            rule("zero", "rate = 0\ninterval = \"1s\""),
            &["rule `zero`", "rate is 0"],
        ),
        // Zero, unitless, negative and enormous intervals.
        (
            rule("z", "rate = 1\ninterval = \"0s\""),
            &[
                "rule `z`",
                "field `interval`",
                "is zero; it must be at least 1 ms",
            ],
        ),
        (
            rule("z", "rate = 1\ninterval = \"0ms\""),
            &[
                "rule `z`",
                "field `interval`",
                "is zero; it must be at least 1 ms",
            ],
        ),
        (
            rule("u", "rate = 1\ninterval = \"60\""),
            &["rule `u`", "field `interval`", "unit"],
        ),
        (
            rule("n", "rate = 1\ninterval = 60"),
            &["rule `n`", "field `interval`"],
        ),
        (
            rule("m", "rate = 1\ninterval = \"-1s\""),
            &["rule `m`", "field `interval`"],
        ),
        (
            rule("e", "rate = 1\ninterval = \"999999999999d\""),
            &["rule `e`", "field `interval`", "2^53 ms"],
        ),
        // The attribute's grammar: each unit once, largest first.
        (
            rule("o", "rate = 1\ninterval = \"30s1m\""),
            &["rule `o`", "field `interval`", "largest first"],
        ),
        // The library's own segment, as the name or its first segment.
        (
            rule("redlimit", "rate = 1\ninterval = \"1s\""),
            &["rule `redlimit`", "may not start with `redlimit`"],
        ),
        (
            rule("\"redlimit:overrides\"", "rate = 1\ninterval = \"1s\""),
            &["rule `redlimit:overrides`", "may not start with `redlimit`"],
        ),
        (rule("\"\"", "rate = 1\ninterval = \"1s\""), &["name is empty"]),
        // Names whose limiters' keys would split across cluster slots: every request
        // would be refused, so the file is.
        (
            rule("\"a{b\"", "rate = 1\ninterval = \"1s\""),
            &["rule `a{b`", "field `name`", "never closed"],
        ),
        (
            rule("\"{}\"", "rate = 1\ninterval = \"1s\""),
            &["rule `{}`", "field `name`", "empty `{}` tag"],
        ),
        (
            rule("\"a}b\"", "rate = 1\ninterval = \"1s\""),
            &["rule `a}b`", "field `name`", "no `{`"],
        ),
        // Permits a grant's 4-byte log field cannot hold, under a rate that would allow
        // them, for either algorithm.
        (
            rule("p", "rate = 9007199254740992\ninterval = \"1s\"\npermits = 4294967296"),
            &["rule `p`", "permits = 4294967296", "at most 4294967295"],
        ),
        (
            rule(
                "t",
                "rate = 9007199254740992\ninterval = \"1ms\"\npermits = 4294967296\nalgorithm = \"token_bucket\"",
            ),
            &["rule `t`", "permits = 4294967296", "at most 4294967295"],
        ),
        // Fields: unknown, misspelt, missing, of the wrong kind, out of place.
        (
            rule("a", "rate = 1\ninterval = \"1s\"\nratee = 2"),
            &["rule `a`", "field `ratee`", "unknown"],
        ),
        (
            rule("a", "interval = \"1s\""),
            &["rule `a`", "field `rate` is missing"],
        ),
        (
            rule("a", "rate = 1"),
            &["rule `a`", "field `interval` is missing"],
        ),
        (
            rule("a", "rate = 1\ninterval = \"1s\"\nkey = \"ip\""),
            &["rule `a`", "field `key`"],
        ),
        (
            rule(
                "a",
                "rate = 1\ninterval = \"1s\"\nkey = { header = \"bad header\" }",
            ),
            &["rule `a`", "not a header name"],
        ),
        (
            rule("a", "rate = 1\ninterval = \"1s\"\nmissing_key = \"unauthorized\""),
            &["rule `a`", "missing_key"],
        ),
        (
            rule("a", "rate = 1\ninterval = \"1s\"\nmissing_key = \"ignore\""),
            &["rule `a`", "field `missing_key`"],
        ),
        (
            rule("a", "rate = 1\ninterval = \"1s\"\nburst = 5"),
            &["rule `a`", "burst"],
        ),
        (
            rule("a", "rate = 1\ninterval = \"1s\"\npermits = 2"),
            &["rule `a`", "permits = 2"],
        ),
        (
            rule("a", "rate = 1\ninterval = \"1s\"\nexempt = [\"\"]"),
            &["rule `a`", "empty exempt"],
        ),
        (
            rule("a", "rate = 1\ninterval = \"1s\"\nname = \"b\""),
            &["rule `a`", "field `name`"],
        ),
        // Rule names given twice: TOML itself refuses a table defined twice.
        (
            format!(
                "{}{}",
                rule("a", "rate = 1\ninterval = \"1s\""),
                rule("a", "rate = 2\ninterval = \"1s\"")
            ),
            &["a"],
        ),
        // Rules are a table by name, not a list.
        (
            "[[rules]]\nname = \"a\"\nrate = 1\ninterval = \"1s\"".to_owned(),
            &["a table of rules by name"],
        ),
        // A layer needs a rule; settings are checked too.
        ("rules = {}".to_owned(), &["`rules` is empty"]),
        ("timeout = \"1s\"".to_owned(), &["rules"]),
        (
            format!("timeout = \"soon\"\n{}", rule("a", "rate = 1\ninterval = \"1s\"")),
            &["field `timeout`"],
        ),
        (
            format!("x_ratelimit = true\n{}", rule("a", "rate = 1\ninterval = \"1s\"")),
            &["x_ratelimit"],
        ),
    ];
    for (text, expected) in &cases {
        let error = refused(text);
        if std::env::var_os("SHOW_ERRORS").is_some() {
            eprintln!("{text}\n=> {error}\n");
        }
        for part in *expected {
            assert!(error.contains(part), "{text:?}: `{part}` not in: {error}");
        }
    }
}

/// What TOML cannot say (a rule named twice) JSON can: refused too.
#[test]
fn attack_a_rule_named_twice_in_json_is_refused() {
    let json = r#"{"rules": {"a": {"rate": 1, "interval": "1s"}, "a": {"rate": 1000, "interval": "1s"}}}"#;
    let error = serde_json::from_str::<LayerConfig>(json).unwrap_err().to_string();
    assert!(error.contains("rule `a`: defined twice"), "{error}");
    let json = r#"{"rules": {"a": {"rate": 1, "interval": "1s", "rate": 1000}}}"#;
    let error = serde_json::from_str::<LayerConfig>(json).unwrap_err().to_string();
    assert!(error.contains("rule `a`: field `rate`: given twice"), "{error}");
}

/// A key whose values are secrets, from the file: written as their digest.
#[test]
fn secret_keys_from_the_file() {
    let config: LayerConfig = toml::from_str(
        r#"
        [rules.api]
        rate = 1
        interval = "1m"
        key = { secret_header = "authorization" }
        [rules.user]
        rate = 1
        interval = "1m"
        key = { secret_path_param = "token" }
        "#,
    )
    .unwrap();
    let rules: Vec<String> = config.rules().iter().map(|r| format!("{r:?}")).collect();
    assert!(
        rules[0].contains("Key::header(\"authorization\").secret()"),
        "{}",
        rules[0]
    );
    assert!(
        rules[1].contains("Key::path_param(\"token\").secret()"),
        "{}",
        rules[1]
    );
    config.builder().build().unwrap();
}

/// One rule on its own, its name among its fields.
#[test]
fn one_rule_with_its_name() {
    let rule: LayerRule = toml::from_str("name = \"solo\"\nrate = 3\ninterval = \"2s\"").unwrap();
    assert_eq!(rule.name(), "solo");
    assert!(format!("{rule:?}").contains(&format!("{:?}", Duration::from_secs(2))));
    let error = toml::from_str::<LayerRule>("rate = 3\ninterval = \"2s\"")
        .unwrap_err()
        .to_string();
    assert!(error.contains("field `name` is missing"), "{error}");
}

/// The error docs/guide/layer.md shows.
#[test]
fn the_readmes_error() {
    let text = "[rules.api]\nrate = 20\ninterval = \"60\"\nkey = { header = \"x-api-key\" }\n";
    let error = refused(text);
    let line = "rule `api`: field `interval`: `60` needs a unit after `60`: ms, s, m, h or d, e.g. \"60s\"";
    assert!(error.lines().any(|l| l == line), "{error}");
}

/// A duration written as a bare number (`interval = 60`, as a rate is written) is
/// refused saying it needs its unit, as text, for each duration field and for a
/// layer's `timeout`; where serde's own message said only "invalid type".
#[test]
fn a_duration_written_as_a_number_is_told_its_unit() {
    for (field, number) in [("interval", "60"), ("warmup", "30"), ("batch_lease", "0.5")] {
        let mut text = "[rules.api]\nrate = 20\ninterval = \"60s\"\n".to_owned();
        text = if field == "interval" {
            text.replace("\"60s\"", number)
        } else {
            format!("{text}{field} = {number}\n")
        };
        let error = refused(&text);
        let line = format!(
            "rule `api`: field `{field}`: `{number}` is a number without a unit; write the \
             duration as text with its unit: ms, s, m, h or d, e.g. \"{number}s\""
        );
        assert!(error.lines().any(|l| l == line), "{field}: {error}");
    }
    let error = refused("timeout = 2\n[rules.api]\nrate = 20\ninterval = \"60s\"\n");
    assert!(
        error.contains("field `timeout`: `2` is a number without a unit"),
        "{error}"
    );
}

/// A batch from the file, and each misuse of it refused naming the rule and what is
/// accepted.
#[test]
fn batch_from_the_file_and_its_misuse_refused() {
    let config: LayerConfig =
        toml::from_str("[rules.hot]\nrate = 1000\ninterval = \"1s\"\nbatch = 10\nbatch_lease = \"50ms\"\n")
            .unwrap();
    let rule = format!("{:?}", config.rules()[0]);
    for part in ["batch: 10", "batch_lease: Some(50ms)"] {
        assert!(rule.contains(part), "{part} in {rule}");
    }
    config.builder().build().unwrap();
    let rule = |body: &str| format!("[rules.hot]\nrate = 10\ninterval = \"1s\"\n{body}\n");
    let cases: [(String, &[&str]); 8] = [
        (rule("batch = 11"), &["rule `hot`", "batch exceeds the rate"]),
        (
            rule("batch = 18446744073709551615"),
            &["rule `hot`", "batch exceeds the rate"],
        ),
        (rule("batch = 0"), &["rule `hot`", "batch must be at least 1"]),
        (rule("batch = -1"), &["rule `hot`", "field `batch`"]),
        (rule("batch = 2.5"), &["rule `hot`", "field `batch`"]),
        (
            rule("batch = 2\nalgorithm = \"token_bucket\""),
            &["rule `hot`", "sliding window"],
        ),
        (
            rule("batch = 2\nbatch_lease = \"1s\""),
            &["rule `hot`", "shorter than the interval"],
        ),
        (
            rule("batch_lease = \"100ms\""),
            &["rule `hot`", "set batch above 1"],
        ),
    ];
    for (text, expected) in &cases {
        let error = refused(text);
        for part in *expected {
            assert!(error.contains(part), "{text:?}: `{part}` not in: {error}");
        }
    }
}

/// A settled rule from the file, and each misuse of it refused naming the rule and
/// what is accepted.
#[test]
fn settle_from_the_file_and_its_misuse_refused() {
    let text = "[rules.tokens]\nrate = 100000\ninterval = \"1m\"\npermits = 2000\n\
                settle = { header = \"x-tokens-used\" }\nmax_overdraft = 8000\n\
                [rules.streamed]\nrate = 1000\ninterval = \"1m\"\nsettle = \"usage\"\n";
    let config: LayerConfig = toml::from_str(text).unwrap();
    let rules: Vec<String> = config.rules().iter().map(|rule| format!("{rule:?}")).collect();
    let both = rules.join("\n");
    for part in [
        "Header(\"x-tokens-used\")",
        "max_overdraft: Some(8000)",
        "settle: Some(Settle(Usage))",
    ] {
        assert!(both.contains(part), "{part} in {both}");
    }
    config.builder().build().unwrap();
    let rule = |body: &str| format!("[rules.hot]\nrate = 10\ninterval = \"1s\"\n{body}\n");
    let cases: [(String, &[&str]); 6] = [
        (
            rule("max_overdraft = 5"),
            &["rule `hot`", "max_overdraft caps", "settle"],
        ),
        (
            rule("settle = { header = \"not a header\" }"),
            &["rule `hot`", "`not a header` is not a header name"],
        ),
        (
            rule("settle = \"body\""),
            &["rule `hot`", "field `settle`", "header", "usage"],
        ),
        (
            rule("settle = { cookie = \"x\" }"),
            &["rule `hot`", "field `settle`"],
        ),
        (
            rule("settle = \"usage\"\nbatch = 2"),
            &["rule `hot`", "batch = 2 with settle"],
        ),
        (
            rule("settle = \"usage\"\nmax_overdraft = -1"),
            &["rule `hot`", "field `max_overdraft`"],
        ),
    ];
    for (text, parts) in cases {
        let error = refused(&text);
        for part in parts {
            assert!(error.contains(part), "{part:?} not in: {error}\n(for {text})");
        }
    }
}
