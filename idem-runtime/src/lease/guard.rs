//! `strategy = "lease"`: a record committed on its own, held for the
//! duration of the body by a lease the runtime keeps renewing.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::error::{Error, LostLease};
use crate::guard::Claim;
use crate::guard::{Guard, GuardError, Prepared};
use crate::guard::{keep, replayed};
use crate::key::Fingerprint;
use crate::lease::new_owner;
use crate::lease::renew::{LostSender, Renewal, bounded, under_renewal};
use crate::lease::steps::{Holder, Steps};
use crate::lease::{CURRENT, Held, HeldLease, LeaseClaim, LeaseInfo, LeaseRequest, LeaseStore};
use crate::precheck::{Sight, confirmed as precheck_confirmed, look};
use crate::replay::Replayable;
use crate::telemetry::Outcome;

/// The lease a first call holds while its body runs: see [`LeaseTicket::run`].
/// A ticket dropped without `run` (or with its `run` future dropped
/// mid-body) leaves its record `PROCESSING` until the lease passes; then
/// the next call takes it over. It is not released at once: what the
/// dropped body already started may still be landing, and a retry let in
/// now could do it a second time. A caller whose work must finish though
/// its own caller goes away (an HTTP handler whose client disconnects) runs
/// it on a task of its own, as the HTTP and gRPC layers do.
#[must_use = "a held lease must run the body and settle the record"]
pub struct LeaseTicket<'s> {
    prepared: Prepared,
    store: &'s dyn LeaseStore,
    owner: String,
    fence: i64,
    reclaimed: bool,
    lease: Duration,
    /// Whether the lease is still this call's, as the body sees it, and
    /// what sets it.
    held: Held,
    lost: LostSender,
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
    pub async fn lease<'s, T: Replayable>(
        self,
        store: &'s dyn LeaseStore,
        lease: Duration,
    ) -> Result<Claim<T, LeaseTicket<'s>>, Error> {
        self.lease_or_wait(store, lease, Duration::ZERO).await
    }

    /// [`lease`](Self::lease), but a call that finds another one holding
    /// the key waits for it, up to `wait`, and then gets what that call
    /// left: its answer to replay, or, if it failed (its record removed)
    /// or its worker died (its lease passed), the key to run itself. Past
    /// `wait`, [`Error::InProgress`] as without waiting.
    ///
    /// Waiting holds no connection, and does not poll the store in a
    /// tight loop: a store that [`notifies`](LeaseStore::notifies) (the
    /// memory store; a Redis store with notifications) wakes the caller
    /// when the holder completes or releases the record, and is asked again
    /// at most every 500 ms; any other is asked again after pauses of 10 ms,
    /// doubling up to 250 ms. No wait is longer than the holder's lease.
    #[tracing::instrument(level = "debug", target = "idem", name = "idem.claim", skip_all, fields(scope = %self.scope(), strategy = "lease"))]
    pub async fn lease_or_wait<'s, T: Replayable>(
        self,
        store: &'s dyn LeaseStore,
        lease: Duration,
        wait: Duration,
    ) -> Result<Claim<T, LeaseTicket<'s>>, Error> {
        let precheck = self.precheck_store();
        let mut p = self.prepare_claim_before("lease", store.kind())?;
        let lease = crate::error::check_ttl("lease", lease)?;
        let owner = new_owner();
        let v1 = p.fingerprint.as_ref().and_then(Fingerprint::v1);
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
                    return replay(&p, response).map(Claim::Replay);
                }
                // A record of 0.2's is compared in its version by the claim.
                Some(LeaseClaim::Mismatch) if v1.is_none() => return Err(p.mismatch()),
                // The claim answers; a completed record still replays from it.
                _ => seen = true,
            }
        }
        let (claim, in_v1) = claim_in_its_version(store, &req, v1.as_ref(), wait).await?;
        if in_v1 {
            p.fingerprint = v1;
        }
        if seen {
            precheck_confirmed(matches!(claim, LeaseClaim::Done { .. }));
        }
        match claim {
            LeaseClaim::Acquired { fence, reclaimed } => {
                if reclaimed {
                    crate::telemetry::metrics::lease_taken_over(&p.scope, store.kind());
                    tracing::warn!(target: "idem", scope = %p.scope, key = %p.key.hash(), fence, store = store.kind(),
                        "reclaimed a record whose lease had passed (its worker stopped mid-work)");
                }
                p.claimed();
                let (held, lost) = Held::new(p.scope.to_string(), p.key.hash());
                Ok(Claim::Run(LeaseTicket { prepared: p, store, owner, fence, reclaimed, lease, held, lost }))
            }
            LeaseClaim::Done { response } => replay(&p, response).map(Claim::Replay),
            LeaseClaim::Busy { retry_after } => Err(p.in_progress(Some(retry_after))),
            LeaseClaim::Mismatch => Err(p.mismatch()),
        }
    }
}

