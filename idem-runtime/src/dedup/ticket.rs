//! The ticket of a first call in the caller's transaction: it stores the
//! body's answer in the dedup record, or undoes the claim (and the state
//! change) when the body fails.

use std::marker::PhantomData;

use crate::dedup::context::{Claimed, EntityMove, TxContext};
use crate::dedup::record::{SURE_FIT, discard, judge};
use crate::error::Error;
use crate::guard::keep;
use crate::guard::{GuardError, Prepared};
use crate::machine::{Cas, Transition};
use crate::replay::Replayable;
use crate::store::sql::{InsertDone, SqlBackend, classify, record as sql_record};
use crate::telemetry::Outcome;

/// The right to run the body once, in the caller's transaction: hand the
/// body's result to [`Ticket::complete`], which stores the answer (or, for
/// an `Err`, removes the record and undoes the state change).
///
/// The ticket is typed by the database it was claimed in: completing it on
/// a transaction of another database does not compile. Complete it on the
/// very transaction the claim was made in (a ticket completed elsewhere
/// finds no record to store into or to remove).
#[derive(Debug)]
#[must_use = "a claimed record must be completed with the body's result"]
pub struct Ticket<DB: SqlBackend> {
    pub(crate) prepared: Prepared,
    /// A dedup record was claimed (or, with `claim_after`, will be written).
    pub(crate) record: bool,
    /// The state change this call made, undone if the body fails.
    pub(crate) moved: Option<Moved>,
    /// What the body published through the call's outbox handle, removed
    /// if it fails (feature `outbox`).
    #[cfg(feature = "outbox")]
    pub(crate) published: std::sync::OnceLock<std::sync::Arc<crate::store::sql::outbox::Published>>,
    pub(crate) db: PhantomData<fn() -> DB>,
}

impl<DB: SqlBackend> Ticket<DB> {
    pub(crate) fn new(prepared: Prepared, record: bool, moved: Option<Moved>) -> Ticket<DB> {
        prepared.claimed();
        Ticket {
            prepared,
            record,
            moved,
            #[cfg(feature = "outbox")]
            published: Default::default(),
            db: PhantomData,
        }
    }

    /// The body runs on `tx` (on an `idem::Tx`, `&mut **tx` is allowed
    /// until the ticket is completed).
    pub(crate) fn running_on<C: TxContext<Db = DB> + ?Sized>(self, tx: &mut C) -> Ticket<DB> {
        tx.body_started();
        self
    }
}

impl<DB: SqlBackend> Ticket<DB> {
    /// Hand over the body's result, in the same transaction the claim was
    /// made in: an `Ok` answer is stored in the record (and returned), an
    /// `Err` removes the record and undoes the state change, so nothing of
    /// this call survives even if the caller commits anyway (and a retry
    /// runs again). The outer `Err` is a guard failure (the database
    /// failed: roll back), the inner one the body's own.
    ///
    /// An answer that cannot be kept (too large for the store, or a value
    /// JSON cannot carry exactly: `f64::NAN`, a `Some` around a value
    /// written as `null`) is still returned, and its record completed
    /// without it ("answer not kept", logged at WARN): committed, a repeat
    /// gets [`Error::AnswerNotKept`] and the body never runs again; rolled
    /// back, the record goes with the body's writes.
    #[tracing::instrument(level = "debug", target = "idem", name = "idem.complete", skip_all, fields(scope = %self.prepared.scope, strategy = self.prepared.strategy))]
    pub async fn complete<T: Replayable, E, C: TxContext<Db = DB> + ?Sized>(
        self,
        tx: &mut C,
        result: Result<T, E>,
    ) -> Result<Result<T, E>, Error> {
        tx.body_ended();
        complete::<T, E, C>(self, tx, result).await
    }

    /// What the body returned, as the function's own result: the answer, or
    /// the body's error, or a guard failure converted into the function's
    /// error type.
    pub async fn finish<T: Replayable, E: GuardError, C: TxContext<Db = DB> + ?Sized>(
        self,
        tx: &mut C,
        result: Result<T, E>,
    ) -> Result<T, E> {
        self.complete(tx, result).await.unwrap_or_else(|e| Err(e.into()))
    }
}

async fn complete<T: Replayable, E, C: TxContext + ?Sized>(
    ticket: Ticket<C::Db>,
    tx: &mut C,
    result: Result<T, E>,
) -> Result<Result<T, E>, Error> {
    let value = match result {
        Ok(value) => value,
        Err(e) if ticket.prepared.claim_after => return failed_after::<T, E, C>(tx, &ticket.prepared, e).await,
        Err(e) => {
            undo::<C::Db>(tx.guard_connection(), &ticket).await;
            return Ok(Err(e));
        }
    };
    let Ticket { prepared: p, record, .. } = ticket;
    if !record {
        // `state`: the transition is the whole guard; nothing to store.
        p.report(Outcome::Executed);
        return Ok(Ok(value));
    }
    // An answer that cannot be kept leaves the record in the transaction,
    // completed without it: committed with the body's writes, a repeat is
    // told so and never runs the body again; rolled back, both go.
    let asked = tx.guard_connection();
    let (json, value) = keep(&p, value, |len| async move {
        let max = <C::Db as SqlBackend>::MAX_RESPONSE;
        if len <= SURE_FIT { max } else { <C::Db as SqlBackend>::answer_limit(asked).await.unwrap_or(max) }
    })
    .await
    .split();
    let started = std::time::Instant::now();
    let done = if p.claim_after {
        complete_after::<T, E, C>(tx, &p, value, json).await
    } else {
        tx.store_answer(&p, json).await.map(|()| {
            p.report(Outcome::Executed);
            Ok(value)
        })
    };
    crate::telemetry::metrics::complete(p.labels(), started.elapsed());
    done
}

