//! `strategy = "lock+dedup"`, `"lock+state"` and `"lock"`: an owner-checked
//! lock on the key, renewed while the body runs, released after it.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::guard::{Guard, GuardError};
use crate::key::Key;
use crate::key::stored_scope;
use crate::lease::new_owner;
use crate::lease::renew::{Renewal, bounded, under_renewal};
use crate::lock::{CURRENT, LockInfo, LockStore, acquire_as};
use crate::telemetry::{Outcome, forget_reported, report, reported};

/// A lock held around a body: see [`LockTicket::run`].
#[must_use = "a held lock must run the body and be released"]
pub struct LockTicket<'s> {
    store: &'s dyn LockStore,
    scope: Cow<'static, str>,
    /// The scope as stored (long ones hashed).
    stored_scope: String,
    key: Key,
    owner: String,
    fence: i64,
    ttl: Duration,
    /// `lock` alone: this ticket is the whole guard, and reports the run.
    alone: bool,
    /// Still to be released (by `run`, or else when dropped).
    armed: bool,
}

impl std::fmt::Debug for LockTicket<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockTicket")
            .field("scope", &self.scope)
            .field("key", &self.key)
            .field("store", &self.store.kind())
            .field("fence", &self.fence)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Guard<'_> {
    /// `lock+dedup`, `lock+state`: take the owner-checked lock on this
    /// guard's key in `store` for `ttl` (renewed while the body runs),
    /// waiting up to `wait` for a busy one ([`Error::LockBusy`] after).
    /// Then, inside [`LockTicket::run`], make the guard's `dedup` or
    /// `state` claim: the lock stops concurrency, the record or the status
    /// stops repeats. The lock is released when the body returns, before
    /// the caller commits; a concurrent repeat arriving in between meets
    /// the record (or the row) and waits on it as under `dedup` alone.
    #[tracing::instrument(level = "debug", target = "idem", name = "idem.lock", skip_all, fields(scope = %self.scope(), strategy = "lock"))]
    pub async fn lock<'s>(
        &self,
        store: &'s dyn LockStore,
        ttl: Duration,
        wait: Duration,
    ) -> Result<LockTicket<'s>, Error> {
        let key = self.key_only()?;
        lock(self.scope_cow(), key, store, ttl, wait, false).await
    }

    /// `lock` alone (`concurrency_only = true`): mutual exclusion on the key
    /// and nothing else. Released, the lock lets the same request run again:
    /// it stops concurrency, not repetition.
    #[tracing::instrument(level = "debug", target = "idem", name = "idem.lock", skip_all, fields(scope = %self.scope(), strategy = "lock"))]
    pub async fn lock_only<'s>(
        self,
        store: &'s dyn LockStore,
        ttl: Duration,
        wait: Duration,
    ) -> Result<LockTicket<'s>, Error> {
        let key = self.key_only()?;
        lock(self.scope_cow(), key, store, ttl, wait, true).await
    }
}

async fn lock<'s>(
    scope: Cow<'static, str>,
    key: Key,
    store: &'s dyn LockStore,
    ttl: Duration,
    wait: Duration,
    alone: bool,
) -> Result<LockTicket<'s>, Error> {
    let stored = stored_scope(&scope).into_owned();
    let owner = new_owner();
    let fence = acquire_as(store, &stored, &key, &owner, ttl, wait).await.map_err(|e| match e {
        // Named by the guard's scope as written, not as stored.
        Error::LockBusy { retry_after, .. } => {
            tracing::debug!(target: "idem", scope = %scope, key = %key.hash(), "lock busy: another call with this key is running");
            Error::LockBusy { name: format!("{scope} (key {})", key.hash()), retry_after }
        }
        other => other,
    })?;
    Ok(LockTicket { store, scope, stored_scope: stored, key, owner, fence, ttl, alone, armed: true })
}

