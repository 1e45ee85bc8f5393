//! Locks (`lock+dedup`, `lock+state`, `lock`): the user-facing documentation
//! is the `idem` crate's `lock` module; this is the runtime behind it.

pub(crate) mod guard;
pub(crate) mod store;

use std::time::Duration;

use crate::error::Error;
use crate::key::stored_scope;
use crate::key::{IdempotencyKey, Key};
use crate::lease::new_owner;

pub use crate::lock::guard::LockTicket;
pub use crate::lock::store::{LockAttempt, LockStore};

/// A lock taken with [`acquire`], outside any guard: the caller releases
/// it with [`HeldLock::release`], which says whether it was still held; one
/// dropped without it is released without waiting for the answer. Nothing
/// renews it; for work that may outlast the TTL, call [`HeldLock::extend`]
/// or use the attribute, whose guard renews for you.
#[must_use = "a held lock should be released when the work is done"]
#[derive(Debug)]
pub struct HeldLock<'s, S: LockStore + ?Sized> {
    store: &'s S,
    /// Scope and key as stored.
    scope: String,
    key: Key,
    owner: String,
    fence: i64,
    ttl: Duration,
    /// Released (or being released) through [`HeldLock::release`].
    released: bool,
}

/// A lock dropped without [`HeldLock::release`] (an early return, a `?`, a
/// cancelled future) is released without waiting
/// ([`LockStore::release_detached`]), rather than held until its TTL.
impl<S: LockStore + ?Sized> Drop for HeldLock<'_, S> {
    fn drop(&mut self) {
        if !self.released {
            self.store.release_detached(&self.scope, self.key.as_str(), &self.owner);
        }
    }
}

impl<S: LockStore + ?Sized> HeldLock<'_, S> {
    /// This grant's fencing token.
    pub fn fence(&self) -> i64 {
        self.fence
    }
    /// This grant's owner id.
    pub fn owner(&self) -> &str {
        &self.owner
    }
    /// Reset the TTL; `false` if the lock was lost (expired and taken, or gone).
    pub async fn extend(&self) -> Result<bool, Error> {
        self.store.extend(&self.scope, self.key.as_str(), &self.owner, self.ttl).await
    }
    /// Release the lock; `false` if it was no longer this holder's (it
    /// expired, and perhaps another holder has it now: that one is untouched).
    pub async fn release(mut self) -> Result<bool, Error> {
        let released = self.store.release(&self.scope, self.key.as_str(), &self.owner).await;
        self.released = true;
        released
    }
}

/// Take the lock on `key` of `scope` for `ttl`, waiting up to `wait` for it
/// to be free; [`Error::LockBusy`] if it is still held then. It is the same
/// lock a lock guard of that scope takes on that key (`#[idempotent(scope =
/// "stock", key = "sku", strategy = "lock", ...)]`), so by-hand holders and
/// guards exclude each other. `wait` may be `Duration::MAX` (wait as long
/// as it takes); a `ttl` under a millisecond or over 100 years is
/// [`Error::InvalidDuration`]; a key that is no key ([`Key::new`]) is
/// [`Error::InvalidKey`].
///
/// ```
/// # extern crate idem_runtime as idem;
/// # async fn demo() -> Result<(), idem::Error> {
/// use std::time::Duration;
/// let store = idem::store::MemoryStore::new();
/// let held = idem::lock::acquire(&store, "stock", &42, Duration::from_secs(5), Duration::ZERO).await?;
/// let fence = held.fence(); // pass it along with every write the lock protects
/// # let _ = fence;
/// assert!(held.release().await?);
/// # Ok(()) }
/// ```
pub async fn acquire<'s, S: LockStore + ?Sized, K: IdempotencyKey + ?Sized>(
    store: &'s S,
    scope: &str,
    key: &K,
    ttl: Duration,
    wait: Duration,
) -> Result<HeldLock<'s, S>, Error> {
    let key = Key::new(key).map_err(|e| match e {
        Error::InvalidKey { reason, .. } => Error::InvalidKey { scope: scope.to_owned(), reason },
        other => other,
    })?;
    let scope = stored_scope(scope).into_owned();
    let owner = new_owner();
    let fence = acquire_as(store, &scope, &key, &owner, ttl, wait).await?;
    Ok(HeldLock { store, scope, key, owner, fence, ttl, released: false })
}

/// Acquire, polling while busy until `wait` has passed. `scope` as stored.
pub(crate) async fn acquire_as<S: LockStore + ?Sized>(
    store: &S,
    scope: &str,
    key: &Key,
    owner: &str,
    ttl: Duration,
    wait: Duration,
) -> Result<i64, Error> {
    let ttl = crate::error::check_ttl("lock TTL", ttl)?;
    // A wait too long to count (`Duration::MAX`) waits for as long as it takes.
    let deadline = tokio::time::Instant::now().checked_add(wait);
    let mut pause = Duration::from_millis(2);
    loop {
        match store.acquire(scope, key.as_str(), owner, ttl).await? {
            LockAttempt::Acquired { fence } => return Ok(fence),
            LockAttempt::Busy { retry_after } => {
                let now = tokio::time::Instant::now();
                if deadline.is_some_and(|d| now >= d) {
                    // The key can carry personal data: the lock is named
                    // by its scope and the key's hash, as every error does.
                    let name = format!("{scope} (key {})", key.hash());
                    return Err(Error::LockBusy { name, retry_after: Some(retry_after) });
                }
                // Poll again soon (the holder may release early), backing
                // off to at most 50 ms, never past the deadline or the TTL.
                // Each pause is drawn from its upper half at random, so that
                // waiters who started together do not all retry at the same
                // instants (and leave a freed lock idle in between).
                let upper = pause.min(retry_after.max(Duration::from_millis(1)));
                let sleep = jitter(upper);
                let sleep = deadline.map_or(sleep, |d| sleep.min(d - now));
                tokio::time::sleep(sleep).await;
                pause = (pause * 2).min(Duration::from_millis(50));
            }
        }
    }
}

/// A duration in `[d / 2, d]`, from a per-call random hash (no RNG state).
fn jitter(d: Duration) -> Duration {
    use std::hash::BuildHasher;
    let r = std::hash::RandomState::new().hash_one(std::time::SystemTime::now());
    let half = d / 2;
    half + Duration::from_nanos(r % (half.as_nanos() as u64).max(1))
}

/// What the body of a lock-guarded call can know about its lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockInfo {
    /// The fencing token of this grant: pass it with the writes the lock
    /// protects, so that a stalled earlier holder's writes are refused.
    pub fence: i64,
    /// This grant's owner id.
    pub owner: String,
}

tokio::task_local! {
    pub(crate) static CURRENT: LockInfo;
}

/// Inside the body of a lock-guarded function: its lock.
pub fn current() -> Option<LockInfo> {
    CURRENT.try_with(Clone::clone).ok()
}
