//! MySQL and MariaDB: a duplicate-key error fails only its statement.
//!
//! InnoDB rolls back just the failing INSERT and keeps the transaction, so the
//! claim is a plain INSERT whose duplicate-key error (1062) is the duplicate
//! signal. Not `INSERT IGNORE` (it also turns truncation and NOT NULL errors
//! into warnings) and not `ON DUPLICATE KEY UPDATE` (its affected-rows count is
//! 1 or 2 or 0 depending on the client flags, an ambiguity that has granted
//! coupons twice).
//!
//! ## Any connection charset
//!
//! The record's text columns are utf8mb4, and the server converts every
//! string between them and the session's charset (`SET NAMES latin1`, an
//! application's `MySqlConnectOptions::charset`): an answer latin1 cannot
//! hold would be stored or replayed with `?` in its place. So idem's values
//! never cross as strings of the session's charset. They are bound as bytes
//! (`&[u8]`: the server takes a blob parameter as binary, unconverted) and
//! stored with `CONVERT(? USING utf8mb4)`, or written as hexadecimal
//! literals (`_utf8mb4 X'..'`, `X'..'` for the `VARBINARY` scope and key);
//! and they are read as bytes (`CAST(response AS BINARY)`, binary results
//! are never converted) and decoded as UTF-8 by idem ([`Utf8`]).

use sqlx::MySql;
use sqlx::mysql::{MySqlConnection, MySqlRow};

use super::admin::{AdminSql, PurgeFilter, Record, RecordId, state_sql, stuck_sql};
use super::{
    Cas, ClaimResult, ExistingRecord, InsertDone, LeaseAction, LeaseRow, LeaseSql, NewRecord, ReadMode, RecordSql,
    SchemaSql, SqlBackend, StateSql,
};
use crate::lease::store::{HeldLease, LeaseClaim, LeaseRequest};
use crate::machine::StoredState;
use crate::record::DedupRecord;

/// One of idem's text values as a statement binds it: its UTF-8 bytes,
/// which the server takes as binary whatever the session's charset (a
/// string parameter would be read in the session's charset and converted).
/// `CONVERT(? USING utf8mb4)` stores it in a text column; a `VARBINARY`
/// column and a comparison take it as it is.
fn utf8<'a>(value: impl Into<Option<&'a str>>) -> Option<&'a [u8]> {
    value.into().map(str::as_bytes)
}

/// One of idem's text columns as a read returns it: its bytes (the
/// statement casts it `AS BINARY`, and a `VARBINARY` is bytes already),
/// never converted to the session's charset, decoded as the UTF-8 idem
/// wrote.
pub(crate) struct Utf8(String);

impl sqlx::Type<MySql> for Utf8 {
    fn type_info() -> sqlx::mysql::MySqlTypeInfo {
        <[u8] as sqlx::Type<MySql>>::type_info()
    }

