//! Lease records (`strategy = "lease"`): the user-facing documentation is the
//! `idem` crate's `lease` module; this is the runtime behind it.

pub(crate) mod guard;
pub(crate) mod renew;
pub(crate) mod steps;
pub(crate) mod store;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::error::{Error, LostLease};

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

/// What the body of a lease-guarded call can know about its lease: its
/// fence for outside writes, and whether the lease is still its own.
///
/// The lease is renewed from a task of its own while the body runs, so a
/// body that blocks its thread (synchronous work, a slow lock) keeps it on
/// a multi-thread runtime. A lease can still be lost: a process paused
/// longer than the lease (a stop-the-world pause, a suspended VM), a store
/// out of reach for most of the lease, an operator's release. Then another
/// call may run the key, and this body is stopped at its next `.await`; a
/// body that blocks its thread learns it from [`lost`](Self::lost) (or
/// [`check`](Self::check)) before its next outside write, and that write
/// should carry the [`fence`](Self::fence) for the outside system to refuse
/// it once a newer holder wrote.
#[derive(Clone)]
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
    held: Held,
}

/// Whether a lease is still its holder's: set once, by its renewal.
#[derive(Clone)]
pub(crate) struct Held {
    lost: tokio::sync::watch::Receiver<Option<LostLease>>,
    /// The scope as given and the key's short hash, for the error.
    call: Arc<(String, String)>,
}

impl Held {
    /// A lease just claimed, and the sender its renewal (or its refused
    /// completion) sets when the lease is lost.
    pub(crate) fn new(scope: String, key_hash: String) -> (Held, renew::LostSender) {
        let (tx, lost) = tokio::sync::watch::channel(None);
        (Held { lost, call: Arc::new((scope, key_hash)) }, Arc::new(tx))
    }

    pub(crate) fn lost(&self) -> Option<LostLease> {
        *self.lost.borrow()
    }

    pub(crate) fn check(&self) -> Result<(), Error> {
        match self.lost() {
            None => Ok(()),
            Some(why) => {
                let (scope, key_hash) = &*self.call;
                Err(Error::LeaseLost { scope: scope.clone(), key_hash: key_hash.clone(), why })
            }
        }
    }
}

impl LeaseInfo {
    pub(crate) fn new(fence: i64, reclaimed: bool, owner: String, held: Held) -> LeaseInfo {
        LeaseInfo { fence, reclaimed, owner, held }
    }

    /// `Some(how)` once the lease is no longer this call's: another call may
    /// run the key now. `None` while it holds.
    pub fn lost(&self) -> Option<LostLease> {
        self.held.lost()
    }

    /// [`Error::LeaseLost`] once the lease is no longer this call's: call it
    /// before each write to another system (`lease.check()?`).
    pub fn check(&self) -> Result<(), Error> {
        self.held.check()
    }

    /// Until the lease is lost (pending for as long as it holds, and after
    /// the call ended): for work the body runs on tasks of its own, to stop
    /// it (`tokio::select!`), since only the body's own future is stopped.
    pub async fn until_lost(&self) -> LostLease {
        let mut lost = self.held.lost.clone();
        let why = lost.wait_for(Option::is_some).await.ok().and_then(|why| *why);
        match why {
            Some(why) => why,
            // The call ended with the lease held: it is never lost now.
            None => std::future::pending().await,
        }
    }
}

impl PartialEq for LeaseInfo {
    fn eq(&self, other: &Self) -> bool {
        (self.fence, self.reclaimed, &self.owner) == (other.fence, other.reclaimed, &other.owner)
    }
}

impl Eq for LeaseInfo {}

impl std::fmt::Debug for LeaseInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseInfo")
            .field("fence", &self.fence)
            .field("reclaimed", &self.reclaimed)
            .field("owner", &self.owner)
            .field("lost", &self.lost())
            .finish()
    }
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
