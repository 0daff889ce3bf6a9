//! Redis key names of a limiter, exactly as Redisson builds them.

pub(crate) mod key_buf;
pub mod member;
mod shown;

pub use shown::shown;

use std::sync::Arc;

use redlimit_syntax::hash_tag::{self, Split};

use crate::Error;

/// The first segment, after the prefix, of the keys the library keeps for itself.
pub const LIBRARY_SEGMENT: &str = "redlimit";

/// The five keys of a limiter, in the order every script receives them. Only the
/// name is held; the other keys are built when a script needs them, so the in-process
/// backend never formats them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimiterKeys {
    name: String,
    client_id: Arc<str>,
}

impl LimiterKeys {
    /// The keys of limiter `name` as seen by the client `client_id`, or an error when
    /// they would not share one cluster slot (see [`check_name`]).
    pub fn new(name: &str, client_id: &str) -> Result<Self, Error> {
        LimiterKeys::with_client(name.to_owned(), Arc::from(client_id))
    }

    pub(crate) fn with_client(name: String, client_id: Arc<str>) -> Result<Self, Error> {
        check_name(&name)?;
        Ok(LimiterKeys { name, client_id })
    }

    /// The keys of a name [`check_name`] accepted before (a rule's, kept checked).
    pub(crate) fn checked_before(name: String, client_id: Arc<str>) -> Self {
        LimiterKeys { name, client_id }
    }

    /// The same keys, borrowed.
    pub(crate) fn borrowed(&self) -> Keys<'_> {
        Keys {
            name: &self.name,
            client_id: &self.client_id,
        }
    }

    /// `NAME`: the config hash.
    pub fn config(&self) -> &str {
        &self.name
    }

    /// `{NAME}:value`: available permits, mode overall.
    pub fn value(&self) -> String {
        self.borrowed().value()
    }

    /// `{NAME}:value:CLIENT_ID`: available permits, mode per_client.
    pub fn client_value(&self) -> String {
        self.borrowed().client_value()
    }

    /// `{NAME}:permits`: the grant log, mode overall.
    pub fn permits(&self) -> String {
        self.borrowed().permits()
    }

    /// `{NAME}:permits:CLIENT_ID`: the grant log, mode per_client.
    pub fn client_permits(&self) -> String {
        self.borrowed().client_permits()
    }

    /// `{NAME}:bucket`: a token bucket's state, mode overall.
    pub fn bucket(&self) -> String {
        self.borrowed().bucket()
    }

    /// `{NAME}:bucket:CLIENT_ID`: a token bucket's state, mode per_client.
    pub fn client_bucket(&self) -> String {
        self.borrowed().client_bucket()
    }

    /// The five keys in script order: config, value, client value, permits, client
    /// permits.
    pub fn all(&self) -> [String; 5] {
        self.borrowed().all()
    }
}

/// A limiter's keys, borrowed from its name and the client's id: what a decision
/// hands the backends, so that a call copies neither (nor counts a reference to the
/// id, which every thread deciding would write). [`LimiterKeys`] owns the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Keys<'a> {
    name: &'a str,
    client_id: &'a str,
}

impl<'a> Keys<'a> {
    /// As [`LimiterKeys::new`], borrowing.
    pub fn new(name: &'a str, client_id: &'a str) -> Result<Self, Error> {
        check_name(name)?;
        Ok(Keys { name, client_id })
    }

    /// The keys of a name [`check_name`] accepted before (a rule's, kept checked).
    pub(crate) fn checked_before(name: &'a str, client_id: &'a str) -> Self {
        Keys { name, client_id }
    }

    pub fn config(&self) -> &'a str {
        self.name
    }

    pub fn value(&self) -> String {
        suffix(self.name, "value")
    }

    pub fn client_value(&self) -> String {
        self.per_client(&self.value())
    }

    pub fn permits(&self) -> String {
        suffix(self.name, "permits")
    }

    pub fn client_permits(&self) -> String {
        self.per_client(&self.permits())
    }

    pub fn bucket(&self) -> String {
        suffix(self.name, "bucket")
    }

    pub fn client_bucket(&self) -> String {
        self.per_client(&self.bucket())
    }

    /// `KEY:CLIENT_ID`, the per_client form of an overall key.
    fn per_client(&self, key: &str) -> String {
        let mut out = String::with_capacity(key.len() + 1 + self.client_id.len());
        out.push_str(key);
        out.push(':');
        out.push_str(self.client_id);
        out
    }

    /// The bytes [`all`](Keys::all)'s five keys take, at most (two braces, a colon
    /// and a suffix each, and the client's id in two).
    pub fn all_len(&self) -> usize {
        5 * self.name.len() + 2 * self.client_id.len() + 4 * (3 + "permits".len()) + 2
    }

    pub fn all(&self) -> [String; 5] {
        let (value, permits) = (self.value(), self.permits());
        let (client_value, client_permits) = (self.per_client(&value), self.per_client(&permits));
        [self.name.to_owned(), value, client_value, permits, client_permits]
    }
}

