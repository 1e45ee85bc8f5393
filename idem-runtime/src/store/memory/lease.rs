//! Lease records in memory: one map entry per record, changed under its
//! shard's lock in one step.

use std::time::Duration;

use super::MemoryStore;
use crate::error::Error;
use crate::lease::store::{HeldLease, LeaseClaim, LeaseRequest, LeaseStore, Watch};
use crate::lease::store::{NewStep, RecordedStep, Resolve, StartedStep, StepLog, StepOutcome};
use crate::store::{BoxFuture, RecordKind, millis};

/// A call's recorded steps and its started mark, kept for the retention
/// from the last write.
pub(super) struct KeptSteps {
    steps: Vec<RecordedStep>,
    started: Option<Mark>,
    pub(super) expires_at: i64,
}

/// A step marked started: by the holder of `fence`.
struct Mark {
    number: usize,
    name: String,
    fence: i64,
}

impl KeptSteps {
    /// The mark, while its step has no result.
    fn mark(&self) -> Option<&Mark> {
        self.started.as_ref().filter(|mark| mark.number == self.steps.len())
    }

    fn log(&self) -> StepLog {
        StepLog {
            recorded: self.steps.clone(),
            started: self.mark().map(|mark| StartedStep { number: mark.number, name: mark.name.clone() }),
        }
    }
}

pub(super) struct Rec {
    done: bool,
    fingerprint: Option<String>,
    response: Option<String>,
    owner: String,
    fence: i64,
    lease_until: i64,
    pub(super) expires_at: i64,
}

impl MemoryStore {
    fn id(&self, scope: &str, key: &str) -> String {
        self.state.names.name(RecordKind::Lease, scope, key)
    }

    fn claim_now(&self, req: &LeaseRequest<'_>) -> LeaseClaim {
        let now = self.now();
        let id = self.id(req.scope, req.key);
        let mut map = self.state.shards.lock(&id);
        let lease_until = now.saturating_add(millis(req.lease));
        let expires_at = now.saturating_add(millis(req.retention.max(req.lease)));
        let fresh = |fence| Rec {
            done: false,
            fingerprint: req.fingerprint.map(str::to_owned),
            response: None,
            owner: req.owner.to_owned(),
            fence,
            lease_until,
            expires_at,
        };
        match map.get_mut(&id) {
            Some(rec) if rec.expires_at > now => {
                if let (Some(ours), Some(theirs)) = (req.fingerprint, rec.fingerprint.as_deref())
                    && ours != theirs
                {
                    return LeaseClaim::Mismatch;
                }
                if rec.done {
                    return LeaseClaim::Done { response: rec.response.clone() };
                }
                if rec.lease_until > now {
                    return LeaseClaim::Busy { retry_after: Duration::from_millis((rec.lease_until - now) as u64) };
                }
                let fence = self.next_fence();
                *rec = fresh(fence);
                LeaseClaim::Acquired { fence, reclaimed: true }
            }
            Some(rec) => {
                // Past retention: a new record.
                let fence = self.next_fence();
                *rec = fresh(fence);
                LeaseClaim::Acquired { fence, reclaimed: false }
            }
            None => {
                let fence = self.next_fence();
                map.insert(id, fresh(fence));
                LeaseClaim::Acquired { fence, reclaimed: false }
            }
        }
    }

    /// Change the call's steps with `write` if `held` still holds the
    /// record with a live lease: what `write` answered, or `false`.
    fn next_step(&self, held: &HeldLease<'_>, write: impl FnOnce(&mut KeptSteps) -> bool) -> bool {
        let (id, now) = (self.id(held.scope, held.key), self.now());
        // The record's shard, then the steps' (always in this order): the
        // lease cannot pass or change hands while the step is written.
        let records = self.state.shards.lock(&id);
        let live = records.get(&id).is_some_and(|rec| {
            !rec.done && rec.owner == held.owner && rec.fence == held.fence && rec.lease_until > now
        });
        if !live {
            return false;
        }
        let mut logs = self.state.steps.lock(&id);
        let expires_at = now.saturating_add(millis(held.retention));
        let kept = logs.entry(id.clone()).or_insert(KeptSteps { steps: Vec::new(), started: None, expires_at });
        if kept.expires_at <= now {
            kept.steps.clear();
            kept.started = None;
        }
        let written = write(kept);
        kept.expires_at = expires_at;
        written
    }

    /// Apply `change` to the record if `held` still holds it.
    fn if_held(&self, held: &HeldLease<'_>, change: impl FnOnce(&mut Rec, i64) -> bool) -> bool {
        let id = self.id(held.scope, held.key);
        let now = self.now();
        let mut map = self.state.shards.lock(&id);
        match map.get_mut(&id) {
            Some(rec) if !rec.done && rec.owner == held.owner && rec.fence == held.fence => {
                if change(rec, now) {
                    map.remove(&id);
                }
                true
            }
            _ => false,
        }
    }
}

