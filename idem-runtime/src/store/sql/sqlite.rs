//! SQLite, the embedded default: one writer at a time.
//!
//! SQLite keeps the transaction after a constraint error, but
//! `ON CONFLICT DO NOTHING` says "duplicate" without raising anything, and a
//! NOT NULL or CHECK failure still raises. Writers are serialised by the
//! database lock, so a duplicate waits (busy timeout) until the first
//! transaction commits or rolls back, then reads the committed record.
//!
//! Begin transactions with `BEGIN IMMEDIATE` if the caller reads before the
//! guard: a deferred transaction that read first and then writes can fail with
//! SQLITE_BUSY instead of waiting.
//!
//! Times are stored as epoch milliseconds ([`NOW_MS`]), durations bound as
//! milliseconds.

use std::time::Duration;

use sqlx::Sqlite;
use sqlx::sqlite::SqliteConnection;

use super::SqlBackend;
use super::dialect::{Arg, Dialect, Driver, Placeholders, Query, Stmt, TakeOver};
use super::lease::{LeaseClaimSql, LeaseClaimed, LeaseStatements, claim_args, judge_row, read_holder};
use super::schema::{ARCHIVED, Cut, PurgeBatch, PurgeSql, archive_copy, cut_copy_delete};
use crate::lease::store::{LeaseClaim, LeaseRequest};
use crate::table::RecordTable;

/// The store's clock, as epoch milliseconds.
macro_rules! now_ms {
    () => {
        "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
    };
}

const NOW_MS: &str = now_ms!();

impl super::sealed::Sealed for Sqlite {}

impl SqlBackend for Sqlite {
    migrations!("sqlite");

    const BACKEND: &'static str = "sqlite";
    /// SQLite's default `SQLITE_MAX_LENGTH`: a longer value is refused
    /// ("string or blob too big").
    const MAX_RESPONSE: usize = 1_000_000_000;
}

impl Dialect for Sqlite {
    const PLACEHOLDERS: Placeholders = Placeholders::Numbered("?");

    /// In milliseconds, like the times.
    fn bind_span(query: Query<Self>, span: Duration) -> Query<Self> {
        Self::bind_int(query, crate::store::millis(span))
    }

    const NOW: &'static str = NOW_MS;

    fn interval(value: &str) -> String {
        value.to_owned()
    }

    const INT: &'static str = "INTEGER";
    const TEXT: &'static str = "TEXT";

    fn ms_until(time: &str) -> String {
        format!("{time} - {NOW_MS}")
    }

    const GREATEST: &'static str = "max";

    /// One upsert: with one writer at a time, nothing can come between.
    fn take_over(t: &RecordTable) -> TakeOver {
        TakeOver::InTheInsert(format!(
            " ON CONFLICT (scope, idem_key) DO UPDATE SET status = 'DONE', fingerprint = excluded.fingerprint, \
             response = excluded.response, owner = NULL, fence = {t}.fence + 1, lease_until = NULL, \
             created_at = excluded.created_at, updated_at = excluded.updated_at, expires_at = excluded.expires_at \
             WHERE {t}.expires_at <= {NOW_MS}"
        ))
    }

    /// No row locks: one writer holds the whole database. To read and then
    /// move with nothing in between, the write lock is taken first.
    const FOR_UPDATE: &'static str = "";
    const FOR_SHARE: &'static str = "";
    const WRITE_LOCK_FIRST: bool = true;

    const TAKES_SCHEMA: bool = false;

    fn is_missing_table(err: &sqlx::Error) -> bool {
        err.as_database_error().is_some_and(|e| e.message().contains("no such table"))
    }
}

impl LeaseClaimSql for Sqlite {
    type Claim = Stmt;

    fn claim_statements(t: &RecordTable) -> Self::Claim {
        Stmt::new::<Self>(&lease_claim_sql(t))
    }

    /// The clock is read holding the write lock: every fence granted on
    /// this file before was granted by a writer that held it earlier, on
    /// the same machine's clock, so a new record's fence is above them all
    /// (a clock read before waiting for the lock could be below one
    /// granted meanwhile).
    async fn lease_claim(
        conn: &mut SqliteConnection,
        s: &LeaseStatements<Self>,
        req: &LeaseRequest<'_>,
    ) -> LeaseClaimed {
        use sqlx::Connection as _;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        let fresh = crate::store::clock_micros();
        let values = claim_args(req);
        let values = [values.as_slice(), &[Arg::Int(fresh)]].concat();
        let row = Self::fetch_optional(&mut tx, s.claim.query::<Self>(&values)).await?;
        let claim = match row {
            // A take-over returns the old fence + 1, never this clock
            // reading: the old one was granted a lease or more ago.
            Some(row) => {
                let fence = Self::int(&row, 0)?;
                Some(LeaseClaim::Acquired { fence, reclaimed: fence != fresh })
            }
            None => read_holder::<Self>(&mut tx, s, req).await?.map(|(holder, _)| judge_row(req, holder)),
        };
        tx.commit().await?;
        Ok(claim)
    }
}

impl PurgeSql for Sqlite {
    /// One cut-off for both statements; the transaction holds the write
    /// lock from its first statement, so the two see the same rows.
    async fn purge_batch(conn: &mut SqliteConnection, p: &PurgeBatch<'_>) -> Result<u64, sqlx::Error> {
        let t = p.table;
        let chosen =
            format!("rowid IN (SELECT rowid FROM {t} WHERE {} ORDER BY rowid LIMIT $2)", p.condition::<Self>("$1"));
        let from = format!("{t} WHERE {chosen} AND {ARCHIVED}");
        let copy = p.archive.then(|| archive_copy("INSERT OR IGNORE INTO", t.archive(), "$1", &from));
        let delete = format!("DELETE FROM {t} WHERE {chosen}");
        let cut = Cut::Int(concat!("SELECT ", now_ms!()));
        cut_copy_delete::<Self>(conn, cut, copy.as_deref(), &delete, p).await
    }
}

