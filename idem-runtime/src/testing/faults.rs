//! A store with faults injected where a test asks for them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::Error;
use crate::future::BoxFuture;
use crate::lease::steps::Holder;
use crate::lease::store::{NewStep, Resolve, StepLog, StepOutcome};
use crate::lease::{HeldLease, LeaseClaim, LeaseRequest, LeaseStore};
use crate::lock::{LockAttempt, LockStore};
use crate::precheck::PrecheckStore;
use crate::token::TokenStore;

/// A store operation, as a fault rule names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// [`LeaseStore::claim`].
    Claim,
    /// [`LeaseStore::complete`].
    Complete,
    /// [`LeaseStore::release`].
    Release,
    /// [`LeaseStore::extend`].
    Extend,
    /// [`LeaseStore::peek`] (a read: [`Fault::LoseWrite`] does not apply).
    Peek,
    /// [`TokenStore::put`].
    TokenPut,
    /// [`TokenStore::consume`].
    TokenConsume,
    /// [`LockStore::acquire`].
    LockAcquire,
    /// [`LockStore::release`].
    LockRelease,
    /// [`LockStore::extend`].
    LockExtend,
    /// [`PrecheckStore::mark`].
    PrecheckMark,
    /// [`LeaseStore::steps`] (a read: [`Fault::LoseWrite`] does not apply).
    Steps,
    /// [`LeaseStore::record_step`] (the condition sees the step's result as
    /// the call's `response`).
    RecordStep,
    /// [`LeaseStore::forget_steps`].
    ForgetSteps,
    /// [`LeaseStore::mark_step`].
    MarkStep,
    /// [`LeaseStore::unmark_step`].
    UnmarkStep,
}

impl Op {
    /// A lease store's write, which [`Fault::LandsLate`] can delay past
    /// its caller.
    fn lands_late(self) -> bool {
        matches!(self, Op::Claim | Op::Complete | Op::Release | Op::Extend | Op::RecordStep | Op::ForgetSteps)
    }
}

/// What an injected fault does to a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The call fails before it reaches the store (the store is down or
    /// unreachable): nothing changes, the caller gets a store error.
    Fail,
    /// The call reaches the store after this delay (a slow network, a
    /// stalled server), then goes on as usual.
    Delay(Duration),
    /// The store acknowledges the write but keeps nothing (a failover that
    /// lost acknowledged writes, a flush): the caller is told it worked.
    /// A claim answers `Acquired` with fence 0, a consume or mark `true`,
    /// a completion, release or extension `true`. Reads are not affected.
    LoseWrite,
    /// The write happens, then the connection drops before the answer
    /// arrives: the store changed, and the caller gets a store error.
    DropAfterWrite,
    /// The write lands after the caller gave up on it: the caller gets the
    /// store's time-out error at once, and the call reaches the store this
    /// long afterwards, on a task of its own (a statement the server
    /// finishes after its client's time-out, a script queued behind a
    /// stalled one). For a lease store's writes (claim, completion,
    /// release, extension, steps recorded or forgotten); other calls are
    /// not affected. A write still waiting when the Tokio runtime shuts
    /// down never lands.
    LandsLate(Duration),
}

/// One call as a rule's condition sees it (scope and key as stored).
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    /// The operation.
    pub op: Op,
    /// The scope, as stored.
    pub scope: &'a str,
    /// The key (or token), as stored.
    pub key: &'a str,
    /// The answer a completion carries, or the result a step records
    /// (`None` for every other call, and for a completion whose answer was
    /// not kept).
    pub response: Option<&'a str>,
}

type Condition = Box<dyn Fn(&Call<'_>) -> bool + Send + Sync>;

struct Rule {
    op: Option<Op>,
    fault: Fault,
    /// How many more calls it applies to; `None`: until cleared.
    left: Option<usize>,
    when: Option<Condition>,
}

/// The fault rules of one or more wrapped stores, changed while the test
/// runs: clone it freely, every clone is the same set of rules.
///
/// The first rule that matches a call applies; a rule with a count is
/// dropped once it has applied that often.
#[derive(Clone, Default)]
pub struct Faults {
    rules: Arc<Mutex<Vec<Rule>>>,
    injected: Arc<AtomicUsize>,
    /// Calls seen, by `Op as usize`, faulty or not.
    calls: Arc<[AtomicUsize; OPS]>,
}

/// How many variants `Op` has.
const OPS: usize = Op::UnmarkStep as usize + 1;

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults").field("rules", &self.lock().len()).field("injected", &self.injected()).finish()
    }
}

impl Faults {
    /// No faults yet.
    pub fn new() -> Faults {
        Faults::default()
    }

