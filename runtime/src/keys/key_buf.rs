//! Building a limiter's key from a template: the text as written, each argument
//! escaped so that no value can forge another key or change the cluster slot (the
//! key names themselves are in `keys.rs`).

use std::fmt::{self, Display, Write};

use sha2::{Digest, Sha256};

/// The longest an interpolated value may be, in bytes once escaped, before it is
/// digested.
pub const MAX_VALUE_LEN: usize = 128;
/// How much of a digested value is kept, in bytes, before its digest.
const DIGEST_PREFIX_LEN: usize = 64;
/// The words the key layout writes after a limiter's name: `NAME:value`,
/// `NAME:permits`, `NAME:bucket` (each also followed by a client's id) and
/// `NAME:settled:ID`, with `{NAME}` in place of `NAME` when it has no hash tag.
const LAYOUT_WORDS: [&str; 4] = ["value", "permits", "bucket", "settled"];

/// A key under construction: template text as written, argument values escaped.
#[derive(Debug)]
pub struct KeyBuf(String);

impl KeyBuf {
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        KeyBuf(String::with_capacity(48))
    }

    /// A key written into `buffer`, emptied (its room kept): a buffer a call gave
    /// back, so that the next key is not allocated again.
    #[inline]
    pub fn reusing(mut buffer: String) -> Self {
        buffer.clear();
        buffer.reserve(48);
        KeyBuf(buffer)
    }

    /// Template text, as written.
    #[inline]
    pub fn text(&mut self, text: &str) {
        self.0.push_str(text);
    }

    /// An argument's `Display`, with `%`, `{`, `}` and `:` percent-encoded so that no
    /// value can change the hash tag or pose as another key's separator. The empty
    /// string is written `%00` (it could empty a hash tag), and a value longer than
    /// [`MAX_VALUE_LEN`] once escaped is cut to its first 64 bytes followed by `%#` and
    /// 32 hex digits of its SHA-256, so keys stay small whatever the caller sends.
    /// A value that is one of the words the key layout writes after a limiter's name
    /// (`value`, `permits`, `bucket`, `settled`) has its first letter percent-encoded
    /// (`%76alue`): after a name with a hash tag, whose keys are `NAME:value` and so
    /// on, it would otherwise name another limiter's key, whichever process holds
    /// that limiter. Escaped values never contain `%00`, `%#` or a lower-case letter
    /// percent-encoded, so these forms cannot collide with a value written out.
    pub fn value<T: Display + ?Sized>(&mut self, value: &T) {
        let start = self.0.len();
        let _ = write!(Escaper(&mut self.0), "{value}");
        self.end_value(start);
    }

    /// [`value`](Self::value) for text already at hand, without the formatting
    /// machinery a `Display` goes through (the edge layer's keys, on every request).
    #[inline]
    pub fn value_str(&mut self, value: &str) {
        let start = self.0.len();
        escape_into(&mut self.0, value);
        self.end_value(start);
    }

    /// A value given as bytes that may not be UTF-8 (a request header's): its UTF-8
    /// runs escaped as [`value_str`](KeyBuf::value_str) escapes them, every other byte
    /// written `%XX` (80 to FF, which escaped text never holds: its `%` is `%25`), so
    /// values that differ in any byte make different keys.
    pub fn value_bytes(&mut self, value: &[u8]) {
        let start = self.0.len();
        for chunk in value.utf8_chunks() {
            escape_into(&mut self.0, chunk.valid());
            for byte in chunk.invalid() {
                let _ = write!(self.0, "%{byte:02X}");
            }
        }
        self.end_value(start);
    }

    /// A value that is a secret (a credential a limiter is keyed by), written as `%#`
    /// and 32 hex digits of its SHA-256: the limiter's name, its keys in Redis and every
    /// message quoting them hold no part of it. Escaped values never contain `%#`, and
    /// a long value's digest follows 64 bytes of it, so no other value is written so.
    pub fn value_digest(&mut self, value: &[u8]) {
        let digest = Sha256::digest(value);
        self.0.push_str("%#");
        for byte in &digest[..16] {
            let _ = write!(self.0, "{byte:02x}");
        }
    }

    /// The empty value's and the long value's forms, for the value written from `start`.
    #[inline]
    fn end_value(&mut self, start: usize) {
        let written = self.0.len() - start;
        if written == 0 {
            self.0.push_str("%00");
        } else if written > MAX_VALUE_LEN {
            self.digest_from(start);
        } else if (5..=7).contains(&written)
            && matches!(self.0.as_bytes()[start], b'v' | b'p' | b'b' | b's')
            && LAYOUT_WORDS.contains(&&self.0[start..])
        {
            self.encode_first(start);
        }
    }

    /// The value written from `start`, a word of the layout, with its first letter
    /// percent-encoded.
    #[cold]
    #[inline(never)]
    fn encode_first(&mut self, start: usize) {
        let first = self.0.as_bytes()[start];
        self.0.replace_range(start..start + 1, &format!("%{first:02X}"));
    }

    /// The long value written from `start` cut to its first bytes and its digest.
    #[cold]
    #[inline(never)]
    fn digest_from(&mut self, start: usize) {
        let digest = Sha256::digest(&self.0.as_bytes()[start..]);
        let mut keep = start + DIGEST_PREFIX_LEN;
        while !self.0.is_char_boundary(keep) {
            keep -= 1;
        }
        self.0.truncate(keep);
        self.0.push_str("%#");
        for byte in &digest[..16] {
            let _ = write!(self.0, "{byte:02x}");
        }
    }

    pub fn finish(self) -> String {
        self.0
    }
}

