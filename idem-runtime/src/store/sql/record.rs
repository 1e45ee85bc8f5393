//! The dedup record in the caller's transaction: its statements, written
//! once over the dialect, and the steps that send them (claim, read,
//! complete, write done, take over, remove, fetch, start over).
//!
//! Expiry counts from the statement's clock (PostgreSQL's
//! `clock_timestamp()`, not `now()`, the transaction's start): a long
//! transaction must not commit a record that is already expired.
//!
//! A claim is a plain insert that does nothing on a conflict (MySQL: that
//! fails on the key, see its dialect); a repeat then reads the record in
//! a second statement. (A single statement that also returned the
//! existing record, a CTE with the insert and a SELECT, made every first
//! call measurably slower in `loadgen` on PostgreSQL; first calls are the
//! common case.) The read is a fresh statement with a fresh snapshot, so
//! under READ COMMITTED it also sees a record committed while the insert
//! waited.

use super::dialect::{Arg, Dialect, Stmt, TakeOver, inserted, read_required, read_text, text};
use super::{ClaimResult, ExistingRecord, InsertDone, NewRecord, SqlBackend, statements, write_lock_sql};
use crate::record::{DedupRecord, RecordStatus};
use crate::table::RecordTable;

/// The record's statements. Their values: `$1` scope, `$2` key, `$3`
/// fingerprint, `$4` retention, `$5` answer (see [`args`]), or fewer.
pub(crate) struct RecordStatements {
    claim: Stmt,
    /// `claim = "after"`: the record and its answer in one statement.
    insert_done: Stmt,
    /// What then takes over an expired record.
    take_over: Later,
    read: Stmt,
    /// The precheck's confirming read, in a transaction that may claim the
    /// key right after.
    read_then_claim: Stmt,
    write_lock: Option<Stmt>,
    complete: Stmt,
    discard: Stmt,
    discard_expired: Stmt,
    fetch: Stmt,
}

/// The take-over after an `insert_done` that met a record.
enum Later {
    /// None: the insert took it over itself.
    Nothing,
    Update(Stmt),
    ReadThenUpdate(Stmt),
}

/// Where a statement finds the record.
const AT: &str = "scope = $1 AND idem_key = $2";

impl RecordStatements {
    pub(crate) fn new<D: Dialect>(t: &RecordTable) -> RecordStatements {
        let now = D::NOW;
        let take_over = D::take_over(t);
        let (claim, insert_done) = inserts::<D>(t, &take_over);
        RecordStatements {
            claim,
            insert_done,
            take_over: match take_over {
                TakeOver::InTheInsert(_) => Later::Nothing,
                TakeOver::Update => Later::Update(take_over_sql::<D>(t)),
                TakeOver::ReadThenUpdate => Later::ReadThenUpdate(take_over_sql::<D>(t)),
            },
            read: read_sql::<D>(t, D::LATEST_READ),
            read_then_claim: read_sql::<D>(t, ""),
            write_lock: D::WRITE_LOCK_FIRST.then(|| Stmt::new::<D>(&write_lock_sql(t.qualified(), "status"))),
            // Its own values: `$1` scope, `$2` key, `$3` answer.
            complete: Stmt::new::<D>(&format!(
                "UPDATE {t} SET status = 'DONE', response = {answer}{touch} WHERE {AT}",
                answer = D::text_value("$3"),
                touch = if D::COMPLETE_TOUCHES { format!(", updated_at = {now}") } else { String::new() },
            )),
            discard: Stmt::new::<D>(&format!("DELETE FROM {t} WHERE {AT}")),
            discard_expired: Stmt::new::<D>(&format!("DELETE FROM {t} WHERE {AT} AND expires_at <= {now}")),
            fetch: fetch_sql::<D>(t),
        }
    }
}

/// The claim, and `claim = "after"`'s record written with its answer.
fn inserts<D: Dialect>(t: &RecordTable, take_over: &TakeOver) -> (Stmt, Stmt) {
    let (now, expires, fp) = (D::NOW, D::after(D::CLOCK, "$4"), D::text_value("$3"));
    let on_duplicate = D::ON_DUPLICATE.unwrap_or("");
    let conflict = match take_over {
        TakeOver::InTheInsert(clause) => clause.as_str(),
        _ => on_duplicate,
    };
    let claim = format!(
        "INSERT INTO {t} (scope, idem_key, status, fingerprint, created_at, updated_at, expires_at) \
         VALUES ($1, $2, 'PROCESSING', {fp}, {now}, {now}, {expires}){on_duplicate}"
    );
    let insert_done = format!(
        "INSERT INTO {t} (scope, idem_key, status, fingerprint, response, created_at, updated_at, expires_at) \
         VALUES ($1, $2, 'DONE', {fp}, {answer}, {now}, {now}, {expires}){conflict}",
        answer = D::text_value("$5"),
    );
    (Stmt::new::<D>(&claim), Stmt::new::<D>(&insert_done))
}

