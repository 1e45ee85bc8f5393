//! Recorded steps inside a lease body (recovery points): each step's `Ok`
//! result is written to the store under the lease's fence before the next
//! step starts, so a take-over (or a retry after the body failed) resumes
//! at the first step without a result. A step with a check, or
//! at-most-once, is also marked started before its work, so that the
//! attempt after a crash knows it was in flight. See `docs/decisions/0002`
//! and `0003`.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, LostLease};
use crate::lease::Held;
use crate::lease::renew::bounded;
use crate::lease::store::{HeldLease, LeaseStore, NewStep, RecordedStep, StartedStep, StepLog};
use crate::replay::{Replayable, encode, fit};
#[cfg(feature = "sql")]
use crate::{
    future::BoxFuture,
    lease::store::{StepInTransaction, StepTransactions},
};

/// The most steps one call records.
pub const MAX_STEPS: usize = 64;

/// The longest step name, in bytes.
const MAX_NAME: usize = 128;

/// A step's stable key: the same for every attempt of the call (scope,
/// key and step name), to give the outside system as its own idempotency
/// key, so that a step re-sent after its worker died mid-step is
/// deduplicated there.
///
/// Equal keys name one step (whatever else they carry).
#[derive(Clone, Debug)]
pub struct StepKey {
    key: String,
    /// The call and this attempt of the step, for the messages it
    /// publishes (`Outbox::for_step`).
    #[cfg(feature = "outbox")]
    pub(crate) call: std::sync::Arc<StepCall>,
}

/// The call a step belongs to (scope and key as stored, its record's
/// retention), and the ordinal of the next message this attempt of the
/// step publishes: the key's clones share it, a new attempt starts at 0.
#[cfg(feature = "outbox")]
#[derive(Debug)]
pub(crate) struct StepCall {
    pub(crate) scope: String,
    pub(crate) key: String,
    pub(crate) retention: std::time::Duration,
    pub(crate) next_message: std::sync::atomic::AtomicU32,
}

impl StepKey {
    /// The key of the step `name` of the call of `scope` and `key`, both
    /// as stored ([`stored_scope`](crate::key::stored_scope),
    /// [`Key::as_str`](crate::Key::as_str)): what [`Steps::key`] gives
    /// inside the call, for a check from outside it.
    pub fn for_step(scope: &str, key: &str, name: &str) -> StepKey {
        StepKey::of(scope, key, name, crate::guard::DEFAULT_RETENTION)
    }

    #[cfg_attr(not(feature = "outbox"), allow(unused_variables))]
    fn of(scope: &str, key: &str, name: &str, retention: std::time::Duration) -> StepKey {
        StepKey {
            key: crate::key::step_key(scope, key, name),
            #[cfg(feature = "outbox")]
            call: std::sync::Arc::new(StepCall {
                scope: scope.to_owned(),
                key: key.to_owned(),
                retention,
                next_message: Default::default(),
            }),
        }
    }

    /// `idem-step-` and 32 hex digits: fits any API's idempotency-key field.
    pub fn as_str(&self) -> &str {
        &self.key
    }
}

impl PartialEq for StepKey {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Eq for StepKey {}

impl std::hash::Hash for StepKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key.hash(state)
    }
}

impl std::fmt::Display for StepKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.key)
    }
}

/// The step log of one lease-guarded call, handed to the body by
/// [`LeaseTicket::run_steps`](crate::lease::LeaseTicket::run_steps), and
/// to an HTTP or gRPC handler in its request's extensions
/// (`Steps<'static>`, under the layer's own record). A handle: its clones
/// are the same log.
#[derive(Clone)]
pub struct Steps<'s>(Arc<Log<'s>>);

/// Where a step log reaches its store: borrowed for a body's call, shared
/// for a handler's request (whose extensions want what lives on its own).
enum StoreRef<'s> {
    Borrowed(&'s dyn LeaseStore),
    #[cfg(any(feature = "http", feature = "grpc"))]
    Shared(Arc<dyn LeaseStore>),
}

