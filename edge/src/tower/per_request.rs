//! One request through the layer: its trusted-proxy setting and client address, each
//! rule's key value and permits, and then the engine's decision on those limiters.
//! The request is read through [`Incoming`]: tower's and actix-web's alike.

use std::borrow::Cow;
use std::future::Future;

use http::request::Parts;
use http::HeaderName;
use redlimit_runtime::engine::{Granted, KeyBuf};
use redlimit_runtime::{Client, Error, RateLimited};
use smallvec::SmallVec;

use super::incoming::{Incoming, TowerRequest};
use super::key::MissingKey;
use super::request::{NoValue, PathParams, Value, OUTSIDE_ROUTER};
use super::shared::{Extract, KeyHeader, Keyed, Shared};
use crate::client_ip::{one_setting, ReadBy};
use crate::request::{Outer, Scope};
use crate::{ClientIp, TrustedProxies};

/// The client address when a rule is keyed by it: `Err` when the peer's is missing.
type ReadClient = Option<Result<ClientIp, &'static str>>;

/// A request's limiters, and its permits per rule when they are per request.
pub(crate) type Keys = (SmallVec<[String; 2]>, Vec<u64>);

thread_local! {
    /// The first limiter name of this thread's last request decided in process, given
    /// back by the engine: the next request's first key is written into it rather than
    /// into a new allocation.
    static NAME_BUFFER: std::cell::Cell<String> = const { std::cell::Cell::new(String::new()) };
    /// The text of this thread's last key value that was not the request's own bytes
    /// (a client address, a credential with its scheme in lower case, a lossy
    /// reading), given back once its key is written: the next one is written into it.
    static VALUE_BUFFER: std::cell::Cell<String> = const { std::cell::Cell::new(String::new()) };
}

/// The buffer for rule `i`'s key: this thread's kept one for the first.
fn key_buf(i: usize) -> KeyBuf {
    match i {
        0 => KeyBuf::reusing(NAME_BUFFER.take()),
        _ => KeyBuf::new(),
    }
}

impl Shared {
    /// `routed`: the layer is inside an axum `Router` (it wraps a route or the
    /// fallback), where a request without matched path parameters matched no route.
    /// A grant comes with the request's scope, for the inner service to run in.
    /// `outer`: the outer scope the request joins.
    pub(super) async fn decide(
        &self,
        parts: &mut Parts,
        routed: bool,
        outer: Outer,
    ) -> Result<(Granted, Scope), RateLimited> {
        let path = PathParams::read(self.needs_path, parts).await;
        let (keys, scope) = self.read(&mut TowerRequest { parts, path: &path }, routed, false, outer)?;
        Ok((self.decide_keys(keys).await?, scope))
    }

    /// The engine's decision on a request's limiters, as [`read`](Shared::read) gave them.
    pub(crate) async fn decide_keys(&self, (mut keys, permits): Keys) -> Result<Granted, RateLimited> {
        let permits = self.per_request.then_some(permits.as_slice());
        self.engine.decide(self.client.as_ref(), &mut keys, permits).await
    }

    /// [`decide`](Shared::decide) where it is called, on an in-process client without
    /// a timeout: `None`, before anything is read, when the request's path parameters
    /// are to be read (an extractor's future) or the layer has no client of its own.
    /// `request`: its parts (`TowerRequest`, with no path parameters read), or the
    /// request whole when no rule reads the head (`WholeRequest`).
    // Inlined into the service's call, which is inlined into axum's route: the
    // decision's answer is written where the call reads it.
    #[inline(always)]
    pub(super) fn decide_now<Q: Incoming>(
        &self,
        request: &mut Q,
        routed: bool,
    ) -> Option<Result<(Granted, Scope), RateLimited>> {
        let client = self
            .client
            .as_ref()
            .filter(|_| !self.needs_path || request.path_read())?;
        self.decide_on_now(client, request, routed)
    }

