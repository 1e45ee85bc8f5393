//! Lease records: guarding work that cannot share a transaction with its
//! record (a bank API call, another database).
//!
//! A call claims the key: the record is written `PROCESSING` with a lease
//! deadline on the **store's** clock, committed on its own. The body runs;
//! `Ok` stores the response (`DONE`), `Err` removes the record so a retry runs
//! again. While the lease is live a duplicate gets [`Error::InProgress`]; once
//! it has passed (the worker died), the next call reclaims the record in one
//! atomic step, with a new owner and an incremented fencing counter.
//! Completing, releasing and extending are conditional on owner and fence: a
//! worker whose lease was taken over gets [`Error::LeaseLost`] and overwrites
//! nothing.
//!
//! Stores: [`MemoryStore`](crate::MemoryStore) (one process), [`SqlStore`] (SQLite, PostgreSQL,
//! MySQL/MariaDB) and, with the `redis` feature, [`RedisStore`](crate::RedisStore);
//! [`Routed`] spreads records over several of them by key (sharded
//! databases: a key's record on the shard of its business row).
//!
//! Limits worth knowing:
//! - fencing tokens: a new record's is the store's clock in microseconds
//!   (the memory store: a counter that starts there), a take-over adds one.
//!   So a key's tokens keep increasing even after a failed body removed its
//!   record or retention expired it, as long as the store's clock does not
//!   step back by more than the time between two claims of the key. They are
//!   large numbers (about 1.8e15 in 2026); compare them, do not count on
//!   them being consecutive;
//! - `reclaimed` says the claim took over an existing record: a passed lease,
//!   and on the SQL stores also a record past its retention;
//! - a guarded future dropped mid-body (cancelled) leaves its record
//!   `PROCESSING` until the lease passes; then the next call reclaims it
//!   (a body that panics is treated like one that returned `Err`: its
//!   record is removed before the panic goes on);
//! - renewals that keep failing stop the body with [`Error::LeaseLost`] a
//!   sixth of the lease before the last successful one would run out, so it
//!   stops before another worker can reclaim the key.

use std::sync::Arc;
use std::time::Duration;

use crate::Error;
use crate::store::BoxFuture;

pub(crate) mod routed;
pub(crate) mod sql;

pub use routed::Routed;
pub use sql::SqlStore;

/// Default lease when the attribute gives none.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// A claim as a store receives it.
#[derive(Clone, Debug)]
pub struct LeaseRequest<'a> {
    /// Scope as stored (long scopes hashed).
    pub scope: &'a str,
    /// Key as stored (long keys hashed).
    pub key: &'a str,
    /// Hash of the payload, when the guard declares a fingerprint.
    pub fingerprint: Option<&'a str>,
    /// This call's owner id.
    pub owner: &'a str,
    /// How long the lease lasts from the store's now.
    pub lease: Duration,
    /// How long the record is kept.
    pub retention: Duration,
}

/// What a claim found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseClaim {
    /// This call holds the lease: run the body. `reclaimed` when it took over
    /// a record whose lease had passed (its worker died or stalled).
    Acquired {
        /// Fencing token: higher than every earlier holder's.
        fence: i64,
        /// An abandoned record was taken over.
        reclaimed: bool,
    },
    /// A completed call: replay its response.
    Done {
        /// JSON of the first call's `Ok` value.
        response: String,
    },
    /// Another call holds a live lease.
    Busy {
        /// Until the lease ends, by the store's clock.
        retry_after: Duration,
    },
    /// The record was written with another fingerprint.
    Mismatch,
}

/// A lease this call holds, as completion, release and extension see it.
#[derive(Clone, Debug)]
pub struct HeldLease<'a> {
    /// Scope as stored.
    pub scope: &'a str,
    /// Key as stored.
    pub key: &'a str,
    /// This call's owner id.
    pub owner: &'a str,
    /// The fingerprint the claim was made with (a store that writes the
    /// record whole on completion, like Redis, writes it again).
    pub fingerprint: Option<&'a str>,
    /// The fencing token the claim returned.
    pub fence: i64,
    /// Lease length (extensions renew it from the store's now).
    pub lease: Duration,
    /// How long a completed record is kept.
    pub retention: Duration,
}