/// [`claim_or_wait`], then, if the record holds another fingerprint, again
/// with the payload's fingerprint as 0.2 wrote it (`v1`): a record of
/// 0.2's is compared, and kept, in its version (an identical retry across
/// the upgrade replays or takes over). `true`: the second claim settled it.
async fn claim_in_its_version(
    store: &dyn LeaseStore,
    req: &LeaseRequest<'_>,
    v1: Option<&Fingerprint>,
    wait: Duration,
) -> Result<(LeaseClaim, bool), Error> {
    let claim = claim_or_wait(store, req, wait).await?;
    let Some(v1) = v1.filter(|_| claim == LeaseClaim::Mismatch) else { return Ok((claim, false)) };
    let claim = claim_or_wait(store, &LeaseRequest { fingerprint: Some(v1.as_str()), ..req.clone() }, wait).await?;
    let settled = claim != LeaseClaim::Mismatch;
    Ok((claim, settled))
}

/// Claim, and while another call holds the key, wait (up to `wait`) and
/// claim again: the claim that settled it, or the last `Busy`.
async fn claim_or_wait(store: &dyn LeaseStore, req: &LeaseRequest<'_>, wait: Duration) -> Result<LeaseClaim, Error> {
    const FIRST: Duration = Duration::from_millis(10);
    let now = tokio::time::Instant::now();
    // A wait too long for the clock (`Duration::MAX`) is a wait of a century.
    let until = now.checked_add(wait).unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600));
    let mut pause = if store.notifies() { Duration::from_millis(500) } else { FIRST };
    loop {
        if wait.is_zero() {
            return store.claim(req).await;
        }
        // Registered before the claim: a completion between the claim and
        // the wait still wakes it.
        let watch = store.watch(req.scope, req.key);
        let claim = store.claim(req).await?;
        let LeaseClaim::Busy { retry_after } = claim else { return Ok(claim) };
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Ok(claim);
        }
        // Woken early by a notifying store; else back off. A lease that
        // passes (its worker died) is taken over by the next claim; one
        // about to pass is asked again no sooner than the first pause.
        watch.wait(pause.min(left).min(retry_after.max(FIRST))).await;
        if !store.notifies() {
            pause = (pause * 2).min(Duration::from_millis(250));
        }
    }
}

impl<'s> LeaseTicket<'s> {
    /// [`run`](Self::run), the body in recorded steps: it gets the call's
    /// [`Steps`] and runs its outside work through [`Steps::run`], each
    /// step's `Ok` result recorded under the lease's fence before the next
    /// starts. A call that takes over a record whose worker died, or a
    /// retry after the body returned `Err`, replays the recorded steps
    /// without running them and resumes at the first step without a
    /// result; the one step in flight when a worker died runs again, with
    /// the same [`StepKey`](crate::lease::StepKey) for the outside system
    /// to deduplicate on (or is checked first, or stops the call in doubt:
    /// [`Steps::run_checked`], [`Steps::run_at_most_once`]). Once the call
    /// completes its steps are forgotten: its answer replays.
    ///
    /// One more round trip to the store before the body (the steps read),
    /// and one write per step run.
    pub async fn run_steps<T, E, F, Fut>(self, body: F) -> Result<T, E>
    where
        T: Replayable,
        E: GuardError,
        F: FnOnce(Steps<'s>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let p = &self.prepared;
        let read = bounded(self.lease, self.store.kind(), self.store.steps(&p.stored_scope, p.key.as_str())).await;
        let recorded = match read {
            Ok(recorded) => recorded,
            Err(e) => {
                self.release_failed("could not read its recorded steps").await;
                return Err(e.into());
            }
        };
        let limit = self.store.answer_limit().await;
        let names = (p.scope.to_string(), p.key.hash());
        let wrote = Arc::new(AtomicBool::new(false));
        let steps = Steps::new(self.store, self.holder(), names, limit, recorded, wrote, self.held.clone());
        let log = steps.clone();
        let value = self.run_body(body(steps)).await?;
        let (value, written) = self.completed_written(value).await?;
        if written {
            self.forget_steps(&log).await;
        }
        Ok(value)
    }
}

