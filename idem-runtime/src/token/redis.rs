//! Tokens in Redis: `SET <prefix>token:<token> <scope> NX PX <ttl>` to
//! issue, and one Lua script that compares the scope and deletes the key to
//! consume (never GET then DEL: between the two, concurrent submits would
//! all see the token).

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use super::TokenStore;
use crate::Error;
use crate::lease::redis::store_error;
use crate::lease::{BoxFuture, RedisStore, millis};

static CONSUME: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
        return 0",
    )
});

impl<C> RedisStore<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The Redis key of a token: `{prefix}token:<token>`.
    pub fn token_key(&self, token: &str) -> String {
        format!("{}token:{token}", self.prefix())
    }
}

impl<C> TokenStore for RedisStore<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn put<'a>(&'a self, scope: &'a str, token: &'a str, ttl: Duration) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let mut cmd = redis::cmd("SET");
            cmd.arg(self.token_key(token)).arg(scope).arg("NX").arg("PX").arg(millis(ttl).max(1));
            let mut conn = self.connection();
            let _: redis::Value = cmd.query_async(&mut conn).await.map_err(store_error)?;
            Ok(())
        })
    }

    fn consume<'a>(&'a self, scope: &'a str, token: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let mut invocation = CONSUME.key(self.token_key(token));
            invocation.arg(scope);
            // Not retried after a dropped connection: the first attempt may
            // have spent the token, and a second would then reject the one
            // submit that should pass. The caller sees a store error instead.
            let mut conn = self.connection();
            let reply = invocation.invoke_async(&mut conn).await.map_err(store_error)?;
            Ok(matches!(reply, redis::Value::Int(1)))
        })
    }
}