impl<'s> std::ops::Deref for StoreRef<'s> {
    type Target = dyn LeaseStore + 's;
    fn deref(&self) -> &Self::Target {
        match self {
            StoreRef::Borrowed(store) => *store,
            #[cfg(any(feature = "http", feature = "grpc"))]
            StoreRef::Shared(store) => &**store,
        }
    }
}

struct Log<'s> {
    store: StoreRef<'s>,
    held: Holder,
    /// The scope as given, for messages; the key's short hash.
    scope: String,
    key_hash: String,
    /// The longest result the store holds, and what an earlier attempt
    /// left: read with the first step (or before the body, by
    /// `run_steps`).
    read: tokio::sync::OnceCell<usize>,
    steps: Mutex<Read>,
    /// Set once a step may have been recorded: shared with the ticket,
    /// which then knows the completed call has steps to forget.
    wrote: Arc<AtomicBool>,
    /// Whether the lease still holds: no step starts once it is lost.
    lease: Held,
}

/// The lease this call holds, a [`HeldLease`] of its own: for what
/// outlives the borrow (the step log, moved into the body's future; a
/// write the test kit lands late).
pub(crate) struct Holder {
    pub(crate) scope: String,
    pub(crate) key: String,
    pub(crate) owner: String,
    pub(crate) fingerprint: Option<String>,
    pub(crate) fence: i64,
    pub(crate) lease: std::time::Duration,
    pub(crate) retention: std::time::Duration,
}

impl Holder {
    /// `held`, owned.
    pub(crate) fn of(held: &HeldLease<'_>) -> Holder {
        Holder {
            scope: held.scope.to_owned(),
            key: held.key.to_owned(),
            owner: held.owner.to_owned(),
            fingerprint: held.fingerprint.map(str::to_owned),
            fence: held.fence,
            lease: held.lease,
            retention: held.retention,
        }
    }

    pub(crate) fn held(&self) -> HeldLease<'_> {
        HeldLease {
            scope: &self.scope,
            key: &self.key,
            owner: &self.owner,
            fingerprint: self.fingerprint.as_deref(),
            fence: self.fence,
            lease: self.lease,
            retention: self.retention,
        }
    }
}

/// What the log read of the store, and the names the body used.
struct Read {
    /// What the store held when the call claimed the key.
    recorded: Vec<RecordedStep>,
    /// The step after them, if an earlier attempt marked it started.
    started: Option<StartedStep>,
    /// Names the body used so far, in order.
    seen: Vec<String>,
}

/// What the log says of the step at a place in the body.
enum Place {
    /// An earlier attempt recorded it: its result's JSON.
    Recorded(String),
    /// An earlier attempt marked it started and did not record it: it was
    /// in flight when that attempt stopped.
    Started,
    /// Nothing yet: the step runs.
    Next,
}

impl std::fmt::Debug for Steps<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let log = self.lock();
        f.debug_struct("Steps").field("recorded", &log.recorded.len()).field("run", &log.seen.len()).finish()
    }
}

