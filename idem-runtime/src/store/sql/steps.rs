//! Recorded steps of lease-guarded calls, in the record table itself: one
//! `DONE` row a step, its scope `\step:<call>` (a stored scope never
//! starts with a backslash but for a hashed one, `\sha256:`; `<call>` a
//! hash of the call's scope and key), its key the step's number, `nn`. A
//! call's steps are the rows of one scope: read and removed by equality on
//! the primary key's first column, whatever the column's collation. So steps need no table of their own, expire with their
//! retention and go with the purges, and live in the lease record's
//! database: a step is written by one `INSERT ... SELECT` from the
//! holder's row, which checks its owner, fence and live lease by the
//! database's clock in the same statement. A step marked started (a step
//! with a check, or at-most-once) is a row of the same scope, written the
//! same way, its key `nn-<fence>` (the number of the step, the fence of
//! the holder that marked it: no two holders' marks meet), its value the
//! step's name.

use super::classify;
use super::dialect::{Arg, Dialect, Stmt, inserted, read_text, text};
use super::{SqlBackend, statements};
use crate::error::Error;
use crate::future::BoxFuture;
use crate::lease::store::{
    HeldLease, NewStep, RecordedStep, StartedStep, StepInTransaction, StepLog, StepTransactions,
};
use crate::table::RecordTable;

/// The step statements of one record table.
pub(crate) struct StepStatements {
    record: Stmt,
    read: Stmt,
    clear_expired: Stmt,
    forget: Stmt,
    delete: Stmt,
    resolve: Stmt,
}

impl StepStatements {
    pub(crate) fn new<D: Dialect>(t: &RecordTable) -> StepStatements {
        let clock = D::CLOCK;
        let on_duplicate = D::ON_DUPLICATE.unwrap_or("");
        // $1 the call's step scope, $2 the step's number, $3 its value, $4
        // the retention; the holder: $5 scope, $6 key, $7 owner, $8 fence;
        // $9 the previous step's number (NULL for the first), which must be
        // recorded already. The holder's row is read with a share lock: in
        // a step's own transaction (`Steps::run_tx`) no take-over can change
        // it between this check and the COMMIT, so the step's writes and
        // its record land under the lease that was checked, or not at all.
        let record = format!(
            "INSERT INTO {t} (scope, idem_key, status, response, fence, created_at, updated_at, expires_at) \
             SELECT $1, $2, 'DONE', {value}, h.fence, {clock}, {clock}, {expires} FROM {t} h \
             WHERE h.scope = $5 AND h.idem_key = $6 AND h.owner = $7 AND h.fence = $8 \
             AND h.status = 'PROCESSING' AND h.lease_until > {clock} \
             AND ($9 IS NULL OR EXISTS (SELECT 1 FROM {t} p WHERE p.scope = $1 AND p.idem_key = $9)){lock}{on_duplicate}",
            lock = D::FOR_SHARE,
            value = D::text_value("$3"),
            expires = D::after(clock, "$4"),
        );
        // $1: the call's step scope.
        let range = "scope = $1";
        StepStatements {
            record: Stmt::new::<D>(&record),
            read: Stmt::new::<D>(&format!(
                "SELECT {}, {}, fence FROM {t} WHERE {range} AND expires_at > {clock} ORDER BY idem_key",
                D::text_column("idem_key"),
                D::text_column("response"),
            )),
            clear_expired: Stmt::new::<D>(&format!("DELETE FROM {t} WHERE {range} AND expires_at <= {clock}")),
            forget: Stmt::new::<D>(&format!("DELETE FROM {t} WHERE {range}")),
            // $2: one row's key.
            delete: Stmt::new::<D>(&format!("DELETE FROM {t} WHERE {range} AND idem_key = $2")),
            // An operator's "done": the step's result from the mark $4 the
            // operator saw, kept as long as the mark ($1 to $3 as `record`).
            resolve: Stmt::new::<D>(&format!(
                "INSERT INTO {t} (scope, idem_key, status, response, fence, created_at, updated_at, expires_at) \
                 SELECT $1, $2, 'DONE', {value}, m.fence, {clock}, {clock}, m.expires_at FROM {t} m \
                 WHERE m.scope = $1 AND m.idem_key = $4 AND m.expires_at > {clock}{on_duplicate}",
                value = D::text_value("$3"),
            )),
        }
    }
}

/// What every step row's scope starts with (6 characters).
pub(crate) const STEP_SCOPES: &str = "\\step:";

/// `\step:<call>`, `<call>` 32 hex digits of the call's scope and key.
fn call(scope: &str, key: &str) -> String {
    format!("{STEP_SCOPES}{}", crate::key::parts_hash(&[scope, key]))
}

