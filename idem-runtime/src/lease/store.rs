//! The lease store interface: what a store of lease records must do
//! (`strategy = "lease"`), one atomic step per operation. Implemented by
//! the memory, Redis and SQL stores and by [`Routed`](crate::store::Routed).

use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::future::BoxFuture;

/// A store of the user's own keeps no steps unless it says so.
fn no_steps(store: &'static str, scope: &str) -> Error {
    Error::Step {
        scope: scope.to_owned(),
        step: String::new(),
        reason: format!("the `{store}` lease store keeps no steps (implement `LeaseStore::steps` and `record_step`)"),
    }
}

/// A claim as a store receives it.
#[derive(Clone, Debug)]
pub struct LeaseRequest<'a> {
    /// Scope as stored (long scopes hashed).
    pub scope: &'a str,
    /// Key as stored (long keys hashed).
    pub key: &'a str,
    /// Hash of the payload, when the guard declares a fingerprint.
    pub fingerprint: Option<&'a str>,
    /// This call's owner id.
    pub owner: &'a str,
    /// How long the lease lasts from the store's now.
    pub lease: Duration,
    /// How long the record is kept.
    pub retention: Duration,
}

/// What a claim found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseClaim {
    /// This call holds the lease: run the body. `reclaimed` when it took over
    /// a record whose lease had passed (its worker died or stalled).
    Acquired {
        /// Fencing token: higher than every earlier holder's.
        fence: i64,
        /// An abandoned record was taken over.
        reclaimed: bool,
    },
    /// A completed call: replay its response.
    Done {
        /// JSON of the first call's `Ok` value; `None` when the call ran to
        /// success but its answer could not be kept (a repeat gets
        /// [`Error::AnswerNotKept`]).
        response: Option<String>,
    },
    /// Another call holds a live lease.
    Busy {
        /// Until the lease ends, by the store's clock.
        retry_after: Duration,
    },
    /// The record was written with another fingerprint.
    Mismatch,
}

/// A lease this call holds, as completion, release and extension see it.
#[derive(Clone, Debug)]
pub struct HeldLease<'a> {
    /// Scope as stored.
    pub scope: &'a str,
    /// Key as stored.
    pub key: &'a str,
    /// This call's owner id.
    pub owner: &'a str,
    /// The fingerprint the claim was made with (a store that writes the
    /// record whole on completion, like Redis, writes it again).
    pub fingerprint: Option<&'a str>,
    /// The fencing token the claim returned.
    pub fence: i64,
    /// Lease length (extensions renew it from the store's now).
    pub lease: Duration,
    /// How long a completed record is kept.
    pub retention: Duration,
}

/// A step as a store keeps it: its name and its result's JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedStep {
    /// The step's name, as the body gave it.
    pub name: String,
    /// JSON of the step's `Ok` value.
    pub result: String,
}

/// What a store holds of one call's steps ([`LeaseStore::steps`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepLog {
    /// The steps recorded, in order.
    pub recorded: Vec<RecordedStep>,
    /// The step after them, if one was marked started ([`LeaseStore::mark_step`]:
    /// a step with a check, or at-most-once) and has no result: its work
    /// may or may not have happened.
    pub started: Option<StartedStep>,
}

/// A step marked started and not recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartedStep {
    /// Its position in the body, from 0: the number of steps recorded.
    pub number: usize,
    /// The step's name.
    pub name: String,
}

/// What an operator found out, from the outside system, about a step in
/// flight ([`LeaseStore::resolve_step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepOutcome<'a> {
    /// Its work was done: record `result` (the JSON of the step's `Ok`
    /// value, as the body's type reads it back) as its result; the call
    /// resumes after it.
    Done {
        /// The step's result, JSON.
        result: &'a str,
    },
    /// Its work was not done: remove its mark; the call runs it.
    NotDone,
}

/// What [`LeaseStore::resolve_step`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resolve {
    /// The step was in flight and is resolved. The call's steps as they
    /// were.
    Resolved(StepLog),
    /// No step of that name is in flight (none was marked, or it was
    /// recorded or resolved since): nothing changed. The call's steps as
    /// they are.
    NotInFlight(StepLog),
    /// A worker holds the call's record with a live lease (it may be
    /// checking or running the step): nothing changed; look again once it
    /// stopped.
    Held {
        /// How long its lease lasts yet, by the store's clock.
        lease_left: Duration,
    },
}