    fn compatible(ty: &sqlx::mysql::MySqlTypeInfo) -> bool {
        <[u8] as sqlx::Type<MySql>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, MySql> for Utf8 {
    fn decode(value: sqlx::mysql::MySqlValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        let bytes = <&[u8] as sqlx::Decode<MySql>>::decode(value)?;
        Ok(Utf8(String::from_utf8(bytes.to_vec())?))
    }
}

impl From<Utf8> for String {
    fn from(Utf8(s): Utf8) -> String {
        s
    }
}

fn mysql_cast(col: &str, int: bool) -> String {
    if int { format!("CAST({col} AS SIGNED)") } else { format!("CAST({col} AS CHAR)") }
}

const CLAIM: &str = "INSERT INTO idem_records \
    (scope, idem_key, status, fingerprint, created_at, updated_at, expires_at) \
    VALUES (?, ?, 'PROCESSING', CONVERT(? USING utf8mb4), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), \
            UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)";

const INSERT_DONE: &str = "INSERT INTO idem_records \
    (scope, idem_key, status, fingerprint, response, created_at, updated_at, expires_at) \
    VALUES (?, ?, 'DONE', CONVERT(? USING utf8mb4), CONVERT(? USING utf8mb4), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), \
            UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)";

// Taking over an expired record in place, only if it is still expired.
const TAKE_OVER: &str = "UPDATE idem_records SET status = 'DONE', fingerprint = CONVERT(? USING utf8mb4), \
    response = CONVERT(? USING utf8mb4), owner = NULL, \
    fence = fence + 1, lease_until = NULL, created_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6), \
    expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
    WHERE scope = ? AND idem_key = ? AND expires_at <= UTC_TIMESTAMP(6)";

// A locking read: under REPEATABLE READ a plain SELECT would use the snapshot of
// the transaction's first read and could miss a record committed since; a
// locking read sees the latest committed version.
const READ: &str = "SELECT CAST(status AS BINARY), CAST(fingerprint AS BINARY), CAST(response AS BINARY), \
    CAST(expires_at <= UTC_TIMESTAMP(6) AS SIGNED) \
    FROM idem_records WHERE scope = ? AND idem_key = ? LOCK IN SHARE MODE";

/// The precheck's confirming read: a plain (snapshot) read. A shared lock
/// here would take a gap lock when the record is missing, and two copies of
/// one key would then deadlock on their claims; a record the snapshot
/// misses is found by the claim's duplicate-key path, whose read locks.
const READ_PLAIN: &str = "SELECT CAST(status AS BINARY), CAST(fingerprint AS BINARY), CAST(response AS BINARY), \
    CAST(expires_at <= UTC_TIMESTAMP(6) AS SIGNED) \
    FROM idem_records WHERE scope = ? AND idem_key = ?";

const FETCH: &str = "SELECT scope, idem_key, CAST(status AS BINARY), CAST(fingerprint AS BINARY), \
    CAST(response AS BINARY), CAST(owner AS BINARY), fence, \
    TIMESTAMPDIFF(MICROSECOND, '1970-01-01', lease_until) DIV 1000, \
    TIMESTAMPDIFF(MICROSECOND, '1970-01-01', created_at) DIV 1000, \
    TIMESTAMPDIFF(MICROSECOND, '1970-01-01', updated_at) DIV 1000, \
    TIMESTAMPDIFF(MICROSECOND, '1970-01-01', expires_at) DIV 1000 \
    FROM idem_records WHERE scope = ? AND idem_key = ?";

/// The fence a lease insert or take-over set through `LAST_INSERT_ID(expr)`.
fn granted_fence(done: &sqlx::mysql::MySqlQueryResult) -> i64 {
    i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX)
}

fn is_duplicate_key(err: &sqlx::Error) -> bool {
    // Only a unique-key violation is a duplicate; everything else surfaces.
    err.as_database_error().is_some_and(|e| e.is_unique_violation())
}

// A new record's fence is the database's clock in microseconds (UTC, no
// time-zone conversion), handed back like the take-over's through
// `LAST_INSERT_ID(expr)`; a take-over adds one to the old fence.
const LEASE_INSERT: &str = "INSERT INTO idem_records \
    (scope, idem_key, status, fingerprint, owner, fence, lease_until, created_at, updated_at, expires_at) \
    VALUES (?, ?, 'PROCESSING', CONVERT(? USING utf8mb4), CONVERT(? USING utf8mb4), \
            LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))), \
            UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), \
            UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)";

// Take over a record whose retention or lease has passed (fingerprint
// permitting). `LAST_INSERT_ID(expr)` hands the new fence back in the OK
// packet, so no read is needed. The WHERE sees the row before the SET.
const LEASE_TAKE_OVER: &str = "UPDATE idem_records SET status = 'PROCESSING', response = NULL, \
    owner = CONVERT(? USING utf8mb4), fence = LAST_INSERT_ID(fence + 1), lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, \
    created_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6), expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, \
    fingerprint = CONVERT(? USING utf8mb4) \
    WHERE scope = ? AND idem_key = ? AND (expires_at <= UTC_TIMESTAMP(6) \
      OR (status <> 'DONE' AND lease_until IS NOT NULL AND lease_until <= UTC_TIMESTAMP(6) \
          AND (fingerprint IS NULL OR ? IS NULL OR fingerprint = ?)))";

/// Status, fingerprint, response, ms left on the lease, past retention (0/1).
type LeaseReadRow = (Utf8, Option<Utf8>, Option<Utf8>, Option<i64>, i64);

// An autocommit read: its own snapshot, so it sees the latest commit.
const LEASE_READ: &str = "SELECT CAST(status AS BINARY), CAST(fingerprint AS BINARY), CAST(response AS BINARY), \
    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), lease_until) DIV 1000, \
    CAST(expires_at <= UTC_TIMESTAMP(6) AS SIGNED) \
    FROM idem_records WHERE scope = ? AND idem_key = ?";

const HELD: &str = "scope = ? AND idem_key = ? AND owner = ? AND fence = ? AND status = 'PROCESSING'";

// Completion may be repeated by the same holder (its reply was lost): the
// owner and fence stay on the completed row, so the repeat matches it.
const HELD_OR_DONE: &str =
    "scope = ? AND idem_key = ? AND owner = ? AND fence = ? AND status IN ('PROCESSING', 'DONE')";

/// The condition of a purge's records, with `now` the clock (a function, or
/// a placeholder for a cut-off read first); bind its placeholders with
/// `bind_purgeable!`: the cut-off (if `now` is one), then with `older_than`
/// the cut-off again and the age, then the scope (with one).
fn purgeable(f: &PurgeFilter<'_>, now: &str) -> String {
    let mut cond = format!("expires_at <= {now}");
    if f.older_than.is_some() {
        cond = format!("({cond} OR (status <> 'PROCESSING' AND created_at <= {now} - INTERVAL ? MICROSECOND))");
    }
    if f.scope.is_some() {
        cond.push_str(" AND scope = ?");
    }
    cond
}

macro_rules! bind_purgeable {
    ($q:expr, $f:expr, $cut:expr) => {{
        let (mut q, cut) = ($q, $cut);
        if let Some(cut) = cut {
            q = q.bind(cut);
        }
        if let Some(older) = $f.older_than {
            if let Some(cut) = cut {
                q = q.bind(cut);
            }
            q = q.bind(super::retention_us(older));
        }
        if let Some(scope) = $f.scope {
            q = q.bind(utf8(scope));
        }
        q
    }};
}

/// The clock as epoch milliseconds, and a `DATETIME(6)` column as such.
const NOW_MS: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000";

/// The admin reads' columns (see `admin::decode_admin`).
fn admin_columns() -> String {
    let ms = |col: &str| format!("TIMESTAMPDIFF(MICROSECOND, '1970-01-01', {col}) DIV 1000");
    format!(
        "scope, idem_key, CAST(status AS BINARY), CAST(fingerprint AS BINARY), CAST(response AS BINARY), \
         CAST(owner AS BINARY), fence, {}, {}, {}, {}, {NOW_MS}, {}",
        ms("lease_until"),
        ms("created_at"),
        ms("updated_at"),
        ms("expires_at"),
        state_sql("UTC_TIMESTAMP(6)")
    )
}

impl super::sealed::Sealed for MySql {}

impl SqlBackend for MySql {
    const SCHEMA: &'static str = concat!(
        include_str!("../../../migrations/mysql/0001_idem_records.sql"),
        "\n",
        include_str!("../../../migrations/mysql/0002_idem_records_archive.sql")
    );