impl LeaseStore for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn claim<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<LeaseClaim, Error>> {
        let claimed = self.claim_now(req);
        Box::pin(std::future::ready(Ok(claimed)))
    }

    fn complete<'a>(
        &'a self,
        held: &'a HeldLease<'a>,
        response: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let id = self.id(held.scope, held.key);
        let now = self.now();
        let mut map = self.state.shards.lock(&id);
        let done = match map.get_mut(&id) {
            Some(rec) if rec.owner == held.owner && rec.fence == held.fence => {
                // Already done by this holder: a repeated completion.
                if !rec.done {
                    rec.done = true;
                    rec.response = response.map(str::to_owned);
                    rec.expires_at = now.saturating_add(millis(held.retention));
                }
                true
            }
            _ => false,
        };
        drop(map);
        if done {
            self.state.waiters.wake(&id);
        }
        Box::pin(std::future::ready(Ok(done)))
    }

    fn release<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        let released = self.if_held(held, |_, _| true);
        if released {
            self.state.waiters.wake(&self.id(held.scope, held.key));
        }
        Box::pin(std::future::ready(Ok(released)))
    }

    fn steps<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<StepLog, Error>> {
        let (id, now) = (self.id(scope, key), self.now());
        let log = match self.state.steps.lock(&id).get(&id) {
            Some(kept) if kept.expires_at > now => kept.log(),
            _ => StepLog::default(),
        };
        Box::pin(std::future::ready(Ok(log)))
    }

    fn record_step<'a>(&'a self, held: &'a HeldLease<'a>, step: &'a NewStep<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        let recorded = self.next_step(held, |kept| match kept.steps.get(step.number) {
            // This holder's own step, written again.
            Some(done) => done.name == step.name && done.result == step.result,
            None if step.number == kept.steps.len() => {
                kept.steps.push(RecordedStep { name: step.name.to_owned(), result: step.result.to_owned() });
                true
            }
            None => false,
        });
        Box::pin(std::future::ready(Ok(recorded)))
    }

    fn mark_step<'a>(
        &'a self,
        held: &'a HeldLease<'a>,
        number: usize,
        name: &'a str,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let marked = self.next_step(held, |kept| {
            if number != kept.steps.len() {
                return false;
            }
            if kept.mark().is_none() {
                kept.started = Some(Mark { number, name: name.to_owned(), fence: held.fence });
            }
            true
        });
        Box::pin(std::future::ready(Ok(marked)))
    }

    fn unmark_step<'a>(&'a self, held: &'a HeldLease<'a>, number: usize) -> BoxFuture<'a, Result<(), Error>> {
        let id = self.id(held.scope, held.key);
        if let Some(kept) = self.state.steps.lock(&id).get_mut(&id)
            && kept.started.as_ref().is_some_and(|mark| mark.number == number && mark.fence == held.fence)
        {
            kept.started = None;
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn resolve_step<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        step: &'a str,
        outcome: StepOutcome<'a>,
    ) -> BoxFuture<'a, Result<Resolve, Error>> {
        let (id, now) = (self.id(scope, key), self.now());
        // The record's shard, then the steps', as a holder's writes take them.
        let records = self.state.shards.lock(&id);
        if let Some(rec) = records.get(&id).filter(|rec| !rec.done && rec.lease_until > now && rec.expires_at > now) {
            let lease_left = Duration::from_millis((rec.lease_until - now) as u64);
            return Box::pin(std::future::ready(Ok(Resolve::Held { lease_left })));
        }
        let mut logs = self.state.steps.lock(&id);
        let Some(kept) = logs.get_mut(&id).filter(|kept| kept.expires_at > now) else {
            return Box::pin(std::future::ready(Ok(Resolve::NotInFlight(StepLog::default()))));
        };
        let before = kept.log();
        if before.started.as_ref().is_none_or(|started| started.name != step) {
            return Box::pin(std::future::ready(Ok(Resolve::NotInFlight(before))));
        }
        if let StepOutcome::Done { result } = outcome {
            kept.steps.push(RecordedStep { name: step.to_owned(), result: result.to_owned() });
        }
        kept.started = None;
        Box::pin(std::future::ready(Ok(Resolve::Resolved(before))))
    }

    fn forget_steps<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        let id = self.id(scope, key);
        self.state.steps.lock(&id).remove(&id);
        Box::pin(std::future::ready(Ok(())))
    }

    fn notifies(&self) -> bool {
        true
    }

    fn watch<'a>(&'a self, scope: &'a str, key: &'a str) -> Watch<'a> {
        Watch::on(self.state.waiters.watch(&self.id(scope, key)))
    }

    fn shared(&self) -> Option<std::sync::Arc<dyn LeaseStore>> {
        Some(std::sync::Arc::new(self.clone()))
    }

    fn extend<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        let extended = self.if_held(held, |rec, now| {
            rec.lease_until = now.saturating_add(millis(held.lease));
            rec.expires_at = rec.expires_at.max(rec.lease_until);
            false
        });
        Box::pin(std::future::ready(Ok(extended)))
    }
}