struct Escaper<'a>(&'a mut String);

impl Write for Escaper<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        escape_into(self.0, s);
        Ok(())
    }
}

/// Whether a byte is one of those [`escape_into`] encodes: `%`, `:`, `{`, `}`.
const ESCAPED: [bool; 256] = {
    let mut table = [false; 256];
    table[b'%' as usize] = true;
    table[b':' as usize] = true;
    table[b'{' as usize] = true;
    table[b'}' as usize] = true;
    table
};

/// `s` with `%`, `:`, `{` and `}` percent-encoded. They are ASCII, so the runs
/// between them are whole UTF-8 text and are copied as they are. (A table read per
/// byte finds them: the value, a header's on every request, is usually all run.)
#[inline]
fn escape_into(out: &mut String, s: &str) {
    // The usual value holds none: copied at once.
    if !s.bytes().any(|byte| ESCAPED[usize::from(byte)]) {
        out.push_str(s);
        return;
    }
    escape_runs(out, s);
}

/// [`escape_into`] for a value holding a byte to encode.
#[cold]
#[inline(never)]
fn escape_runs(out: &mut String, s: &str) {
    let mut run = 0;
    for (i, &byte) in s.as_bytes().iter().enumerate() {
        if !ESCAPED[usize::from(byte)] {
            continue;
        }
        out.push_str(&s[run..i]);
        out.push_str(match byte {
            b'%' => "%25",
            b':' => "%3A",
            b'{' => "%7B",
            _ => "%7D",
        });
        run = i + 1;
    }
    out.push_str(&s[run..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(parts: &[&dyn Display]) -> String {
        let mut key = KeyBuf::new();
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                key.text(":");
            }
            key.value(*part);
        }
        key.finish()
    }

    /// A key written into a buffer given back holds nothing of the key before.
    #[test]
    fn a_reused_buffer_starts_empty() {
        let mut key = KeyBuf::reusing("rate_limit:api:old-value".to_owned());
        key.text("api:");
        key.value_str("new");
        assert_eq!(key.finish(), "api:new");
    }

    #[test]
    fn values_are_escaped_and_others_unchanged() {
        assert_eq!(key(&[&"a:b", &"c"]), "a%3Ab:c");
        assert_ne!(key(&[&"a:b", &"c"]), key(&[&"a", &"b:c"]));
        assert_eq!(key(&[&"{x}", &"100%"]), "%7Bx%7D:100%25");
        assert_eq!(key(&[&"user 42", &"Ünïcode"]), "user 42:Ünïcode");
        assert_eq!(key(&[&42u64]), "42");
        assert_eq!(key(&[&"", &"x"]), "%00:x");
    }

    /// A value that is a word of the key layout never ends a name as that word: after
    /// a name with a hash tag it would be another limiter's key.
    #[test]
    fn layout_words_are_written_encoded() {
        assert_eq!(key(&[&"{t:acme}", &"value"]), "%7Bt%3Aacme%7D:%76alue");
        for (word, written) in [
            ("value", "%76alue"),
            ("permits", "%70ermits"),
            ("bucket", "%62ucket"),
            ("settled", "%73ettled"),
        ] {
            assert_eq!(key(&[&word]), written);
            let mut bytes = KeyBuf::new();
            bytes.value_bytes(word.as_bytes());
            assert_eq!(bytes.finish(), written);
            let mut text = KeyBuf::new();
            text.value_str(word);
            assert_eq!(text.finish(), written);
        }
        // Other spellings are values like any other, and none is written as a word.
        for other in ["Value", "values", "valu", "%76alue", "settle", "bucket "] {
            let written = key(&[&other]);
            assert!(!LAYOUT_WORDS.contains(&written.as_str()), "{other}");
            assert_ne!(written, key(&[&"value"]), "{other}");
        }
    }

    /// Bytes key as their text escapes when they are UTF-8, and no two byte strings
    /// share a key: over random strings of pieces, valid and not.
    #[test]
    fn byte_values_keep_keys_distinct() {
        use rand::rngs::StdRng;
        use rand::{RngExt, SeedableRng};
        use std::collections::HashMap;

        let pieces: [&[u8]; 17] = [
            b"a",
            b"%",
            b"%E9",
            b"%25",
            b":",
            b"{",
            b"\xe9",
            b"\xff",
            b"\xc3",
            b"\xc3\xa9",
            "\u{fffd}".as_bytes(),
            b"E9",
            b"",
            b"\x80",
            b"value",
            b"%76",
            b"alue",
        ];
        let mut rng = StdRng::seed_from_u64(11);
        let mut seen: HashMap<String, Vec<u8>> = HashMap::new();
        for _ in 0..20_000 {
            let n = rng.random_range(0..5);
            let value: Vec<u8> = (0..n)
                .flat_map(|_| pieces[rng.random_range(0..pieces.len())].to_vec())
                .collect();
            let mut key = KeyBuf::new();
            key.value_bytes(&value);
            let key = key.finish();
            if let Ok(text) = std::str::from_utf8(&value) {
                let mut by_str = KeyBuf::new();
                by_str.value_str(text);
                assert_eq!(key, by_str.finish(), "{value:?}");
            }
            if let Some(before) = seen.insert(key.clone(), value.clone()) {
                assert_eq!(before, value, "two values made the key {key:?}");
            }
        }
    }

    #[test]
    fn long_values_are_digested() {
        let long = "é".repeat(100);
        let digested = key(&[&long]);
        assert!(digested.len() <= DIGEST_PREFIX_LEN + 2 + 32, "{digested}");
        assert!(digested.starts_with(&"é".repeat(32)), "{digested}");
        assert!(digested.contains("%#"));
        assert_ne!(key(&[&format!("{long}x")]), digested);
        let exactly = "a".repeat(MAX_VALUE_LEN);
        assert_eq!(key(&[&exactly]), exactly, "up to the limit, written out");
    }

    /// Property: distinct argument tuples give distinct keys, every key set lies in one
    /// cluster slot, and keys stay bounded, for hostile values.
    #[test]
    fn hostile_values_keep_keys_distinct_bounded_and_in_one_slot() {
        use rand::rngs::StdRng;
        use rand::{RngExt, SeedableRng};
        use std::collections::HashMap;

        let pieces = [
            "", "{", "}", ":", "%", "%3A", "%25", "%#", "%00", "{}", "}{", "a", "Z", "0", " ", "\0", "\n",
            "\u{7f}", "é", "漢", "🦀", "\u{200b}", "user", "42", "::", "{{", "}}", "%7B", "value", "%76",
            "alue", "v", "bucket",
        ];
        let mut rng = StdRng::seed_from_u64(7);
        let mut seen: HashMap<String, (String, String)> = HashMap::new();
        for _ in 0..20_000 {
            let mut value = || -> String {
                let n = rng.random_range(0..6);
                let mut s: String = (0..n)
                    .map(|_| pieces[rng.random_range(0..pieces.len())])
                    .collect();
                if rng.random_range(0..20) == 0 {
                    s = s.repeat(rng.random_range(20..200));
                }
                s
            };
            let (a, b) = (value(), value());
            let (mut by_display, mut by_str) = (KeyBuf::new(), KeyBuf::new());
            by_display.value(&a);
            by_str.value_str(&a);
            assert_eq!(by_str.finish(), by_display.finish(), "{a:?}");
            for template in [0, 1] {
                let mut key = KeyBuf::new();
                if template == 0 {
                    key.text("rate_limit:t:");
                    key.value(&a);
                    key.text(":");
                    key.value(&b);
                } else {
                    // value_str, as the edge layer writes values
                    key.text("rate_limit:{t:");
                    key.value_str(&a);
                    key.text("}:");
                    key.value_str(&b);
                }
                let key = key.finish();
                assert!(
                    key.len() <= 20 + 2 * (DIGEST_PREFIX_LEN + 34).max(MAX_VALUE_LEN),
                    "{key}"
                );
                let keys = crate::LimiterKeys::new(&key, "00000000-0000-4000-8000-000000000000")
                    .unwrap_or_else(|e| panic!("{a:?} {b:?}: {e}"));
                let slot = crate::keys::hash_slot(keys.config().as_bytes());
                for k in keys.all() {
                    assert_eq!(crate::keys::hash_slot(k.as_bytes()), slot, "{k}");
                }
                if let Some(other) = seen.insert(key.clone(), (a.clone(), b.clone())) {
                    assert_eq!(other, (a.clone(), b.clone()), "two tuples share {key}");
                }
            }
        }
    }
}