impl LockTicket<'_> {
    /// Run the body holding the lock, renewing it every third of its TTL,
    /// then release it. A lock lost while the body runs (a renewal found
    /// another holder, or none succeeded in time) stops the body with
    /// [`Error::LockLost`]; so does a release that finds the lock gone, for
    /// `lock+dedup` and `lock+state`, whose caller has not committed yet.
    /// A future dropped mid-body (a client disconnected, a timeout fired)
    /// releases the lock without waiting ([`LockStore::release_detached`]),
    /// so the next caller need not wait for the TTL. The body's future
    /// stopped with it; work it spawned, or requests it already sent, may
    /// still land after the next holder starts: that is what the fencing
    /// token is for.
    #[tracing::instrument(level = "debug", target = "idem", name = "idem.run", skip_all, fields(scope = %self.scope, strategy = "lock", fence = self.fence))]
    pub async fn run<T, E, F>(mut self, body: F) -> Result<T, E>
    where
        E: GuardError,
        F: Future<Output = Result<T, E>>,
    {
        if self.alone {
            forget_reported();
        }
        let info = LockInfo { fence: self.fence, owner: self.owner.clone() };
        let body = CURRENT.scope(info, body);
        let in_task = || self.store.extend(&self.stored_scope, self.key.as_str(), &self.owner, self.ttl);
        let renew = match self.store.shared() {
            Some(store) => {
                let held = Arc::new((self.stored_scope.clone(), self.key.as_str().to_owned(), self.owner.clone()));
                let ttl = self.ttl;
                Renewal::Detached(Box::new(move || {
                    let (store, held) = (store.clone(), held.clone());
                    Box::pin(async move { store.extend(&held.0, &held.1, &held.2, ttl).await })
                }))
            }
            None => Renewal::InTask(in_task),
        };
        // Nothing reads a lock's loss but this call.
        let lost = Arc::new(tokio::sync::watch::channel(None).0);
        let Ok(result) = under_renewal(body, self.ttl, renew, &lost, "lock", &self.scope).await else {
            // Given up before the store's TTL ran out: if the lock is still
            // this owner's, free it now rather than at its TTL (but do not
            // keep the caller waiting on a store that does not answer).
            let _ = self.release().await;
            self.armed = false;
            return Err(self.lost().into());
        };
        let released = self.release().await;
        self.armed = false;
        match released {
            Ok(true) => {}
            // `lock` alone: the body finished, its work (outside any
            // transaction of ours) is done and cannot be withheld; say that
            // exclusion was broken, and return what it did.
            Ok(false) if self.alone => {
                tracing::error!(target: "idem", scope = %self.scope, key = %self.key.hash(), fence = self.fence,
                    "the lock expired before the body finished; another caller may have run at the same time");
            }
            // With `dedup` or `state` the caller has not committed yet: fail,
            // so the change rolls back.
            Ok(false) => return Err(self.lost().into()),
            Err(e) => tracing::warn!(target: "idem", scope = %self.scope, key = %self.key.hash(), error = %e,
                "could not release the lock; it frees itself when its TTL passes"),
        }
        // A guard nested in the body (a dedup call inside a `lock` alone)
        // knows better whether the work ran or replayed.
        if self.alone && result.is_ok() && !reported() {
            let labels =
                crate::telemetry::metrics::Labels { scope: &self.scope, strategy: "lock", store: self.store.kind() };
            report(labels, &self.key, Outcome::Executed);
        }
        result
    }

    /// Release the lock, waiting at most a third of its TTL for the answer.
    async fn release(&self) -> Result<bool, Error> {
        bounded(self.ttl, self.store.kind(), self.store.release(&self.stored_scope, self.key.as_str(), &self.owner))
            .await
    }

    fn lost(&self) -> Error {
        crate::telemetry::metrics::lock_lost(&self.scope, self.store.kind());
        tracing::error!(target: "idem", scope = %self.scope, key = %self.key.hash(), fence = self.fence,
            store = self.store.kind(), "lock lost while the body ran: another caller may hold it now");
        Error::LockLost { scope: self.scope.to_string(), key_hash: self.key.hash() }
    }
}

/// A ticket dropped before its lock was released (never run, or its `run`
/// future dropped mid-body: a client disconnected, a timeout fired, a claim
/// made after the lock failed) releases the lock without waiting, so the
/// next caller need not wait for the TTL.
impl Drop for LockTicket<'_> {
    fn drop(&mut self) {
        if self.armed {
            tracing::debug!(target: "idem", scope = %self.scope, key = %self.key.hash(), fence = self.fence,
                "a held lock was dropped before it was released; releasing it");
            self.store.release_detached(&self.stored_scope, self.key.as_str(), &self.owner);
        }
    }
}
