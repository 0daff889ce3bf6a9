//! Key templates: text with `{param}` / `{param.field}` placeholders; `{{` and `}}`
//! are literal braces.

use redlimit_syntax::hash_tag::{self, Split};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Text as written (with `{{`/`}}` already turned into single braces).
    Text(String),
    /// A parameter and a path of fields: `user.id` is `["user", "id"]`.
    Value(Vec<String>),
    /// A value of the request the layer serves: `{request.client_ip}`,
    /// `{request.identity}` (where no parameter is named `request`).
    Request(RequestPart),
}

/// A value of the request the layer serves, as a template names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestPart {
    ClientIp,
    Identity,
}

/// What `{request.<field>}` accepts, as written.
pub const REQUEST_PARTS: [(&str, RequestPart); 2] = [
    ("client_ip", RequestPart::ClientIp),
    ("identity", RequestPart::Identity),
];

/// The name a template's values of the request start with.
pub const REQUEST: &str = "request";

impl Piece {
    /// What a value is called in a message: `user.id`, `request.identity`.
    pub fn value_name(&self) -> Option<String> {
        match self {
            Piece::Text(_) => None,
            Piece::Value(path) => Some(path.join(".")),
            Piece::Request(part) => {
                let field = REQUEST_PARTS.iter().find(|(_, p)| p == part).map(|(f, _)| *f);
                Some(format!("{REQUEST}.{}", field.unwrap_or_default()))
            }
        }
    }
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

/// A key template split into pieces and checked: its placeholders name `params` (or,
/// when no parameter is named `request`, the request the layer serves), its braces
/// keep one cluster slot, its values fill whole segments. The first problem found, in
/// that order, is the one reported.
pub fn checked(text: &str, params: &[String]) -> Result<Vec<Piece>, String> {
    let pieces = parse(text)?;
    let pieces = request_values(pieces, params)?;
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

/// `{request.client_ip}` and `{request.identity}` as the request's values, when no
/// parameter binds `request` (a parameter's fields are written as before); any other
/// `{request...}` then says what the request has.
fn request_values(pieces: Vec<Piece>, params: &[String]) -> Result<Vec<Piece>, String> {
    if params.iter().any(|p| p == REQUEST) {
        return Ok(pieces);
    }
    pieces
        .into_iter()
        .map(|piece| match piece {
            Piece::Value(path) if path[0] == REQUEST => {
                let field = path.get(1).filter(|_| path.len() == 2);
                REQUEST_PARTS
                    .iter()
                    .find(|(name, _)| Some(*name) == field.map(String::as_str))
                    .map(|&(_, part)| Piece::Request(part))
                    .ok_or_else(|| {
                        format!(
                            "`{{{}}}` in the key: the request the layer serves has `{{request.client_ip}}` \
                             (the client address the layer read) and `{{request.identity}}` (what the \
                             application set with redlimit::request::set_identity)",
                            path.join(".")
                        )
                    })
            }
            piece => Ok(piece),
        })
        .collect()
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
                    "unknown placeholder `{{{}}}` in the key; {listed} (and `{{request.client_ip}}`, \
                     `{{request.identity}}` name the request the layer serves)",
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
    check_reserved_further_in(pieces)?;
    check_whole_segments(pieces)
}

/// Nor does the key hold the library's own segment further in, before a `:` or at its
/// end: its limiters would be the library's keys of clients whose key prefix is the
/// text before it (`orders:redlimit:{user}` under no prefix, sent the value
/// `overrides`, is the override table of the clients on the prefix `orders:`).
fn check_reserved_further_in(pieces: &[Piece]) -> Result<(), String> {
    for (i, piece) in pieces.iter().enumerate() {
        let Piece::Text(text) = piece else { continue };
        let last = i + 1 == pieces.len();
        let reserved = text.match_indices(RESERVED).any(|(at, _)| {
            let after = &text[at + RESERVED.len()..];
            after.starts_with(':') || (after.is_empty() && last)
        });
        if reserved {
            return Err(format!(
                "a key may not hold `{RESERVED}` before a `:` or at its end: its limiters would be the \
                 library's own keys (run-time overrides, refusal reports) of clients whose key prefix is \
                 the text before it; choose another segment"
            ));
        }
    }
    Ok(())
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
        Some(_) => {
            let value = pieces.iter().find_map(Piece::value_name);
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
        let Some(name) = piece.value_name() else { continue };
        let before = match i.checked_sub(1).map(|j| &pieces[j]) {
            Some(Piece::Text(text)) => text.chars().last(),
            Some(_) => Some('v'),
            None => None,
        };
        let after = match pieces.get(i + 1) {
            Some(Piece::Text(text)) => text.chars().next(),
            Some(_) => Some('v'),
            None => None,
        };
        if !separated(before) || !separated(after) {
            return Err(format!(
                "`{{{}}}` shares a segment of the key with other text: a value must fill a whole segment, \
                 between `:` (or a hash tag's braces) and the next, so that no value can spell another key; \
                 {SEGMENTS_EXAMPLE}",
                name
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
            Piece::Value(_) | Piece::Request(_) => "v",
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
mod tests;
