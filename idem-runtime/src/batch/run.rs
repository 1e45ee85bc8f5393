//! [`dedup`]: each message in a transaction of its own, one after another.

use std::panic::AssertUnwindSafe;

use futures_util::FutureExt as _;
use tracing::Instrument as _;

use crate::batch::handled::{Failure, Handled};
use crate::error::Error;
use crate::future::BoxFuture;
use crate::guard::{Claim, Guard};
use crate::replay::Replayable;
use crate::store::sql::SqlBackend;

/// Run each message of `batch` under its own guard ([`Guard::dedup`]), in
/// a transaction of its own from `pool`, one after another in the batch's
/// order; what became of each, in that order.
///
/// `handler` does a message's work in the transaction it is given (the
/// dedup record is written in the same one, and both commit or neither
/// does). A message whose handler fails, panics, or whose claim or commit
/// fails rolls back alone; the others are not touched and never run twice.
/// The handler's future may borrow the transaction, the message, and what
/// the closure borrows (`'c`, the lifetime in the transaction's type, is
/// as long as those borrows need).
///
/// A consumer's batch on PostgreSQL, with markers in the installed
/// precheck store in front of the records:
///
/// ```no_run
/// # extern crate idem_runtime as idem;
/// use std::time::Duration;
/// use idem::Guard;
/// use idem::batch::{self, Handled};
///
/// struct Delivery { key: Option<String>, amount: i64 }
///
/// # async fn demo(pool: sqlx::PgPool, deliveries: Vec<Delivery>, ledger: &str) -> Result<(), idem::Error> {
/// let marks = idem::Stores::installed()?.precheck()?;
/// let guarded = deliveries.iter().map(|d| {
///     (Guard::new("ledger.book").key(&d.key).precheck(marks, Duration::from_secs(2 * 86_400)), d)
/// });
/// let handled = batch::dedup(&pool, guarded, |tx, d| Box::pin(async move {
///     sqlx::query(sqlx::AssertSqlSafe(format!("INSERT INTO {ledger} (amount) VALUES ($1)")))
///         .bind(d.amount)
///         .execute(&mut **tx)
///         .await?;
///     Ok::<_, sqlx::Error>(())
/// }))
/// .await;
/// for (delivery, handled) in deliveries.iter().zip(&handled) {
///     match handled {
///         Handled::Failed(failure) if failure.is_retryable() => { /* retry it, or dead-letter after the last attempt */ }
///         Handled::Failed(failure) => { /* dead-letter it with failure.to_string() */ }
///         _ => { /* acknowledge it */ }
///     }
/// }
/// # Ok(()) }
/// ```
// Not an `async fn`: the batch is collected before the future starts, so
// the caller's iterator (a `map` closure over borrowed messages) is not held
// across an await, where it would make the future not `Send` ("not general
// enough", a limit of the compiler's reasoning about such closures).
pub fn dedup<'c, 's, DB, M, T, E, F>(
    pool: &sqlx::Pool<DB>,
    batch: impl IntoIterator<Item = (Guard<'s>, M)>,
    mut handler: F,
) -> impl Future<Output = Vec<Handled<T, E>>>
where
    DB: SqlBackend,
    DB::Connection: Send,
    T: Replayable,
    F: for<'t> FnMut(&'t mut sqlx::Transaction<'c, DB>, &'t M) -> BoxFuture<'t, Result<T, E>>,
{
    let batch: Vec<(Guard<'s>, M)> = batch.into_iter().collect();
    let span = tracing::debug_span!(target: "idem", "idem.batch", messages = batch.len());
    async move {
        let mut handled = Vec::with_capacity(batch.len());
        for (guard, message) in batch {
            handled.push(one(pool, guard, &message, &mut handler).await);
        }
        handled
    }
    .instrument(span)
}

/// One message: begin, claim, run the handler, store its answer, commit.
async fn one<'c, DB, M, T, E, F>(pool: &sqlx::Pool<DB>, guard: Guard<'_>, message: &M, handler: &mut F) -> Handled<T, E>
where
    DB: SqlBackend,
    DB::Connection: Send,
    T: Replayable,
    F: for<'t> FnMut(&'t mut sqlx::Transaction<'c, DB>, &'t M) -> BoxFuture<'t, Result<T, E>>,
{
    let mut tx: sqlx::Transaction<'c, DB> = match pool.begin().await {
        Ok(tx) => tx,
        Err(e) => return Handled::Failed(Failure::Idem(e.into())),
    };
    let handled = claim_and_run(&mut tx, guard, message, handler).await;
    if matches!(handled, Handled::Succeeded(_)) {
        if let Err(e) = tx.commit().await {
            return Handled::Failed(Failure::Idem(e.into()));
        }
    } else {
        // A repeat wrote nothing; a failure's claim and writes go. Rolled
        // back now, not when the pool reuses the connection, so that a
        // claim's row lock does not hold up the next copy of the key.
        let _ = tx.rollback().await;
    }
    handled
}

/// The claim, then (on a first run) the handler and its answer, in `tx`.
async fn claim_and_run<'c, DB, M, T, E, F>(
    tx: &mut sqlx::Transaction<'c, DB>,
    guard: Guard<'_>,
    message: &M,
    handler: &mut F,
) -> Handled<T, E>
where
    DB: SqlBackend,
    DB::Connection: Send,
    T: Replayable,
    F: for<'t> FnMut(&'t mut sqlx::Transaction<'c, DB>, &'t M) -> BoxFuture<'t, Result<T, E>>,
{
    let ticket = match guard.dedup::<T, _>(tx).await {
        Ok(Claim::Run(ticket)) => ticket,
        Ok(Claim::Replay(answer)) => return Handled::Repeat(Some(answer)),
        Err(Error::AnswerNotKept { .. }) => return Handled::Repeat(None),
        Err(e) => return Handled::Failed(Failure::Idem(e)),
    };
    // Unwind safety: after a panic this message's transaction is rolled
    // back (with the claim) and nothing of it is looked at again. A
    // handler that panics as it is called (before its future exists)
    // fails its message alike: the batch goes on.
    let running = async { handler(&mut *tx, message).await };
    let result = match AssertUnwindSafe(running).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => return Handled::Failed(Failure::Panicked(panic_message(&*panic))),
    };
    match ticket.complete(tx, result).await {
        Ok(Ok(answer)) => Handled::Succeeded(answer),
        Ok(Err(e)) => Handled::Failed(Failure::Handler(e)),
        Err(e) => Handled::Failed(Failure::Idem(e)),
    }
}

/// What `panic!` was given: a `&str` or a `String`, else a placeholder.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(text), _) => (*text).to_owned(),
        (_, Some(text)) => text.clone(),
        _ => "(a panic payload that is not text)".to_owned(),
    }
}
