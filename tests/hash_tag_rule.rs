//! The hash-tag rule is written once, in `redlimit_syntax::hash_tag`: the attribute
//! refuses a key at compile time with it, and the runtime refuses a name at run time
//! with `keys::check_name`, which adds a fast path for names without braces and
//! refuses the empty name. This test holds the runtime's check to the rule, with the
//! same reason, on every name of up to seven characters over `{`, `}`, `a`, `:`, `é`,
//! and on random longer ones, and every accepted name's five keys to one slot.

use std::collections::HashMap;

use redlimit_runtime::keys::{check_name, hash_slot, shares_keys_with};
use redlimit_runtime::{Error, LimiterKeys};
use redlimit_syntax::hash_tag::{self, Split};

/// The runtime's reason for each of the attribute's (which words its own message).
fn runtime_reason(split: Split) -> &'static str {
    match split {
        Split::CloseWithoutOpen => "it has a `}` but no `{`",
        Split::EmptyTag => "its first `{` opens an empty `{}` tag",
        Split::Unclosed => "its first `{` is never closed",
    }
}

/// Both rules on `name`; an accepted name's five keys must also share its slot, so
/// that agreeing on a wrong rule would fail too.
fn agree(name: &str) {
    let runtime = match check_name(name) {
        Ok(()) => None,
        Err(Error::CrossSlotName { reason, .. }) => Some(reason),
        Err(other) => panic!("{name:?}: {other}"),
    };
    assert_eq!(runtime, hash_tag::split(name).map(runtime_reason), "{name:?}");
    if runtime.is_none() {
        let slot = hash_slot(name.as_bytes());
        for key in LimiterKeys::new(name, "client").unwrap().all() {
            assert_eq!(hash_slot(key.as_bytes()), slot, "{name:?}: {key}");
        }
    }
}

#[test]
fn every_short_name() {
    let alphabet = ['{', '}', 'a', ':', 'é'];
    let mut names = vec![String::new()];
    let mut checked = 0;
    for _ in 0..7 {
        names = names
            .iter()
            .flat_map(|name| alphabet.iter().map(move |c| format!("{name}{c}")))
            .collect();
        for name in &names {
            agree(name);
            checked += 1;
        }
    }
    // Each rejection reason and acceptance occurs in the corpus.
    for name in ["a}", "{}a", "{a", "a", "{a}"] {
        agree(name);
    }
    assert_eq!(checked, (1..=7).map(|n| 5usize.pow(n)).sum::<usize>());
}

/// Two names keep their permits in the same keys exactly when `shares_keys_with` pairs
/// them (`{N}` and `N`), over every accepted name of up to seven characters: the
/// names grouped by their value key, each group one name or such a pair.
#[test]
fn names_share_keys_only_as_shares_keys_with_says() {
    let alphabet = ['{', '}', 'a', ':', 'é'];
    let mut names = vec![String::new()];
    let mut by_value: HashMap<String, Vec<String>> = HashMap::new();
    for _ in 0..7 {
        names = names
            .iter()
            .flat_map(|name| alphabet.iter().map(move |c| format!("{name}{c}")))
            .collect();
        for name in names.iter().filter(|name| check_name(name).is_ok()) {
            let keys = LimiterKeys::new(name, "id").unwrap();
            assert_eq!(
                keys.value().replace(":value", ":permits"),
                keys.permits(),
                "{name}"
            );
            by_value.entry(keys.value()).or_default().push(name.clone());
        }
    }
    let mut pairs = 0;
    for (value, group) in &by_value {
        match &group[..] {
            [one] => assert_eq!(
                shares_keys_with(one)
                    .and_then(|other| by_value.get(&LimiterKeys::new(other, "id").unwrap().value())),
                None,
                "{one}"
            ),
            [a, b] => {
                let (braced, plain) = if a.starts_with('{') { (a, b) } else { (b, a) };
                assert_eq!(shares_keys_with(braced), Some(plain.as_str()), "{value}");
                assert_eq!(shares_keys_with(plain), None, "{value}");
                pairs += 1;
            }
            more => panic!("{value}: {more:?}"),
        }
    }
    // N of one to five characters over `a`, `:` and `é` (braced, seven at most):
    // 3 + 9 + 27 + 81 + 243
    assert_eq!(pairs, 363, "pairs");
}

#[test]
fn random_longer_names() {
    let alphabet: Vec<char> = "{}{}a:é🦀 %\u{0}".chars().collect();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..100_000 {
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let len = 8 + (next() % 24) as usize;
        let name: String = (0..len)
            .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
            .collect();
        agree(&name);
    }
}

/// The one name only the runtime refuses: the attribute checks a template's text, and
/// a limiter's name is the client's prefix followed by it. Refused as what it is, a
/// missing name, not as keys split across slots.
#[test]
fn the_empty_name_is_the_runtimes_alone() {
    assert!(hash_tag::split("").is_none());
    let error = check_name("").unwrap_err();
    assert!(matches!(error, Error::InvalidConfig { .. }), "{error:?}");
    assert_eq!(
        error.to_string(),
        "rate limiter ``: invalid configuration: the name is empty; give each limiter a \
         name of its own, e.g. `orders:42`"
    );
}
