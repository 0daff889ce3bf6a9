//! Errors: backend failures and misuse. Being limited is not an error (see
//! [`Decision`](crate::Decision)).

use std::time::Duration;

/// The oldest servers supported, as errors name them (the versions the Redis backend
/// checks on connect; a test there holds the two together).
pub(crate) const SUPPORTED_SERVERS: &str = "Redis 6.2.0 or later, or Valkey 7.2.0 or later";

/// What went wrong talking to the limiter's state, or how it was misused.
///
/// Every message names the limiter or key concerned and says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The limiter has no config: Redisson's `RateLimiter is not initialized`.
    #[error(
        "rate limiter `{name}` is not initialized (RateLimiter is not initialized): \
         call try_set_rate or set_rate first, or decide it with a Rule, which creates the config",
        name = crate::keys::shown(.name)
    )]
    NotInitialized {
        /// The limiter's name (its config key).
        name: String,
    },

    /// More permits were asked for than the limiter's rate can ever grant.
    #[error(
        "rate limiter `{name}`: {permits} permits requested but the rate is {rate} \
         (Requested permits amount cannot exceed defined rate); ask for at most {rate}",
        name = crate::keys::shown(.name)
    )]
    PermitsExceedRate {
        /// The limiter's name.
        name: String,
        /// Permits asked for.
        permits: u64,
        /// The limiter's rate, when known.
        rate: u64,
    },

    /// More permits were asked for than a token bucket can ever hold.
    #[error(
        "token bucket `{name}`: {permits} permits requested but it holds at most {burst} tokens; ask for at most {burst}, or give it a larger burst",
        name = crate::keys::shown(.name)
    )]
    PermitsExceedBurst {
        /// The limiter's name.
        name: String,
        /// Permits asked for.
        permits: u64,
        /// The bucket's capacity.
        burst: u64,
    },

    /// A call of more rules than one call decides
    /// ([`MAX_RULES_PER_CALL`](crate::MAX_RULES_PER_CALL)): in Redis one call is one
    /// script run, which holds the server while it runs.
    #[error(
        "a call of {rules} rules: one call decides at most {most}, as one script run (on a cluster, one \
         per slot) that holds Redis while it runs; decide them in calls of at most {most} rules"
    )]
    TooManyRules {
        /// The rules the call named.
        rules: usize,
        /// The most a call decides.
        most: usize,
    },

    /// A rule on a name that is one hash tag and nothing else, `{N}`: Redisson's layout
    /// keeps its value, log and bucket in the keys of the name `N` (`{N}:value` and so
    /// on; only the configs differ, `{N}` and `N`), so that a rule on `N`, under a config
    /// of its own, would count the same permits: called on either, it spent or gave back
    /// the other's. Refused for rules (the attribute's, the layer's, `check_rules`,
    /// `reserve`); the handles (`RateLimiter`, `TokenBucket`) take such a name, as
    /// Redisson does.
    #[error(
        "rate limiter `{name}`: a name that is one hash tag and nothing else keeps its permits in the keys \
         of `{other}` (`{name}:value` and the rest, in Redisson's layout), which a rule on `{other}` would \
         count under a config of its own; name it `{other}`: the same keys, in the same cluster slot",
        name = crate::keys::shown(.name), other = crate::keys::shown(.other)
    )]
    SharedKeys {
        /// The name that is one hash tag.
        name: String,
        /// The name without it.
        other: String,
    },

    /// Zero permits were asked for.
    #[error("rate limiter `{name}`: 0 permits requested; ask for at least 1", name = crate::keys::shown(.name))]
    ZeroPermits {
        /// The limiter's name.
        name: String,
    },

    /// A rate, interval or keep-alive out of range.
    #[error("rate limiter `{name}`: invalid configuration: {problem}", name = crate::keys::shown(.name), problem = crate::keys::shown(.problem))]
    InvalidConfig {
        /// The limiter's name.
        name: String,
        /// What is wrong and what is accepted.
        problem: &'static str,
    },

    /// A limiter name whose keys would fall into different Redis Cluster slots.
    #[error(
        "rate limiter name `{name}` would split its keys across cluster slots ({reason}); \
         use a name without braces, or one with a non-empty {{hash tag}} such as `{{user:42}}:orders`",
        name = crate::keys::shown(.name), reason = crate::keys::shown(.reason)
    )]
    CrossSlotName {
        /// The rejected name.
        name: String,
        /// Why its keys would not share a slot.
        reason: &'static str,
    },

    /// A key exists with a type the layout does not use there.
    #[error(
        "key `{key}` holds the wrong Redis type for a rate limiter's {role} ({detail}); \
         another program wrote it: delete it or choose another limiter name",
        key = crate::keys::shown(.key), detail = crate::keys::shown(.detail)
    )]
    WrongType {
        /// The key.
        key: String,
        /// Its role: config, value or permits.
        role: &'static str,
        /// What Redis reported.
        detail: String,
    },

    /// A write of a limiter (setting its rate, keep-alive or TTL, deleting it) found
    /// a key that is not a rate limiter's: another program's data, or one of this
    /// library's own keys. Nothing was written. A misuse, not a backend failure.
    #[error(
        "key `{key}` is not a rate limiter's {role}: it {found}; nothing was written \
         (a limiter's config is a hash with fields rate, interval and type, a token \
         bucket's state a string rate:interval:burst:tokens:at); choose another limiter name",
        key = crate::keys::shown(.key), found = crate::keys::shown(.found)
    )]
    NotALimiter {
        /// The key.
        key: String,
        /// What the write took it for: config, value, permits or bucket.
        role: &'static str,
        /// What it holds.
        found: String,
    },

    /// A config hash field holds something that is not a valid value.
    #[error(
        "config `{key}` has field `{field}` = {value:?}, which is not valid \
         (rate and interval: integers >= 1, type: 0 or 1, keepAliveTime: integer >= 0); \
         fix it with set_rate or delete the limiter",
        key = crate::keys::shown(.key)
    )]
    CorruptConfig {
        /// The config key.
        key: String,
        /// The field.
        field: &'static str,
        /// Its stored value.
        value: String,
    },

    /// The available-permits key holds something that is not an integer.
    #[error(
        "key `{key}` should hold the available permits as an integer but holds {value:?}; \
         delete it (the log rebuilds it) or call set_rate",
        key = crate::keys::shown(.key)
    )]
    CorruptValue {
        /// The value key.
        key: String,
        /// What it holds.
        value: String,
    },

    /// A token bucket's key does not hold `rate:interval:burst:tokens:at`.
    #[error(
        "token bucket key `{key}` holds {detail:?}, not a token bucket's state \
         (rate:interval:burst:tokens:at); delete it (a missing bucket is a full one)",
        key = crate::keys::shown(.key)
    )]
    CorruptBucket {
        /// The bucket key.
        key: String,
        /// The field and what it holds.
        detail: String,
    },

    /// A permits log member does not decode (for example a Redisson 3.13-3.16 member).
    #[error(
        "permits log `{key}` holds a member that does not decode ({detail}); it was written \
         by an incompatible client (Redisson before 3.17?): delete the limiter or call set_rate",
        key = crate::keys::shown(.key), detail = crate::keys::shown(.detail)
    )]
    CorruptMember {
        /// The log key.
        key: String,
        /// What is wrong with it.
        detail: String,
    },

    /// Redis did not answer a command within the command timeout.
    #[error(
        "Redis did not answer within {after:?} (the command timeout){while_connecting}; \
         check the server, or raise the timeout with ClientBuilder::command_timeout",
        while_connecting = while_connecting(.connecting)
    )]
    Timeout {
        /// The timeout that elapsed.
        after: Duration,
        /// Whether no connection had answered since the client was made or since the
        /// last failure: the time went to connecting (see also
        /// [`ClientBuilder::connect_timeout`](crate::ClientBuilder::connect_timeout)).
        connecting: bool,
    },

    /// No connection could be established within the connect timeout.
    #[error(
        "no connection to Redis at `{target}` within {after:?} (the connect timeout); \
         check the host, port and network, or raise it with ClientBuilder::connect_timeout"
    )]
    ConnectTimeout {
        /// The server, password hidden.
        target: String,
        /// The timeout that elapsed.
        after: Duration,
    },

    /// The server could not be reached: connection refused or reset, or its name did
    /// not resolve.
    #[error(
        "cannot reach Redis at `{target}`: {detail}; check the host and port in the URL \
         and that redis-server is running and reachable there",
        detail = crate::keys::shown(.detail)
    )]
    Unreachable {
        /// The server, password hidden.
        target: String,
        /// What the operating system reported.
        detail: String,
    },

    /// The server refused the credentials, or requires some and none were given.
    #[error(
        "Redis at `{target}` refused the connection's credentials ({detail}); put the right \
         user and password in the URL: redis://[user]:password@host:port/",
        detail = crate::keys::shown(.detail)
    )]
    AuthFailed {
        /// The server, password hidden.
        target: String,
        /// What the server said, in words (no password given, or one refused).
        detail: String,
    },

    /// The URL names a database the server does not have.
    #[error(
        "Redis at `{target}` has no such database ({detail}); use a database number \
         below the server's `databases` setting (16 by default) in the URL's path",
        detail = crate::keys::shown(.detail)
    )]
    UnknownDatabase {
        /// The server, password hidden.
        target: String,
        /// What the server answered.
        detail: String,
    },

    /// The TLS handshake failed (untrusted or mismatched certificate, TLS not enabled
    /// on the server's port, ...).
    #[error(
        "TLS handshake with Redis at `{target}` failed: {detail}; check that the port \
         serves TLS, trust its CA with ClientBuilder::tls_ca_cert, or for a development \
         server with a self-signed certificate append #insecure to the URL",
        detail = crate::keys::shown(.detail)
    )]
    Tls {
        /// The server, password hidden.
        target: String,
        /// What the TLS layer reported.
        detail: String,
    },

    /// The server answered, but not in Redis's protocol (RESP): the URL names a port
    /// that another kind of server listens on (HTTP, say).
    #[error(
        "the server at `{target}` is not a Redis server: it does not answer in Redis's \
         protocol ({detail}); check the host and port in the URL",
        detail = crate::keys::shown(.detail)
    )]
    NotRedis {
        /// The server, password hidden.
        target: String,
        /// What the parser reported.
        detail: String,
    },

    /// The server is not the kind the URL names: a `redis+cluster://` URL's server is
    /// no cluster node, or a `redis+sentinel://` URL's is no sentinel. It lasts until
    /// the URL is changed: not transient, so `on_error = "allow"` decides in process.
    #[error(
        "the server at `{target}` is not the kind its URL names: {detail}; check the URL's \
         scheme and addresses",
        detail = crate::keys::shown(.detail)
    )]
    WrongServer {
        /// The server, password hidden.
        target: String,
        /// What it is, and the URL it takes.
        detail: String,
    },

    /// The backend failed in another way (an error reply, a protocol error, ...).
    #[error("Redis backend failed: {detail}; check that the server is reachable and healthy", detail = crate::keys::shown(.detail))]
    Backend {
        /// What redis-rs reported, any password removed.
        detail: String,
    },

    /// A client setting out of range (what is wrong and what is accepted).
    #[error("ClientBuilder::{setting}: {problem}", problem = crate::keys::shown(.problem))]
    InvalidSetting {
        /// The builder's method.
        setting: &'static str,
        /// What is wrong and what is accepted.
        problem: String,
    },

    /// A grant the master made that fewer replicas than
    /// [`ClientBuilder::wait_for_replicas`](crate::ClientBuilder::wait_for_replicas)
    /// asks for acknowledged within its timeout: a failover now could lose it. The
    /// permits stay taken on the master; `on_error` decides the call.
    #[error(
        "Redis at `{target}` granted, but {acknowledged} of the {wanted} replicas asked for \
         acknowledged the grant within {after:?}; check the replicas' links, or lower \
         ClientBuilder::wait_for_replicas"
    )]
    NotReplicated {
        /// The server, password hidden.
        target: String,
        /// The replicas asked for.
        wanted: u32,
        /// The replicas `WAIT` counted by the call's deadline (0 when it had not
        /// answered by then).
        acknowledged: u64,
        /// How long the master waited.
        after: Duration,
    },

    /// A call [`ClientBuilder::wait_for_replicas`](crate::ClientBuilder::wait_for_replicas)
    /// waits for that no connection of the client's waits could take within the
    /// replicas' timeout, each busy waiting for replicas for other calls: it was not
    /// sent, and took no permit; `on_error` decides the call.
    #[error(
        "Redis at `{target}`: all {connections} connections that wait for replicas stayed \
         busy for {after:?}, so the call was not sent and took no permit; the replicas are \
         slow or cut off: check their links (INFO replication on the master)"
    )]
    ReplicaWaitsBusy {
        /// The server, password hidden.
        target: String,
        /// The connections a client waits for replicas on.
        connections: usize,
        /// How long the call waited for one (the replicas' timeout).
        after: Duration,
    },

    /// The server is full and refuses writes (`OOM`: used memory over `maxmemory` under
    /// the `noeviction` policy): no grant can be recorded until memory is freed.
    #[error(
        "Redis at `{target}` is out of memory and refuses writes ({detail}): no grant can be \
         recorded; add memory or raise maxmemory, keeping maxmemory-policy noeviction \
         (an evicting policy would forget limits instead; see RELIABILITY.md)",
        detail = crate::keys::shown(.detail)
    )]
    OutOfMemory {
        /// The server, password hidden.
        target: String,
        /// What the server answered.
        detail: String,
    },

    /// The server is a replica (`READONLY`): the URL names a node that is not, or is no
    /// longer, the master. Behind Sentinel the next command asks the sentinels again;
    /// with a plain URL it lasts until someone changes the URL, so `on_error =
    /// "allow"` decides such calls in process rather than letting them through.
    #[error(
        "Redis at `{target}` is a read-only replica and cannot take a grant; point the URL at \
         the master, or use redis+sentinel:// to follow failovers"
    )]
    ReadOnlyReplica {
        /// The server, password hidden.
        target: String,
    },

    /// The connection's ACL user may not run a command the scripts need, or touch the
    /// limiter's keys.
    #[error(
        "Redis at `{target}` refused a command for the connection's user ({detail}); give the \
         user the commands the scripts run and the limiter's keys, for example \
         `ACL SETUSER <user> ~rate_limit:* ~{{rate_limit:* +@read +@write +@scripting +ping +time +info +config|get +client|setname` \
         for the default prefix (docs/operating.md explains it)",
        detail = crate::keys::shown(.detail)
    )]
    NoPermission {
        /// The server, password hidden.
        target: String,
        /// What the server answered (NOPERM, and the command when it says which).
        detail: String,
    },

    /// The server is older than the scripts need (or would not say its version).
    #[error(
        "Redis at `{target}` is {found}, and redlimit needs {needed}; upgrade the server \
         (the README's compatibility table lists the servers tested)",
        needed = SUPPORTED_SERVERS,
        found = crate::keys::shown(.found)
    )]
    UnsupportedServer {
        /// The server, password hidden.
        target: String,
        /// The server and version found (`Redis 6.0.20`).
        found: String,
    },

    /// A script answered something this version of the crate does not understand.
    /// The client makes its connection again (at most once a second): a connection
    /// out of step hands each command another's reply.
    #[error(
        "{script} answered an unexpected reply ({reply}); another program may have \
         loaded a different script under the same SHA, or the server is not Redis-compatible",
        reply = crate::keys::shown(.reply)
    )]
    UnexpectedReply {
        /// The script.
        script: &'static str,
        /// The reply, abbreviated.
        reply: String,
    },

    /// A run-time rate override that a rule it reaches cannot take (a rate below the
    /// permits the rule takes per call, or outside what its token bucket counts).
    #[error(
        "the override {of} cannot apply to rule `{rule}`: {reason}; set a rate and interval the rule can \
         take (the rule's own checks), or remove the override"
    )]
    UnusableOverride {
        /// The override: `rule:<name>` or `key:<limiter>`.
        of: String,
        /// The rule it reaches.
        rule: String,
        /// The rule's check that fails (its message, which shows names escaped already).
        reason: String,
    },

    /// Two rules of this process, of different shapes, that can produce one limiter
    /// name: a value passed to one would reach the limiters of the other.
    #[error(
        "rules `{rule}` (limiters `{shape}`) and `{other}` (limiters `{other_shape}`) can produce the same \
         Redis key from different values (one's limiter name, or a key a limiter keeps beside its config), \
         so a value passed to one reaches the keys of the other; \
         give one of them a literal segment of its own (`login:user:{{user}}`), or name the values alike if \
         they are the same value; both refuse every call until then",
        other = crate::keys::shown(.other)
    )]
    OverlappingRules {
        /// The rule refused (the other is refused too).
        rule: String,
        /// Its limiter names, prefix included, values by placeholder name.
        shape: String,
        /// The rule it overlaps.
        other: String,
        /// That rule's limiter names.
        other_shape: String,
    },

    /// A URL that cannot name a Redis server.
    #[error(
        "invalid Redis URL `{url}`: {detail}; expected redis://[user:password@]host[:port][/db], \
         rediss://... for TLS, redis+cluster://host:port,host:port/, or \
         redis+sentinel://[user:password@]host:port[,host:port...]/master_name[/db]",
        detail = crate::keys::shown(.detail)
    )]
    InvalidUrl {
        /// The URL given, password hidden.
        url: String,
        /// What the parser reported.
        detail: String,
    },

    /// The in-process backend holds its maximum of limiters and none has expired, so
    /// a decision that needs a new one is refused (the limiters held are kept: none is
    /// dropped early to make room). Not a backend failure: `on_error` does not apply,
    /// the call is refused.
    #[error(
        "in-process rate limiter full: it holds its maximum of {max} live limiters, so the new \
         limiter `{name}` is refused until idle ones expire; raise ClientBuilder::max_limiters \
         if this many keys are expected",
        name = crate::keys::shown(.name)
    )]
    MemoryFull {
        /// The limiter that could not be created.
        name: String,
        /// The bound (`ClientBuilder::max_limiters`).
        max: usize,
    },

    /// `set_default` was called after a default client was set or first used.
    #[error(
        "a default client is already in place (set earlier, or resolved from REDIS_URL on first use); \
         call redlimit::set_default once, before the first rate-limited call"
    )]
    DefaultAlreadySet,

    /// A request without a value for a layer rule's key, under a rule that refuses
    /// such requests rather than sharing one limiter among them. Not a backend
    /// failure: answered 400 (or 401) with `what` in the body.
    #[error("rule `{rule}` refuses requests without {what}", what = crate::keys::shown(.what))]
    MissingKey {
        /// The rule.
        rule: String,
        /// What the request lacks, for the client: `the x-api-key header`.
        what: String,
        /// Answered 401 Unauthorized rather than 400 Bad Request.
        unauthorized: bool,
    },

    /// A call whose key names a value of the request the layer serves
    /// (`{request.client_ip}`, `{request.identity}`) that it does not have: a call
    /// outside any request, a request without an identity, a server without the
    /// peer's address. Not a backend failure: the call is refused, never given a
    /// shared key.
    #[error("rule `{rule}` keys by {value}, which this call does not have: {reason}", value = crate::keys::shown(.value), reason = crate::keys::shown(.reason))]
    MissingRequestValue {
        /// The rule (its key template).
        rule: String,
        /// The value the key names: `the request's identity ({request.identity})`.
        value: &'static str,
        /// Why it is missing, and what to change.
        reason: &'static str,
    },

    /// A request that sends a layer rule's key header more than once: it has no one
    /// value (keying by the first line would let the client choose which value is
    /// limited, where the application may read another). Not a backend failure:
    /// answered 400 with `what` in the body; nothing is spent.
    #[error("rule `{rule}` refuses requests that send {what} more than once", what = crate::keys::shown(.what))]
    RepeatedKey {
        /// The rule.
        rule: String,
        /// What the request repeats, for the client: `the x-api-key header`.
        what: String,
    },

    /// A reservation asked or settled with what it cannot take (what is wrong and
    /// what is accepted): a rule that batches, two rules on one limiter of which one
    /// is settled, a settle with one amount too many or too few. Nothing is spent.
    #[error("reservation on `{name}`: {problem}", name = crate::keys::shown(.name), problem = crate::keys::shown(.problem))]
    InvalidReservation {
        /// The limiter concerned.
        name: String,
        /// What is wrong and what is accepted.
        problem: String,
    },
}

