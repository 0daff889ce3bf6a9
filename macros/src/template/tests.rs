//! The template grammar and its checks, on chosen and on random templates.

use super::*;
use crate::test_rng::XorShift;

#[test]
fn values_fill_whole_segments_after_a_literal_one() {
    let ok = |t: &str| check_segments(&parse(t).unwrap());
    for good in [
        "order",
        "order:{user_id}",
        "order:{a}:{b.c}:x",
        "{{tenant:{tenant.id}}}:search:{query}",
        "search:{{{tenant}}}",
        "redlimitx:{a}",
        "x:redlimits:{a}",
        "x:redlimit-y:{a}",
        "x:{{redlimit}}:{a}",
    ] {
        assert_eq!(ok(good), Ok(()), "{good}");
    }
    for (bad, says) in [
        ("{tenant}:{user}", "starts with the value `{tenant}`"),
        ("{api_key}", "starts with the value"),
        (":{a}", "starts with the value"),
        ("{{{t}}}:search", "starts with the value"),
        ("user-{id}", "`{id}` shares a segment"),
        ("v{n}:x", "`{n}` shares a segment"),
        ("a:{x}{y}", "`{x}` shares a segment"),
        ("a:{x}.json", "`{x}` shares a segment"),
        ("redlimit", "may not start with `redlimit`"),
        ("redlimit:overrides", "may not start with `redlimit`"),
        ("redlimit:{x}", "may not start with `redlimit`"),
        (
            "x:redlimit:{a}",
            "may not hold `redlimit` before a `:` or at its end",
        ),
        (
            "orders:redlimit",
            "may not hold `redlimit` before a `:` or at its end",
        ),
        (
            "ordersredlimit:{a}",
            "may not hold `redlimit` before a `:` or at its end",
        ),
        (
            "x:{a}:redlimit",
            "may not hold `redlimit` before a `:` or at its end",
        ),
    ] {
        let error = ok(bad).unwrap_err();
        assert!(error.contains(says), "{bad}: {error}");
    }
}

fn text(s: &str) -> Piece {
    Piece::Text(s.into())
}

fn value(path: &[&str]) -> Piece {
    Piece::Value(path.iter().map(|s| s.to_string()).collect())
}

#[test]
fn pieces() {
    assert_eq!(
        parse("order:{user_id}"),
        Ok(vec![text("order:"), value(&["user_id"])])
    );
    assert_eq!(
        parse("{{tenant:{t.id}}}:x{p.0}"),
        Ok(vec![
            text("{tenant:"),
            value(&["t", "id"]),
            text("}:x"),
            value(&["p", "0"])
        ])
    );
    assert_eq!(parse("é{ü}"), Ok(vec![text("é"), value(&["ü"])]));
    assert_eq!(parse(""), Ok(vec![]));
}

#[test]
fn rejected_with_a_reason() {
    for (input, says) in [
        ("a{b", "unclosed"),
        ("a}b", "unmatched `}`"),
        ("a{}", "empty `{}`"),
        ("a{ }", "empty `{}`"),
        ("{a b}", "not a parameter"),
        ("{a.}", "not a parameter"),
        ("{0}", "not a parameter"),
        ("{a..b}", "not a parameter"),
    ] {
        let err = parse(input).unwrap_err();
        assert!(err.contains(says), "{input:?}: {err}");
    }
}

#[test]
fn the_request_is_named_where_no_parameter_is() {
    let none: Vec<String> = vec!["user".to_owned()];
    assert_eq!(
        checked("llm:ip:{request.client_ip}", &none),
        Ok(vec![text("llm:ip:"), Piece::Request(RequestPart::ClientIp)])
    );
    assert_eq!(
        checked("llm:user:{request.identity}", &none),
        Ok(vec![text("llm:user:"), Piece::Request(RequestPart::Identity)])
    );
    for (bad, says) in [
        ("a:{request}", "has `{request.client_ip}`"),
        ("a:{request.ip}", "`{request.ip}` in the key"),
        ("a:{request.identity.x}", "`{request.identity.x}`"),
        (
            "{request.identity}:a",
            "starts with the value `{request.identity}`",
        ),
        ("a:x{request.identity}", "`{request.identity}` shares a segment"),
        ("redlimit:{request.identity}", "may not start with `redlimit`"),
    ] {
        let error = checked(bad, &none).unwrap_err();
        assert!(error.contains(says), "{bad}: {error}");
    }
    // A parameter named `request` is the parameter, fields and all.
    let param = vec!["request".to_owned()];
    assert_eq!(
        checked("a:{request.identity}", &param),
        Ok(vec![text("a:"), value(&["request", "identity"])])
    );
    assert_eq!(
        checked("a:{request.ip}", &param),
        Ok(vec![text("a:"), value(&["request", "ip"])])
    );
}