    const MIGRATIONS: &'static [(i64, &'static str, &'static str)] = &[
        (1, "idem_records", include_str!("../../../migrations/mysql/0001_idem_records.sql")),
        (2, "idem_records_archive", include_str!("../../../migrations/mysql/0002_idem_records_archive.sql")),
    ];

    /// `MEDIUMTEXT` holds 16 MiB less one byte; the statement carrying it
    /// must also fit MySQL's and MariaDB's default `max_allowed_packet`
    /// (16 MiB on MariaDB), hence 64 KiB less.
    const MAX_RESPONSE: usize = (1 << 24) - (1 << 16);
    const TEXT_IGNORES_CASE: bool = true;
    const BACKEND: &'static str = "mysql";

    /// A statement longer than the session's `max_allowed_packet` is refused
    /// by the server, which then closes the connection: an answer must
    /// leave room in it for the statement around it (64 KiB: the scope,
    /// key and fingerprint hold at most 1 KiB).
    const ASKS_ANSWER_LIMIT: bool = true;

    async fn answer_limit(conn: &mut MySqlConnection) -> Result<usize, sqlx::Error> {
        let packet = sqlx::query_scalar::<_, u64>("SELECT @@max_allowed_packet").fetch_one(conn).await?;
        Ok(Self::MAX_RESPONSE.min(usize::try_from(packet).unwrap_or(usize::MAX).saturating_sub(1 << 16)))
    }
}