/// An expired record taken over in place, only if it is still expired.
fn take_over_sql<D: Dialect>(t: &RecordTable) -> Stmt {
    let now = D::NOW;
    Stmt::new::<D>(&format!(
        "UPDATE {t} SET status = 'DONE', fingerprint = {fp}, response = {answer}, owner = NULL, \
         fence = fence + 1, lease_until = NULL, created_at = {now}, updated_at = {now}, expires_at = {expires} \
         WHERE {AT} AND expires_at <= {now}",
        fp = D::text_value("$3"),
        answer = D::text_value("$5"),
        expires = D::after(D::CLOCK, "$4"),
    ))
}

/// What a repeat judges by (see [`decode_existing`]), the read ended by `end`.
fn read_sql<D: Dialect>(t: &RecordTable, end: &str) -> Stmt {
    Stmt::new::<D>(&format!(
        "SELECT {}, {}, {}, {} FROM {t} WHERE {AT}{end}",
        D::text_column("status"),
        D::text_column("fingerprint"),
        D::text_column("response"),
        D::flag(&format!("expires_at <= {}", D::NOW)),
    ))
}

/// The whole record (see [`decode_record`]).
fn fetch_sql<D: Dialect>(t: &RecordTable) -> Stmt {
    Stmt::new::<D>(&format!("SELECT {} FROM {t} WHERE {AT}", columns::<D>()))
}

/// The record's columns, as [`decode_record`] reads them.
pub(crate) fn columns<D: Dialect>() -> String {
    format!(
        "scope, idem_key, {}, {}, {}, {}, fence, {}, {}, {}, {}",
        D::text_column("status"),
        D::text_column("fingerprint"),
        D::text_column("response"),
        D::text_column("owner"),
        D::epoch_ms("lease_until"),
        D::epoch_ms("created_at"),
        D::epoch_ms("updated_at"),
        D::epoch_ms("expires_at"),
    )
}

/// The values of the record's statements, in their numbering.
fn args<'a>(r: &NewRecord<'a>, answer: Option<&'a str>) -> [Arg<'a>; 5] {
    [text(r.scope), text(r.key), Arg::Text(r.fingerprint), Arg::Span(r.retention), Arg::Text(answer)]
}

/// Scope and key.
fn at<'a>(scope: &'a str, key: &'a str) -> [Arg<'a>; 2] {
    [text(scope), text(key)]
}

/// Insert the record, or find that another holds the key.
pub(crate) async fn claim<DB: SqlBackend>(
    conn: &mut DB::Connection,
    r: &NewRecord<'_>,
) -> Result<ClaimResult, sqlx::Error> {
    let done = DB::execute(conn, statements::<DB>().record.claim.query::<DB>(&args(r, None))).await;
    Ok(if inserted::<DB>(done)? { ClaimResult::Claimed } else { ClaimResult::Conflict })
}

/// The claim's text, and how many values it binds: what the state
/// strategies' one-statement claim and move (PostgreSQL) builds on.
pub(crate) fn claim_statement<DB: SqlBackend>() -> &'static Stmt {
    &statements::<DB>().record.claim
}

/// The values of [`claim_statement`] for `r`.
pub(crate) fn claim_args<'a>(r: &NewRecord<'a>) -> [Arg<'a>; 5] {
    args(r, None)
}

/// The record that holds the key, as the latest commit left it.
pub(crate) async fn read<DB: SqlBackend>(
    conn: &mut DB::Connection,
    scope: &str,
    key: &str,
) -> Result<Option<ExistingRecord>, sqlx::Error> {
    let row = DB::fetch_optional(conn, statements::<DB>().record.read.query::<DB>(&at(scope, key))).await?;
    row.map(|row| decode_existing::<DB>(&row)).transpose()
}

/// [`read`], in a transaction that may claim the key right after (the
/// precheck's confirmation): a plain read (MySQL: a shared lock here
/// would take a gap lock when the record is missing, and two copies of
/// one key would then deadlock on their claims; a record the snapshot
/// misses is found by the claim's duplicate-key path, whose read locks).
/// SQLite takes its write lock first: a transaction that has read cannot
/// wait for the lock later (its snapshot would be stale) and fails with
/// "database is locked".
pub(crate) async fn read_then_claim<DB: SqlBackend>(
    conn: &mut DB::Connection,
    scope: &str,
    key: &str,
) -> Result<Option<ExistingRecord>, sqlx::Error> {
    let s = &statements::<DB>().record;
    if let Some(lock) = &s.write_lock {
        DB::execute(&mut *conn, lock.query::<DB>(&[])).await?;
    }
    let row = DB::fetch_optional(conn, s.read_then_claim.query::<DB>(&at(scope, key))).await?;
    row.map(|row| decode_existing::<DB>(&row)).transpose()
}

/// Decode a read's columns, in that order: status, fingerprint, response,
/// expired (as an integer: 0 or 1).
pub(crate) fn decode_existing<DB: SqlBackend>(row: &DB::Row) -> Result<ExistingRecord, sqlx::Error> {
    Ok(ExistingRecord {
        status: read_required::<DB>(row, 0)?,
        fingerprint: read_text::<DB>(row, 1)?,
        response: read_text::<DB>(row, 2)?,
        expired: DB::int(row, 3)? != 0,
    })
}

