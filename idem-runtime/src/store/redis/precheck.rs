//! Precheck markers in Redis: `SET <prefix>{<key>}seen:<scope> 1 NX PX
//! <ttl>`, one command, in the slot of the key's other records.

use std::time::Duration;

use super::{RedisStore, store_error};
use crate::error::Error;
use crate::precheck::store::PrecheckStore;
use crate::store::{BoxFuture, RecordKind, millis};

impl<C> PrecheckStore for RedisStore<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn mark<'a>(&'a self, scope: &'a str, key: &'a str, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.bounded(async move {
            let mut cmd = redis::cmd("SET");
            cmd.arg(self.key(RecordKind::Seen, scope, key)).arg("1").arg("NX").arg("PX").arg(millis(ttl).max(1));
            let mut conn = self.connection();
            let reply: redis::Value = cmd.query_async(&mut conn).await.map_err(store_error)?;
            Ok(!matches!(reply, redis::Value::Nil))
        }))
    }
}