/// A store of lease records. Each operation is one atomic step on the store
/// (one statement or one script call); no operation reads and then writes
/// from the client.
///
/// `complete`, `release` and `extend` return `Ok(false)` when the record is
/// no longer this holder's (taken over, or gone): they changed nothing.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a lease store",
    label = "`store` must name a lease store",
    note = "use `idem::MemoryStore`, `idem::lease::SqlStore::new(pool)`, `idem::RedisStore::new(conn, prefix)` or an `idem::Stores` (or your own `impl idem::lease::LeaseStore`); leave `store` out to use the installed one (`idem::Stores::builder().lease(..).install()`)"
)]
pub trait LeaseStore: Send + Sync {
    /// `memory`, `redis`, `postgres`, `mysql` or `sqlite`, for logs.
    fn kind(&self) -> &'static str;
    /// Claim, replay, report busy, or report a fingerprint mismatch.
    fn claim<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<LeaseClaim, Error>>;
    /// Mark the record `DONE` with `response`, if still held.
    fn complete<'a>(&'a self, held: &'a HeldLease<'a>, response: &'a str) -> BoxFuture<'a, Result<bool, Error>>;
    /// Remove the record (the body failed), if still held.
    fn release<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>>;
    /// Renew the lease from the store's now, if still held.
    fn extend<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>>;
    /// Read the record without claiming it (for `precheck`): `Done` or
    /// `Mismatch` when that settles the call, `None` when only a claim can.
    /// The default is `None`, right for stores whose claim of a completed
    /// record is already a pure read (memory, Redis); the SQL store reads
    /// with a plain `SELECT` instead of its claiming upsert.
    fn peek<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<Option<LeaseClaim>, Error>> {
        let _ = req;
        Box::pin(std::future::ready(Ok(None)))
    }
    /// The longest response, in bytes of JSON, a record can hold: a longer
    /// answer fails its call with [`Error::Response`] and the record is
    /// released. Unlimited by default; MySQL's `MEDIUMTEXT` holds 16 MiB.
    fn max_response(&self) -> usize {
        usize::MAX
    }
}

impl<S: LeaseStore + ?Sized> LeaseStore for Arc<S> {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    fn claim<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<LeaseClaim, Error>> {
        (**self).claim(req)
    }
    fn complete<'a>(&'a self, held: &'a HeldLease<'a>, response: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).complete(held, response)
    }
    fn release<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).release(held)
    }
    fn extend<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).extend(held)
    }
    fn peek<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<Option<LeaseClaim>, Error>> {
        (**self).peek(req)
    }
    fn max_response(&self) -> usize {
        (**self).max_response()
    }
}

impl<S: LeaseStore + ?Sized> LeaseStore for &S {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    fn claim<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<LeaseClaim, Error>> {
        (**self).claim(req)
    }
    fn complete<'a>(&'a self, held: &'a HeldLease<'a>, response: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).complete(held, response)
    }
    fn release<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).release(held)
    }
    fn extend<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).extend(held)
    }
    fn peek<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<Option<LeaseClaim>, Error>> {
        (**self).peek(req)
    }
    fn max_response(&self) -> usize {
        (**self).max_response()
    }
}

/// What the body of a lease-guarded call can know about its lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseInfo {
    /// The fencing token: higher than every earlier holder's of this key
    /// (see the module's notes). Make writes elsewhere conditional on it
    /// (`... WHERE fence < $token`) so that a worker whose lease was taken
    /// over cannot overwrite.
    pub fence: i64,
    /// This call took over a record whose earlier holder stopped.
    pub reclaimed: bool,
    /// This call's owner id.
    pub owner: String,
}

tokio::task_local! {
    pub(crate) static CURRENT: LeaseInfo;
}

/// Inside the body of a `strategy = "lease"` function: its lease.
pub fn current() -> Option<LeaseInfo> {
    CURRENT.try_with(Clone::clone).ok()
}
