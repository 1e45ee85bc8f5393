//! Lease records (`strategy = "lease"`): the user-facing documentation is the
//! `idem` crate's `lease` module; this is the runtime behind it.

pub(crate) mod guard;
pub(crate) mod renew;
pub(crate) mod steps;
pub(crate) mod store;

use std::sync::OnceLock;
use std::time::Duration;

pub use crate::lease::guard::LeaseTicket;
pub use crate::lease::steps::{MAX_STEPS, StepKey, Steps};
pub use crate::lease::store::{
    HeldLease, LeaseClaim, LeaseRequest, LeaseStore, NewStep, RecordedStep, Resolve, StartedStep, StepLog, StepOutcome,
    Watch,
};
#[cfg(feature = "sql")]
pub use crate::lease::store::{StepInTransaction, StepTransactions};

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

/// A fresh owner id (of a lease or a lock): this process (its id and
/// start time) and a counter.
pub(crate) fn new_owner() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    static PROCESS: OnceLock<String> = OnceLock::new();
    let process = PROCESS.get_or_init(|| {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        format!("{}-{nanos:x}-", std::process::id())
    });
    format!("{process}{:x}", N.fetch_add(1, Ordering::Relaxed))
}