/// The key of step `number`.
fn step_key(number: usize) -> String {
    format!("{number:02}")
}

/// The key of the mark of step `number` by the holder of `fence`.
fn mark_key(number: usize, fence: i64) -> String {
    format!("{number:02}-{fence}")
}

/// A mark of the call's steps, as read: its row's key, the step's number
/// and name.
pub(crate) struct MarkRow {
    pub(crate) key: String,
    pub(crate) number: usize,
    pub(crate) name: String,
}

/// The call's steps as a call reads them: [`read_rows`], its marks of the
/// step after the recorded ones as that step's.
pub(crate) async fn read<DB: SqlBackend>(
    conn: &mut DB::Connection,
    scope: &str,
    key: &str,
) -> Result<StepLog, sqlx::Error> {
    let (recorded, marks) = read_rows::<DB>(conn, scope, key).await?;
    let started = marks.into_iter().next().map(|mark| StartedStep { number: mark.number, name: mark.name });
    Ok(StepLog { recorded, started })
}

/// The call's steps, in order, and the marks of the step after them (of
/// earlier steps, recorded since, left out), those past their retention
/// left out (a first record in their way deletes them, see [`record`]):
/// one statement, what a call reads before its body and the operator's
/// reads show.
pub(crate) async fn read_rows<DB: SqlBackend>(
    conn: &mut DB::Connection,
    scope: &str,
    key: &str,
) -> Result<(Vec<RecordedStep>, Vec<MarkRow>), sqlx::Error> {
    let call = call(scope, key);
    let rows = DB::fetch_all(conn, statements::<DB>().steps.read.query::<DB>(&[text(&call)])).await?;
    let (mut steps, mut marks) = (Vec::with_capacity(rows.len()), Vec::new());
    for row in &rows {
        let key = read_text::<DB>(row, 0)?.unwrap_or_default();
        let value = read_text::<DB>(row, 1)?.unwrap_or_default();
        if let Some((number, _)) = key.split_once('-') {
            let number = number.parse().map_err(|_| not_a_step(&key))?;
            marks.push(MarkRow { number, name: value, key });
            continue;
        }
        let (name, result) = value.split_once('\n').ok_or_else(|| not_a_step(&key))?;
        // The keys run from 00 without a gap: a step is written only next.
        if key != step_key(steps.len()) {
            return Err(not_a_step(&key));
        }
        steps.push(RecordedStep { name: name.to_owned(), result: result.to_owned() });
    }
    marks.retain(|mark| mark.number == steps.len());
    Ok((steps, marks))
}

pub(crate) async fn record<DB: SqlBackend>(
    conn: &mut DB::Connection,
    held: &HeldLease<'_>,
    step: &NewStep<'_>,
) -> Result<bool, sqlx::Error> {
    let s = &statements::<DB>().steps;
    let call = call(held.scope, held.key);
    let (key, previous) = (step_key(step.number), step.number.checked_sub(1).map(step_key));
    let value = format!("{}\n{}", step.name, step.result);
    let args = holders_row(held, [&call, &key, &value], previous.as_deref());
    if inserted::<DB>(DB::execute(conn, s.record.query::<DB>(&args)).await)? {
        return Ok(true);
    }
    // Not written: the lease is gone, the step is not the next one, or it
    // is there already: written by this very holder (its reply lost), it is
    // the same step at its fence.
    let rows = DB::fetch_all(conn, s.read.query::<DB>(&[text(&call)])).await?;
    let mine = rows.iter().any(|row| {
        read_text::<DB>(row, 0).ok().flatten().as_deref() == Some(key.as_str())
            && read_text::<DB>(row, 1).ok().flatten().as_deref() == Some(value.as_str())
            && DB::int(row, 2).ok() == Some(held.fence)
    });
    if mine {
        return Ok(true);
    }
    past_retention::<DB>(conn, &args).await
}

/// The values of the record statement: the row's scope, key and value,
/// the holder it is written from, and the step that must precede it.
fn holders_row<'a>(held: &HeldLease<'a>, [call, key, value]: [&'a str; 3], previous: Option<&'a str>) -> [Arg<'a>; 9] {
    [
        text(call),
        text(key),
        text(value),
        Arg::Span(held.retention),
        text(held.scope),
        text(held.key),
        text(held.owner),
        Arg::Int(held.fence),
        Arg::Text(previous),
    ]
}