    /// [`decide_now`](Shared::decide_now) on `client`, the layer's, in process without
    /// a timeout, for a request whose path parameters need not be read first (an
    /// actix-web request's are at hand).
    #[inline]
    pub(crate) fn decide_on_now<Q: Incoming>(
        &self,
        client: &Client,
        request: &mut Q,
        routed: bool,
    ) -> Option<Result<(Granted, Scope), RateLimited>> {
        if self.rules.len() == 1 && self.permits_own {
            return self.decide_one_now(client, request, routed);
        }
        match self.read(request, routed, self.reads_prefixed(), Outer::Current) {
            Ok((keys, scope)) => Some(
                self.decide_keys_now(client, keys)?
                    .map(|granted| (granted, scope)),
            ),
            Err(refused) => Some(Err(refused)),
        }
    }

    /// [`decide_now`](Shared::decide_now) for a layer of one rule at its own permits,
    /// the usual one: [`read`](Shared::read) and [`decide_keys_now`](Shared::decide_keys_now)
    /// without a list of keys to carry between them.
    #[inline]
    fn decide_one_now<Q: Incoming>(
        &self,
        client: &Client,
        request: &mut Q,
        routed: bool,
    ) -> Option<Result<(Granted, Scope), RateLimited>> {
        let (client_ip, trusted) = match self.client(request) {
            Ok(read) => read,
            Err(refused) => return Some(Err(refused)),
        };
        let mut key = key_buf(0);
        let permits = match self.write_key(0, request, &self.keyed(client_ip), routed, true, &mut key) {
            Ok(Some(permits)) => permits,
            // A path parameter's rule on a request no route matched: it does not apply,
            // which the general path decides (the request goes on to the fallback).
            Ok(None) => return None,
            Err(refused) => return Some(Err(refused)),
        };
        let scope = self.scope(request, client_ip, trusted, Outer::Current);
        let mut keys = [key.finish()];
        let decided = match self.engine.decide_now(client, &mut keys, None) {
            Some(decided) => {
                NAME_BUFFER.set(std::mem::take(&mut keys[0]));
                decided
            }
            None => self.decide_keys_polled(client, (keys.into_iter().collect(), vec![permits]))?,
        };
        Some(decided.map(|granted| (granted, scope)))
    }

    /// Whether [`decide_keys_now`](Shared::decide_keys_now)'s keys are read after the
    /// prefix of the layer's client: when each rule takes its own permits wherever it
    /// applies, so that the engine's path where it is called may decide them. (The
    /// engine's general path puts the prefix in front itself.)
    fn reads_prefixed(&self) -> bool {
        self.client.is_some() && self.permits_own
    }

    /// [`decide_keys`](Shared::decide_keys) where it is called, on `client`, in
    /// process without a timeout (the layer's client), for keys [`read`](Shared::read)
    /// as [`reads_prefixed`](Shared::reads_prefixed) says: `None` if it would wait
    /// after all. Inlined where a request is read; the engine's general path out of line.
    #[inline]
    fn decide_keys_now(
        &self,
        client: &Client,
        (mut keys, permits): Keys,
    ) -> Option<Result<Granted, RateLimited>> {
        if self.permits_own {
            // Every rule at its own permits: decided where it is called. Not so a path
            // parameter's rule on a request no route matched, which takes nothing of
            // it (0 permits, which no rule takes of its own): the engine gives the keys
            // back without the prefix, for its general path.
            let own = !self.per_request
                || (permits.iter().zip(self.engine.rules())).all(|(&spent, spec)| spent == spec.permits);
            let per_request = (!own).then_some(permits.as_slice());
            if let Some(decided) = self.engine.decide_now(client, &mut keys, per_request) {
                if let Some(first) = keys.first_mut() {
                    NAME_BUFFER.set(std::mem::take(first));
                }
                return Some(decided);
            }
        }
        self.decide_keys_polled(client, (keys, permits))
    }