    /// `store`, with these faults injected into its calls.
    pub fn wrap<S>(&self, store: S) -> Faulty<S> {
        Faulty { store: Arc::new(store), faults: self.clone(), answer_limit: None }
    }

    /// Every call of `op` gets `fault` until [`clear`](Self::clear).
    pub fn inject(&self, op: Op, fault: Fault) -> &Faults {
        self.push(Rule { op: Some(op), fault, left: None, when: None })
    }

    /// The next `times` calls of `op` get `fault`.
    pub fn inject_times(&self, op: Op, fault: Fault, times: usize) -> &Faults {
        self.push(Rule { op: Some(op), fault, left: Some(times), when: None })
    }

    /// Every call of every operation gets `fault` until cleared (the whole
    /// store down: `Fault::Fail`).
    pub fn inject_all(&self, fault: Fault) -> &Faults {
        self.push(Rule { op: None, fault, left: None, when: None })
    }

    /// Calls of `op` for which `when` holds get `fault` until cleared
    /// (say, only completions that carry an answer, or one key).
    pub fn inject_when(
        &self,
        op: Op,
        fault: Fault,
        when: impl Fn(&Call<'_>) -> bool + Send + Sync + 'static,
    ) -> &Faults {
        self.push(Rule { op: Some(op), fault, left: None, when: Some(Box::new(when)) })
    }

    /// Remove every rule: the stores work as they are again.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// How many calls got a fault so far.
    pub fn injected(&self) -> usize {
        self.injected.load(Ordering::SeqCst)
    }

    /// How many calls of `op` the wrapped stores received so far, faulty
    /// or not.
    pub fn calls(&self, op: Op) -> usize {
        self.calls[op as usize].load(Ordering::SeqCst)
    }

    fn push(&self, rule: Rule) -> &Faults {
        self.lock().push(rule);
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Rule>> {
        // A test that panicked while holding the rules leaves them usable.
        self.rules.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The fault for `call`, if a rule matches (counting it down).
    fn take(&self, call: &Call<'_>) -> Option<Fault> {
        self.calls[call.op as usize].fetch_add(1, Ordering::SeqCst);
        let mut rules = self.lock();
        let i = rules.iter().position(|r| {
            r.op.is_none_or(|op| op == call.op)
                && !(r.fault == Fault::LoseWrite && matches!(call.op, Op::Peek | Op::Steps))
                && (call.op.lands_late() || !matches!(r.fault, Fault::LandsLate(_)))
                && r.left != Some(0)
                && r.when.as_ref().is_none_or(|when| when(call))
        })?;
        let fault = rules[i].fault;
        if let Some(left) = &mut rules[i].left {
            *left -= 1;
            if *left == 0 {
                rules.remove(i);
            }
        }
        self.injected.fetch_add(1, Ordering::SeqCst);
        Some(fault)
    }
}

/// A store whose calls get the faults of its [`Faults`]; made by
/// [`Faults::wrap`]. Implements each store trait its inner store does, and
/// can be installed in [`Stores`](crate::Stores) like any store.
#[derive(Debug)]
pub struct Faulty<S> {
    /// Shared with the writes that land late ([`Fault::LandsLate`]).
    store: Arc<S>,
    faults: Faults,
    answer_limit: Option<usize>,
}

// By hand: derived, it would ask `S: Clone`.
impl<S> Clone for Faulty<S> {
    fn clone(&self) -> Self {
        Faulty { store: self.store.clone(), faults: self.faults.clone(), answer_limit: self.answer_limit }
    }
}

/// A late write ([`Fault::LandsLate`]): the call, made with owned copies of
/// its values, for a task of its own.
type Late = BoxFuture<'static, ()>;

impl<S> Faulty<S> {
    /// Say that records hold answers of at most `bytes` of JSON (a server
    /// configured with a smaller limit), whatever the inner store says: a
    /// longer answer is not kept ([`Error::AnswerNotKept`] for repeats).
    pub fn answer_limit(mut self, bytes: usize) -> Faulty<S> {
        self.answer_limit = Some(bytes);
        self
    }

    /// The wrapped store (calls on it get no faults).
    pub fn inner(&self) -> &S {
        &self.store
    }

    /// The rules its calls get.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// The call `real` makes, under the fault `call` gets, if any; `lost`
    /// is the answer a lost write gives. `real` is not even called unless
    /// the call reaches the store: a store may do its work as it builds
    /// the future (the memory store does).
    fn call<'a, T: Send + 'a>(
        &'a self,
        kind: &'static str,
        call: Call<'_>,
        real: impl FnOnce() -> BoxFuture<'a, Result<T, Error>> + Send + 'a,
        lost: impl FnOnce() -> T + Send + 'a,
    ) -> BoxFuture<'a, Result<T, Error>> {
        self.write(kind, call, real, lost, || -> Late { unreachable!("a late write is a lease store's") })
    }

    /// [`call`](Self::call) of a write that can land late: `late` makes it
    /// from owned copies of its values.
    fn write<'a, T: Send + 'a>(
        &'a self,
        kind: &'static str,
        call: Call<'_>,
        real: impl FnOnce() -> BoxFuture<'a, Result<T, Error>> + Send + 'a,
        lost: impl FnOnce() -> T + Send + 'a,
        late: impl FnOnce() -> Late,
    ) -> BoxFuture<'a, Result<T, Error>> {
        match self.faults.take(&call) {
            None => real(),
            Some(Fault::Fail) => Box::pin(std::future::ready(Err(injected(kind, "the store is unreachable")))),
            Some(Fault::LoseWrite) => Box::pin(std::future::ready(Ok(lost()))),
            Some(Fault::Delay(delay)) => Box::pin(async move {
                tokio::time::sleep(delay).await;
                real().await
            }),
            Some(Fault::DropAfterWrite) => Box::pin(async move {
                // What the store answered is lost with the connection.
                let _ = real().await;
                Err(injected(kind, "the connection dropped after the write, before its answer"))
            }),
            Some(Fault::LandsLate(after)) => {
                let write = late();
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    write.await;
                });
                Box::pin(std::future::ready(Err(injected(kind, "no answer in time (the write lands later)"))))
            }
        }
    }
}

