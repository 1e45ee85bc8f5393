//! [`Guard::unique`] and [`Guard::unique_state`]: the body's own insert is
//! the claim. Before the body: a savepoint (unless the guard is told the
//! body's insert cannot fail its transaction), and for `unique+state` the
//! transition. After it: an `Ok` releases the savepoint; an error that is a
//! unique-key violation on the guard's constraint rolls back to it and
//! asks for the replay; any other error is the body's.

use std::marker::PhantomData;

use crate::dedup::context::TxContext;
use crate::dedup::ticket::{Moved, revert};
use crate::error::Error;
use crate::guard::{Claim, Guard, GuardError, Prepared};
use crate::state::Transition;
use crate::state::transition::{Step, check_key, move_entity};
use crate::store::sql::{SqlBackend, classify};
use crate::telemetry::Outcome;
use crate::unique::{DatabaseFailure, Found};

/// The guard's savepoint. One name: a guarded call inside another's body
/// takes its own over it (SQL savepoints of one name stack), and releases
/// or rolls back to the innermost.
const SAVEPOINT: &str = "SAVEPOINT idem_unique";
const RELEASE: &str = "RELEASE SAVEPOINT idem_unique";
const ROLLBACK_AND_RELEASE: &str = "ROLLBACK TO SAVEPOINT idem_unique; RELEASE SAVEPOINT idem_unique";

impl Guard<'_> {
    /// `unique`: the body's insert into a table whose unique constraint (or
    /// unique index) is `constraint` is the claim; idem writes nothing.
    ///
    /// Always [`Claim::Run`]: run the body in `tx`, then hand its result to
    /// [`UniqueTicket::complete`]. That says [`Completed::Duplicate`] when
    /// the body failed on exactly `constraint` (the transaction rolled back
    /// to before the body): read the existing row in `tx` (your replay
    /// function) and hand that answer to [`Replaying::answer`].
    ///
    /// The key (optional: [`Guard::key`]) only names the call in logs and
    /// metrics; the constraint's columns are the real key. A fingerprint,
    /// a retention and a precheck have no meaning here: nothing is stored.
    ///
    /// Errors: [`Error::NoTransaction`], database errors (the savepoint).
    #[tracing::instrument(level = "debug", target = "idem", name = "idem.claim", skip_all, fields(scope = %self.scope(), strategy = "unique"))]
    pub async fn unique<C: TxContext + ?Sized>(
        self,
        tx: &mut C,
        constraint: &'static str,
    ) -> Result<Claim<Replaying, UniqueTicket<C::Db>>, Error> {
        let savepoint = self.takes_savepoint();
        let p = self.named_by(constraint).prepare_claim_before("unique", <C::Db as SqlBackend>::BACKEND)?;
        tx.ready_for_guard(&p, false).await?;
        if savepoint {
            send::<C::Db>(tx.guard_connection(), SAVEPOINT).await?;
        }
        tx.body_started();
        Ok(Claim::Run(UniqueTicket::new(p, constraint, savepoint, None)))
    }

    /// `unique+state`: [`unique`](Self::unique), and before the body the
    /// entity the key selects moves along `transition`
    /// (compare-and-set, as [`Guard::state`] does; the key's parts are
    /// added with [`Guard::entity_key`]). An entity already in the target
    /// state is a repeat: [`Claim::Replay`], read the existing row with
    /// your replay function. A duplicate on `constraint` in the body
    /// undoes the transition with the body's writes.
    ///
    /// Errors: [`Error::IllegalTransition`], [`Error::NotFound`], and
    /// those of [`unique`](Self::unique).
    #[tracing::instrument(level = "debug", target = "idem", name = "idem.claim", skip_all, fields(scope = %self.scope(), strategy = "unique+state"))]
    pub async fn unique_state<C: TxContext + ?Sized>(
        self,
        tx: &mut C,
        constraint: &'static str,
        transition: &'static Transition,
    ) -> Result<Claim<Replaying, UniqueTicket<C::Db>>, Error> {
        let savepoint = self.takes_savepoint();
        let p = self.prepare_claim_before("unique+state", <C::Db as SqlBackend>::BACKEND)?;
        check_key(transition, &p)?;
        tx.ready_for_guard(&p, false).await?;
        if savepoint {
            send::<C::Db>(tx.guard_connection(), SAVEPOINT).await?;
        }
        match move_entity::<C::Db>(tx.guard_connection(), &p, transition, None).await {
            Ok(Step::Moved(from)) => {
                tx.body_started();
                Ok(Claim::Run(UniqueTicket::new(p, constraint, savepoint, Some(Moved { transition, from }))))
            }
            Ok(Step::Repeat) => {
                if savepoint {
                    send::<C::Db>(tx.guard_connection(), RELEASE).await?;
                }
                p.claimed();
                Ok(Claim::Replay(Replaying { prepared: Box::new(p) }))
            }
            Err(e) => {
                if savepoint {
                    let _ = send::<C::Db>(tx.guard_connection(), RELEASE).await;
                }
                Err(e)
            }
        }
    }

    /// A guard with no key part is named by its constraint (in logs and
    /// metrics).
    fn named_by(self, constraint: &'static str) -> Self {
        if self.has_key() { self } else { self.key(constraint) }
    }
}