impl LeaseTicket<'_> {
    /// The call's step log for a door's handler (its request's
    /// extensions), reading what an earlier attempt left with its first
    /// step: no round trip for a handler that runs none. `None` for a
    /// store that gives no shared handle ([`LeaseStore::shared`]).
    #[cfg(any(feature = "http", feature = "grpc"))]
    pub(crate) fn door_steps(&self) -> Option<Steps<'static>> {
        let store = self.store.shared()?;
        let names = (self.prepared.scope.to_string(), self.prepared.key.hash());
        let wrote = Arc::new(AtomicBool::new(false));
        Some(Steps::shared(store, self.holder(), names, wrote, self.held.clone()))
    }

    /// The call completed (its record written): forget the steps its log
    /// found or recorded, whose answer replays from now on. A record left
    /// as a crash leaves it (the store failed for the whole lease) keeps
    /// them, for the take-over; a call that neither found nor recorded a
    /// step has none to forget.
    pub(crate) async fn forget_steps(&self, log: &Steps<'_>) {
        if !log.to_forget() {
            return;
        }
        let p = &self.prepared;
        if let Err(e) = self.store.forget_steps(&p.stored_scope, p.key.as_str()).await {
            tracing::warn!(target: "idem", scope = %p.scope, key = %p.key.hash(), error = %e,
                "a completed call's steps could not be removed; they go with their retention");
        }
    }
}