impl RecordSql for MySql {
    async fn claim(conn: &mut MySqlConnection, r: &NewRecord<'_>) -> Result<ClaimResult, sqlx::Error> {
        let micros = super::retention_us(r.retention);
        let inserted = sqlx::query(super::table::sql(CLAIM))
            .bind(utf8(r.scope))
            .bind(utf8(r.key))
            .bind(utf8(r.fingerprint))
            .bind(micros)
            .execute(&mut *conn)
            .await;
        match inserted {
            Ok(_) => Ok(ClaimResult::Claimed),
            Err(e) if is_duplicate_key(&e) => Ok(ClaimResult::Conflict),
            Err(e) => Err(e),
        }
    }

    async fn read_then_claim(
        conn: &mut MySqlConnection,
        scope: &str,
        key: &str,
    ) -> Result<Option<ExistingRecord>, sqlx::Error> {
        let row: Option<MySqlRow> =
            sqlx::query(super::table::sql(READ_PLAIN)).bind(utf8(scope)).bind(utf8(key)).fetch_optional(conn).await?;
        row.map(|row| super::decode_existing_as::<Utf8, _>(&row)).transpose()
    }

    async fn read(conn: &mut MySqlConnection, scope: &str, key: &str) -> Result<Option<ExistingRecord>, sqlx::Error> {
        let row: Option<MySqlRow> =
            sqlx::query(super::table::sql(READ)).bind(utf8(scope)).bind(utf8(key)).fetch_optional(conn).await?;
        row.map(|row| super::decode_existing_as::<Utf8, _>(&row)).transpose()
    }

    async fn complete(
        conn: &mut MySqlConnection,
        scope: &str,
        key: &str,
        response: Option<&str>,
    ) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(super::table::sql(
            "UPDATE idem_records SET status = 'DONE', response = CONVERT(? USING utf8mb4), updated_at = UTC_TIMESTAMP(6) \
             WHERE scope = ? AND idem_key = ?",
        ))
        .bind(utf8(response))
        .bind(utf8(scope))
        .bind(utf8(key))
        .execute(conn)
        .await?;
        Ok(done.rows_affected())
    }

    async fn insert_done(
        conn: &mut MySqlConnection,
        r: &NewRecord<'_>,
        response: Option<&str>,
    ) -> Result<InsertDone, sqlx::Error> {
        let micros = super::retention_us(r.retention);
        let inserted = sqlx::query(super::table::sql(INSERT_DONE))
            .bind(utf8(r.scope))
            .bind(utf8(r.key))
            .bind(utf8(r.fingerprint))
            .bind(utf8(response))
            .bind(micros)
            .execute(&mut *conn)
            .await;
        match inserted {
            Ok(_) => Ok(InsertDone::Written),
            Err(e) if is_duplicate_key(&e) => {
                // Read first (a shared lock, like the other repeats' reads), and
                // take over only an expired record: an UPDATE straight away would
                // ask for an exclusive lock on a row every concurrent repeat holds
                // shared, and InnoDB would resolve that as a deadlock.
                let existing = Self::read(conn, r.scope, r.key).await?;
                if existing.as_ref().is_some_and(|e| e.expired) {
                    let taken = sqlx::query(super::table::sql(TAKE_OVER))
                        .bind(utf8(r.fingerprint))
                        .bind(utf8(response))
                        .bind(micros)
                        .bind(utf8(r.scope))
                        .bind(utf8(r.key))
                        .execute(conn)
                        .await?;
                    if taken.rows_affected() == 1 {
                        return Ok(InsertDone::Written);
                    }
                }
                Ok(InsertDone::Conflict)
            }
            Err(e) => Err(e),
        }
    }

    async fn restart(conn: &mut MySqlConnection) -> Result<(), sqlx::Error> {
        let sql = super::restart_sql::<MySql>(conn);
        sqlx::raw_sql(sql).execute(conn).await?;
        Ok(())
    }

    async fn discard(conn: &mut MySqlConnection, scope: &str, key: &str) -> Result<u64, sqlx::Error> {
        let gone = sqlx::query(super::table::sql("DELETE FROM idem_records WHERE scope = ? AND idem_key = ?"))
            .bind(utf8(scope))
            .bind(utf8(key))
            .execute(conn)
            .await?;
        Ok(gone.rows_affected())
    }

    async fn discard_expired(conn: &mut MySqlConnection, scope: &str, key: &str) -> Result<u64, sqlx::Error> {
        let gone = sqlx::query(super::table::sql(
            "DELETE FROM idem_records WHERE scope = ? AND idem_key = ? AND expires_at <= UTC_TIMESTAMP(6)",
        ))
        .bind(utf8(scope))
        .bind(utf8(key))
        .execute(conn)
        .await?;
        Ok(gone.rows_affected())
    }

    async fn fetch(conn: &mut MySqlConnection, scope: &str, key: &str) -> Result<Option<DedupRecord>, sqlx::Error> {
        let row = sqlx::query(super::table::sql(FETCH)).bind(utf8(scope)).bind(utf8(key)).fetch_optional(conn).await?;
        row.map(|row| super::decode_record_as::<Utf8, _>(&row)).transpose()
    }
}

