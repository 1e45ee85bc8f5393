//! Recorded steps of lease-guarded calls, in the record table itself: one
//! `DONE` row a step, under the reserved scope `\step` (a stored scope
//! never starts with a backslash but for a hashed one, `\sha256:`), keyed
//! `<call>:<nn>` (`<call>` a hash of the call's scope and key, `nn` the
//! step's number). So steps need no table of their own, expire with their
//! retention and go with the purges, and live in the lease record's
//! database: a step is written by one `INSERT ... SELECT` from the
//! holder's row, which checks its owner, fence and live lease by the
//! database's clock in the same statement.

use sha2::{Digest as _, Sha256};

use super::dialect::{Arg, Dialect, Stmt, inserted, read_text, text};
use super::{SqlBackend, statements};
use crate::lease::store::{HeldLease, NewStep, RecordedStep};
use crate::table::RecordTable;

/// The scope of the step rows.
const STEP_SCOPE: &str = "\\step";

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
        // $1 the step's key, $2 its value, $3 the retention; the holder:
        // $4 scope, $5 key, $6 owner, $7 fence; $8 the previous step's key
        // (NULL for the first), which must be recorded already.
        let record = format!(
            "INSERT INTO {t} (scope, idem_key, status, response, fence, created_at, updated_at, expires_at) \
             SELECT '{STEP_SCOPE}', $1, 'DONE', {value}, h.fence, {clock}, {clock}, {expires} FROM {t} h \
             WHERE h.scope = $4 AND h.idem_key = $5 AND h.owner = $6 AND h.fence = $7 \
             AND h.status = 'PROCESSING' AND h.lease_until > {clock} \
             AND ($8 IS NULL OR EXISTS (SELECT 1 FROM {t} p WHERE p.scope = '{STEP_SCOPE}' AND p.idem_key = $8)){on_duplicate}",
            value = D::text_value("$2"),
            expires = D::after(clock, "$3"),
        );
        // $1 and $2: the call's range of keys, `<call>:` to `<call>;`.
        let range = format!("scope = '{STEP_SCOPE}' AND idem_key >= $1 AND idem_key < $2");
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

/// `<call>`: 32 hex digits of the call's scope and key.
fn call(scope: &str, key: &str) -> String {
    let mut hash = Sha256::new();
    for part in [scope, key] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    hash.finalize()[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// The key of step `number` of the call.
fn step_key(call: &str, number: usize) -> String {
    format!("{call}:{number:02}")
}

/// The first and the last-but-one key of a call's range.
fn range(call: &str) -> [String; 2] {
    [format!("{call}:"), format!("{call};")]
}

pub(crate) async fn read<DB: SqlBackend>(
    conn: &mut DB::Connection,
    scope: &str,
    key: &str,
) -> Result<Vec<RecordedStep>, sqlx::Error> {
    let s = &statements::<DB>().steps;
    let [from, to] = range(&call(scope, key));
    let args = [text(&from), text(&to)];
    DB::execute(conn, s.clear_expired.query::<DB>(&args)).await?;
    let rows = DB::fetch_all(conn, s.read.query::<DB>(&args)).await?;
    let mut steps = Vec::with_capacity(rows.len());
    for (number, row) in rows.iter().enumerate() {
        let key = read_text::<DB>(row, 0)?.unwrap_or_default();
        let value = read_text::<DB>(row, 1)?.unwrap_or_default();
        let (name, result) = value.split_once('\n').ok_or_else(|| not_a_step(&key))?;
        // The keys run from 00 without a gap: a step is written only next.
        if !key.ends_with(&format!(":{number:02}")) {
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
    let (key, previous) = (step_key(&call, step.number), step.number.checked_sub(1).map(|n| step_key(&call, n)));
    let value = format!("{}\n{}", step.name, step.result);
    let args = [
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
    let [from, to] = range(&call);
    let rows = DB::fetch_all(conn, s.read.query::<DB>(&[text(&from), text(&to)])).await?;
    Ok(rows.iter().any(|row| {
        read_text::<DB>(row, 0).ok().flatten().as_deref() == Some(key.as_str())
            && read_text::<DB>(row, 1).ok().flatten().as_deref() == Some(value.as_str())
            && DB::int(row, 2).ok() == Some(held.fence)
    }))
}

pub(crate) async fn forget<DB: SqlBackend>(
    conn: &mut DB::Connection,
    scope: &str,
    key: &str,
) -> Result<(), sqlx::Error> {
    let [from, to] = range(&call(scope, key));
    DB::execute(conn, statements::<DB>().steps.forget.query::<DB>(&[text(&from), text(&to)])).await?;
    Ok(())
}

fn not_a_step(key: &str) -> sqlx::Error {
    sqlx::Error::ColumnDecode {
        index: "response".into(),
        source: format!("the row `\\step` `{key}` does not hold one of idem's recorded steps").into(),
    }
}