    /// A call the engine's general path decides (costs, shadow rules, a debug span, a
    /// path parameter's rule where no route matched), the keys given back without the
    /// prefix, polled here, out of line: in process without a timeout nothing it awaits
    /// waits. (Were it to, the request would be read and decided again on the boxed
    /// path.)
    #[inline(never)]
    fn decide_keys_polled(
        &self,
        client: &Client,
        (mut keys, permits): Keys,
    ) -> Option<Result<Granted, RateLimited>> {
        let permits = self.per_request.then_some(permits.as_slice());
        let decision = std::pin::pin!(self.engine.decide(Some(client), &mut keys, permits));
        match decision.poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
            std::task::Poll::Ready(decided) => Some(decided),
            std::task::Poll::Pending => {
                debug_assert!(false, "an in-process decision waited");
                None
            }
        }
    }

    /// The request's trusted-proxy setting, client address and keys, read; and its
    /// scope, with the client address, for the code the request runs. `prefixed`: each
    /// key is written after the prefix of the layer's client, for
    /// [`decide_keys_now`](Shared::decide_keys_now). `outer`: the outer scope the
    /// request joins.
    pub(crate) fn read<Q: Incoming>(
        &self,
        request: &mut Q,
        routed: bool,
        prefixed: bool,
        outer: Outer,
    ) -> Result<(Keys, Scope), RateLimited> {
        let (client, trusted) = self.client(request)?;
        let keys = self.keys(request, &self.keyed(client), routed, prefixed)?;
        Ok((keys, self.scope(request, client, trusted, outer)))
    }

    /// The client address for the rules' keys: when a rule is keyed by it.
    #[inline]
    fn keyed(&self, client: Result<ClientIp, &'static str>) -> ReadClient {
        self.keys_client_ip.then_some(client)
    }

    /// The scope of a request whose keys are read: the trusted-proxy setting left on
    /// the request first, when the layer leaves it (for a layer inside this one).
    #[inline]
    fn scope<Q: Incoming>(
        &self,
        request: &mut Q,
        client: Result<ClientIp, &'static str>,
        trusted: Option<TrustedProxies>,
        outer: Outer,
    ) -> Scope {
        if let Some(trusted) = trusted {
            request.leave(ReadBy {
                trusted,
                client: client.ok(),
            });
        }
        Scope::joining(client, outer)
    }

    /// The client address behind the request's one trusted-proxy setting (this layer's,
    /// an extension's or an outer layer's, which must not differ; none trusted when
    /// none is given), or why it has none; and the setting, when the layer leaves it on
    /// the request (`reads_trust`). Two settings refuse the request when a rule is keyed
    /// by the client address or the layer has its own.
    fn client<Q: Incoming>(
        &self,
        request: &Q,
    ) -> Result<(Result<ClientIp, &'static str>, Option<TrustedProxies>), RateLimited> {
        let peer = request.peer();
        if peer.is_none() && !self.reads_trust {
            // No client address without a peer, and no setting to leave: nothing
            // the settings would be read for.
            return Ok((Err(Q::NO_PEER), None));
        }
        let read = request.settings(|extension, read| {
            let setting = one_setting([self.trusted.as_ref(), extension, read.map(|read| &read.trusted)])?;
            let setting = setting.unwrap_or(&self.untrusted);
            let client = peer.map(|peer| request.client_ip(setting, peer.ip()));
            Ok((client, self.reads_trust.then(|| setting.clone())))
        });
        match read {
            Ok((client, trusted)) => Ok((client.ok_or(Q::NO_PEER), trusted)),
            Err(problem) if self.reads_trust => {
                let error = Error::InvalidConfig {
                    name: self.rules[self.trust_rule].name.to_string(),
                    problem,
                };
                Err(self.engine.refuse_misconfigured(self.trust_rule, error))
            }
            // Only the scope's client address reads it: it has none.
            Err(problem) => Ok((Err(problem), None)),
        }
    }

    /// Each rule's limiter for the request (after the client's prefix when
    /// `prefixed`), and its permits when they are per request.
    fn keys<Q: Incoming>(
        &self,
        request: &Q,
        client: &ReadClient,
        routed: bool,
        prefixed: bool,
    ) -> Result<Keys, RateLimited> {
        let mut keys = SmallVec::<[String; 2]>::new();
        let mut permits = Vec::with_capacity(if self.per_request { self.rules.len() } else { 0 });
        for i in 0..self.rules.len() {
            let mut key = key_buf(i);
            let spent = self.write_key(i, request, client, routed, prefixed, &mut key)?;
            keys.push(key.finish());
            if self.per_request || spent.is_none() {
                permits.push(spent.unwrap_or(0));
            }
        }
        Ok((keys, permits))
    }

    /// Rule `i`'s limiter for the request, written into `key` (after the client's
    /// prefix when `prefixed`); its permits when they are per request, `None` when
    /// the request matched no route (the rule does not apply to it).
    #[inline]
    fn write_key<Q: Incoming>(
        &self,
        i: usize,
        request: &Q,
        client: &ReadClient,
        routed: bool,
        prefixed: bool,
        key: &mut KeyBuf,
    ) -> Result<Option<u64>, RateLimited> {
        let (rule, spec) = (&self.rules[i], &self.engine.rules()[i]);
        let (alone, keyed_start) = match prefixed {
            true => (&*rule.prefixed.0, &*rule.prefixed.1),
            false => (&*rule.name, &*rule.keyed_start),
        };
        let problem = match rule.key.value(request, client) {
            Ok(value) => Ok(value),
            // No route matched: the request goes on to the router's fallback (404),
            // as without the layer; the other rules still apply.
            Err(NoValue::NotRouted) if routed => {
                key.text(alone);
                return Ok(None);
            }
            Err(NoValue::NotRouted) => Err(OUTSIDE_ROUTER),
            Err(NoValue::Misconfigured(problem)) => Err(problem),
            Err(NoValue::Repeated) => {
                let error = Error::RepeatedKey {
                    rule: rule.name.to_string(),
                    what: match &rule.key {
                        Extract::Header(name) | Extract::Credential(name) => format!("the {name} header"),
                        _ => "its key".to_owned(),
                    },
                };
                return Err(self.engine.refuse_without_key(i, error));
            }
        };
        let value = match problem {
            Ok(value) => value,
            Err(problem) => {
                let error = Error::InvalidConfig {
                    name: rule.name.to_string(),
                    problem,
                };
                return Err(self.engine.refuse_misconfigured(i, error));
            }
        };
        if rule.missing.is_some() {
            self.refuse_missing(i, rule, value.as_ref())?;
        }
        // A header that is not UTF-8 keys by its bytes (its text above is lossy, for
        // the missing-value check only): two such values never share a limiter, nor
        // one with a value that is UTF-8.
        let raw = match &value {
            // Only an owned value may be a lossy reading, which holds U+FFFD where
            // the bytes were not UTF-8 (an owned credential's text is the header's, a
            // client address's ASCII).
            Some(Cow::Owned(text)) if !text.is_ascii() && text.contains(char::REPLACEMENT_CHARACTER) => {
                rule.key.not_utf8(request)
            }
            _ => None,
        };
        match &value {
            Some(value) => {
                key.text(keyed_start);
                match &raw {
                    // No value: every such request shares the rule's one limiter of
                    // the empty value, however it is spelled.
                    None if blank(value) => key.value_str(""),
                    Some(bytes) if rule.secret => key.value_digest(bytes),
                    None if rule.secret => key.value_digest(value.as_bytes()),
                    Some(bytes) => key.value_bytes(bytes),
                    None => key.value_str(value),
                }
            }
            None => key.text(alone),
        }
        if !self.per_request {
            recycle(value);
            return Ok(Some(spec.permits));
        }
        let exempt = raw.is_none() && value.as_ref().is_some_and(|v| rule.exempt.contains(&**v));
        recycle(value);
        Ok(Some(match (&rule.cost, exempt) {
            (_, true) => 0,
            (Some(cost), false) => cost(request.head()).max(1),
            (None, false) => spec.permits,
        }))
    }

    /// The refusal of a request without a value for rule `i`, when the rule refuses
    /// those (`missing_key`): an empty or all-whitespace value is none.
    fn refuse_missing(
        &self,
        i: usize,
        rule: &Keyed,
        value: Option<&Cow<'_, str>>,
    ) -> Result<(), RateLimited> {
        if let (Some((what, refuse)), Some(value)) = (&rule.missing, value) {
            if blank(value) {
                let error = Error::MissingKey {
                    rule: rule.name.to_string(),
                    what: what.clone(),
                    unauthorized: *refuse == MissingKey::Unauthorized,
                };
                return Err(self.engine.refuse_without_key(i, error));
            }
        }
        Ok(())
    }
}