/// A step to record, as a store receives it.
#[derive(Clone, Copy, Debug)]
pub struct NewStep<'a> {
    /// Its position in the body, from 0: the store records it only as the
    /// next one (one more than the steps it holds).
    pub number: usize,
    /// The step's name.
    pub name: &'a str,
    /// JSON of the step's `Ok` value.
    pub result: &'a str,
}

/// A database whose transactions can record a step with the step's own
/// writes ([`Steps::run_tx`](crate::lease::Steps::run_tx)): the databases
/// of [`SqlStore`](crate::store::SqlStore) (PostgreSQL, MySQL/MariaDB,
/// SQLite), which implement it.
#[cfg(feature = "sql")]
#[diagnostic::on_unimplemented(
    message = "`{Self}` keeps no lease records: a step cannot be recorded in its transactions",
    note = "`run_tx` takes a pool of sqlx::Postgres, sqlx::MySql or sqlx::Sqlite: the database of the call's `SqlStore`"
)]
pub trait StepTransactions: sqlx::Database {
    /// The [`LeaseStore::kind`] of a lease store on this database.
    const LEASE_KIND: &'static str;
    /// Record `step` in the transaction open on `conn`, as
    /// [`LeaseStore::record_step`] records it on its own (only the live
    /// holder's next step), the holder's record kept from changing until
    /// the transaction ends.
    fn record_step_in<'a>(
        conn: &'a mut Self::Connection,
        held: &'a HeldLease<'a>,
        step: &'a NewStep<'a>,
    ) -> BoxFuture<'a, Result<StepInTransaction, Error>>;
}

/// What [`StepTransactions::record_step_in`] did.
#[cfg(feature = "sql")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepInTransaction {
    /// Written: it commits with the transaction.
    Recorded,
    /// Not written: the lease is no longer the holder's, or the record is
    /// not in this database (`call_here` false: no record of the call).
    Refused {
        /// The database holds a record of the call.
        call_here: bool,
    },
}

/// News of one lease record that a waiting call takes before its claim
/// ([`LeaseStore::watch`]).
pub struct Watch<'a> {
    wake: Option<BoxFuture<'a, ()>>,
}

impl<'a> Watch<'a> {
    /// A watch that hears nothing: a wait on it is its pause.
    pub fn none() -> Watch<'a> {
        Watch { wake: None }
    }

    /// A watch that `wake` ends: a future, registered with the store as it
    /// was made, that completes when the record changed.
    pub fn on(wake: BoxFuture<'a, ()>) -> Watch<'a> {
        Watch { wake: Some(wake) }
    }

    /// Until the record changed, at most `pause`.
    pub(crate) async fn wait(self, pause: Duration) {
        match self.wake {
            Some(wake) => {
                let _ = tokio::time::timeout(pause, wake).await;
            }
            None => tokio::time::sleep(pause).await,
        }
    }
}

impl std::fmt::Debug for Watch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").field("hears", &self.wake.is_some()).finish()
    }
}

