//! One of the scripts as Redis runs it: called by its SHA1 (`EVALSHA`), and loaded
//! (`SCRIPT LOAD`) when the server answers that it does not have it (`NOSCRIPT`, after
//! a restart or `SCRIPT FLUSH`), the load's reply checked. A load answered with another
//! SHA1 (a connection out of step hands a command another's reply) is an
//! [`ErrorKind::UnexpectedReturnType`], which the client reads as a reply that does not
//! fit: the script is not called again on the strength of it.

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisError, RedisResult, ServerErrorKind, ToRedisArgs, Value};

use super::connection::Conn;
use super::nodes::{primary_of, SlotMap};
use crate::keys::hash_slot;

/// A script's source and SHA1.
pub(crate) struct Lua {
    source: &'static str,
    hash: String,
}

impl Lua {
    pub fn new(source: &'static str) -> Lua {
        Lua {
            source,
            hash: redis::Script::new(source).get_hash().to_owned(),
        }
    }

    /// The SHA1 of its source, as `EVALSHA` names it.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// A call of the script, its keys and arguments to be given.
    pub fn prepare_invoke(&self) -> Invocation<'_> {
        Invocation {
            lua: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    /// Loads it into the server's script cache: an error if the server answers with
    /// another SHA1 than its own.
    pub async fn load(&self, conn: &mut impl ConnectionLike) -> RedisResult<()> {
        let hash: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(self.source)
            .query_async(conn)
            .await?;
        self.loaded_as(hash)
    }

    /// [`load`](Lua::load)s it where `call` (an `EVALSHA` of it) goes: on a Redis
    /// Cluster whose slot map (`slots`, the client's own) names a primary for its
    /// first key's slot, into the primary the cluster's client routes the slot to
    /// only; anywhere else as the connection sends a `SCRIPT LOAD` (a cluster's
    /// client, to every node, waiting for each: one that hangs holds every load, and
    /// the call, for the command timeout). A slot the map does not name has the map
    /// read soon, for the next load. The primary is asked first whether it is a
    /// cluster node (`CLUSTER MYID`), one round trip more on a script missing only.
    ///
    /// (Not before the client's map names the slot: while the cluster's client has no
    /// slot map it sends a routed command to a connection of its choosing, so a
    /// cluster URL on a single server would be served, where the load to every node
    /// fails and the client says the server is no cluster node. The client's map is
    /// read only from a cluster that answers it.)
    pub async fn load_for(&self, call: &Cmd, conn: &mut Conn, slots: Option<SlotMap<'_>>) -> RedisResult<()> {
        let slot = first_key(call).map(hash_slot);
        let named = match (slots, slot) {
            (Some(slots), Some(slot)) => slots.names(slot, conn),
            _ => false,
        };
        let (Conn::Cluster(cluster), Some(slot), true) = (&mut *conn, slot, named) else {
            return self.load(conn).await;
        };
        let primary = primary_of(slot);
        // A node that is no cluster's (a single server put in its place since the map
        // was read) is not loaded into: loaded into every node, the load fails, and
        // the client says the server is no cluster node.
        let id = cluster
            .route_command(redis::cmd("CLUSTER").arg("MYID").clone(), primary.clone())
            .await;
        if !matches!(id, Ok(Value::BulkString(_) | Value::SimpleString(_))) {
            return self.load(conn).await;
        }
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(self.source);
        // (a routed command's error reply comes as a value)
        let hash = match cluster.route_command(load, primary).await?.extract_error()? {
            Value::BulkString(hash) => String::from_utf8_lossy(&hash).into_owned(),
            Value::SimpleString(hash) => hash,
            other => format!("{other:?}"),
        };
        self.loaded_as(hash)
    }

    /// `call`, an `EVALSHA` of it, as an `EVAL` of its source (which caches it where
    /// it runs).
    fn eval(&self, call: &Cmd) -> Cmd {
        let mut eval = redis::cmd("EVAL");
        eval.arg(self.source);
        for arg in call.args_iter().skip(2) {
            if let redis::Arg::Simple(arg) = arg {
                eval.arg(arg);
            }
        }
        eval
    }

    /// What a load answered with `hash`.
    fn loaded_as(&self, hash: String) -> RedisResult<()> {
        if hash != self.hash {
            return Err(RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "SCRIPT LOAD answered another SHA1 than the script's",
                hash,
            )));
        }
        Ok(())
    }
}

/// The first key of `call`, an `EVALSHA sha numkeys key...`; `None` without keys.
fn first_key(call: &Cmd) -> Option<&[u8]> {
    let mut args = call.args_iter().skip(2);
    let (Some(redis::Arg::Simple(keys)), Some(redis::Arg::Simple(key))) = (args.next(), args.next()) else {
        return None;
    };
    (keys != b"0").then_some(key)
}

/// A call of a [`Lua`] script: its keys, then its arguments.
pub(crate) struct Invocation<'a> {
    lua: &'a Lua,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Invocation<'_> {
    pub fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    pub fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// Calls the script by its SHA1; loads it where the call goes (see
    /// [`Lua::load_for`]) and calls it once more if the server does not have it.
    pub async fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut Conn,
        slots: Option<SlotMap<'_>>,
    ) -> RedisResult<T> {
        eval_sha(self.lua, &self.command(), conn, slots).await
    }

    /// [`invoke`](Invocation::invoke) on any connection: the script loaded as the
    /// connection sends a `SCRIPT LOAD` (a cluster's, to every node).
    pub async fn invoke_async<T: FromRedisValue>(&self, conn: &mut impl ConnectionLike) -> RedisResult<T> {
        let cmd = self.command();
        match cmd.query_async(conn).await {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.lua.load(conn).await?;
                cmd.query_async(conn).await
            }
            other => other,
        }
    }

    /// `EVALSHA` with its keys and arguments.
    fn command(&self) -> Cmd {
        let mut cmd = Cmd::new();
        cmd.arg("EVALSHA")
            .arg(self.lua.hash.as_bytes())
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        cmd
    }
}

/// `cmd`, an `EVALSHA` of `lua`; on `NOSCRIPT`, `lua` loaded where `cmd` goes (see
/// [`Lua::load_for`]; `slots`: a cluster's slot map) and `cmd` sent once more. The
/// decisions build their command by hand and call this: an [`Invocation`] keeps
/// every key and argument in a vector of its own and copies them into the command.
pub(crate) async fn eval_sha<T: FromRedisValue>(
    lua: &Lua,
    cmd: &Cmd,
    conn: &mut Conn,
    slots: Option<SlotMap<'_>>,
) -> RedisResult<T> {
    let no_script = |err: &RedisError| err.kind() == ErrorKind::Server(ServerErrorKind::NoScript);
    match cmd.query_async(conn).await {
        Err(err) if no_script(&err) => {
            lua.load_for(cmd, conn, slots).await?;
            match cmd.query_async(conn).await {
                // Loaded elsewhere than the call goes: its slot being moved, the call
                // followed an `ASK`, which a load, having no key, is never answered.
                // The script is sent whole, where the call goes.
                Err(err) if no_script(&err) && matches!(conn, Conn::Cluster(_)) => {
                    lua.eval(cmd).query_async(conn).await
                }
                other => other,
            }
        }
        other => other,
    }
}