/// Insert, or take over a record whose retention or lease has passed
/// (fingerprint permitting); RETURNING gives the fence either way and
/// nothing when the record holds. It runs in an IMMEDIATE transaction with
/// the read that follows, which sees what blocked the claim. A new
/// record's fence (`$7`) is the clock in microseconds, read holding the
/// write lock; a take-over adds one to the old. Values: `claim_args`, then
/// `$7`.
fn lease_claim_sql(t: &RecordTable) -> String {
    let now = NOW_MS;
    format!(
        "INSERT INTO {t} (scope, idem_key, status, fingerprint, owner, fence, lease_until, created_at, updated_at, \
         expires_at) VALUES ($1, $2, 'PROCESSING', $3, $4, $7, {now} + $5, {now}, {now}, {now} + max($5, $6)) \
         ON CONFLICT (scope, idem_key) DO UPDATE SET status = 'PROCESSING', fingerprint = excluded.fingerprint, \
         response = NULL, owner = excluded.owner, fence = {t}.fence + 1, lease_until = excluded.lease_until, \
         created_at = excluded.created_at, updated_at = excluded.updated_at, expires_at = excluded.expires_at \
         WHERE {t}.expires_at <= {now} OR ({t}.status <> 'DONE' AND {t}.lease_until IS NOT NULL \
         AND {t}.lease_until <= {now} AND ({t}.fingerprint IS NULL OR excluded.fingerprint IS NULL \
         OR {t}.fingerprint = excluded.fingerprint)) RETURNING fence"
    )
}

/// One statement: with one writer at a time, nothing comes between the
/// choice and the claim, and no lock outlives it.
#[cfg(feature = "outbox")]
impl super::outbox::OutboxSql for Sqlite {
    type BatchClaim = Stmt;

    fn claim_statements(o: &str, scopes: usize) -> Stmt {
        use super::outbox::{candidates_sql, message_columns};
        let candidates = candidates_sql::<Self>(o, "c.seq", scopes);
        Stmt::new::<Self>(&format!(
            "UPDATE {o} SET claimed_by = $1, claim_until = {NOW_MS} + $2, attempts = attempts + 1 \
             WHERE seq IN ({candidates}) RETURNING {}",
            message_columns::<Self>("", "attempts")
        ))
    }

    fn purge_sql(o: &str, condition: &str) -> String {
        format!("DELETE FROM {o} WHERE seq IN (SELECT seq FROM {o} WHERE {condition} LIMIT $1)")
    }
}

/// A duplicate is `SQLITE_CONSTRAINT_UNIQUE` (2067) or
/// `SQLITE_CONSTRAINT_PRIMARYKEY` (1555), whose message names no index,
/// only its columns: `UNIQUE constraint failed: payment_record.pay_no`.
/// So the guard's index is looked up once (`sqlite_master` for its table,
/// `pragma_index_info` for its columns, in order) and its columns kept by
/// name; `table(a, b)` names the columns directly.
impl super::unique::UniqueSql for Sqlite {
    fn violation(error: &dyn sqlx::error::DatabaseError) -> Option<super::unique::Violation> {
        matches!(error.code().as_deref(), Some("2067" | "1555"))
            .then(|| super::unique::Violation { named: None, message: error.message().to_owned() })
    }

    fn is_on<'a>(
        conn: &'a mut SqliteConnection,
        violation: &'a super::unique::Violation,
        constraint: &'a str,
    ) -> crate::future::BoxFuture<'a, Result<bool, crate::error::Error>> {
        Box::pin(async move {
            let columns = index_columns(conn, constraint).await?;
            let failed = violation.message.strip_prefix("UNIQUE constraint failed: ");
            Ok(failed == Some(columns.as_str()))
        })
    }
}

/// The columns of the index `constraint` as SQLite's message lists them
/// (`t.a, t.b`), or of `t(a, b)` as written.
async fn index_columns(conn: &mut SqliteConnection, constraint: &str) -> Result<String, crate::error::Error> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static KNOWN: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    let known = KNOWN.get_or_init(Default::default);
    if let Some((table, columns)) = constraint.trim_end().strip_suffix(')').and_then(|c| c.split_once('(')) {
        let table = table.trim();
        return Ok(columns.split(',').map(|c| format!("{table}.{}", c.trim())).collect::<Vec<_>>().join(", "));
    }
    if let Some(columns) = known.lock().unwrap_or_else(|e| e.into_inner()).get(constraint) {
        return Ok(columns.clone());
    }
    let invalid = |reason: String| crate::error::Error::InvalidConstraint { constraint: constraint.to_owned(), reason };
    let table: Option<String> =
        sqlx::query_scalar("SELECT tbl_name FROM sqlite_master WHERE type = 'index' AND name = ?1")
            .bind(constraint)
            .fetch_optional(&mut *conn)
            .await?;
    let Some(table) = table else {
        return Err(invalid("this database has no index of that name (on SQLite, name the unique index, or write the columns as `table(a, b)`)".to_owned()));
    };
    let names: Vec<String> = sqlx::query_scalar("SELECT name FROM pragma_index_info(?1) ORDER BY seqno")
        .bind(constraint)
        .fetch_all(&mut *conn)
        .await?;
    if names.is_empty() {
        return Err(invalid("the index covers an expression, not columns SQLite could name".to_owned()));
    }
    let columns = names.iter().map(|c| format!("{table}.{c}")).collect::<Vec<_>>().join(", ");
    known.lock().unwrap_or_else(|e| e.into_inner()).insert(constraint.to_owned(), columns.clone());
    Ok(columns)
}