/// A store of lease records. Each operation is one atomic step on the store
/// (one statement or one script call); no operation reads and then writes
/// from the client.
///
/// `complete`, `release` and `extend` return `Ok(false)` when the record is
/// no longer this holder's (taken over, or gone): they changed nothing.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a lease store",
    label = "`store` must name a lease store",
    note = "use `idem::store::MemoryStore`, `idem::store::SqlStore::new(pool)`, `idem::store::RedisStore::new(conn, prefix)` or an `idem::Stores` (or your own `impl idem::lease::LeaseStore`); leave `store` out to use the installed one (`idem::Stores::builder().lease(..).install()`)"
)]
pub trait LeaseStore: Send + Sync {
    /// `memory`, `redis`, `postgres`, `mysql` or `sqlite`, for logs.
    fn kind(&self) -> &'static str;
    /// Claim, replay, report busy, or report a fingerprint mismatch.
    fn claim<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<LeaseClaim, Error>>;
    /// Mark the record `DONE` with `response`, if still held; without one
    /// (`None`), the record says "completed, answer not kept". A stored
    /// answer is final: repeated by the same holder (its reply was lost),
    /// with the answer, another one or none, it changes nothing and
    /// answers `true`.
    fn complete<'a>(&'a self, held: &'a HeldLease<'a>, response: Option<&'a str>)
    -> BoxFuture<'a, Result<bool, Error>>;
    /// Remove the record (the body failed), if still held.
    fn release<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>>;
    /// Renew the lease from the store's now, if still held.
    fn extend<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>>;
    /// Read the record without claiming it (for `precheck`): `Done` or
    /// `Mismatch` when that settles the call, `None` when only a claim can.
    /// The default is `None`, right for stores whose claim of a completed
    /// record is already a pure read (memory, Redis); the SQL store reads
    /// with a plain `SELECT` instead of its claiming upsert.
    fn peek<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<Option<LeaseClaim>, Error>> {
        let _ = req;
        Box::pin(std::future::ready(Ok(None)))
    }
    /// The longest answer, in bytes of JSON, a record can hold (a longer
    /// one is not kept: its record is completed without it). Unlimited by
    /// default; MySQL's is asked of the server once per store, Redis's
    /// (`proto-max-bulk-len`) once per store where `CONFIG GET` is allowed.
    fn answer_limit(&self) -> BoxFuture<'_, usize> {
        Box::pin(std::future::ready(usize::MAX))
    }
    /// The steps recorded for the call of `scope` and `key` (as stored),
    /// in order, and the one marked started after them, if any
    /// ([`Steps`](crate::lease::Steps)): read by a call that holds the key,
    /// before its body runs. The default, for a store of your own that
    /// keeps no steps, is [`Error::Step`].
    fn steps<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<StepLog, Error>> {
        let _ = key;
        Box::pin(std::future::ready(Err(no_steps(self.kind(), scope))))
    }
    /// Record `step` if `held` still holds the record with a live lease by
    /// the store's clock and `step` is the next one (its number is the
    /// count of steps recorded), in one atomic step: `false`, changing
    /// nothing, when the lease is no longer `held`'s. Recorded steps outlive
    /// a released record (a failed body's retry resumes from them) and are
    /// kept for the retention from their last write.
    fn record_step<'a>(&'a self, held: &'a HeldLease<'a>, step: &'a NewStep<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        let _ = step;
        Box::pin(std::future::ready(Err(no_steps(self.kind(), held.scope))))
    }
    /// Mark step `number` (`name`) started, before its work runs, on the
    /// same terms as [`record_step`](Self::record_step) records one (the
    /// live holder's next step, in one atomic step; `false`, changing
    /// nothing, when the lease is no longer `held`'s). A mark already there
    /// for that step (an earlier holder's) is kept, and answers `true`. A
    /// mark is read back by [`steps`](Self::steps) until the step is
    /// recorded; it is kept as recorded steps are.
    fn mark_step<'a>(
        &'a self,
        held: &'a HeldLease<'a>,
        number: usize,
        name: &'a str,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let _ = (number, name);
        Box::pin(std::future::ready(Err(no_steps(self.kind(), held.scope))))
    }
    /// Remove the mark of step `number` if `held` wrote it (its fence): the
    /// step's work said it did not act. Another holder's mark is left.
    fn unmark_step<'a>(&'a self, held: &'a HeldLease<'a>, number: usize) -> BoxFuture<'a, Result<(), Error>> {
        let _ = number;
        Box::pin(std::future::ready(Err(no_steps(self.kind(), held.scope))))
    }
    /// An operator's answer for the step `step` in flight in the call of
    /// `scope` and `key` (as stored), found out from the outside system:
    /// record its result, or remove its mark. Only while no worker holds
    /// the call's record with a live lease, and only if the step is still
    /// marked and unrecorded ([`Resolve`] says otherwise, changing
    /// nothing). The default, for a store that keeps no steps, is
    /// [`Error::Step`].
    fn resolve_step<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        step: &'a str,
        outcome: StepOutcome<'a>,
    ) -> BoxFuture<'a, Result<Resolve, Error>> {
        let _ = (key, step, outcome);
        Box::pin(std::future::ready(Err(no_steps(self.kind(), scope))))
    }
    /// Forget the steps of a completed call (its answer replays from now
    /// on). The default does nothing.
    fn forget_steps<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        let _ = (scope, key);
        Box::pin(std::future::ready(Ok(())))
    }
    /// Whether [`watch`](Self::watch) hears when a record's holder
    /// completes or releases it (the memory store; a Redis store with
    /// notifications). Default `false`.
    fn notifies(&self) -> bool {
        false
    }
    /// A watch on the record of `scope` and `key` (as stored), registered
    /// now, before the claim that may find it busy: a call that waits for
    /// the holder to finish ([`Guard::lease_or_wait`](crate::Guard::lease_or_wait))
    /// takes one before each claim and waits on it after a `Busy`. The
    /// default hears nothing, and the wait is its pause. Holds no
    /// connection.
    fn watch<'a>(&'a self, scope: &'a str, key: &'a str) -> Watch<'a> {
        let _ = (scope, key);
        Watch::none()
    }
    /// This store as a handle that outlives the call, for the lease's
    /// renewal: it runs on a task of its own beside the body, so that a
    /// body that blocks its thread cannot starve it. idem's stores give one
    /// (a clone of their pool or connection). `None`, the default for a
    /// store of your own: the renewal is polled with the body, in its task,
    /// and a body that blocks its thread for most of the lease loses it.
    fn shared(&self) -> Option<Arc<dyn LeaseStore>> {
        None
    }
}