impl LeaseTicket<'_> {
    /// Run the body under the lease, renewing it every third of its length;
    /// then store the `Ok` value, or remove the record on `Err` (or a panic,
    /// which then goes on). If a renewal finds the lease taken over, the
    /// body is stopped (dropped): another worker owns the key now, and this
    /// one's completion would be refused.
    ///
    /// Once the body returned `Ok`, it never runs again for this key within
    /// the retention, whatever becomes of its answer: an answer that cannot
    /// be kept (longer than the store holds, a value JSON cannot carry
    /// exactly, a store that fails as it is written) is still returned, and
    /// the record says "completed, answer not kept" (a repeat gets
    /// [`Error::AnswerNotKept`]). Only a store that fails for the whole
    /// lease leaves the record as a crash would: taken over once the lease
    /// passes (logged at ERROR).
    #[tracing::instrument(level = "debug", target = "idem", name = "idem.run", skip_all, fields(scope = %self.prepared.scope, strategy = "lease", fence = self.fence))]
    pub async fn run<T, E, F>(self, body: F) -> Result<T, E>
    where
        T: Replayable,
        E: GuardError,
        F: Future<Output = Result<T, E>>,
    {
        let value = self.run_body(body).await?;
        Ok(self.completed(value).await?)
    }

    /// The body under the lease (see [`run`](Self::run)): its `Ok` value
    /// with the record still held, to be settled by [`completed`](Self::completed)
    /// or [`completed_without_answer`](Self::completed_without_answer).
    /// An `Err` or a panic removes the record (a retry runs again); a lost
    /// lease is [`Error::LeaseLost`].
    pub(crate) async fn run_body<T, E, F>(&self, body: F) -> Result<T, E>
    where
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
    {
        let p = &self.prepared;
        let held = self.held();
        let body = catching(CURRENT.scope(self.info(), body));
        let in_task = || self.store.extend(&held);
        let renew = match self.store.shared() {
            Some(store) => {
                let holder = Arc::new(self.holder());
                Renewal::Detached(Box::new(move || {
                    let (store, holder) = (store.clone(), holder.clone());
                    Box::pin(async move { store.extend(&holder.held()).await })
                }))
            }
            None => Renewal::InTask(in_task),
        };
        let result = match under_renewal(body, self.lease, renew, &self.lost, "lease", &p.scope).await {
            Ok(result) => result,
            Err(why) => return Err(self.lost(why).into()),
        };
        // A panic fails the call like an `Err`: the record goes, so a retry
        // runs at once rather than after the lease; then the panic goes on.
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                self.release_failed("failed").await;
                Err(e)
            }
            Err(panic) => {
                self.release_failed("panicked").await;
                std::panic::resume_unwind(panic)
            }
        }
    }

    /// The body ran to success with `value`: store it, and return what
    /// every repeat will get (decoded back from the record), or `value`
    /// itself if it cannot be kept.
    pub(crate) async fn completed<T: Replayable>(&self, value: T) -> Result<T, Error> {
        Ok(self.completed_written(value).await?.0)
    }

    /// [`completed`](Self::completed), and whether the record was completed
    /// (`false`: the store failed for the whole lease, and the record was
    /// left as a crash leaves it).
    async fn completed_written<T: Replayable>(&self, value: T) -> Result<(T, bool), Error> {
        let (json, value) = keep(&self.prepared, value, |_| self.store.answer_limit()).await.split();
        let written = self.write_completion(json).await?;
        Ok((value, written))
    }

    /// [`completed`](Self::completed) for a door's handler, then the
    /// steps of its `log` forgotten.
    #[cfg(any(feature = "http", feature = "grpc"))]
    pub(crate) async fn completed_with_steps<T: Replayable>(
        &self,
        value: T,
        log: Option<&Steps<'_>>,
    ) -> Result<T, Error> {
        let (value, written) = self.completed_written(value).await?;
        if let (true, Some(log)) = (written, log) {
            self.forget_steps(log).await;
        }
        Ok(value)
    }

    /// The body ran to success, and its answer is not to be kept (`why`):
    /// the record says so, and repeats get [`Error::AnswerNotKept`]; then
    /// the steps of its `log` are forgotten.
    #[cfg(any(feature = "http", feature = "grpc"))]
    pub(crate) async fn completed_without_answer(&self, why: &str, log: Option<&Steps<'_>>) -> Result<(), Error> {
        self.prepared.answer_not_kept(why);
        if let (true, Some(log)) = (self.write_completion(None).await?, log) {
            self.forget_steps(log).await;
        }
        Ok(())
    }

    /// Write the completion. One that failed on the store is tried again
    /// (a repeat by the same holder is harmless on every store), then
    /// written without its answer (a shorter write, and the record no
    /// longer `PROCESSING`: the next caller must not run the body again),
    /// for as long as the lease lasts; past that, the record is left as a
    /// crash leaves it, and the body's answer still returned. A try that
    /// failed may have landed (its reply lost): the store then keeps its
    /// answer, whatever the later tries carry, and repeats replay it.
    async fn write_completion(&self, mut json: Option<String>) -> Result<bool, Error> {
        let p = &self.prepared;
        let held = self.held();
        let started = std::time::Instant::now();
        let mut attempt = 0u32;
        loop {
            let completed = bounded(self.lease, self.store.kind(), self.store.complete(&held, json.as_deref())).await;
            let e = match completed {
                Ok(true) => {
                    crate::telemetry::metrics::complete(p.labels(), started.elapsed());
                    p.report(Outcome::Executed);
                    return Ok(true);
                }
                Ok(false) => return Err(self.lost(LostLease::TakenOver)),
                Err(e) => e,
            };
            attempt += 1;
            if started.elapsed() >= self.lease {
                tracing::error!(target: "idem", scope = %p.scope, key = %p.key.hash(), error = %e, store = self.store.kind(),
                    "the body ran to success, but its record could not be completed while the lease lasted; it is \
                     left as a crash leaves it: once the lease passes, a retry takes it over and runs the body again");
                p.report(Outcome::Executed);
                return Ok(false);
            }
            if json.is_some() && attempt >= 3 {
                p.answer_not_kept(format_args!(
                    "the store failed as it was written: {e} (if a try landed, its answer stays and replays)"
                ));
                json = None;
            } else {
                tracing::warn!(target: "idem", scope = %p.scope, key = %p.key.hash(), error = %e, attempt,
                    "storing the response failed; trying again");
            }
            tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt.min(10)))).await;
        }
    }

    fn held(&self) -> HeldLease<'_> {
        let p = &self.prepared;
        HeldLease {
            scope: &p.stored_scope,
            key: p.key.as_str(),
            owner: &self.owner,
            fingerprint: p.fingerprint.as_ref().map(|f| f.as_str()),
            fence: self.fence,
            lease: self.lease,
            retention: p.retention,
        }
    }

    /// The body `failed` or `panicked` (or, from a door's layer, its claim
    /// was refused by a misconfigured layer): remove the record so a retry
    /// runs again.
    pub(crate) async fn release_failed(&self, how: &str) {
        if let Err(e) = bounded(self.lease, self.store.kind(), self.store.release(&self.held())).await {
            let p = &self.prepared;
            tracing::warn!(target: "idem", scope = %p.scope, key = %p.key.hash(), error = %e,
                "the body {how} and its record could not be removed; a retry waits for the lease to pass");
        }
    }

    /// What the body sees of its lease: its fence, and whether it still holds.
    pub fn info(&self) -> LeaseInfo {
        LeaseInfo::new(self.fence, self.reclaimed, self.owner.clone(), self.held.clone())
    }

    /// The lease this call holds, owned (for a task of its own).
    fn holder(&self) -> Holder {
        Holder::of(&self.held())
    }

    /// The lease was lost (`why`): the body learns it too.
    fn lost(&self, why: LostLease) -> Error {
        self.lost.send_replace(Some(why));
        let p = &self.prepared;
        crate::telemetry::metrics::lease_lost(&p.scope, self.store.kind());
        tracing::error!(target: "idem", scope = %p.scope, key = %p.key.hash(), fence = self.fence,
            store = self.store.kind(), "lease lost: it {why}");
        Error::LeaseLost { scope: p.scope.to_string(), key_hash: p.key.hash(), why }
    }
}

/// A completed record's answer for a repeat: replayed, or, for a call whose
/// answer was not kept, [`Error::AnswerNotKept`].
fn replay<T: Replayable>(p: &Prepared, response: Option<String>) -> Result<T, Error> {
    match response {
        Some(json) => replayed(p, &json),
        None => Err(p.not_kept()),
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