/// `claim = "after"`: the body already ran in the caller's transaction; write
/// the record with its response in one statement. If a live record is there,
/// this call was a repeat: roll the transaction back to its start (the body's
/// writes go with it), continue in a fresh one, and replay the first answer.
///
/// `claim = "commit"` on an `idem::Tx`: the record goes out with `COMMIT`,
/// and a repeat finds the transaction already rolled back.
async fn complete_after<T: Replayable, E, C: TxContext + ?Sized>(
    tx: &mut C,
    p: &Prepared,
    value: T,
    json: Option<String>,
) -> Result<Result<T, E>, Error> {
    if p.at_commit {
        match tx.commit_with_record(p, json.as_deref()).await? {
            Some(Claimed::Fresh { .. }) => {
                p.report(Outcome::Executed);
                return Ok(Ok(value));
            }
            Some(Claimed::Existing(existing)) => return judge(p, existing).map(Ok),
            // Not a transaction idem commits: as `claim = "after"`.
            None => {}
        }
    }
    match tx.insert_done(p, json.as_deref()).await? {
        InsertDone::Written => {
            p.report(Outcome::Executed);
            Ok(Ok(value))
        }
        InsertDone::Conflict => replay_after_restart::<T, E, C>(tx, p).await?.ok_or_else(|| vanished(p)),
    }
}

/// `claim = "after"` and the body failed. On a repeat that is common: the
/// body's own insert hits its own unique key (`orders.trade_no`) before the
/// guard's record is reached. Answering that with an error would make a
/// gateway retry forever, so look for a live record first (in a fresh
/// transaction: the failed one may be aborted) and replay it if there is one.
async fn failed_after<T: Replayable, E, C: TxContext + ?Sized>(
    tx: &mut C,
    p: &Prepared,
    error: E,
) -> Result<Result<T, E>, Error> {
    Ok(match replay_after_restart::<T, E, C>(tx, p).await? {
        Some(replay) => replay,
        None => Err(error),
    })
}

/// Roll the transaction back to its start, then read the record in the fresh
/// one. The read comes after the restart on purpose: a record written earlier
/// in this same transaction (the guarded call was not the transaction's first
/// work) is gone now, and must not be replayed as if it had committed.
async fn replay_after_restart<T: Replayable, E, C: TxContext + ?Sized>(
    tx: &mut C,
    p: &Prepared,
) -> Result<Option<Result<T, E>>, Error> {
    tx.restart().await?;
    let read = sql_record::read::<C::Db>(tx.guard_connection(), &p.stored_scope, p.key.as_str()).await;
    match read.map_err(classify::<C::Db>)? {
        // Expired: another caller's take-over won, or is about to; retry.
        Some(existing) if existing.expired => Err(p.in_progress(Some(std::time::Duration::ZERO))),
        Some(existing) => judge(p, existing).map(|v| Some(Ok(v))),
        None => Ok(None),
    }
}

/// The record a `claim = "after"` insert conflicted with is gone after the
/// restart: it was written earlier in this same transaction (then rolled back
/// with it), or its own transaction rolled back. Either way nothing may be
/// replayed; the caller retries from the start.
fn vanished(p: &Prepared) -> Error {
    tracing::warn!(target: "idem", scope = %p.scope,
        "claim = \"after\" conflicted with a record that is gone after the restart; was the key used \
         earlier in the same transaction? claim = \"after\" must be the first work of its transaction");
    p.in_progress(Some(std::time::Duration::ZERO))
}

/// The body failed: remove the record and the messages it published, and
/// undo the transition, so nothing of this call survives even if the
/// caller commits anyway.
async fn undo<DB: SqlBackend>(conn: &mut DB::Connection, ticket: &Ticket<DB>) {
    let p = &ticket.prepared;
    if let Some(moved) = &ticket.moved {
        revert::<DB>(conn, p, moved).await;
    }
    #[cfg(feature = "outbox")]
    if let Some(published) = ticket.published.get() {
        crate::store::sql::outbox::discard::<DB>(conn, published).await;
    }
    if ticket.record {
        discard::<DB>(conn, p).await;
    }
}

/// A transition this call made: undone if the body fails.
#[derive(Debug)]
pub(crate) struct Moved {
    pub(crate) transition: &'static Transition,
    /// The source state the entity was in (a transition may list several).
    pub(crate) from: usize,
}

/// The body failed: put the entity back where this call found it, so the
/// transition does not survive even if the caller commits anyway.
pub(crate) async fn revert<DB: SqlBackend>(conn: &mut DB::Connection, p: &Prepared, moved: &Moved) {
    let states = moved.transition.states;
    let from = [states.codes[moved.transition.to_index()]];
    let cas = Cas { states, from: &from, to: states.codes[moved.from], key: &p.entity };
    // As with a record's removal: if this fails the transaction cannot commit.
    if let Err(e) = EntityMove::<DB>::make(&cas, conn).await {
        tracing::debug!(target: "idem", scope = %p.scope, key = %p.key.hash(), error = %e,
            "transition not undone after the body failed; the transaction cannot commit it");
    }
}
