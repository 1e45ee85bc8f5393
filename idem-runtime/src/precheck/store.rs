//! The precheck store interface: "seen" markers in front of a record
//! (`precheck = "redis"`).

use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::future::BoxFuture;

/// A store of "seen" markers.
///
/// [`MemoryStore`](crate::store::MemoryStore) and, with the `redis` feature,
/// [`RedisStore`][crate::store::RedisStore] implement it.
#[doc = links!()]
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a precheck store",
    label = "`store` must name a precheck store",
    note = "use `idem::store::RedisStore::new(conn, prefix)`, `idem::store::MemoryStore` or an `idem::Stores` (or your own `impl idem::precheck::PrecheckStore`); leave `store` out to use the installed one (`idem::Stores::builder().precheck(..).install()`)"
)]
pub trait PrecheckStore: Send + Sync {
    /// `memory` or `redis`, for logs.
    fn kind(&self) -> &'static str;
    /// Mark `key` of `scope` (both as stored) seen for `ttl`, if it is not
    /// already: `true` when this call wrote the marker (first sight). One
    /// atomic step.
    fn mark<'a>(&'a self, scope: &'a str, key: &'a str, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>>;
}

impl<S: PrecheckStore + ?Sized> PrecheckStore for Arc<S> {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    fn mark<'a>(&'a self, scope: &'a str, key: &'a str, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).mark(scope, key, ttl)
    }
}

impl<S: PrecheckStore + ?Sized> PrecheckStore for &S {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    fn mark<'a>(&'a self, scope: &'a str, key: &'a str, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).mark(scope, key, ttl)
    }
}