impl StateSql for MySql {
    async fn transition(conn: &mut MySqlConnection, cas: &Cas<'_>) -> Result<u64, sqlx::Error> {
        let sql = super::cas_sql(cas, 1, super::ph_question);
        let done = bind_keys!(sqlx::query(sqlx::AssertSqlSafe(sql)), cas.key, |u| u.hyphenated().to_string())
            .execute(conn)
            .await?;
        Ok(done.rows_affected())
    }

    async fn read_state(
        conn: &mut MySqlConnection,
        cas: &Cas<'_>,
        mode: ReadMode,
    ) -> Result<Option<StoredState>, sqlx::Error> {
        // Always a locking read: a plain one would see the transaction's first
        // snapshot, not the status a concurrent caller just committed.
        let mut sql = super::state_read_sql(cas, super::ph_question, mysql_cast);
        sql.push_str(if mode == ReadMode::ForUpdate { " FOR UPDATE" } else { " LOCK IN SHARE MODE" });
        let row = bind_keys!(sqlx::query(sqlx::AssertSqlSafe(sql)), cas.key, |u| u.hyphenated().to_string())
            .fetch_optional(conn)
            .await?;
        row.map(|row| super::decode_state(&row, cas.states)).transpose()
    }
}

impl LeaseSql for MySql {
    async fn lease_claim(
        conn: &mut MySqlConnection,
        req: &LeaseRequest<'_>,
    ) -> Result<Option<LeaseClaim>, sqlx::Error> {
        // Read first: a replay (the common repeat) or a live holder is then
        // answered in one round trip. A fresh key costs the insert too; a
        // record inserted in between fails the insert (only a unique-key
        // violation counts) and the caller asks again, reading it.
        let row: Option<LeaseReadRow> = sqlx::query_as(super::table::sql(LEASE_READ))
            .bind(utf8(req.scope))
            .bind(utf8(req.key))
            .fetch_optional(&mut *conn)
            .await?;
        let Some((status, fingerprint, response, lease_left_ms, expired)) = row else {
            return lease_insert(conn, req).await;
        };
        let (status, fingerprint, response) =
            (status.into(), fingerprint.map(String::from), response.map(String::from));
        if expired == 0 {
            let live = status == "DONE" || lease_left_ms.is_some_and(|ms| ms > 0);
            let mismatch = matches!((req.fingerprint, fingerprint.as_deref()), (Some(a), Some(b)) if a != b);
            if live || mismatch {
                let row = LeaseRow { status, fingerprint, response, lease_left_ms };
                return Ok(Some(crate::store::sql::lease::judge_row(req, row)));
            }
        }
        // Past its lease or its retention: take it over, in one conditional
        // statement (it re-checks, so two reclaimers cannot both win).
        lease_take_over(conn, req).await
    }

