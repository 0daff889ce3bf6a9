//! One of the scripts as Redis runs it: called by its SHA1 (`EVALSHA`), and loaded
//! (`SCRIPT LOAD`) when the server answers that it does not have it (`NOSCRIPT`, after
//! a restart or `SCRIPT FLUSH`), the load's reply checked. A load answered with another
//! SHA1 (a connection out of step hands a command another's reply) is an
//! [`ErrorKind::UnexpectedReturnType`], which the client reads as a reply that does not
//! fit: the script is not called again on the strength of it.

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisError, RedisResult, ServerErrorKind, ToRedisArgs};

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

    /// Calls the script by its SHA1; loads it and calls it once more if the server
    /// does not have it.
    pub async fn invoke_async<T: FromRedisValue>(&self, conn: &mut impl ConnectionLike) -> RedisResult<T> {
        let mut cmd = Cmd::new();
        cmd.arg("EVALSHA")
            .arg(self.lua.hash.as_bytes())
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        eval_sha(self.lua, &cmd, conn).await
    }
}

/// `cmd`, an `EVALSHA` of `lua`; on `NOSCRIPT`, `lua` loaded and `cmd` sent once more.
/// The decisions build their command by hand and call this: an [`Invocation`] keeps
/// every key and argument in a vector of its own and copies them into the command.
pub(crate) async fn eval_sha<T: FromRedisValue>(
    lua: &Lua,
    cmd: &Cmd,
    conn: &mut impl ConnectionLike,
) -> RedisResult<T> {
    match cmd.query_async(conn).await {
        Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            lua.load(conn).await?;
            cmd.query_async(conn).await
        }
        other => other,
    }
}
