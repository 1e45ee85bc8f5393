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

use sqlx::Sqlite;
use sqlx::sqlite::{SqliteConnection, SqliteRow};

use super::admin::{AdminSql, PurgeFilter, Record, RecordId, state_sql, stuck_sql};
use super::{
    Cas, ClaimResult, ExistingRecord, InsertDone, LeaseAction, LeaseRow, LeaseSql, NewRecord, ReadMode, RecordSql,
    SchemaSql, SqlBackend, StateSql,
};
use crate::lease::store::{HeldLease, LeaseClaim, LeaseRequest};
use crate::machine::StoredState;
use crate::record::DedupRecord;

fn sqlite_cast(col: &str, int: bool) -> String {
    if int { format!("CAST({col} AS INTEGER)") } else { format!("CAST({col} AS TEXT)") }
}

/// The store's clock, as epoch milliseconds.
macro_rules! now_ms {
    () => {
        "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
    };
}

const CLAIM: &str = concat!(
    "INSERT INTO idem_records (scope, idem_key, status, fingerprint, created_at, updated_at, expires_at) \
     VALUES (?1, ?2, 'PROCESSING', ?3, ",
    now_ms!(),
    ", ",
    now_ms!(),
    ", ",
    now_ms!(),
    " + ?4) ON CONFLICT (scope, idem_key) DO NOTHING"
);

const INSERT_DONE: &str = concat!(
    "INSERT INTO idem_records (scope, idem_key, status, fingerprint, response, created_at, updated_at, expires_at) \
     VALUES (?1, ?2, 'DONE', ?3, ?5, ",
    now_ms!(),
    ", ",
    now_ms!(),
    ", ",
    now_ms!(),
    " + ?4) ON CONFLICT (scope, idem_key) DO UPDATE SET status = 'DONE', fingerprint = excluded.fingerprint, \
     response = excluded.response, owner = NULL, fence = idem_records.fence + 1, lease_until = NULL, \
     created_at = excluded.created_at, updated_at = excluded.updated_at, expires_at = excluded.expires_at \
     WHERE idem_records.expires_at <= ",
    now_ms!()
);

const READ: &str = concat!(
    "SELECT status, fingerprint, response, expires_at <= ",
    now_ms!(),
    " FROM idem_records WHERE scope = ?1 AND idem_key = ?2"
);

// Insert, or take over a record whose retention or lease has passed
// (fingerprint permitting); RETURNING gives the fence either way and nothing
// when the record holds. It runs in an IMMEDIATE transaction with the read
// that follows, which sees what blocked the claim. A new record's fence (?7)
// is the clock in microseconds, read holding the write lock; a take-over
// adds one to the old.
const LEASE_CLAIM: &str = concat!(
    "INSERT INTO idem_records (scope, idem_key, status, fingerprint, owner, fence, lease_until, created_at, \
     updated_at, expires_at) VALUES (?1, ?2, 'PROCESSING', ?3, ?4, ?7, ",
    now_ms!(),
    " + ?5, ",
    now_ms!(),
    ", ",
    now_ms!(),
    ", ",
    now_ms!(),
    " + max(?5, ?6)) ON CONFLICT (scope, idem_key) DO UPDATE SET status = 'PROCESSING', \
     fingerprint = excluded.fingerprint, response = NULL, owner = excluded.owner, fence = idem_records.fence + 1, \
     lease_until = excluded.lease_until, created_at = excluded.created_at, updated_at = excluded.updated_at, \
     expires_at = excluded.expires_at \
     WHERE idem_records.expires_at <= ",
    now_ms!(),
    " OR (idem_records.status <> 'DONE' AND idem_records.lease_until IS NOT NULL AND idem_records.lease_until <= ",
    now_ms!(),
    " AND (idem_records.fingerprint IS NULL OR excluded.fingerprint IS NULL \
      OR idem_records.fingerprint = excluded.fingerprint)) RETURNING fence"
);