    async fn lease_finish(
        conn: &mut MySqlConnection,
        held: &HeldLease<'_>,
        action: LeaseAction<'_>,
    ) -> Result<bool, sqlx::Error> {
        let sql = match action {
            LeaseAction::Complete(_) => format!(
                "UPDATE idem_records SET status = 'DONE', response = CONVERT(? USING utf8mb4), lease_until = NULL, \
                 updated_at = UTC_TIMESTAMP(6), expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE {HELD_OR_DONE}"
            ),
            LeaseAction::Release => format!("DELETE FROM idem_records WHERE {HELD}"),
            LeaseAction::Extend => format!(
                "UPDATE idem_records SET lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, \
                 updated_at = UTC_TIMESTAMP(6), \
                 expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) WHERE {HELD}"
            ),
        };
        let q = sqlx::query(sqlx::AssertSqlSafe(super::table::owned(sql)));
        let q = match action {
            LeaseAction::Complete(response) => q.bind(utf8(response)).bind(super::retention_us(held.retention)),
            LeaseAction::Release => q,
            LeaseAction::Extend => q.bind(super::retention_us(held.lease)).bind(super::retention_us(held.lease)),
        };
        let done =
            q.bind(utf8(held.scope)).bind(utf8(held.key)).bind(utf8(held.owner)).bind(held.fence).execute(conn).await?;
        Ok(done.rows_affected() == 1)
    }
}

/// The lease and the record's retention (never shorter than the lease), in
/// microseconds.
fn lease_and_keep_us(req: &LeaseRequest<'_>) -> (i64, i64) {
    (super::retention_us(req.lease), super::retention_us(req.retention.max(req.lease)))
}

/// A claim of a key that had no record when it was read.
async fn lease_insert(conn: &mut MySqlConnection, req: &LeaseRequest<'_>) -> Result<Option<LeaseClaim>, sqlx::Error> {
    let (lease, keep) = lease_and_keep_us(req);
    let inserted = sqlx::query(super::table::sql(LEASE_INSERT))
        .bind(utf8(req.scope))
        .bind(utf8(req.key))
        .bind(utf8(req.fingerprint))
        .bind(utf8(req.owner))
        .bind(lease)
        .bind(keep)
        .execute(&mut *conn)
        .await;
    match inserted {
        Ok(done) => {
            let fence = granted_fence(&done);
            Ok(Some(LeaseClaim::Acquired { fence, reclaimed: false }))
        }
        Err(e) if is_duplicate_key(&e) => Ok(None), // inserted since the read: ask again
        Err(e) => Err(e),
    }
}

/// A claim of a record read past its lease or its retention.
async fn lease_take_over(
    conn: &mut MySqlConnection,
    req: &LeaseRequest<'_>,
) -> Result<Option<LeaseClaim>, sqlx::Error> {
    let (lease, keep) = lease_and_keep_us(req);
    let taken = sqlx::query(super::table::sql(LEASE_TAKE_OVER))
        .bind(utf8(req.owner))
        .bind(lease)
        .bind(keep)
        .bind(utf8(req.fingerprint))
        .bind(utf8(req.scope))
        .bind(utf8(req.key))
        .bind(utf8(req.fingerprint))
        .bind(utf8(req.fingerprint))
        .execute(&mut *conn)
        .await?;
    if taken.rows_affected() == 1 {
        let fence = granted_fence(&taken);
        return Ok(Some(LeaseClaim::Acquired { fence, reclaimed: true }));
    }
    Ok(None) // another caller took it over first: ask again
}