/// Store the answer and mark the record `DONE`; returns rows changed.
pub(crate) async fn complete<DB: SqlBackend>(
    conn: &mut DB::Connection,
    scope: &str,
    key: &str,
    answer: Option<&str>,
) -> Result<u64, sqlx::Error> {
    let values = [text(scope), text(key), Arg::Text(answer)];
    let done = DB::execute(conn, statements::<DB>().record.complete.query::<DB>(&values)).await?;
    Ok(DB::rows(&done))
}

/// `claim = "after"`: write the record `DONE` with its answer in one
/// statement, taking over an expired record in place. `Written` when this
/// call now owns the key; `Conflict` when a live record holds it (the
/// caller's transaction still holds the body's writes).
pub(crate) async fn insert_done<DB: SqlBackend>(
    conn: &mut DB::Connection,
    r: &NewRecord<'_>,
    answer: Option<&str>,
) -> Result<InsertDone, sqlx::Error> {
    let s = &statements::<DB>().record;
    let values = args(r, answer);
    if inserted::<DB>(DB::execute(&mut *conn, s.insert_done.query::<DB>(&values)).await)? {
        return Ok(InsertDone::Written);
    }
    let take_over = match &s.take_over {
        Later::Nothing => return Ok(InsertDone::Conflict),
        // The update only matches an expired record, so no read is needed first.
        Later::Update(take_over) => take_over,
        Later::ReadThenUpdate(take_over) => {
            let existing = read::<DB>(&mut *conn, r.scope, r.key).await?;
            if !existing.is_some_and(|e| e.expired) {
                return Ok(InsertDone::Conflict);
            }
            take_over
        }
    };
    let done = DB::execute(conn, take_over.query::<DB>(&values)).await?;
    Ok(if DB::rows(&done) == 1 { InsertDone::Written } else { InsertDone::Conflict })
}

/// Roll the caller's transaction back to its start and go on in a fresh
/// one (see [`restart_sql`](super::restart_sql)), in one round trip: the
/// simple-query protocol runs both statements.
pub(crate) async fn restart<DB: SqlBackend>(conn: &mut DB::Connection) -> Result<(), sqlx::Error> {
    let text = super::restart_sql::<DB>(conn);
    DB::execute_text(conn, text).await?;
    Ok(())
}

/// Remove the record (the body failed); returns rows removed.
pub(crate) async fn discard<DB: SqlBackend>(
    conn: &mut DB::Connection,
    scope: &str,
    key: &str,
) -> Result<u64, sqlx::Error> {
    remove::<DB>(conn, &statements::<DB>().record.discard, scope, key).await
}

/// Remove the record only if it has expired; returns rows removed.
pub(crate) async fn discard_expired<DB: SqlBackend>(
    conn: &mut DB::Connection,
    scope: &str,
    key: &str,
) -> Result<u64, sqlx::Error> {
    remove::<DB>(conn, &statements::<DB>().record.discard_expired, scope, key).await
}

async fn remove<DB: SqlBackend>(
    conn: &mut DB::Connection,
    delete: &Stmt,
    scope: &str,
    key: &str,
) -> Result<u64, sqlx::Error> {
    let done = DB::execute(conn, delete.query::<DB>(&at(scope, key))).await?;
    Ok(DB::rows(&done))
}

/// The whole record, as [`find_record`](super::find_record) returns it.
pub(crate) async fn fetch<DB: SqlBackend>(
    conn: &mut DB::Connection,
    scope: &str,
    key: &str,
) -> Result<Option<DedupRecord>, sqlx::Error> {
    let row = DB::fetch_optional(conn, statements::<DB>().record.fetch.query::<DB>(&at(scope, key))).await?;
    row.map(|row| decode_record::<DB>(&row)).transpose()
}

/// Decode the [`columns`], in that order: scope, key, status, fingerprint,
/// response, owner, fence, lease_until, created_at, updated_at, expires_at
/// (times as epoch milliseconds).
pub(crate) fn decode_record<DB: SqlBackend>(row: &DB::Row) -> Result<DedupRecord, sqlx::Error> {
    let status = read_required::<DB>(row, 2)?;
    Ok(DedupRecord {
        scope: read_required::<DB>(row, 0)?,
        key: read_required::<DB>(row, 1)?,
        status: RecordStatus::parse(&status).ok_or_else(|| sqlx::Error::ColumnDecode {
            index: "status".into(),
            source: format!("unknown record status {status:?}").into(),
        })?,
        fingerprint: read_text::<DB>(row, 3)?,
        response: read_text::<DB>(row, 4)?,
        owner: read_text::<DB>(row, 5)?,
        fence: DB::int(row, 6)?,
        lease_until_ms: DB::opt_int(row, 7)?,
        created_at_ms: DB::int(row, 8)?,
        updated_at_ms: DB::int(row, 9)?,
        expires_at_ms: DB::int(row, 10)?,
    })
}
