//! Lease records: guarding work that cannot share a transaction with its
//! record (a bank API call, another database).
//!
//! A call claims the key: the record is written `PROCESSING` with a lease
//! deadline on the **store's** clock, committed on its own. The body runs;
//! `Ok` stores the response (`DONE`), `Err` removes the record so a retry runs
//! again. While the lease is live a duplicate gets [`Error::InProgress`](crate::Error::InProgress); once
//! it has passed (the worker died), the next call reclaims the record in one
//! atomic step, with a new owner and an incremented fencing counter.
//! Completing, releasing and extending are conditional on owner and fence: a
//! worker whose lease was taken over gets [`Error::LeaseLost`](crate::Error::LeaseLost) and overwrites
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
//! - renewals that keep failing stop the body with [`Error::LeaseLost`](crate::Error::LeaseLost) a
//!   sixth of the lease before the last successful one would run out, so it
//!   stops before another worker can reclaim the key.

use std::time::Duration;

pub use crate::store::lease::{HeldLease, LeaseClaim, LeaseRequest, LeaseStore};
pub use crate::store::routed::Routed;
pub use crate::store::sql::SqlStore;

/// Default lease when the attribute gives none.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

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
