//! `strategy = "lease"`: a record committed on its own, held for the
//! duration of the body by a lease the runtime keeps renewing.

use std::time::Duration;

use crate::guard::{Guard, GuardError, Prepared};
use crate::lease::{CURRENT, HeldLease, LeaseClaim, LeaseInfo, LeaseRequest, LeaseStore};
use crate::precheck::{Sight, confirmed as precheck_confirmed, look};
use crate::record::Outcome;
use crate::store::new_owner;
use crate::strategy::record::{replayed, stored_response};
use crate::strategy::renew::{bounded, under_renewal};
use crate::{Claim, Error, Replayable};

/// The lease a first call holds while its body runs: see [`LeaseTicket::run`].
/// A ticket dropped without `run` (or with its `run` future dropped
/// mid-body) leaves its record `PROCESSING` until the lease passes; then
/// the next call takes it over. It is not released at once: what the
/// dropped body already started may still be landing, and a retry let in
/// now could do it a second time. A caller whose work must finish though
/// its own caller goes away (an HTTP handler whose client disconnects) runs
/// it on a task of its own, as [`crate::http`] does.
#[must_use = "a held lease must run the body and settle the record"]
pub struct LeaseTicket<'s> {
    prepared: Prepared,
    store: &'s dyn LeaseStore,
    owner: String,
    fence: i64,
    reclaimed: bool,
    lease: Duration,
}

impl std::fmt::Debug for LeaseTicket<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseTicket")
            .field("scope", &self.prepared.scope)
            .field("key", &self.prepared.key)
            .field("store", &self.store.kind())
            .field("fence", &self.fence)
            .field("reclaimed", &self.reclaimed)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl Guard<'_> {
    /// `lease`: claim the key in `store` with a record committed on its own
    /// (for work that cannot share a transaction with its record: a bank's
    /// API), held by a lease of `lease` on the store's clock.
    ///
    /// - [`Claim::Run`]: run the body with [`LeaseTicket::run`], which keeps
    ///   renewing the lease, then stores the answer (or removes the record
    ///   for an `Err` or a panic). A record whose lease passed (its worker
    ///   died) is taken over: new owner, fencing token + 1
    ///   ([`lease::current`](crate::lease::current) in the body).
    /// - [`Claim::Replay`]: the first call's answer, one round trip.
    ///
    /// Errors: [`Error::InProgress`] while another call holds a live lease
    /// (`retry_after`: the lease left), [`Error::KeyMismatch`], store
    /// errors. With [`Guard::precheck`] a seen key is read before it is
    /// claimed (on SQL stores a plain read instead of the claiming upsert).
    #[tracing::instrument(level = "debug", target = "idem", name = "idem.claim", skip_all, fields(scope = %self.scope(), strategy = "lease"))]
    pub async fn lease<'s, T: Replayable>(
        self,
        store: &'s dyn LeaseStore,
        lease: Duration,
    ) -> Result<Claim<T, LeaseTicket<'s>>, Error> {
        let precheck = self.precheck_store();
        let p = self.prepare_claim_before("lease", store.kind())?;
        let lease = crate::error::check_ttl("lease", lease)?;
        let owner = new_owner();
        let req = LeaseRequest {
            scope: &p.stored_scope,
            key: p.key.as_str(),
            fingerprint: p.fingerprint.as_ref().map(|f| f.as_str()),
            owner: &owner,
            lease,
            retention: p.retention,
        };
        let mut seen = false;
        if let Some((marks, ttl)) = precheck
            && let Sight::Seen = look(marks, &p.stored_scope, p.key.as_str(), ttl, &p.scope).await?
        {
            match store.peek(&req).await? {
                Some(LeaseClaim::Done { response }) => {
                    precheck_confirmed(true);
                    return replayed(&p, &response).map(Claim::Replay);
                }
                Some(LeaseClaim::Mismatch) => return Err(p.mismatch()),
                // The claim answers; a completed record still replays from it.
                _ => seen = true,
            }
        }
        let claim = store.claim(&req).await?;
        if seen {
            precheck_confirmed(matches!(claim, LeaseClaim::Done { .. }));
        }
        match claim {
            LeaseClaim::Acquired { fence, reclaimed } => {
                if reclaimed {
                    crate::metrics::lease_taken_over(&p.scope, store.kind());
                    tracing::warn!(target: "idem", scope = %p.scope, key = %p.key.hash(), fence, store = store.kind(),
                        "reclaimed a record whose lease had passed (its worker stopped mid-work)");
                }
                p.claimed();
                Ok(Claim::Run(LeaseTicket { prepared: p, store, owner, fence, reclaimed, lease }))
            }
            LeaseClaim::Done { response } => replayed(&p, &response).map(Claim::Replay),
            LeaseClaim::Busy { retry_after } => Err(p.in_progress(Some(retry_after))),
            LeaseClaim::Mismatch => Err(p.mismatch()),
        }
    }
}