// As lock/store.rs does for locks: a shared or borrowed store is the store.
macro_rules! forward_lease_store {
    ($($ty:ty),*) => {$(
        impl<S: LeaseStore + ?Sized> LeaseStore for $ty {
            fn kind(&self) -> &'static str {
                (**self).kind()
            }
            fn claim<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<LeaseClaim, Error>> {
                (**self).claim(req)
            }
            fn complete<'a>(
                &'a self,
                held: &'a HeldLease<'a>,
                response: Option<&'a str>,
            ) -> BoxFuture<'a, Result<bool, Error>> {
                (**self).complete(held, response)
            }
            fn release<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
                (**self).release(held)
            }
            fn extend<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
                (**self).extend(held)
            }
            fn peek<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<Option<LeaseClaim>, Error>> {
                (**self).peek(req)
            }
            fn answer_limit(&self) -> BoxFuture<'_, usize> {
                (**self).answer_limit()
            }
            fn steps<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<StepLog, Error>> {
                (**self).steps(scope, key)
            }
            fn record_step<'a>(&'a self, held: &'a HeldLease<'a>, step: &'a NewStep<'a>) -> BoxFuture<'a, Result<bool, Error>> {
                (**self).record_step(held, step)
            }
            fn mark_step<'a>(&'a self, held: &'a HeldLease<'a>, number: usize, name: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
                (**self).mark_step(held, number, name)
            }
            fn unmark_step<'a>(&'a self, held: &'a HeldLease<'a>, number: usize) -> BoxFuture<'a, Result<(), Error>> {
                (**self).unmark_step(held, number)
            }
            fn resolve_step<'a>(
                &'a self,
                scope: &'a str,
                key: &'a str,
                step: &'a str,
                outcome: StepOutcome<'a>,
            ) -> BoxFuture<'a, Result<Resolve, Error>> {
                (**self).resolve_step(scope, key, step, outcome)
            }
            fn forget_steps<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<(), Error>> {
                (**self).forget_steps(scope, key)
            }
            fn notifies(&self) -> bool {
                (**self).notifies()
            }
            fn watch<'a>(&'a self, scope: &'a str, key: &'a str) -> Watch<'a> {
                (**self).watch(scope, key)
            }
            fn shared(&self) -> Option<Arc<dyn LeaseStore>> {
                (**self).shared()
            }
        }
    )*};
}
forward_lease_store!(Arc<S>, &S);