fn while_connecting(connecting: &bool) -> &'static str {
    if *connecting {
        ", no connection having answered yet (connecting is bounded by ClientBuilder::connect_timeout)"
    } else {
        ""
    }
}

impl Error {
    /// True for the backend failures an outage causes, which pass by themselves (a
    /// timeout, a server unreachable or answering errors), as opposed to those that
    /// last until someone acts: credentials refused, an unknown database, state that is
    /// not a limiter's, a reply the scripts never send (a server that is not
    /// Redis-compatible, or something between it and the client that changes replies).
    /// `on_error = "allow"` lets calls through on transient failures only, and decides
    /// the others in process, as `"local"` does: no key another program writes, no
    /// server that answers what it should not, and no configuration mistake switches
    /// a limit off.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Timeout { .. }
                | Error::ConnectTimeout { .. }
                | Error::Unreachable { .. }
                | Error::Tls { .. }
                | Error::Backend { .. }
                | Error::NotReplicated { .. }
                | Error::ReplicaWaitsBusy { .. }
        )
    }

    /// True for failures of the backend itself (unreachable, hung, refusing the
    /// credentials, answering with errors or holding corrupt state), as opposed to a
    /// misuse of the API. The attribute's `on_error` policy applies to these and only
    /// these; a misuse refuses the call (it never lets it through unlimited).
    pub fn is_backend_failure(&self) -> bool {
        matches!(
            self,
            Error::Timeout { .. }
                | Error::ConnectTimeout { .. }
                | Error::Unreachable { .. }
                | Error::AuthFailed { .. }
                | Error::UnknownDatabase { .. }
                | Error::Tls { .. }
                | Error::NotRedis { .. }
                | Error::WrongServer { .. }
                | Error::Backend { .. }
                | Error::UnsupportedServer { .. }
                | Error::OutOfMemory { .. }
                | Error::NoPermission { .. }
                | Error::ReadOnlyReplica { .. }
                | Error::UnexpectedReply { .. }
                | Error::NotReplicated { .. }
                | Error::ReplicaWaitsBusy { .. }
                | Error::WrongType { .. }
                | Error::CorruptConfig { .. }
                | Error::CorruptValue { .. }
                | Error::CorruptBucket { .. }
                | Error::CorruptMember { .. }
        )
    }
}

/// A stored text an error quotes, as the error keeps it: [`cut`] to 200 bytes (the
/// scripts quote 64 and the length; a server not ours may send any, and a config read
/// whole may hold any).
pub(crate) fn quoted(text: &str) -> String {
    cut(text, 200)
}

/// `text`'s first `most` bytes (on a character boundary) and `...` when it is
/// longer, copied no further.
pub(crate) fn cut(text: &str, most: usize) -> String {
    if text.len() <= most {
        return text.to_owned();
    }
    let mut end = most;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}