impl LeaseTicket<'_> {
    /// Run the body under the lease, renewing it every third of its length;
    /// then store the `Ok` value, or remove the record on `Err` (or a panic,
    /// which then goes on). If a renewal
    /// finds the lease taken over, the body is stopped (dropped): another
    /// worker owns the key now, and this one's completion would be refused.
    #[tracing::instrument(level = "debug", target = "idem", name = "idem.run", skip_all, fields(scope = %self.prepared.scope, strategy = "lease", fence = self.fence))]
    pub async fn run<T, E, F>(self, body: F) -> Result<T, E>
    where
        T: Replayable,
        E: GuardError,
        F: Future<Output = Result<T, E>>,
    {
        let p = &self.prepared;
        let held = HeldLease {
            scope: &p.stored_scope,
            key: p.key.as_str(),
            owner: &self.owner,
            fingerprint: p.fingerprint.as_ref().map(|f| f.as_str()),
            fence: self.fence,
            lease: self.lease,
            retention: p.retention,
        };
        let info = LeaseInfo { fence: self.fence, reclaimed: self.reclaimed, owner: self.owner.clone() };
        let body = catching(CURRENT.scope(info, body));
        let renew = || self.store.extend(&held);
        let ran = under_renewal(body, self.lease, renew, "lease", &p.scope).await;
        let Some(result) = ran else {
            return Err(self.lost().into());
        };
        // A panic fails the call like an `Err`: the record goes, so a retry
        // runs at once rather than after the lease; then the panic goes on.
        let result = match result {
            Ok(result) => result,
            Err(panic) => {
                self.release_failed(&held, "panicked").await;
                std::panic::resume_unwind(panic)
            }
        };
        let value = match result {
            Ok(value) => value,
            Err(e) => {
                self.release_failed(&held, "failed").await;
                return Err(e);
            }
        };
        let (json, value) = match stored_response(&value, self.store.max_response()) {
            Ok(stored) => stored,
            Err(source) => {
                let _ = bounded(self.lease, self.store.kind(), self.store.release(&held)).await;
                return Err(Error::Response { scope: p.scope.to_string(), action: "stored", source }.into());
            }
        };
        // A completion that failed on the store is tried again (a repeat by
        // the same holder is harmless on every store): a record left
        // PROCESSING would make the next caller run the body again.
        let mut attempt = 0;
        let started = std::time::Instant::now();
        loop {
            let completed = self.store.complete(&held, &json).await;
            crate::metrics::complete(p.labels(), started.elapsed());
            match completed {
                Ok(true) => {
                    p.report(Outcome::Executed);
                    return Ok(value);
                }
                Ok(false) => return Err(self.lost().into()),
                Err(e) if attempt < 2 => {
                    attempt += 1;
                    tracing::warn!(target: "idem", scope = %p.scope, key = %p.key.hash(), error = %e, attempt,
                        "storing the response failed; trying again");
                    tokio::time::sleep(Duration::from_millis(50 * attempt)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The body `failed` or `panicked`: remove the record so a retry runs again.
    async fn release_failed(&self, held: &HeldLease<'_>, how: &str) {
        if let Err(e) = bounded(self.lease, self.store.kind(), self.store.release(held)).await {
            let p = &self.prepared;
            tracing::warn!(target: "idem", scope = %p.scope, key = %p.key.hash(), error = %e,
                "the body {how} and its record could not be removed; a retry waits for the lease to pass");
        }
    }

    fn lost(&self) -> Error {
        let p = &self.prepared;
        crate::metrics::lease_lost(&p.scope, self.store.kind());
        tracing::error!(target: "idem", scope = %p.scope, key = %p.key.hash(), fence = self.fence,
            store = self.store.kind(), "lease lost: another worker took the record over, the store lost it, or it could not be renewed in time");
        Error::LeaseLost { scope: p.scope.to_string(), key_hash: p.key.hash() }
    }
}

/// `body`, with a panic while it is polled caught and returned as `Err`
/// (to be resumed once the record is released).
async fn catching<F: Future>(body: F) -> Result<F::Output, Box<dyn std::any::Any + Send>> {
    let mut body = std::pin::pin!(body);
    std::future::poll_fn(move |cx| {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body.as_mut().poll(cx))) {
            Ok(std::task::Poll::Ready(out)) => std::task::Poll::Ready(Ok(out)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(panic) => std::task::Poll::Ready(Err(panic)),
        }
    })
    .await
}