/// The five keys of [`Keys::all`], in its order, written as five arguments straight
/// into a command: each is built in one buffer, on the stack while the longest key
/// fits in 160 bytes (names up to about 110 bytes with a client's 36-byte id), rather
/// than as a string of its own.
impl redis::ToRedisArgs for Keys<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        out.write_arg(self.name.as_bytes());
        // `{NAME}:` (or `NAME:` with a hash tag) once, then each suffix after it.
        let mut key = smallvec::SmallVec::<[u8; 160]>::new();
        let (open, close) = braces(self.name);
        for piece in [open, self.name, close, ":"] {
            key.extend_from_slice(piece.as_bytes());
        }
        let base = key.len();
        for suffix in [&b"value"[..], b"permits"] {
            key.truncate(base);
            key.extend_from_slice(suffix);
            out.write_arg(&key);
            key.push(b':');
            key.extend_from_slice(self.client_id.as_bytes());
            out.write_arg(&key);
        }
    }

    fn num_of_args(&self) -> usize {
        5
    }
}

/// Redisson's `suffixName`: `NAME:s` when the name has a brace, else `{NAME}:s`,
/// built at its final size.
pub fn suffix(name: &str, s: &str) -> String {
    let (open, close) = braces(name);
    let mut out = String::with_capacity(name.len() + s.len() + 3);
    for piece in [open, name, close, ":", s] {
        out.push_str(piece);
    }
    out
}

/// What `suffixName` puts around a name: braces, so that its keys share the name's
/// cluster slot, unless the name has a brace (a hash tag) of its own.
fn braces(name: &str) -> (&'static str, &'static str) {
    if name.contains('{') {
        ("", "")
    } else {
        ("{", "}")
    }
}

/// What `name` is when it is one of the library's own keys under the clients' key
/// `prefix`, all of them under `<prefix>redlimit:`: the override table
/// (`<prefix>redlimit:overrides`), a refusal report (`<prefix>redlimit:refused:<second>`),
/// the stream of limiters reset (`<prefix>redlimit:resets`), or any other key of the
/// library's. No limiter may be named so: its writes would
/// rewrite, expire or delete them. `None` for any other name.
pub fn library_key(prefix: &str, name: &str) -> Option<&'static str> {
    let rest = name.strip_prefix(prefix)?.strip_prefix(LIBRARY_SEGMENT)?;
    if rest == ":overrides" {
        Some("the override table")
    } else if rest.starts_with(":refused:") {
        Some("a refusal report")
    } else if rest == ":resets" {
        Some("the stream of limiters reset")
    } else if rest.is_empty() || rest.starts_with(':') {
        Some("a key of the library's own")
    } else {
        None
    }
}

/// Accepts a limiter name only when it is not empty and its five keys share one Redis
/// Cluster slot: a name without braces, or one whose first `{` opens a non-empty hash
/// tag (`redlimit_syntax::hash_tag`, the rule the attribute applies to a key at
/// compile time).
pub fn check_name(name: &str) -> Result<(), Error> {
    // One search for a brace: most names have none, and need no more.
    if memchr::memchr2(b'{', b'}', name.as_bytes()).is_none() && !name.is_empty() {
        return Ok(());
    }
    let reason = match hash_tag::split(name) {
        None if name.is_empty() => {
            return Err(Error::InvalidConfig {
                name: String::new(),
                problem: "the name is empty; give each limiter a name of its own, e.g. `orders:42`",
            })
        }
        None => return Ok(()),
        Some(Split::CloseWithoutOpen) => "it has a `}` but no `{`",
        Some(Split::EmptyTag) => "its first `{` opens an empty `{}` tag",
        Some(Split::Unclosed) => "its first `{` is never closed",
    };
    Err(Error::CrossSlotName {
        name: name.to_owned(),
        reason,
    })
}