const LEASE_READ: &str = concat!(
    "SELECT status, fingerprint, response, lease_until - ",
    now_ms!(),
    " FROM idem_records WHERE scope = ?1 AND idem_key = ?2"
);

const HELD: &str = "scope = ?1 AND idem_key = ?2 AND owner = ?3 AND fence = ?4 AND status = 'PROCESSING'";

// Completion may be repeated by the same holder (its reply was lost): the
// owner and fence stay on the completed row, so the repeat matches it.
const HELD_OR_DONE: &str =
    "scope = ?1 AND idem_key = ?2 AND owner = ?3 AND fence = ?4 AND status IN ('PROCESSING', 'DONE')";

/// The condition of a purge's records: `?1` the cut-off (epoch ms), then,
/// numbered from `next`, the age in milliseconds (with `older_than`) and
/// the scope (with one), bound in that order by `bind_purgeable!`.
fn purgeable(f: &PurgeFilter<'_>, next: usize) -> String {
    let mut n = next;
    let mut cond = "expires_at <= ?1".to_owned();
    if f.older_than.is_some() {
        cond = format!("({cond} OR (status <> 'PROCESSING' AND created_at <= ?1 - ?{n}))");
        n += 1;
    }
    if f.scope.is_some() {
        cond.push_str(&format!(" AND scope = ?{n}"));
    }
    cond
}

macro_rules! bind_purgeable {
    ($q:expr, $f:expr) => {{
        let mut q = $q;
        if let Some(older) = $f.older_than {
            q = q.bind(crate::store::millis(older));
        }
        if let Some(scope) = $f.scope {
            q = q.bind(scope);
        }
        q
    }};
}

/// The admin reads' columns (see `admin::decode_admin`).
fn admin_columns() -> String {
    format!(
        "scope, idem_key, status, fingerprint, response, owner, fence, lease_until, created_at, updated_at, \
         expires_at, {}, {}",
        now_ms!(),
        state_sql(now_ms!())
    )
}

impl super::sealed::Sealed for Sqlite {}

impl SqlBackend for Sqlite {
    const SCHEMA: &'static str = concat!(
        include_str!("../../../migrations/sqlite/0001_idem_records.sql"),
        "\n",
        include_str!("../../../migrations/sqlite/0002_idem_records_archive.sql")
    );

    const MIGRATIONS: &'static [(i64, &'static str, &'static str)] = &[
        (1, "idem_records", include_str!("../../../migrations/sqlite/0001_idem_records.sql")),
        (2, "idem_records_archive", include_str!("../../../migrations/sqlite/0002_idem_records_archive.sql")),
    ];

    const BACKEND: &'static str = "sqlite";
    /// SQLite's default `SQLITE_MAX_LENGTH`: a longer value is refused
    /// ("string or blob too big").
    const MAX_RESPONSE: usize = 1_000_000_000;
}

impl RecordSql for Sqlite {
    async fn claim(conn: &mut SqliteConnection, r: &NewRecord<'_>) -> Result<ClaimResult, sqlx::Error> {
        let inserted = sqlx::query(super::table::sql(CLAIM))
            .bind(r.scope)
            .bind(r.key)
            .bind(r.fingerprint)
            .bind(super::retention_ms(r.retention))
            .execute(&mut *conn)
            .await?;
        Ok(if inserted.rows_affected() == 1 { ClaimResult::Claimed } else { ClaimResult::Conflict })
    }

    async fn read_then_claim(
        conn: &mut SqliteConnection,
        scope: &str,
        key: &str,
    ) -> Result<Option<ExistingRecord>, sqlx::Error> {
        sqlx::query(super::table::sql("UPDATE idem_records SET status = status WHERE 0")).execute(&mut *conn).await?;
        Self::read(conn, scope, key).await
    }

    async fn read(conn: &mut SqliteConnection, scope: &str, key: &str) -> Result<Option<ExistingRecord>, sqlx::Error> {
        let row: Option<SqliteRow> =
            sqlx::query(super::table::sql(READ)).bind(scope).bind(key).fetch_optional(conn).await?;
        row.map(|row| super::decode_existing(&row)).transpose()
    }