/// Whether a key's value is none: empty, or whitespace only (any of Unicode's, as
/// `str::trim` reads it: a no-break space is no value either). (A value usually
/// starts with a visible ASCII character, which no whitespace is: read first.)
#[inline]
fn blank(value: &str) -> bool {
    match value.as_bytes().first() {
        Some(&first) if first > b' ' && first.is_ascii() => false,
        _ => value.trim().is_empty(),
    }
}

/// A gRPC binary header's value (a name ending `-bin`) without its base64 padding:
/// tonic decodes it with or without, so `YQ==` and `YQ` are one value. (Looked for
/// only in a value ending `=`.)
#[inline]
pub(super) fn unpadded<'a>(name: &HeaderName, text: &'a str) -> &'a str {
    match text.ends_with('=') && name.as_str().ends_with("-bin") {
        true => text.trim_end_matches('='),
        false => text,
    }
}

/// An `Authorization` or `Proxy-Authorization` value ([`Extract::Credential`]) as one
/// credential: its scheme in lower case (schemes are case-insensitive) and one space
/// before the rest, however many spaces or tabs came there, so that `Bearer t`,
/// `bearer t` and `BEARER\tt`, one token to the application reading it, are one value.
/// A value without a space as it is.
pub(super) fn credentials(text: &str) -> Cow<'_, str> {
    let Some((gap, after)) = credential_gap(text.as_bytes()) else {
        return Cow::Borrowed(text);
    };
    // Usually `Bearer`: written into this thread's buffer, given back once the key is.
    // (Spaces and tabs are ASCII: the text is cut where the bytes are.)
    let mut credential = VALUE_BUFFER.take();
    credential.clear();
    credential.push_str(&text[..gap]);
    credential.make_ascii_lowercase();
    credential.push(' ');
    credential.push_str(&text[after..]);
    Cow::Owned(credential)
}