/// The hash of a limiter name in the in-process tables (the memory backend's limiters,
/// a client's kept refusals): SipHash-1-3, std's map hash, under one random key per
/// process. Keyed on purpose: names carry callers' values (user ids, API keys,
/// addresses), and with an unkeyed or weakly seeded hash a caller who learns how it
/// mixes can choose names that fall into one bucket and turn every lookup into a
/// walk. A rule computes it once and keeps it ([`Rule`](crate::Rule)), so a rule
/// called again pays no hashing.
pub(crate) fn name_hash(name: &str) -> u64 {
    // The bytes alone (a `str`'s `Hash` adds a terminator, for hashing one field after
    // another: one name is hashed here).
    let mut hasher = name_hasher();
    std::hash::Hasher::write(&mut hasher, name.as_bytes());
    std::hash::Hasher::finish(&hasher)
}

/// The hasher of [`name_hash`], before any byte: a name's start written into it once
/// and the hasher cloned for each name that starts so (a layer's limiters of one rule)
/// hashes each name as [`name_hash`] does, its bytes read in pieces or at once alike.
pub(crate) fn name_hasher() -> std::hash::DefaultHasher {
    static KEY: std::sync::OnceLock<std::collections::hash_map::RandomState> = std::sync::OnceLock::new();
    std::hash::BuildHasher::build_hasher(KEY.get_or_init(Default::default))
}

/// The other name whose limiter keeps its permits in `name`'s keys, when there is one:
/// for a name that is one hash tag and nothing else, `{N}` with no brace in `N`, the
/// name `N`. Redisson's layout puts `{N}`'s value, log and bucket at `{N}:value` and
/// so on (a name with braces is written as it is), and `N`'s at the same keys (a name
/// without braces is put in one); only their configs, `{N}` and `N`, differ. Every
/// other name's keys are its own.
pub fn shares_keys_with(name: &str) -> Option<&str> {
    let inner = name.strip_prefix('{')?.strip_suffix('}')?;
    (!inner.is_empty() && !inner.contains(['{', '}'])).then_some(inner)
}

/// The Redis Cluster hash slot of a key (CRC16/XMODEM of its hash tag, mod 16384).
pub fn hash_slot(key: &[u8]) -> u16 {
    crc16(hash_tag::hashed_part(key)) % 16384
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redisson_names() {
        let keys = LimiterKeys::new("rate_limit:user:42", "id").unwrap();
        assert_eq!(
            keys.all(),
            [
                "rate_limit:user:42",
                "{rate_limit:user:42}:value",
                "{rate_limit:user:42}:value:id",
                "{rate_limit:user:42}:permits",
                "{rate_limit:user:42}:permits:id",
            ]
        );
        // Written into a command, the same five keys in the same order, names longer
        // than the stack buffer included.
        let long = format!("rate_limit:{}", "x".repeat(300));
        for name in ["rate_limit:user:42", "{tenant:7}:orders", &long] {
            let keys = LimiterKeys::new(name, "a-client-id").unwrap();
            let written = redis::ToRedisArgs::to_redis_args(&keys.borrowed());
            let all = keys.all().map(String::into_bytes);
            assert!(written.iter().map(Vec::len).sum::<usize>() <= keys.borrowed().all_len());
            assert_eq!(written, all, "{name}");
        }
        let tagged = LimiterKeys::new("{tenant:7}:orders", "id").unwrap();
        assert_eq!(tagged.value(), "{tenant:7}:orders:value");
        assert_eq!(tagged.client_permits(), "{tenant:7}:orders:permits:id");
    }

    #[test]
    fn crc16_matches_redis() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(hash_slot(b"foo"), 12182);
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
        assert_eq!(hash_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
    }

    #[test]
    fn accepted_names_keep_one_slot_and_rejected_ones_would_not() {
        for name in ["a", "rate_limit:x", "{t}:x", "x{t}y", "x{t}{", "{a}b}"] {
            let keys = LimiterKeys::new(name, "c").expect(name);
            let slot = hash_slot(name.as_bytes());
            for key in keys.all() {
                assert_eq!(hash_slot(key.as_bytes()), slot, "{name}: {key}");
            }
        }
        assert!(matches!(
            LimiterKeys::new("", "c").unwrap_err(),
            Error::InvalidConfig { .. }
        ));
        for name in ["a{b", "a{}b", "{}", "a}b", "}"] {
            let err = LimiterKeys::new(name, "c").unwrap_err();
            assert!(matches!(err, Error::CrossSlotName { .. }), "{name}");
            let value = suffix(name, "value");
            assert_ne!(hash_slot(name.as_bytes()), hash_slot(value.as_bytes()), "{name}");
        }
    }
}