impl<'s> Steps<'s> {
    /// The log of a body, with what the store held when it began.
    pub(crate) fn new(
        store: &'s dyn LeaseStore,
        held: Holder,
        names: (String, String),
        answer_limit: usize,
        found: StepLog,
        wrote: Arc<AtomicBool>,
        lease: Held,
    ) -> Steps<'s> {
        let steps = Steps::unread(StoreRef::Borrowed(store), held, names, wrote, lease);
        steps.found(answer_limit, found);
        steps
    }

    fn unread(
        store: StoreRef<'s>,
        held: Holder,
        (scope, key_hash): (String, String),
        wrote: Arc<AtomicBool>,
        lease: Held,
    ) -> Steps<'s> {
        let steps = Mutex::new(Read { recorded: Vec::new(), started: None, seen: Vec::new() });
        Steps(Arc::new(Log { store, held, scope, key_hash, read: tokio::sync::OnceCell::new(), steps, wrote, lease }))
    }

    fn found(&self, answer_limit: usize, StepLog { recorded, started }: StepLog) {
        let mut log = self.lock();
        (log.recorded, log.started) = (recorded, started);
        drop(log);
        let _ = self.0.read.set(answer_limit);
    }

    /// Read what the store holds, once, before the first step.
    async fn read(&self) -> Result<(), Error> {
        let log = &*self.0;
        log.read
            .get_or_try_init(|| async {
                let store = &*log.store;
                let found = bounded(log.held.lease, store.kind(), store.steps(&log.held.scope, &log.held.key)).await?;
                let limit = store.answer_limit().await;
                let mut read = self.lock();
                (read.recorded, read.started) = (found.recorded, found.started);
                Ok::<_, Error>(limit)
            })
            .await?;
        Ok(())
    }

    /// A log for a door's handler, which reads what an earlier attempt
    /// left with its first step.
    #[cfg(any(feature = "http", feature = "grpc"))]
    pub(crate) fn shared(
        store: Arc<dyn LeaseStore>,
        held: Holder,
        names: (String, String),
        wrote: Arc<AtomicBool>,
        lease: Held,
    ) -> Steps<'static> {
        Steps::unread(StoreRef::Shared(store), held, names, wrote, lease)
    }

    fn answer_limit(&self) -> usize {
        self.0.read.get().copied().unwrap_or(usize::MAX)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Read> {
        self.0.steps.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the call has steps to forget once it completed: some were
    /// found, marked or may have been recorded.
    pub(crate) fn to_forget(&self) -> bool {
        let log = self.lock();
        !log.recorded.is_empty() || log.started.is_some() || self.0.wrote.load(Ordering::Relaxed)
    }

    /// Steps recorded by an earlier attempt of this call (a worker that
    /// died, a body that failed), which this one replays. At a door, known
    /// once the first step ran.
    pub fn recorded(&self) -> usize {
        self.lock().recorded.len()
    }

    /// The stable key of the step `name` of this call.
    pub fn key(&self, name: &str) -> StepKey {
        StepKey::of(&self.0.held.scope, &self.0.held.key, name, self.0.held.retention)
    }

    fn error(&self, step: &str, reason: impl Into<String>) -> Error {
        Error::Step { scope: self.0.scope.clone(), step: step.to_owned(), reason: reason.into() }
    }

    /// Run the step `name`, or return its recorded result.
    ///
    /// A step an earlier attempt recorded returns that result without
    /// running; the first step without one runs `step` with its
    /// [`StepKey`] (hand it to the outside system as its idempotency key),
    /// and its `Ok` value is recorded, under the lease's fence, before this
    /// returns: from then on no attempt runs it again. An `Err` is returned
    /// as it is, nothing recorded (the body's own `Err` then lets a retry
    /// resume here, and the body itself may run the step again, as a retry
    /// loop does). Steps run one after another, in the body's order.
    ///
    /// The step in flight when an earlier attempt stopped (its worker
    /// died mid-step) runs again, with the same key: at-least-once. For an
    /// outside system that does not deduplicate on the key, use
    /// [`run_checked`](Self::run_checked) or
    /// [`run_at_most_once`](Self::run_at_most_once).
    ///
    /// Errors: [`Error::StepsChanged`] when the body names another step at
    /// this place than the one recorded (a deploy changed the body);
    /// [`Error::Step`] for a name used twice, empty or over 128 bytes, more
    /// than [`MAX_STEPS`] steps, a result that does not replay exactly or is
    /// longer than the store holds, a store that keeps no steps;
    /// [`Error::LeaseLost`] when the lease is no longer this call's (the
    /// result is not recorded, and the body must stop).
    pub async fn run<T, E, F, Fut>(&self, name: &str, step: F) -> Result<T, E>
    where
        T: Replayable,
        E: From<Error>,
        F: FnOnce(StepKey) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.read().await?;
        let number = self.begin(name)?;
        if let Place::Recorded(json) = self.place(number, name)? {
            return Ok(self.decode(name, &json)?);
        }
        // A lease lost while the body was blocked (its thread held past the
        // lease) is known by now: the step is not sent.
        self.0.lease.check()?;
        let value = match step(self.key(name)).await {
            Ok(value) => value,
            Err(e) => return Err(self.not_run(e)),
        };
        let (json, value) = self.result(name, value)?;
        self.record(number, name, &json).await?;
        Ok(value)
    }

    /// [`run`](Self::run), for a step whose outside system can be asked
    /// whether the step's key was done, but does not deduplicate on it (a
    /// bank that can be queried, and would charge twice): the step is
    /// marked started under the lease's fence before `step` runs (one more
    /// write), and an attempt that finds it marked and not recorded (its
    /// worker died, or its body was dropped or panicked, mid-step) calls
    /// `check` with the step's key instead of running it at once:
    ///
    /// - `Ok(Some(result))`: it was done; `result` is recorded and
    ///   returned, and `step` does not run;
    /// - `Ok(None)`: it was not done; `step` runs (the mark stays, so an
    ///   attempt after this one checks again);
    /// - `Err`: returned as it is, the mark left: the next attempt checks
    ///   again.
    ///
    /// So the outside system gets the step once, as long as what `check`
    /// answers is true when it is asked: a stale worker still sending the
    /// step after its lease was taken over is stopped only by the lease's
    /// fence ([`lease::current`](crate::lease::current)), where the outside
    /// system compares it.
    ///
    /// A `step` that returns `Err` says it did not act: its mark is removed
    /// (if this attempt wrote it), and the step runs at once next time.
    /// An attempt that runs the step without a crash in it never calls
    /// `check`.
    ///
    /// ```
    /// # extern crate idem_runtime as idem;
    /// # struct Bank;
    /// # impl Bank {
    /// #     async fn charge(&self, _key: &str, cents: u64) -> Result<String, idem::Error> { Ok(format!("ch_{cents}")) }
    /// #     async fn find_charge(&self, _key: &str) -> Result<Option<String>, idem::Error> { Ok(None) }
    /// # }
    /// # async fn demo(steps: &idem::lease::Steps<'_>, bank: &Bank) -> Result<String, idem::Error> {
    /// let charge = steps
    ///     .run_checked(
    ///         "charge",
    ///         |key| async move { bank.find_charge(key.as_str()).await },
    ///         |key| async move { bank.charge(key.as_str(), 4_200).await },
    ///     )
    ///     .await?;
    /// # Ok(charge) }
    /// ```
    ///
    /// Errors: as [`run`](Self::run), and `check`'s own; [`Error::LeaseLost`]
    /// before `step` runs when the mark finds the lease lost.
    pub async fn run_checked<T, E, F, Fut, C, CheckFut>(&self, name: &str, check: C, step: F) -> Result<T, E>
    where
        T: Replayable,
        E: From<Error>,
        F: FnOnce(StepKey) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        C: FnOnce(StepKey) -> CheckFut,
        CheckFut: Future<Output = Result<Option<T>, E>>,
    {
        self.read().await?;
        let number = self.begin(name)?;
        match self.place(number, name)? {
            Place::Recorded(json) => return Ok(self.decode(name, &json)?),
            Place::Started => match check(self.key(name)).await {
                Ok(Some(done)) => {
                    let (json, value) = self.result(name, done)?;
                    self.record(number, name, &json).await?;
                    return Ok(value);
                }
                // Not done: it runs under the earlier attempt's mark.
                Ok(None) => {}
                Err(e) => return Err(self.not_run(e)),
            },
            Place::Next => {
                if let Err(e) = self.mark(number, name).await {
                    return Err(self.not_run(e.into()));
                }
            }
        }
        // As in `run`: no step is sent once the lease is known lost.
        self.0.lease.check()?;
        let value = match step(self.key(name)).await {
            Ok(value) => value,
            Err(e) => {
                self.unmark(number, name).await;
                return Err(self.not_run(e));
            }
        };
        // Not recordable: the mark stays, as after a crash (the step acted).
        let (json, value) = self.result(name, value)?;
        self.record(number, name, &json).await?;
        Ok(value)
    }

    /// [`run`](Self::run), for a step whose outside system can neither
    /// deduplicate on the step's key nor be asked about it: the step is
    /// marked started under the lease's fence before `step` runs (one more
    /// write), and an attempt that finds it marked and not recorded (its
    /// worker died, or its body was dropped or panicked, mid-step) does not
    /// run it: it returns [`Error::InDoubt`], naming the step and its key,
    /// and so does every later attempt, until an operator finds out what
    /// happened and resolves the step with `idem steps resolve` (done, with
    /// its result: the call resumes after it; not done: the call runs it).
    /// The step runs at most once.
    ///
    /// A `step` that returns `Err` says it did not act: its mark is
    /// removed, and the step runs again next time (or now, if the body
    /// calls it again).
    ///
    /// Errors: as [`run`](Self::run), and [`Error::InDoubt`];
    /// [`Error::LeaseLost`] before `step` runs when the mark finds the
    /// lease lost.
    pub async fn run_at_most_once<T, E, F, Fut>(&self, name: &str, step: F) -> Result<T, E>
    where
        T: Replayable,
        E: From<Error>,
        F: FnOnce(StepKey) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        // A check that never finds out: the step in flight is in doubt.
        let in_doubt = |key: StepKey| std::future::ready(Err(self.in_doubt(name, &key).into()));
        self.run_checked(name, in_doubt, step).await
    }

    /// [`run`](Self::run), for a step whose work is writes to the lease
    /// record's database: the step runs in a transaction begun on `pool`,
    /// and its result is recorded in that same transaction, so that its
    /// writes and its record commit together or not at all (an *atomic
    /// phase*). A worker that dies mid-step leaves neither; a take-over
    /// runs the step again from scratch, and no step key is needed for
    /// these writes.
    ///
    /// The record is written under the lease's fence, with the lease
    /// record's row share-locked until `COMMIT`: a take-over waits for the
    /// step's transaction to end, and finds the step recorded if it
    /// committed. Once the step has a result, later attempts replay it
    /// without beginning a transaction. Costs no round trip beyond the
    /// transaction's own and one `INSERT`.
    ///
    /// `pool` must be the database of the call's [`SqlStore`](crate::store::SqlStore)
    /// (lease records in another store: run the writes in a [`run`](Self::run)
    /// step whose transaction carries a `dedup` guard keyed on the step's
    /// [`StepKey`], which makes them once-only in that database).
    ///
    /// ```no_run
    /// # extern crate idem_runtime as idem;
    /// # async fn demo(steps: &idem::lease::Steps<'_>, pool: &sqlx::PgPool) -> Result<(), idem::Error> {
    /// let entry: i64 = steps
    ///     .run_tx("ledger", pool, |tx, _key| {
    ///         Box::pin(async move {
    ///             let (id,): (i64,) = sqlx::query_as("INSERT INTO ledger (amount) VALUES (100) RETURNING id")
    ///                 .fetch_one(&mut **tx)
    ///                 .await?;
    ///             Ok::<_, idem::Error>(id)
    ///         })
    ///     })
    ///     .await?;
    /// # let _ = entry; Ok(()) }
    /// ```
    ///
    /// Errors: as [`run`](Self::run); [`Error::Step`] for a `pool` on
    /// another database than the lease records; database errors of the
    /// transaction (a failed `COMMIT` may have committed: the call must
    /// fail, and a retry finds the step recorded, or runs it).
    #[cfg(feature = "sql")]
    pub async fn run_tx<'c, DB, T, E, F>(&self, name: &str, pool: &sqlx::Pool<DB>, step: F) -> Result<T, E>
    where
        DB: StepTransactions,
        T: Replayable,
        E: From<Error>,
        // `'c` outlives every `'t` (`&'t mut Transaction<'c, _>` says so):
        // the step's future may borrow what lives that long.
        F: for<'t> FnOnce(&'t mut sqlx::Transaction<'c, DB>, StepKey) -> BoxFuture<'t, Result<T, E>>,
    {
        self.read().await?;
        let number = self.begin(name)?;
        if let Place::Recorded(json) = self.place(number, name)? {
            return Ok(self.decode(name, &json)?);
        }
        if let Err(e) = self.same_database(name, DB::LEASE_KIND) {
            return Err(self.not_run(e.into()));
        }
        let mut tx: sqlx::Transaction<'c, DB> = match pool.begin().await {
            Ok(tx) => tx,
            Err(e) => return Err(self.not_run(Error::Database(e).into())),
        };
        // Dropped on any return before COMMIT, `tx` rolls back.
        let value = match step(&mut tx, self.key(name)).await {
            Ok(value) => value,
            Err(e) => return Err(self.not_run(e)),
        };
        // Not recordable: rolled back with the step's writes.
        let (json, value) = self.result(name, value).map_err(|e| self.not_run(e))?;
        let new = NewStep { number, name, result: &json };
        if let StepInTransaction::Refused { call_here } = DB::record_step_in(&mut tx, &self.0.held.held(), &new).await?
        {
            drop(tx);
            return Err(self.not_recorded(name, !call_here).await.into());
        }
        self.0.wrote.store(true, Ordering::Relaxed);
        tx.commit().await.map_err(Error::Database)?;
        Ok(value)
    }

    /// The step did not run, or ran and left nothing (its own `Err`, its
    /// transaction rolled back): the body may run it again, here.
    fn not_run<E>(&self, e: E) -> E {
        self.lock().seen.pop();
        e
    }

    /// A recorded result, decoded.
    fn decode<T: Replayable>(&self, name: &str, json: &str) -> Result<T, Error> {
        serde_json::from_str(json).map_err(|e| self.error(name, format!("its recorded result does not decode: {e}")))
    }

    /// A step's `Ok` value as it is recorded, and the value the body gets
    /// (what a replay will give).
    fn result<T: Replayable>(&self, name: &str, value: T) -> Result<(String, T), Error> {
        let json = encode(&value).map_err(|e| self.error(name, format!("its result does not serialize: {e}")))?;
        fit(&value, json, self.answer_limit())
            .map_err(|e| self.error(name, format!("its result cannot be recorded: {e}")))
    }

    /// A step in a transaction of `backend` when the lease records are
    /// in a store known to be elsewhere.
    #[cfg(feature = "sql")]
    fn same_database(&self, name: &str, backend: &str) -> Result<(), Error> {
        match self.0.store.kind() {
            kind @ ("memory" | "redis" | "postgres" | "mysql" | "sqlite") if kind != backend => {
                Err(self.elsewhere(name, kind))
            }
            _ => Ok(()),
        }
    }

    #[cfg(feature = "sql")]
    fn elsewhere(&self, name: &str, kind: &str) -> Error {
        self.error(
            name,
            format!(
                "`run_tx` records a step beside the lease record, in the step's transaction, but the lease records are \
                 in another database (`{kind}`): begin the step's transaction on the lease store's database, or use \
                 `run` with a `dedup` guard keyed on the step's key in your transaction"
            ),
        )
    }

    /// The step's record was refused: the lease is lost, or (the
    /// transaction's database has no record of the call, `absent`, while
    /// the lease store holds it for this call) the transaction was on
    /// another database than the lease records.
    #[cfg(feature = "sql")]
    async fn not_recorded(&self, name: &str, absent: bool) -> Error {
        if absent && let Ok(true) = self.0.store.extend(&self.0.held.held()).await {
            return self.elsewhere(name, self.0.store.kind());
        }
        self.taken_over()
    }

    /// The store refused a step's record: the lease is another call's.
    fn taken_over(&self) -> Error {
        Error::LeaseLost { scope: self.0.scope.clone(), key_hash: self.0.key_hash.clone(), why: LostLease::TakenOver }
    }

    /// Check `name` and take the next position.
    fn begin(&self, name: &str) -> Result<usize, Error> {
        if name.is_empty() || name.len() > MAX_NAME || name.chars().any(char::is_control) {
            return Err(self.error(name, "a step name is 1 to 128 bytes, no control characters"));
        }
        let mut log = self.lock();
        if log.seen.iter().any(|seen| seen == name) {
            return Err(self.error(name, "the body runs a step of this name twice; give each step its own name"));
        }
        if log.seen.len() >= MAX_STEPS {
            return Err(self.error(name, format!("a call records at most {MAX_STEPS} steps")));
        }
        log.seen.push(name.to_owned());
        Ok(log.seen.len() - 1)
    }

    /// What an earlier attempt left at `number`, if the step there is `name`.
    fn place(&self, number: usize, name: &str) -> Result<Place, Error> {
        let log = self.lock();
        let (earlier, place) = match (log.recorded.get(number), &log.started) {
            (Some(step), _) => (&step.name, Place::Recorded(step.result.clone())),
            (None, Some(started)) if started.number == number => (&started.name, Place::Started),
            (None, _) => return Ok(Place::Next),
        };
        if earlier != name {
            return Err(Error::StepsChanged {
                scope: self.0.scope.clone(),
                position: number,
                recorded: earlier.clone(),
                found: name.to_owned(),
            });
        }
        Ok(place)
    }

    /// Mark the step started, before its work runs.
    async fn mark(&self, number: usize, name: &str) -> Result<(), Error> {
        // A mark is a step row to forget once the call completes.
        self.0.wrote.store(true, Ordering::Relaxed);
        match self.0.store.mark_step(&self.0.held.held(), number, name).await? {
            true => Ok(()),
            false => Err(self.taken_over()),
        }
    }

    /// The step's work said it did not act: remove its mark. A mark that
    /// cannot be removed stays, and the next attempt treats the step as in
    /// flight (checks it, or stops in doubt): the safe side.
    async fn unmark(&self, number: usize, name: &str) {
        if let Err(e) = self.0.store.unmark_step(&self.0.held.held(), number).await {
            tracing::warn!(target: "idem", scope = %self.0.scope, key = %self.0.key_hash, step = name, error = %e,
                "a step that failed could not remove its started mark; the next attempt treats it as in flight");
        }
    }

    fn in_doubt(&self, name: &str, key: &StepKey) -> Error {
        tracing::error!(target: "idem", scope = %self.0.scope, key = %self.0.key_hash, step = name, step_key = %key,
            "an at-most-once step was in flight when an earlier attempt stopped: the call is in doubt until an \
             operator resolves the step (idem steps resolve)");
        Error::InDoubt {
            scope: self.0.scope.clone(),
            key_hash: self.0.key_hash.clone(),
            step: name.to_owned(),
            step_key: key.to_string(),
        }
    }

    async fn record(&self, number: usize, name: &str, json: &str) -> Result<(), Error> {
        let step = NewStep { number, name, result: json };
        // Set before: a write whose answer was lost may have landed.
        self.0.wrote.store(true, Ordering::Relaxed);
        match self.0.store.record_step(&self.0.held.held(), &step).await? {
            true => Ok(()),
            false => Err(self.taken_over()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::StepKey;

    #[test]
    fn a_step_key_is_stable_and_names_one_step() {
        let a = StepKey::for_step("pay", "T-1", "charge");
        assert_eq!(a, StepKey::for_step("pay", "T-1", "charge"));
        assert_ne!(a, StepKey::for_step("pay", "T-1", "refund"));
        assert_ne!(StepKey::for_step("pa", "yT-1", "charge"), a, "parts do not run into each other");
        assert!(a.as_str().starts_with("idem-step-") && a.as_str().len() == 42, "{a}");
        // The value itself: keys already given to outside systems stay valid.
        assert_eq!(a.as_str(), "idem-step-cb3000e11bb46d657b1a4209269c4af3");
    }
}