    async fn complete(
        conn: &mut SqliteConnection,
        scope: &str,
        key: &str,
        response: Option<&str>,
    ) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(super::table::sql(concat!(
            "UPDATE idem_records SET status = 'DONE', response = ?3, updated_at = ",
            now_ms!(),
            " WHERE scope = ?1 AND idem_key = ?2"
        )))
        .bind(scope)
        .bind(key)
        .bind(response)
        .execute(conn)
        .await?;
        Ok(done.rows_affected())
    }

    async fn insert_done(
        conn: &mut SqliteConnection,
        r: &NewRecord<'_>,
        response: Option<&str>,
    ) -> Result<InsertDone, sqlx::Error> {
        let done = sqlx::query(super::table::sql(INSERT_DONE))
            .bind(r.scope)
            .bind(r.key)
            .bind(r.fingerprint)
            .bind(super::retention_ms(r.retention))
            .bind(response)
            .execute(conn)
            .await?;
        Ok(if done.rows_affected() == 1 { InsertDone::Written } else { InsertDone::Conflict })
    }

    async fn restart(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
        let sql = super::restart_sql::<Sqlite>(conn);
        sqlx::raw_sql(sql).execute(conn).await?;
        Ok(())
    }

    async fn discard(conn: &mut SqliteConnection, scope: &str, key: &str) -> Result<u64, sqlx::Error> {
        let gone = sqlx::query(super::table::sql("DELETE FROM idem_records WHERE scope = ?1 AND idem_key = ?2"))
            .bind(scope)
            .bind(key)
            .execute(conn)
            .await?;
        Ok(gone.rows_affected())
    }

    async fn discard_expired(conn: &mut SqliteConnection, scope: &str, key: &str) -> Result<u64, sqlx::Error> {
        let gone = sqlx::query(super::table::sql(concat!(
            "DELETE FROM idem_records WHERE scope = ?1 AND idem_key = ?2 AND expires_at <= ",
            now_ms!()
        )))
        .bind(scope)
        .bind(key)
        .execute(conn)
        .await?;
        Ok(gone.rows_affected())
    }

    async fn fetch(conn: &mut SqliteConnection, scope: &str, key: &str) -> Result<Option<DedupRecord>, sqlx::Error> {
        let row = sqlx::query(super::table::sql(
            "SELECT scope, idem_key, status, fingerprint, response, owner, fence, lease_until, \
             created_at, updated_at, expires_at FROM idem_records WHERE scope = ?1 AND idem_key = ?2",
        ))
        .bind(scope)
        .bind(key)
        .fetch_optional(conn)
        .await?;
        row.map(|row| super::decode_record(&row)).transpose()
    }
}

impl StateSql for Sqlite {
    async fn transition(conn: &mut SqliteConnection, cas: &Cas<'_>) -> Result<u64, sqlx::Error> {
        let sql = super::cas_sql(cas, 1, super::ph_question);
        let done = bind_keys!(sqlx::query(sqlx::AssertSqlSafe(sql)), cas.key, |u| u.hyphenated().to_string())
            .execute(conn)
            .await?;
        Ok(done.rows_affected())
    }

    async fn read_state(
        conn: &mut SqliteConnection,
        cas: &Cas<'_>,
        mode: ReadMode,
    ) -> Result<Option<StoredState>, sqlx::Error> {
        // SQLite has no row locks: one writer holds the whole database. To
        // read and then move with nothing in between, take the write lock
        // first with a write that changes nothing (it waits for the busy
        // timeout like any writer); after that no other writer can commit.
        if mode == ReadMode::ForUpdate {
            let t = cas.states;
            let lock = format!("UPDATE {} SET {col} = {col} WHERE 0", t.table, col = t.status_column);
            sqlx::query(sqlx::AssertSqlSafe(lock)).execute(&mut *conn).await?;
        }
        let sql = super::state_read_sql(cas, super::ph_question, sqlite_cast);
        let row = bind_keys!(sqlx::query(sqlx::AssertSqlSafe(sql)), cas.key, |u| u.hyphenated().to_string())
            .fetch_optional(conn)
            .await?;
        row.map(|row| super::decode_state(&row, cas.states)).transpose()
    }
}

