//! Tokens in Redis: `SET <prefix>{<token>}token:<scope> 1 NX PX <ttl>` to
//! issue, `GETDEL` of that key to consume. The scope is part of the key,
//! so a token of another scope is another key: never found, never spent.
//! `GETDEL` is one command (never GET then DEL: between the two, concurrent
//! submits would all see the token), and on a key of another type it fails
//! without deleting anything.

use std::time::Duration;

use super::{RedisStore, store_error};
use crate::error::Error;
use crate::store::{BoxFuture, RecordKind, millis};
use crate::token::store::TokenStore;

impl<C> TokenStore for RedisStore<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn put<'a>(&'a self, scope: &'a str, token: &'a str, ttl: Duration) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.bounded(async move {
            let mut cmd = redis::cmd("SET");
            cmd.arg(self.key(RecordKind::Token, scope, token)).arg("1").arg("NX").arg("PX").arg(millis(ttl).max(1));
            let mut conn = self.connection();
            let _: redis::Value = cmd.query_async(&mut conn).await.map_err(store_error)?;
            Ok(())
        }))
    }

    fn consume<'a>(&'a self, scope: &'a str, token: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.bounded(async move {
            let mut cmd = redis::cmd("GETDEL");
            cmd.arg(self.key(RecordKind::Token, scope, token));
            // Not retried after a dropped connection: the first attempt may
            // have spent the token, and a second would then reject the one
            // submit that should pass. The caller sees a store error instead.
            let mut conn = self.connection();
            let reply: redis::Value = cmd.query_async(&mut conn).await.map_err(store_error)?;
            Ok(!matches!(reply, redis::Value::Nil))
        }))
    }
}
