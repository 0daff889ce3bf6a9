//! Key templates: text with `{param}` / `{param.field}` placeholders; `{{` and `}}`
//! are literal braces.

use redlimit_syntax::hash_tag::{self, Split};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Text as written (with `{{`/`}}` already turned into single braces).
    Text(String),
    /// A parameter and a path of fields: `user.id` is `["user", "id"]`.
    Value(Vec<String>),
}

fn is_ident(segment: &str) -> bool {
    let mut chars = segment.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
        && segment != "_"
}

fn is_index(segment: &str) -> bool {
    !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit())
}

/// Splits a template into pieces, or says what is wrong with it.
pub fn parse(text: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut literal = String::new();
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            '{' if chars.peek().map(|&(_, c)| c) == Some('{') => {
                chars.next();
                literal.push('{');
            }
            '}' if chars.peek().map(|&(_, c)| c) == Some('}') => {
                chars.next();
                literal.push('}');
            }
            '}' => {
                return Err(format!(
                    "unmatched `}}` at byte {at} of the key; write `}}}}` for a literal brace"
                ))
            }
            '{' => {
                let (path, inner_chars) = placeholder(text, at)?;
                if !literal.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut literal)));
                }
                pieces.push(Piece::Value(path));
                for _ in 0..inner_chars + 1 {
                    chars.next();
                }
            }
            c => literal.push(c),
        }
    }
    if !literal.is_empty() {
        pieces.push(Piece::Text(literal));
    }
    Ok(pieces)
}

/// A key template split into pieces and checked: its placeholders name `params`, its
/// braces keep one cluster slot, its values fill whole segments. The first problem
/// found, in that order, is the one reported.
pub fn checked(text: &str, params: &[String]) -> Result<Vec<Piece>, String> {
    let pieces = parse(text)?;
    check_params(&pieces, params)?;
    check_slot(&pieces)?;
    check_segments(&pieces)?;
    Ok(pieces)
}

/// The placeholder opened by the `{` at byte `at` of `text`: its path, and how many
/// characters lie between its braces.
fn placeholder(text: &str, at: usize) -> Result<(Vec<String>, usize), String> {
    let rest = &text[at + 1..];
    let Some(close) = rest.find('}') else {
        return Err(format!(
            "unclosed `{{` at byte {at} of the key; close it with `}}`, or write `{{{{` for a literal brace"
        ));
    };
    let inner = &rest[..close];
    if inner.trim().is_empty() {
        return Err("empty `{}` in the key; name a parameter inside, e.g. `{user_id}`".into());
    }
    let segments: Vec<&str> = inner.split('.').collect();
    let valid = is_ident(segments[0]) && segments[1..].iter().all(|s| is_ident(s) || is_index(s));
    if !valid {
        return Err(format!(
            "`{{{inner}}}` in the key is not a parameter or a field path; \
             write `{{param}}` or `{{param.field}}`"
        ));
    }
    let path = segments.iter().map(|s| s.to_string()).collect();
    Ok((path, inner.chars().count()))
}

