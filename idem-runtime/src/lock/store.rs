//! The lock store interface: owner-checked locks with a TTL and fencing
//! tokens (the lock strategies, `lock::acquire`).

use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::future::BoxFuture;

/// What an acquire found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockAttempt {
    /// This owner holds the lock now.
    Acquired {
        /// Fencing token: higher than every earlier grant of this lock.
        fence: i64,
    },
    /// Another owner holds it.
    Busy {
        /// Until its TTL ends, by the store's clock (it may be renewed).
        retry_after: Duration,
    },
}

/// A store of locks.
///
/// [`MemoryStore`](crate::store::MemoryStore) and, with the `redis` feature,
/// [`RedisStore`][crate::store::RedisStore] implement it.
#[doc = links!()]
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a lock store",
    label = "`store` must name a lock store",
    note = "use `idem::store::MemoryStore`, `idem::store::RedisStore::new(conn, prefix)` or an `idem::Stores` (or your own `impl idem::lock::LockStore`); leave `store` out to use the installed one (`idem::Stores::builder().lock(..).install()`)"
)]
pub trait LockStore: Send + Sync {
    /// `memory` or `redis`, for logs.
    fn kind(&self) -> &'static str;
    /// Take the lock on `key` of `scope` (both as stored) for `owner`, for
    /// `ttl` on the store's clock, if it is free.
    fn acquire<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<LockAttempt, Error>>;
    /// Delete the lock if `owner` still holds it; `false` if it does not.
    fn release<'a>(&'a self, scope: &'a str, key: &'a str, owner: &'a str) -> BoxFuture<'a, Result<bool, Error>>;
    /// Reset the TTL if `owner` still holds it; `false` if it does not.
    fn extend<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;
    /// Release without waiting for the answer: called when a holder's
    /// future is dropped mid-body (a client disconnected, a timeout fired),
    /// where nothing can be awaited. The default does nothing, and the lock
    /// frees itself when its TTL passes; the memory store releases at once,
    /// the Redis store sends the release from a spawned task.
    fn release_detached(&self, scope: &str, key: &str, owner: &str) {
        let _ = (scope, key, owner);
    }
    /// This store as a handle that outlives the call, for the lock's
    /// renewal, which then runs on a task of its own (see
    /// [`LeaseStore::shared`](crate::lease::LeaseStore::shared)). `None` by
    /// default: renewed in the body's task.
    fn shared(&self) -> Option<Arc<dyn LockStore>> {
        None
    }
}

macro_rules! forward_lock_store {
    ($($ty:ty),*) => {$(
        impl<S: LockStore + ?Sized> LockStore for $ty {
            fn kind(&self) -> &'static str {
                (**self).kind()
            }
            fn acquire<'a>(
                &'a self,
                scope: &'a str,
                key: &'a str,
                owner: &'a str,
                ttl: Duration,
            ) -> BoxFuture<'a, Result<LockAttempt, Error>> {
                (**self).acquire(scope, key, owner, ttl)
            }
            fn release<'a>(&'a self, scope: &'a str, key: &'a str, owner: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
                (**self).release(scope, key, owner)
            }
            fn extend<'a>(
                &'a self,
                scope: &'a str,
                key: &'a str,
                owner: &'a str,
                ttl: Duration,
            ) -> BoxFuture<'a, Result<bool, Error>> {
                (**self).extend(scope, key, owner, ttl)
            }
            fn release_detached(&self, scope: &str, key: &str, owner: &str) {
                (**self).release_detached(scope, key, owner)
            }
            fn shared(&self) -> Option<Arc<dyn LockStore>> {
                (**self).shared()
            }
        }
    )*};
}
forward_lock_store!(Arc<S>, &S, Box<S>);