impl LeaseSql for Sqlite {
    async fn lease_claim(
        conn: &mut SqliteConnection,
        req: &LeaseRequest<'_>,
    ) -> Result<Option<LeaseClaim>, sqlx::Error> {
        use sqlx::Connection as _;
        // The clock is read holding the write lock: every fence granted on
        // this file before was granted by a writer that held it earlier, on
        // the same machine's clock, so a new record's fence is above them
        // all (a clock read before waiting for the lock could be below one
        // granted meanwhile).
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        let fresh = crate::store::clock_micros();
        let fence: Option<i64> = sqlx::query_scalar(super::table::sql(LEASE_CLAIM))
            .bind(req.scope)
            .bind(req.key)
            .bind(req.fingerprint)
            .bind(req.owner)
            .bind(crate::store::millis(req.lease))
            .bind(crate::store::millis(req.retention))
            .bind(fresh)
            .fetch_optional(&mut *tx)
            .await?;
        let claim = match fence {
            // A take-over returns the old fence + 1, never this clock
            // reading: the old one was granted a lease or more ago.
            Some(fence) => Some(LeaseClaim::Acquired { fence, reclaimed: fence != fresh }),
            None => {
                let row: Option<crate::store::sql::lease::LeaseRowColumns> =
                    sqlx::query_as(super::table::sql(LEASE_READ))
                        .bind(req.scope)
                        .bind(req.key)
                        .fetch_optional(&mut *tx)
                        .await?;
                row.map(|columns| crate::store::sql::lease::judge_row(req, LeaseRow::from(columns)))
            }
        };
        tx.commit().await?;
        Ok(claim)
    }

    async fn lease_finish(
        conn: &mut SqliteConnection,
        held: &HeldLease<'_>,
        action: LeaseAction<'_>,
    ) -> Result<bool, sqlx::Error> {
        let now = now_ms!();
        let sql = match action {
            LeaseAction::Complete(_) => format!(
                "UPDATE idem_records SET status = 'DONE', response = ?5, lease_until = NULL, updated_at = {now}, \
                 expires_at = {now} + ?6 WHERE {HELD_OR_DONE}"
            ),
            LeaseAction::Release => format!("DELETE FROM idem_records WHERE {HELD}"),
            LeaseAction::Extend => format!(
                "UPDATE idem_records SET lease_until = {now} + ?5, updated_at = {now}, \
                 expires_at = max(expires_at, {now} + ?5) WHERE {HELD}"
            ),
        };
        let q = sqlx::query(sqlx::AssertSqlSafe(super::table::owned(sql)))
            .bind(held.scope)
            .bind(held.key)
            .bind(held.owner)
            .bind(held.fence);
        let q = match action {
            LeaseAction::Complete(response) => q.bind(response).bind(crate::store::millis(held.retention)),
            LeaseAction::Release => q,
            LeaseAction::Extend => q.bind(crate::store::millis(held.lease)),
        };
        Ok(q.execute(conn).await?.rows_affected() == 1)
    }
}