/// The holder's row was not written (`args` of the record statement): if
/// rows of an earlier call of this key past their retention were in the
/// way (reads leave them out), they are cleared here, off the common path,
/// and the row written once more.
async fn past_retention<DB: SqlBackend>(conn: &mut DB::Connection, args: &[Arg<'_>]) -> Result<bool, sqlx::Error> {
    let s = &statements::<DB>().steps;
    let cleared = DB::execute(conn, s.clear_expired.query::<DB>(&args[..1])).await?;
    if DB::rows(&cleared) == 0 {
        return Ok(false);
    }
    inserted::<DB>(DB::execute(conn, s.record.query::<DB>(args)).await)
}

/// Mark step `number` started, as [`record`] records one: a row of the
/// holder's own (its key names the holder's fence), so a mark another
/// holder left stays beside it.
pub(crate) async fn mark<DB: SqlBackend>(
    conn: &mut DB::Connection,
    held: &HeldLease<'_>,
    number: usize,
    name: &str,
) -> Result<bool, sqlx::Error> {
    let call = call(held.scope, held.key);
    let (key, previous) = (mark_key(number, held.fence), number.checked_sub(1).map(step_key));
    let args = holders_row(held, [&call, &key, name], previous.as_deref());
    if inserted::<DB>(DB::execute(conn, statements::<DB>().steps.record.query::<DB>(&args)).await)? {
        return Ok(true);
    }
    past_retention::<DB>(conn, &args).await
}

/// An operator's "done" for step `number` (`name`): its `result`
/// recorded, from the mark row `mark`, which must still be there.
pub(crate) async fn record_resolved<DB: SqlBackend>(
    conn: &mut DB::Connection,
    (scope, key): (&str, &str),
    (number, name): (usize, &str),
    result: &str,
    mark: &str,
) -> Result<bool, sqlx::Error> {
    let (call, step) = (call(scope, key), step_key(number));
    let value = format!("{name}\n{result}");
    let args = [text(&call), text(&step), text(&value), text(mark)];
    inserted::<DB>(DB::execute(conn, statements::<DB>().steps.resolve.query::<DB>(&args)).await)
}

/// Remove the mark of step `number` that the holder of `fence` wrote.
pub(crate) async fn unmark<DB: SqlBackend>(
    conn: &mut DB::Connection,
    scope: &str,
    key: &str,
    number: usize,
    fence: i64,
) -> Result<(), sqlx::Error> {
    delete_marks::<DB>(conn, scope, key, &[mark_key(number, fence)]).await.map(|_| ())
}

/// Delete the marks of the call with these keys ([`MarkRow::key`]): how
/// many there were.
pub(crate) async fn delete_marks<DB: SqlBackend>(
    conn: &mut DB::Connection,
    scope: &str,
    key: &str,
    marks: &[String],
) -> Result<u64, sqlx::Error> {
    let call = call(scope, key);
    let mut deleted = 0;
    for mark in marks {
        let done = DB::execute(conn, statements::<DB>().steps.delete.query::<DB>(&[text(&call), text(mark)])).await?;
        deleted += DB::rows(&done);
    }
    Ok(deleted)
}

impl<DB: SqlBackend> StepTransactions for DB {
    const LEASE_KIND: &'static str = DB::BACKEND;

    fn record_step_in<'a>(
        conn: &'a mut DB::Connection,
        held: &'a HeldLease<'a>,
        step: &'a NewStep<'a>,
    ) -> BoxFuture<'a, Result<StepInTransaction, Error>> {
        Box::pin(async move {
            if record::<DB>(conn, held, step).await.map_err(classify::<DB>)? {
                return Ok(StepInTransaction::Recorded);
            }
            // No holder's row to write from: the lease passed or was taken
            // over, or this database holds no record of the call at all.
            let call = super::record::read::<DB>(conn, held.scope, held.key).await.map_err(classify::<DB>)?;
            Ok(StepInTransaction::Refused { call_here: call.is_some() })
        })
    }
}

pub(crate) async fn forget<DB: SqlBackend>(
    conn: &mut DB::Connection,
    scope: &str,
    key: &str,
) -> Result<(), sqlx::Error> {
    let call = call(scope, key);
    DB::execute(conn, statements::<DB>().steps.forget.query::<DB>(&[text(&call)])).await?;
    Ok(())
}

fn not_a_step(key: &str) -> sqlx::Error {
    sqlx::Error::ColumnDecode {
        index: "response".into(),
        source: format!("the step row `{key}` does not hold one of idem's recorded steps").into(),
    }
}

#[cfg(test)]
mod tests {
    /// The steps already in a table stay the call's: its step scope does
    /// not change between versions.
    #[test]
    fn a_calls_step_scope_is_stable() {
        assert_eq!(super::call("pay", "T-1"), "\\step:6e734bae796b24ded4ef70f6c8179693");
        assert_ne!(super::call("pa", "yT-1"), super::call("pay", "T-1"), "parts do not run into each other");
    }
}