/// [`credentials`] for a value that is not UTF-8, read as its bytes.
fn credential_bytes(bytes: &[u8]) -> Cow<'_, [u8]> {
    let Some((gap, after)) = credential_gap(bytes) else {
        return Cow::Borrowed(bytes);
    };
    let mut credential = bytes[..gap].to_ascii_lowercase();
    credential.push(b' ');
    credential.extend_from_slice(&bytes[after..]);
    Cow::Owned(credential)
}

/// Where a credential's scheme ends and its rest starts (the spaces and tabs between),
/// when it is not already written with its scheme in lower case and one space.
#[inline]
fn credential_gap(bytes: &[u8]) -> Option<(usize, usize)> {
    let gap_byte = |b: &u8| *b == b' ' || *b == b'\t';
    let gap = bytes.iter().position(gap_byte)?;
    let after = bytes[gap..]
        .iter()
        .position(|b| !gap_byte(b))
        .map_or(bytes.len(), |n| gap + n);
    let spelled = !bytes[..gap].iter().any(u8::is_ascii_uppercase) && after - gap == 1 && bytes[gap] == b' ';
    (!spelled).then_some((gap, after))
}

/// A key's value once its key is written: an owned one's room kept for the next,
/// unless a long header made it large.
#[inline]
fn recycle(value: Option<Cow<'_, str>>) {
    if let Some(Cow::Owned(text)) = value {
        if text.capacity() <= 1024 {
            VALUE_BUFFER.set(text);
        }
    }
}

