//! Recorded steps of lease-guarded calls, in the record table itself: one
//! `DONE` row a step, its scope `\step:<call>` (a stored scope never
//! starts with a backslash but for a hashed one, `\sha256:`; `<call>` a
//! hash of the call's scope and key), its key the step's number, `nn`. A
//! call's steps are the rows of one scope: read and removed by equality on
//! the primary key's first column, whatever the column's collation. So steps need no table of their own, expire with their
//! retention and go with the purges, and live in the lease record's
//! database: a step is written by one `INSERT ... SELECT` from the
//! holder's row, which checks its owner, fence and live lease by the
//! database's clock in the same statement.

use super::classify;
use super::dialect::{Arg, Dialect, Stmt, inserted, read_text, text};
use super::{SqlBackend, statements};
use crate::error::Error;
use crate::future::BoxFuture;
use crate::lease::store::{HeldLease, NewStep, RecordedStep, StepInTransaction, StepTransactions};
use crate::table::RecordTable;

/// The step statements of one record table.
pub(crate) struct StepStatements {
    record: Stmt,
    read: Stmt,
    clear_expired: Stmt,
    forget: Stmt,
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

/// The call's steps, in order, those past their retention left out (a
/// first record in their way deletes them, see [`record`]): one statement,
/// what a call reads before its body and the operator's reads show.
pub(crate) async fn read<DB: SqlBackend>(
    conn: &mut DB::Connection,
    scope: &str,
    key: &str,
) -> Result<Vec<RecordedStep>, sqlx::Error> {
    let call = call(scope, key);
    let rows = DB::fetch_all(conn, statements::<DB>().steps.read.query::<DB>(&[text(&call)])).await?;
    let mut steps = Vec::with_capacity(rows.len());
    for (number, row) in rows.iter().enumerate() {
        let key = read_text::<DB>(row, 0)?.unwrap_or_default();
        let value = read_text::<DB>(row, 1)?.unwrap_or_default();
        let (name, result) = value.split_once('\n').ok_or_else(|| not_a_step(&key))?;
        // The keys run from 00 without a gap: a step is written only next.
        if key != step_key(number) {
            return Err(not_a_step(&key));
        }
        steps.push(RecordedStep { name: name.to_owned(), result: result.to_owned() });
    }
    Ok(steps)
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
    let args = [
        text(&call),
        text(&key),
        text(&value),
        Arg::Span(held.retention),
        text(held.scope),
        text(held.key),
        text(held.owner),
        Arg::Int(held.fence),
        Arg::Text(previous.as_deref()),
    ];
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
    // Or rows of an earlier call of this key past their retention are in
    // the way (reads leave them out): cleared here, off the common path,
    // then the step written once more.
    let cleared = DB::execute(conn, s.clear_expired.query::<DB>(&[text(&call)])).await?;
    if DB::rows(&cleared) == 0 {
        return Ok(false);
    }
    inserted::<DB>(DB::execute(conn, s.record.query::<DB>(&args)).await)
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