impl SchemaSql for Sqlite {
    async fn purge_batch(
        conn: &mut SqliteConnection,
        batch: u32,
        archive: bool,
        f: &PurgeFilter<'_>,
    ) -> Result<u64, sqlx::Error> {
        // One cut-off for both statements; the transaction holds the write
        // lock from its first statement, so the two see the same rows.
        let t = f.table;
        let chosen = format!("rowid IN (SELECT rowid FROM {t} WHERE {} ORDER BY rowid LIMIT ?2)", purgeable(f, 3));
        use sqlx::Connection;
        let mut tx = conn.begin().await?;
        let cut: i64 = sqlx::query_scalar(concat!("SELECT ", now_ms!())).fetch_one(&mut *tx).await?;
        if archive {
            let copy = sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT OR IGNORE INTO {archive} (scope, idem_key, status, fingerprint, response, owner, \
                 fence, lease_until, created_at, updated_at, expires_at, archived_at) \
                 SELECT scope, idem_key, status, fingerprint, response, owner, fence, lease_until, created_at, \
                 updated_at, expires_at, ?1 FROM {t} WHERE {chosen} AND status = 'DONE'",
                archive = f.archive_table
            )))
            .bind(cut)
            .bind(i64::from(batch));
            bind_purgeable!(copy, f).execute(&mut *tx).await?;
        }
        let delete = sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {t} WHERE {chosen}")))
            .bind(cut)
            .bind(i64::from(batch));
        let gone = bind_purgeable!(delete, f).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(gone.rows_affected())
    }

    async fn migrate(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
        if let Some(schema) = super::table::record_table().schema() {
            return Err(sqlx::Error::Configuration(
                format!(
                    "the record table `{}` names a schema (`{schema}`); on SQLite name the table alone",
                    super::table::record_table()
                )
                .into(),
            ));
        }
        sqlx::raw_sql(super::table::schema(Self::SCHEMA)).execute(conn).await?;
        Ok(())
    }

    fn is_missing_table(err: &sqlx::Error) -> bool {
        err.as_database_error().is_some_and(|e| e.message().contains("no such table"))
    }
}

impl AdminSql for Sqlite {
    async fn admin_fetch(
        conn: &mut SqliteConnection,
        table: &str,
        id: &RecordId,
    ) -> Result<Option<Record>, sqlx::Error> {
        let sql = format!("SELECT {} FROM {table} WHERE scope = ?1 AND idem_key = ?2", admin_columns());
        let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id.scope()).bind(id.key()).fetch_optional(conn).await?;
        row.map(|row| super::admin::decode_admin(&row)).transpose()
    }

    async fn admin_stuck(
        conn: &mut SqliteConnection,
        table: &str,
        scope: Option<&str>,
        after: Option<&RecordId>,
        limit: u32,
    ) -> Result<Vec<Record>, sqlx::Error> {
        let sql = format!(
            "SELECT {} FROM {table} WHERE {} AND (?1 IS NULL OR scope = ?1) \
             AND (?2 IS NULL OR scope > ?2 OR (scope = ?2 AND idem_key > ?3)) ORDER BY scope, idem_key LIMIT ?4",
            admin_columns(),
            stuck_sql(now_ms!())
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(scope)
            .bind(after.map(RecordId::scope))
            .bind(after.map(RecordId::key))
            .bind(i64::from(limit))
            .fetch_all(conn)
            .await?;
        rows.iter().map(super::admin::decode_admin).collect()
    }

    async fn admin_release(
        conn: &mut SqliteConnection,
        table: &str,
        id: &RecordId,
        fence: i64,
    ) -> Result<u64, sqlx::Error> {
        let sql = format!(
            "DELETE FROM {table} WHERE scope = ?1 AND idem_key = ?2 AND fence = ?3 AND {}",
            stuck_sql(now_ms!())
        );
        let gone =
            sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id.scope()).bind(id.key()).bind(fence).execute(conn).await?;
        Ok(gone.rows_affected())
    }

    async fn purge_count(conn: &mut SqliteConnection, f: &PurgeFilter<'_>) -> Result<(u64, u64), sqlx::Error> {
        let sql =
            format!("SELECT count(*), coalesce(sum(status = 'DONE'), 0) FROM {} WHERE {}", f.table, purgeable(f, 2));
        let now: i64 = sqlx::query_scalar(concat!("SELECT ", now_ms!())).fetch_one(&mut *conn).await?;
        let query = sqlx::query_as::<_, (i64, i64)>(sqlx::AssertSqlSafe(sql)).bind(now);
        let (all, done) = bind_purgeable!(query, f).fetch_one(conn).await?;
        Ok((u64::try_from(all).unwrap_or(0), u64::try_from(done).unwrap_or(0)))
    }
}