fn injected(store: &'static str, what: &str) -> Error {
    Error::Store { store, source: format!("fault injected by idem::testing: {what}").into() }
}

fn plain<'a>(op: Op, scope: &'a str, key: &'a str) -> Call<'a> {
    Call { op, scope, key, response: None }
}

impl<S: LeaseStore + 'static> Faulty<S> {
    /// A late write of `held`'s holder: `op` on the inner store.
    fn late_held(
        &self,
        held: &HeldLease<'_>,
        op: impl for<'h> FnOnce(&'h S, &'h HeldLease<'h>) -> BoxFuture<'h, Result<bool, Error>> + Send + 'static,
    ) -> Late {
        let (store, held) = (self.store.clone(), Holder::of(held));
        Box::pin(async move {
            let _ = op(&store, &held.held()).await;
        })
    }
}

impl<S: LeaseStore + 'static> LeaseStore for Faulty<S> {
    fn kind(&self) -> &'static str {
        self.store.kind()
    }

    fn claim<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<LeaseClaim, Error>> {
        let call = plain(Op::Claim, req.scope, req.key);
        let late = || -> Late {
            let store = self.store.clone();
            let (scope, key, owner) = (req.scope.to_owned(), req.key.to_owned(), req.owner.to_owned());
            let fingerprint = req.fingerprint.map(str::to_owned);
            let (lease, retention) = (req.lease, req.retention);
            Box::pin(async move {
                let fingerprint = fingerprint.as_deref();
                let req = LeaseRequest { scope: &scope, key: &key, fingerprint, owner: &owner, lease, retention };
                let _ = store.claim(&req).await;
            })
        };
        let real = move || self.store.claim(req);
        self.write(self.kind(), call, real, || LeaseClaim::Acquired { fence: 0, reclaimed: false }, late)
    }

    fn complete<'a>(
        &'a self,
        held: &'a HeldLease<'a>,
        response: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let call = Call { op: Op::Complete, scope: held.scope, key: held.key, response };
        let late = || {
            let answer = response.map(str::to_owned);
            self.late_held(held, move |store, held| {
                Box::pin(async move { store.complete(held, answer.as_deref()).await })
            })
        };
        self.write(self.kind(), call, move || self.store.complete(held, response), || true, late)
    }

    fn release<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        let late = || self.late_held(held, |store, held| store.release(held));
        let call = plain(Op::Release, held.scope, held.key);
        self.write(self.kind(), call, move || self.store.release(held), || true, late)
    }

    fn extend<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        let late = || self.late_held(held, |store, held| store.extend(held));
        let call = plain(Op::Extend, held.scope, held.key);
        self.write(self.kind(), call, move || self.store.extend(held), || true, late)
    }

    fn peek<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<Option<LeaseClaim>, Error>> {
        self.call(self.kind(), plain(Op::Peek, req.scope, req.key), move || self.store.peek(req), || None)
    }

    fn steps<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<StepLog, Error>> {
        self.call(self.kind(), plain(Op::Steps, scope, key), move || self.store.steps(scope, key), StepLog::default)
    }

    fn record_step<'a>(&'a self, held: &'a HeldLease<'a>, step: &'a NewStep<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        let call = Call { op: Op::RecordStep, scope: held.scope, key: held.key, response: Some(step.result) };
        let late = || {
            let (number, name, result) = (step.number, step.name.to_owned(), step.result.to_owned());
            self.late_held(held, move |store, held| {
                Box::pin(async move {
                    let step = NewStep { number, name: &name, result: &result };
                    store.record_step(held, &step).await
                })
            })
        };
        self.write(self.kind(), call, move || self.store.record_step(held, step), || true, late)
    }

    fn mark_step<'a>(
        &'a self,
        held: &'a HeldLease<'a>,
        number: usize,
        name: &'a str,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let call = plain(Op::MarkStep, held.scope, held.key);
        self.call(self.kind(), call, move || self.store.mark_step(held, number, name), || true)
    }

    fn unmark_step<'a>(&'a self, held: &'a HeldLease<'a>, number: usize) -> BoxFuture<'a, Result<(), Error>> {
        let call = plain(Op::UnmarkStep, held.scope, held.key);
        self.call(self.kind(), call, move || self.store.unmark_step(held, number), || ())
    }

    fn resolve_step<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        step: &'a str,
        outcome: StepOutcome<'a>,
    ) -> BoxFuture<'a, Result<Resolve, Error>> {
        // An operator's act: no fault of its own.
        self.store.resolve_step(scope, key, step, outcome)
    }

    fn forget_steps<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        let late = || -> Late {
            let (store, scope, key) = (self.store.clone(), scope.to_owned(), key.to_owned());
            Box::pin(async move {
                let _ = store.forget_steps(&scope, &key).await;
            })
        };
        let call = plain(Op::ForgetSteps, scope, key);
        self.write(self.kind(), call, move || self.store.forget_steps(scope, key), || (), late)
    }

    fn notifies(&self) -> bool {
        self.store.notifies()
    }

    fn watch<'a>(&'a self, scope: &'a str, key: &'a str) -> crate::lease::store::Watch<'a> {
        self.store.watch(scope, key)
    }

    /// The inner store's handle, with the same faults.
    fn shared(&self) -> Option<Arc<dyn LeaseStore>> {
        let store = self.store.shared()?;
        Some(Arc::new(Faulty { store: Arc::new(store), faults: self.faults.clone(), answer_limit: self.answer_limit }))
    }

    fn answer_limit(&self) -> BoxFuture<'_, usize> {
        match self.answer_limit {
            Some(bytes) => Box::pin(std::future::ready(bytes)),
            None => self.store.answer_limit(),
        }
    }
}