/// The one line of header `name` a request sends (empty when none), read by `read`
/// when it is text; a header sent twice has no one value: keying by either line would
/// let a client choose, among values an application may read the other way, the one
/// that is limited.
#[inline]
fn header_value<'a, Q: Incoming>(
    request: &'a Q,
    name: &KeyHeader,
    read: impl FnOnce(&'a str) -> Cow<'a, str>,
) -> Value<'a> {
    let mut lines = request.lines(name);
    let first = lines.next();
    if lines.next().is_some() {
        return Err(NoValue::Repeated);
    }
    Ok(Some(
        first
            .map(|line| match line.text() {
                Some(text) => read(text),
                None => String::from_utf8_lossy(line.bytes),
            })
            .unwrap_or_default(),
    ))
}

impl Extract {
    /// The bytes of a header this key reads when they are not UTF-8 (a credential's
    /// read as [`credentials`] reads text).
    fn not_utf8<'a, Q: Incoming>(&self, request: &'a Q) -> Option<Cow<'a, [u8]>> {
        let (Extract::Header(name) | Extract::Credential(name)) = self else {
            return None;
        };
        let line = request.lines(name).next().filter(|line| line.text().is_none())?;
        Some(match self {
            Extract::Credential(_) => credential_bytes(line.bytes),
            _ => Cow::Borrowed(line.bytes),
        })
    }

    /// This key's value for the request.
    fn value<'a, Q: Incoming>(&self, request: &'a Q, client: &ReadClient) -> Value<'a> {
        match self {
            Extract::Global => Ok(None),
            Extract::ClientIp => match client {
                Some(Ok(client)) => {
                    let mut text = VALUE_BUFFER.take();
                    text.clear();
                    client.write_text(&mut text);
                    Ok(Some(Cow::Owned(text)))
                }
                Some(Err(problem)) => Err(NoValue::Misconfigured(problem)),
                None => Err(NoValue::Misconfigured(Q::NO_PEER)),
            },
            Extract::Header(name) => header_value(request, name, |text| Cow::Borrowed(unpadded(name, text))),
            Extract::Credential(name) => header_value(request, name, credentials),
            #[cfg(any(feature = "axum", feature = "actix"))]
            Extract::PathParam(name) => request.path_param(name),
            Extract::With(f) => Ok(Some(Cow::Owned(f(request.head()).unwrap_or_default()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A credential's scheme in lower case and one space before the rest, written
    /// into this thread's buffer one after another: each as if it were the first.
    #[test]
    fn credentials_read_one_spelling_each_whatever_came_before() {
        let cases = [
            ("Bearer tok", "bearer tok"),
            ("bearer tok", "bearer tok"),
            ("BEARER \t  tok", "bearer tok"),
            ("Basic\tdXNlcjpwYXNz", "basic dXNlcjpwYXNz"),
            ("token", "token"),
            ("Token", "Token"),
            ("Bearer", "Bearer"),
            ("Bearer ", "bearer "),
            ("Bearer TOK with Spaces", "bearer TOK with Spaces"),
            ("Négociation jeton", "négociation jeton"),
            (
                "AWS4-HMAC-SHA256 Credential=AKIA/x, Signature=Ab",
                "aws4-hmac-sha256 Credential=AKIA/x, Signature=Ab",
            ),
        ];
        for _ in 0..2 {
            for (sent, read) in cases {
                let value = credentials(sent);
                assert_eq!(value, read, "{sent:?}");
                // A value that is not UTF-8 is read the same way, as bytes.
                assert_eq!(credential_bytes(sent.as_bytes()), read.as_bytes(), "{sent:?}");
                recycle(Some(value));
            }
        }
    }
}
