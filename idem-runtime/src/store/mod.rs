//! The stores behind the guards, one module per store: [`MemoryStore`]
//! (one process), with the `redis` feature
//! [`RedisStore`][crate::store::RedisStore], and with the `etcd` feature
//! [`EtcdStore`][crate::store::EtcdStore]. Each holds every kind of
//! record a guard keeps outside your transaction: lease records, one-time
//! tokens, locks with their fencing counters, and precheck markers. (Dedup
//! and state records live in your SQL transaction; lease records can also
//! live in SQL, see [`SqlStore`][crate::store::SqlStore]. A [`Routed`]
//! store spreads lease records over several stores.)
#![doc = links!()]
// Here `RedisStore` and `SqlStore` name the items without a path, where
// their features compile them; the explicit labels are for builds where
// they do not (see `doc_links`).
#![allow(rustdoc::redundant_explicit_links)]

use std::time::Duration;

#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod keyspace;
pub(crate) mod memory;
#[cfg(feature = "redis")]
pub(crate) mod redis;
pub(crate) mod routed;
// Public through the crate root's `sql` module, which lists its items.
#[cfg(feature = "sql")]
pub(crate) mod sql;
pub(crate) mod waiters;

#[cfg(feature = "etcd")]
pub use etcd::EtcdStore;
pub use keyspace::RecordKind;
pub use memory::MemoryStore;
#[cfg(feature = "redis")]
pub use redis::{RedisStats, RedisStore};
pub use routed::Routed;
#[cfg(feature = "sql")]
pub use sql::SqlStore;

pub use crate::future::BoxFuture;

/// How long a store of idem's own
/// ([`RedisStore`][crate::store::RedisStore],
/// [`SqlStore`][crate::store::SqlStore], [`EtcdStore`][crate::store::EtcdStore]) waits for one call (a connection from its pool included) before the
/// guard fails with a retryable error ([`Error::Store`](crate::Error::Store),
/// or a pool time-out): 3 s, unless the store is given another with its
/// `timeout` method. A store that is down is reported within it, not after
/// a client's own reconnect cycle (a Redis `ConnectionManager` retries for
/// about 9 s, a sqlx pool for its 30 s `acquire_timeout`). A call cut off
/// may still have landed: every lease step is safe to repeat, and a claim
/// that landed waits for its lease before a retry takes it over.
#[doc = links!()]
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);

/// `call` within `timeout`, else a retryable store error of `store`.
#[cfg(feature = "redis")]
pub(crate) async fn within<T>(
    timeout: Duration,
    store: &'static str,
    call: impl std::future::Future<Output = Result<T, crate::error::Error>>,
) -> Result<T, crate::error::Error> {
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result,
        Err(_) => Err(no_answer(store, timeout)),
    }
}

/// The error of a store call that did not answer within `timeout`.
#[cfg(any(feature = "redis", feature = "sql"))]
pub(crate) fn no_answer(store: &'static str, timeout: Duration) -> crate::error::Error {
    crate::error::Error::Store { store, source: format!("no answer within {timeout:?}").into() }
}

/// `store`'s release of a lock, sent from a task of its own (its holder
/// was dropped, where nothing can be awaited); without a Tokio runtime,
/// none: the lock frees itself when its TTL passes.
#[cfg(any(feature = "redis", feature = "etcd"))]
pub(crate) fn release_in_background<S>(store: &S, scope: &str, key: &str, owner: &str)
where
    S: crate::lock::store::LockStore + Clone + 'static,
{
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    let (store, scope, key, owner) = (store.clone(), scope.to_owned(), key.to_owned(), owner.to_owned());
    runtime.spawn(async move {
        if let Err(e) = store.release(&scope, &key, &owner).await {
            tracing::warn!(target: "idem", error = %e,
                "could not release a lock whose holder was dropped; it frees itself when its TTL passes");
        }
    });
}

/// Microseconds since the Unix epoch on this machine's clock.
pub(crate) fn clock_micros() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
}

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