impl SchemaSql for MySql {
    async fn purge_batch(
        conn: &mut MySqlConnection,
        batch: u32,
        archive: bool,
        f: &PurgeFilter<'_>,
    ) -> Result<u64, sqlx::Error> {
        let t = f.table;
        if !archive {
            let cond = purgeable(f, "UTC_TIMESTAMP(6)");
            let query =
                sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {t} WHERE {cond} ORDER BY expires_at LIMIT ?")));
            let gone = bind_purgeable!(query, f, None::<&String>).bind(batch).execute(conn).await?;
            return Ok(gone.rows_affected());
        }
        let chosen = format!("{} ORDER BY expires_at, scope, idem_key LIMIT ?", purgeable(f, "CAST(? AS DATETIME(6))"));
        // One short transaction: the same rows (one cut-off, one order) are
        // copied, then deleted; the copy's shared locks keep them in place.
        use sqlx::Connection;
        let mut tx = conn.begin().await?;
        let cut: String = sqlx::query_scalar("SELECT CAST(UTC_TIMESTAMP(6) AS CHAR)").fetch_one(&mut *tx).await?;
        let copy = sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {archive} (scope, idem_key, status, fingerprint, response, owner, fence, \
             lease_until, created_at, updated_at, expires_at, archived_at) \
             SELECT scope, idem_key, status, fingerprint, response, owner, fence, lease_until, created_at, updated_at, \
             expires_at, UTC_TIMESTAMP(6) FROM (SELECT * FROM {t} WHERE {chosen}) AS expired \
             WHERE status = 'DONE'",
            archive = f.archive_table
        )));
        let delete = sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {t} WHERE {chosen}")));
        bind_purgeable!(copy, f, Some(&cut)).bind(batch).execute(&mut *tx).await?;
        let gone = bind_purgeable!(delete, f, Some(&cut)).bind(batch).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(gone.rows_affected())
    }

    async fn migrate(conn: &mut MySqlConnection) -> Result<(), sqlx::Error> {
        // DDL commits implicitly in MySQL; CREATE TABLE IF NOT EXISTS is safe to
        // race under the server's metadata lock.
        sqlx::raw_sql(super::table::schema(Self::SCHEMA)).execute(conn).await?;
        Ok(())
    }

    fn is_missing_table(err: &sqlx::Error) -> bool {
        // 42S02 / ER_NO_SUCH_TABLE (1146)
        err.as_database_error().and_then(|e| e.code()).is_some_and(|c| c == "42S02" || c == "1146")
    }
}

impl AdminSql for MySql {
    async fn admin_fetch(
        conn: &mut MySqlConnection,
        table: &str,
        id: &RecordId,
    ) -> Result<Option<Record>, sqlx::Error> {
        let sql = format!("SELECT {} FROM {table} WHERE scope = ? AND idem_key = ?", admin_columns());
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(utf8(id.scope()))
            .bind(utf8(id.key()))
            .fetch_optional(conn)
            .await?;
        row.map(|row| super::admin::decode_admin_as::<Utf8, _>(&row)).transpose()
    }

    async fn admin_stuck(
        conn: &mut MySqlConnection,
        table: &str,
        scope: Option<&str>,
        after: Option<&RecordId>,
        limit: u32,
    ) -> Result<Vec<Record>, sqlx::Error> {
        let sql = format!(
            "SELECT {} FROM {table} WHERE {} AND (? IS NULL OR scope = ?) \
             AND (? IS NULL OR scope > ? OR (scope = ? AND idem_key > ?)) ORDER BY scope, idem_key LIMIT ?",
            admin_columns(),
            stuck_sql("UTC_TIMESTAMP(6)")
        );
        let (after_scope, after_key) = (after.map(RecordId::scope), after.map(RecordId::key));
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(utf8(scope))
            .bind(utf8(scope))
            .bind(utf8(after_scope))
            .bind(utf8(after_scope))
            .bind(utf8(after_scope))
            .bind(utf8(after_key))
            .bind(limit)
            .fetch_all(conn)
            .await?;
        rows.iter().map(super::admin::decode_admin_as::<Utf8, _>).collect()
    }

    async fn admin_release(
        conn: &mut MySqlConnection,
        table: &str,
        id: &RecordId,
        fence: i64,
    ) -> Result<u64, sqlx::Error> {
        let sql = format!(
            "DELETE FROM {table} WHERE scope = ? AND idem_key = ? AND fence = ? AND {}",
            stuck_sql("UTC_TIMESTAMP(6)")
        );
        let gone = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(utf8(id.scope()))
            .bind(utf8(id.key()))
            .bind(fence)
            .execute(conn)
            .await?;
        Ok(gone.rows_affected())
    }

    async fn purge_count(conn: &mut MySqlConnection, f: &PurgeFilter<'_>) -> Result<(u64, u64), sqlx::Error> {
        let sql = format!(
            "SELECT COUNT(*), CAST(COALESCE(SUM(status = 'DONE'), 0) AS SIGNED) FROM {} WHERE {}",
            f.table,
            purgeable(f, "UTC_TIMESTAMP(6)")
        );
        let query = sqlx::query_as::<_, (i64, i64)>(sqlx::AssertSqlSafe(sql));
        let (all, done) = bind_purgeable!(query, f, None::<&String>).fetch_one(conn).await?;
        Ok((u64::try_from(all).unwrap_or(0), u64::try_from(done).unwrap_or(0)))
    }
}