/// Every placeholder must start with one of `params`.
pub fn check_params(pieces: &[Piece], params: &[String]) -> Result<(), String> {
    for piece in pieces {
        if let Piece::Value(path) = piece {
            if !params.contains(&path[0]) {
                let listed = if params.is_empty() {
                    "the function's parameters bind no names".to_owned()
                } else {
                    format!(
                        "the names the function's parameters bind are: {}",
                        params
                            .iter()
                            .map(|p| format!("`{p}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                return Err(format!(
                    "unknown placeholder `{{{}}}` in the key; {listed}",
                    path.join(".")
                ));
            }
        }
    }
    Ok(())
}

/// What ends a segment of a limiter name: interpolated values never contain these
/// (they are escaped), so a value fills exactly the segment it is written into.
const SEPARATORS: [char; 3] = [':', '{', '}'];

/// The first segment of every key the library keeps for itself (`<prefix>redlimit:...`).
pub const RESERVED: &str = "redlimit";

/// A key's values must each fill a whole segment, after a literal one, so that no value
/// can write another rule's literal text: every placeholder sits between separators
/// (`:`, or the braces of a hash tag) or at the end, the key starts with literal text,
/// and that text does not start with the library's own segment.
pub fn check_segments(pieces: &[Piece]) -> Result<(), String> {
    check_first_segment(pieces)?;
    check_whole_segments(pieces)
}

/// What a key's segment rules are shown with.
const SEGMENTS_EXAMPLE: &str =
    "write the key as literal segments and whole-segment values, e.g. \"order:{user_id}\" or \
                                \"{{tenant:{tenant.id}}}:search\"";

/// The key starts with literal text, and not with the library's own segment.
fn check_first_segment(pieces: &[Piece]) -> Result<(), String> {
    match pieces.first() {
        Some(Piece::Text(text)) if text.chars().any(|c| !SEPARATORS.contains(&c)) => {
            let starts_reserved = text
                .strip_prefix(RESERVED)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(SEPARATORS));
            if starts_reserved {
                return Err(format!(
                    "a key may not start with `{RESERVED}`: the library keeps its own keys (run-time overrides, \
                     refusal reports) under that segment; choose another first segment"
                ));
            }
            Ok(())
        }
        None => Ok(()),
        Some(Piece::Text(_)) | Some(Piece::Value(_)) => {
            let value = pieces.iter().find_map(|p| match p {
                Piece::Value(path) => Some(path.join(".")),
                Piece::Text(_) => None,
            });
            Err(format!(
                "the key starts with the value `{{{}}}`: a key must start with literal text of its own, so that \
                 no value can choose which rule's limiters it reaches; {SEGMENTS_EXAMPLE}",
                value.unwrap_or_default()
            ))
        }
    }
}

/// Every placeholder sits between separators or at the end.
fn check_whole_segments(pieces: &[Piece]) -> Result<(), String> {
    let separated = |c: Option<char>| c.is_none_or(|c| SEPARATORS.contains(&c));
    for (i, piece) in pieces.iter().enumerate() {
        let Piece::Value(path) = piece else { continue };
        let before = match i.checked_sub(1).map(|j| &pieces[j]) {
            Some(Piece::Text(text)) => text.chars().last(),
            Some(Piece::Value(_)) => Some('v'),
            None => None,
        };
        let after = match pieces.get(i + 1) {
            Some(Piece::Text(text)) => text.chars().next(),
            Some(Piece::Value(_)) => Some('v'),
            None => None,
        };
        if !separated(before) || !separated(after) {
            return Err(format!(
                "`{{{}}}` shares a segment of the key with other text: a value must fill a whole segment, \
                 between `:` (or a hash tag's braces) and the next, so that no value can spell another key; \
                 {SEGMENTS_EXAMPLE}",
                path.join(".")
            ));
        }
    }
    Ok(())
}

/// The key's written braces must form a Redis hash tag that keeps the limiter's keys
/// in one cluster slot (`redlimit_syntax::hash_tag`). Interpolated values never
/// contain braces (they are escaped) and are never empty, so the written text, with a
/// letter for each value, decides.
pub fn check_slot(pieces: &[Piece]) -> Result<(), String> {
    let skeleton: String = pieces
        .iter()
        .map(|piece| match piece {
            Piece::Text(text) => text.as_str(),
            Piece::Value(_) => "v",
        })
        .collect();
    let problem = match hash_tag::split(&skeleton) {
        None => return Ok(()),
        Some(Split::CloseWithoutOpen) => "it has a literal `}` but no `{`",
        Some(Split::EmptyTag) => "its first literal `{` opens an empty hash tag",
        Some(Split::Unclosed) => "its first literal `{` is never closed",
    };
    Err(format!(
        "this key would split the limiter's keys across Redis Cluster slots: {problem}; \
         write a non-empty hash tag such as \"{{{{tenant:{{tenant}}}}}}:orders\", or no literal braces"
    ))
}

#[cfg(test)]
mod tests {
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
            "x:redlimit:{a}",
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
            Piece::Text(_) => true,
        });
        match check_params(pieces, params) {
            Ok(()) => assert!(named, "{input:?}"),
            Err(message) => assert!(!named && !message.is_empty(), "{input:?}"),
        }
        let name: String = std::iter::once("rate_limit:".to_owned())
            .chain(pieces.iter().map(|piece| match piece {
                Piece::Text(text) => text.clone(),
                Piece::Value(_) => "v".to_owned(),
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
                            Piece::Value(path) => format!("{{{}}}", path.join(".")),
                        })
                        .collect();
                    assert_eq!(parse(&rebuilt).as_ref(), Ok(&pieces), "{text:?}");
                    checks_agree(&pieces, &params, &text);
                }
                Err(message) => assert!(message.len() > 10, "{text:?}: {message}"),
            }
        }
    }
}
