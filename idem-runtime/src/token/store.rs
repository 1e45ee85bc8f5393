//! The token store interface: one-time tokens, spent in one atomic step
//! (`token`, `token+dedup`, `token::issue`).

use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::future::BoxFuture;

/// A store of one-time tokens.
///
/// [`MemoryStore`](crate::store::MemoryStore) and, with the `redis` feature,
/// [`RedisStore`][crate::store::RedisStore] implement it (the same store types that hold lease records and locks).
#[doc = links!()]
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a token store",
    label = "`store` must name a token store",
    note = "use `idem::store::MemoryStore`, `idem::store::RedisStore::new(conn, prefix)` or an `idem::Stores` (or your own `impl idem::token::TokenStore`); leave `store` out to use the installed one (`idem::Stores::builder().token(..).install()`)"
)]
pub trait TokenStore: Send + Sync {
    /// `memory` or `redis`, for logs.
    fn kind(&self) -> &'static str;
    /// Keep `token` for `scope` (as stored) for `ttl`. Never overwrites an
    /// existing token.
    fn put<'a>(&'a self, scope: &'a str, token: &'a str, ttl: Duration) -> BoxFuture<'a, Result<(), Error>>;
    /// Delete `token` if it was issued for `scope` and has not expired, in
    /// one atomic step; `true` if this call deleted it. A token of another
    /// scope is left alone.
    fn consume<'a>(&'a self, scope: &'a str, token: &'a str) -> BoxFuture<'a, Result<bool, Error>>;
}

impl<S: TokenStore + ?Sized> TokenStore for Arc<S> {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    fn put<'a>(&'a self, scope: &'a str, token: &'a str, ttl: Duration) -> BoxFuture<'a, Result<(), Error>> {
        (**self).put(scope, token, ttl)
    }
    fn consume<'a>(&'a self, scope: &'a str, token: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).consume(scope, token)
    }
}

impl<S: TokenStore + ?Sized> TokenStore for &S {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    fn put<'a>(&'a self, scope: &'a str, token: &'a str, ttl: Duration) -> BoxFuture<'a, Result<(), Error>> {
        (**self).put(scope, token, ttl)
    }
    fn consume<'a>(&'a self, scope: &'a str, token: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).consume(scope, token)
    }
}
