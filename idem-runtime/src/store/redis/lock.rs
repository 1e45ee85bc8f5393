//! Locks in Redis. The lock is `<prefix>{<key>}lock:<scope>` holding its
//! owner id, taken with `SET ... NX PX ttl`; its fencing counter is
//! `<prefix>{<key>}fence:<scope>` (same hash tag, so one Cluster slot).
//! Acquire, release and extend are each one Lua script call
//! (`lock_*.lua`), which reads and checks what it needs before it writes.
//!
//! The counter starts at Redis's clock in microseconds the first time a lock
//! is taken (and again if the counter is ever lost: expired after a week
//! unused, or flushed), then counts up by one per grant. So tokens keep
//! increasing across a lost counter, as long as Redis's clock does not step
//! back. Scripts that read `TIME` and then write need Redis 5 or later
//! (effects replication).

use std::sync::LazyLock;
use std::time::Duration;

use super::{Lua, RedisStore, int, store_error, unexpected};
use crate::error::Error;
use crate::lock::store::{LockAttempt, LockStore};
use crate::store::{BoxFuture, RecordKind, millis};

/// How long a lock's fencing counter outlives its last grant.
const FENCE_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

/// The acquire script (the benchmark sends this very file as its floor).
static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("lock_acquire.lua")));
static RELEASE: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("lock_release.lua")));
static EXTEND: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("lock_extend.lua")));

impl<C> LockStore for RedisStore<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn acquire<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<LockAttempt, Error>> {
        Box::pin(self.bounded(async move {
            let (lock, fence) = (self.key(RecordKind::Lock, scope, key), self.key(RecordKind::Fence, scope, key));
            let (ttl, keep) = (millis(ttl).max(1), millis(FENCE_KEEP));
            // Safe to repeat (a cluster client resends a command whose
            // connection dropped): an attempt that finds the lock held by
            // this very owner is granted again, with the fence it got. Not
            // retried here all the same: the caller gets a store error and
            // retries as a new owner, and the lock frees itself at its TTL.
            let mut conn = self.connection();
            let reply = ACQUIRE
                .eval(&mut conn, |c| {
                    c.arg(2).arg(&lock).arg(&fence).arg(owner).arg(ttl).arg(keep);
                })
                .await
                .map_err(store_error)?;
            let redis::Value::Array(items) = &reply else { return Err(unexpected(&reply)) };
            let (Some(kind), Some(n)) = (items.first().and_then(int), items.get(1).and_then(int)) else {
                return Err(unexpected(&reply));
            };
            Ok(if kind == 1 {
                LockAttempt::Acquired { fence: n }
            } else {
                // PTTL is -1 for a lock without TTL (written by something
                // else); report a short hint rather than none.
                LockAttempt::Busy { retry_after: Duration::from_millis(n.max(1) as u64) }
            })
        }))
    }

    fn release<'a>(&'a self, scope: &'a str, key: &'a str, owner: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.bounded(async move {
            let lock = self.key(RecordKind::Lock, scope, key);
            // Not retried after a dropped connection: if the first attempt
            // deleted the lock, a second would find it gone and report it
            // lost. A release that did not happen frees itself at the TTL.
            let mut conn = self.connection();
            let reply = RELEASE.eval(&mut conn, |c| {
                c.arg(1).arg(&lock).arg(owner);
            });
            let reply = reply.await.map_err(store_error)?;
            Ok(matches!(reply, redis::Value::Int(1)))
        }))
    }

    fn shared(&self) -> Option<std::sync::Arc<dyn LockStore>> {
        Some(std::sync::Arc::new(self.clone()))
    }

    fn release_detached(&self, scope: &str, key: &str, owner: &str) {
        crate::store::release_in_background(self, scope, key, owner);
    }

    fn extend<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.bounded(async move {
            let (lock, ttl) = (self.key(RecordKind::Lock, scope, key), millis(ttl).max(1));
            let mut conn = self.connection();
            let reply = EXTEND.eval_retrying(&mut conn, |c| {
                c.arg(1).arg(&lock).arg(owner).arg(ttl);
            });
            Ok(matches!(reply.await.map_err(store_error)?, redis::Value::Int(1)))
        }))
    }
}