#[test]
fn placeholders_name_parameters() {
    let params = vec!["user".to_owned(), "self".to_owned()];
    assert!(check_params(&parse("{user.id}:{self.tenant}").unwrap(), &params).is_ok());
    let err = check_params(&parse("{usr}").unwrap(), &params).unwrap_err();
    assert!(err.contains("`{usr}`") && err.contains("`user`, `self`"), "{err}");
}

#[test]
fn slots() {
    assert!(check_slot(&parse("order:{id}").unwrap()).is_ok());
    assert!(check_slot(&parse("{{t:{id}}}:orders").unwrap()).is_ok());
    for bad in ["a{{b", "a}}b", "{{}}x"] {
        assert!(check_slot(&parse(bad).unwrap()).is_err(), "{bad}");
    }
}

/// The part of `key` Redis Cluster hashes: the first `{...}` when non-empty, else
/// the whole key (the specification's rule, written independently of check_slot).
fn hashed(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        if let Some(len) = key[open + 1..].find('}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// What check_params and check_slot must answer for `pieces`: params exactly when
/// every placeholder names a parameter; slot exactly when the config key and the
/// value key (`{NAME}:value`, or `NAME:value` when NAME has a `{`) hash alike, with
/// the default prefix and a value standing in for each placeholder.
fn checks_agree(pieces: &[Piece], params: &[String], input: &str) {
    let named = pieces.iter().all(|piece| match piece {
        Piece::Value(path) => params.contains(&path[0]),
        Piece::Text(_) | Piece::Request(_) => true,
    });
    match check_params(pieces, params) {
        Ok(()) => assert!(named, "{input:?}"),
        Err(message) => assert!(!named && !message.is_empty(), "{input:?}"),
    }
    let name: String = std::iter::once("rate_limit:".to_owned())
        .chain(pieces.iter().map(|piece| match piece {
            Piece::Text(text) => text.clone(),
            Piece::Value(_) | Piece::Request(_) => "v".to_owned(),
        }))
        .collect();
    let value_key = if name.contains('{') {
        format!("{name}:value")
    } else {
        format!("{{{name}}}:value")
    };
    let one_slot = hashed(&name) == hashed(&value_key);
    assert_eq!(
        check_slot(pieces).is_ok(),
        one_slot,
        "{input:?}: {name} / {value_key}"
    );
}

#[test]
fn no_input_panics() {
    let alphabet = ["", "{", "}", "a", ".", "0", ":", "é", " ", "_"];
    let params = vec!["a".to_owned()];
    for a in alphabet {
        for b in alphabet {
            for c in alphabet {
                for d in alphabet {
                    for e in alphabet {
                        let input = format!("{a}{b}{c}{d}{e}");
                        if let Ok(pieces) = parse(&input) {
                            checks_agree(&pieces, &params, &input);
                        } else {
                            assert!(!parse(&input).unwrap_err().is_empty());
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn random_templates_never_panic_and_round_trip() {
    let alphabet: Vec<char> = "{}{}{}ab_.0:%é🦀 \u{0}x".chars().collect();
    let params = vec!["a".to_owned(), "b".to_owned()];
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    for _ in 0..100_000 {
        let len = rng.below(16);
        let text: String = (0..len).map(|_| alphabet[rng.below(alphabet.len())]).collect();
        match parse(&text) {
            Ok(pieces) => {
                // Writing the pieces back as a template gives the same pieces.
                let rebuilt: String = pieces
                    .iter()
                    .map(|piece| match piece {
                        Piece::Text(t) => t.replace('{', "{{").replace('}', "}}"),
                        value => format!("{{{}}}", value.value_name().unwrap_or_default()),
                    })
                    .collect();
                assert_eq!(parse(&rebuilt).as_ref(), Ok(&pieces), "{text:?}");
                checks_agree(&pieces, &params, &text);
            }
            Err(message) => assert!(message.len() > 10, "{text:?}: {message}"),
        }
    }
}