impl<S: TokenStore> TokenStore for Faulty<S> {
    fn kind(&self) -> &'static str {
        self.store.kind()
    }

    fn put<'a>(&'a self, scope: &'a str, token: &'a str, ttl: Duration) -> BoxFuture<'a, Result<(), Error>> {
        self.call(self.kind(), plain(Op::TokenPut, scope, token), move || self.store.put(scope, token, ttl), || ())
    }

    fn consume<'a>(&'a self, scope: &'a str, token: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        self.call(self.kind(), plain(Op::TokenConsume, scope, token), move || self.store.consume(scope, token), || true)
    }
}

impl<S: LockStore> LockStore for Faulty<S> {
    fn kind(&self) -> &'static str {
        self.store.kind()
    }

    fn acquire<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<LockAttempt, Error>> {
        let real = move || self.store.acquire(scope, key, owner, ttl);
        self.call(self.kind(), plain(Op::LockAcquire, scope, key), real, || LockAttempt::Acquired { fence: 0 })
    }

    fn release<'a>(&'a self, scope: &'a str, key: &'a str, owner: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        self.call(
            self.kind(),
            plain(Op::LockRelease, scope, key),
            move || self.store.release(scope, key, owner),
            || true,
        )
    }

    fn extend<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let real = move || self.store.extend(scope, key, owner, ttl);
        self.call(self.kind(), plain(Op::LockExtend, scope, key), real, || true)
    }

    fn release_detached(&self, scope: &str, key: &str, owner: &str) {
        // Fire and forget: a fault can only drop it.
        match self.faults.take(&plain(Op::LockRelease, scope, key)) {
            Some(Fault::Fail | Fault::LoseWrite) => {}
            _ => self.store.release_detached(scope, key, owner),
        }
    }

    /// The inner store's handle, with the same faults.
    fn shared(&self) -> Option<Arc<dyn LockStore>> {
        let store = self.store.shared()?;
        Some(Arc::new(Faulty { store: Arc::new(store), faults: self.faults.clone(), answer_limit: self.answer_limit }))
    }
}

impl<S: PrecheckStore> PrecheckStore for Faulty<S> {
    fn kind(&self) -> &'static str {
        self.store.kind()
    }

    fn mark<'a>(&'a self, scope: &'a str, key: &'a str, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>> {
        self.call(self.kind(), plain(Op::PrecheckMark, scope, key), move || self.store.mark(scope, key, ttl), || true)
    }
}