/// The right to run the body once: hand its result to
/// [`complete`](Self::complete) (or, in generated code,
/// [`finish`](Self::finish)) on the transaction the guard was given.
#[derive(Debug)]
#[must_use = "the body's result must be handed to the ticket, which releases or rolls back its savepoint"]
pub struct UniqueTicket<DB: SqlBackend> {
    prepared: Prepared,
    constraint: &'static str,
    savepoint: bool,
    moved: Option<Moved>,
    db: PhantomData<fn() -> DB>,
}

/// What the body's result came to.
#[derive(Debug)]
#[must_use = "a duplicate's answer is the replay function's: hand it to `Replaying::answer`"]
pub enum Completed<T, E> {
    /// The body's own result: its answer, or an error that is not a
    /// duplicate (returned unchanged).
    Answer(Result<T, E>),
    /// The body's insert met an existing row on the constraint; its
    /// writes are undone. Read that row in the same transaction and hand
    /// the answer to [`Replaying::answer`].
    Duplicate(Replaying),
}

/// A repeat: the answer is the replay function's, read from the existing
/// row in the same transaction.
#[derive(Debug)]
#[must_use = "hand the replay function's answer to `Replaying::answer`"]
pub struct Replaying {
    /// Boxed: a `Completed` is mostly the body's answer.
    prepared: Box<Prepared>,
}

impl Replaying {
    /// The replay function's answer, as the call's: an `Ok` is reported as
    /// a replay ([`Outcome::Replayed`]: `observe`, logs, metrics).
    pub fn answer<T, E>(self, answer: Result<T, E>) -> Result<T, E> {
        if answer.is_ok() {
            self.prepared.report(Outcome::Replayed);
        }
        answer
    }
}

impl<DB: SqlBackend> UniqueTicket<DB> {
    fn new(prepared: Prepared, constraint: &'static str, savepoint: bool, moved: Option<Moved>) -> Self {
        prepared.claimed();
        UniqueTicket { prepared, constraint, savepoint, moved, db: PhantomData }
    }

    /// Hand over the body's result, on the transaction the guard was given.
    /// An `Ok` is the answer (the savepoint released). An error that is a
    /// unique-key violation on the guard's constraint (found in the error's
    /// `source()` chain, see [`DatabaseFailure`]) is a duplicate: the
    /// transaction is rolled back to the savepoint (the transition undone)
    /// and [`Completed::Duplicate`] asks for the existing row. Any other
    /// error is the body's, unchanged. The outer `Err` is a guard failure.
    pub async fn complete<T, E: DatabaseFailure, C: TxContext<Db = DB> + ?Sized>(
        self,
        tx: &mut C,
        result: Result<T, E>,
    ) -> Result<Completed<T, E>, Error> {
        tx.body_ended();
        let p = &self.prepared;
        let error = match result {
            Ok(value) => {
                if self.savepoint {
                    send::<DB>(tx.guard_connection(), RELEASE).await?;
                }
                p.report(Outcome::Executed);
                return Ok(Completed::Answer(Ok(value)));
            }
            Err(error) => error,
        };
        let duplicate = match error.violation::<DB>() {
            Some(Found::Claimed(constraint)) => constraint == self.constraint,
            Some(Found::Violation(v)) => {
                let on = DB::is_on(tx.guard_connection(), &v, self.constraint).await?;
                if on && !self.savepoint && DB::ERROR_ABORTS {
                    // Nothing can be read in an aborted transaction.
                    return Err(Error::UniqueAborted {
                        scope: p.scope.to_string(),
                        constraint: self.constraint.to_owned(),
                    });
                }
                on
            }
            None => false,
        };
        if !duplicate {
            // The body's own error. Its transition is undone (a caller that
            // commits anyway keeps no half of this call), its savepoint left
            // for the caller's rollback.
            if let Some(moved) = &self.moved {
                revert::<DB>(tx.guard_connection(), p, moved).await;
            }
            p.report(Outcome::Executed);
            return Ok(Completed::Answer(Err(error)));
        }
        if self.savepoint {
            send::<DB>(tx.guard_connection(), ROLLBACK_AND_RELEASE).await?;
        } else if let Some(moved) = &self.moved {
            revert::<DB>(tx.guard_connection(), p, moved).await;
        }
        Ok(Completed::Duplicate(Replaying { prepared: Box::new(self.prepared) }))
    }

    /// [`complete`](Self::complete) with a guard failure converted into the
    /// function's error type.
    pub async fn finish<T, E: DatabaseFailure + GuardError, C: TxContext<Db = DB> + ?Sized>(
        self,
        tx: &mut C,
        result: Result<T, E>,
    ) -> Completed<T, E> {
        self.complete(tx, result).await.unwrap_or_else(|e| Completed::Answer(Err(e.into())))
    }
}

/// One of the savepoint's statements.
async fn send<DB: SqlBackend>(conn: &mut DB::Connection, text: &'static str) -> Result<(), Error> {
    use sqlx::SqlSafeStr as _;
    DB::execute_text(conn, sqlx::AssertSqlSafe(text).into_sql_str()).await.map(drop).map_err(classify::<DB>)
}
