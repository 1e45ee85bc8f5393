//! PostgreSQL: claims never fail inside the caller's transaction.
//!
//! A unique violation in PostgreSQL aborts the whole transaction, so the claim
//! is `INSERT ... ON CONFLICT DO NOTHING`, never a bare INSERT that may fail.

use sqlx::Postgres;
use sqlx::postgres::PgConnection;

use super::admin::{AdminSql, PurgeFilter, Record, RecordId, state_sql, stuck_sql};
use super::{
    Cas, ClaimResult, ExistingRecord, InsertDone, LeaseAction, LeaseRow, LeaseSql, NewRecord, ReadMode, RecordSql,
    SchemaSql, SqlBackend, StateSql,
};
use crate::lease::store::{HeldLease, LeaseClaim, LeaseRequest};
use crate::machine::StoredState;
use crate::record::DedupRecord;

fn pg_cast(col: &str, int: bool) -> String {
    if int { format!("{col}::int8") } else { format!("{col}::text") }
}

// Expiry counts from the statement's clock (clock_timestamp()), not from now(),
// the transaction's start: a long transaction must not commit a record that is
// already expired.
//
// The claim is a plain insert that does nothing on a conflict; a repeat then
// reads the record in a second statement. (A single statement that also
// returned the existing record, a CTE with the insert and a SELECT, made every
// first call measurably slower in `loadgen`; first calls are the common case.)
// The read is a fresh statement with a fresh snapshot, so under READ
// COMMITTED it also sees a record committed while the insert waited.
const CLAIM: &str = "\
INSERT INTO idem_records (scope, idem_key, status, fingerprint, created_at, updated_at, expires_at)
VALUES ($1, $2, 'PROCESSING', $3, now(), now(), clock_timestamp() + $4::interval)
ON CONFLICT (scope, idem_key) DO NOTHING";

// `claim = "after"`: the record and its response in one statement. A live or
// expired record makes it a no-op (0 rows); an expired one is then taken over
// in place by TAKE_OVER (rare, so not worth an upsert on every first call).
const INSERT_DONE: &str = "\
INSERT INTO idem_records (scope, idem_key, status, fingerprint, response, created_at, updated_at, expires_at)
VALUES ($1, $2, 'DONE', $3, $5, now(), now(), clock_timestamp() + $4::interval)
ON CONFLICT (scope, idem_key) DO NOTHING";

const TAKE_OVER: &str = "\
UPDATE idem_records SET status = 'DONE', fingerprint = $3, response = $5, owner = NULL, fence = fence + 1,
    lease_until = NULL, created_at = now(), updated_at = now(), expires_at = clock_timestamp() + $4::interval
WHERE scope = $1 AND idem_key = $2 AND expires_at <= now()";

const READ: &str = "SELECT status, fingerprint, response, (expires_at <= now())::int::int8 AS expired \
                    FROM idem_records WHERE scope = $1 AND idem_key = $2";

const FETCH: &str = "SELECT scope, idem_key, status, fingerprint, response, owner, fence, \
    (extract(epoch FROM lease_until) * 1000)::int8, (extract(epoch FROM created_at) * 1000)::int8, \
    (extract(epoch FROM updated_at) * 1000)::int8, (extract(epoch FROM expires_at) * 1000)::int8 \
    FROM idem_records WHERE scope = $1 AND idem_key = $2";

// Lease claim, one statement: insert, or take over a record whose retention
// or lease has passed (fingerprint permitting), or return the record that
// holds the key. The second SELECT sees the statement's snapshot: a record
// committed while the insert waited is not in it, nor is one only visible in
// an expired version (another caller took it over since); then nothing comes
// back and the caller asks again.
const LEASE_CLAIM: &str = "\
WITH claim AS (
  INSERT INTO idem_records AS r (scope, idem_key, status, fingerprint, owner, fence, lease_until, created_at, updated_at, expires_at)
  VALUES ($1, $2, 'PROCESSING', $3, $4, (extract(epoch FROM clock_timestamp()) * 1000000)::int8,
          clock_timestamp() + $5::interval, now(), now(),
          clock_timestamp() + greatest($5::interval, $6::interval))
  ON CONFLICT (scope, idem_key) DO UPDATE SET status = 'PROCESSING', fingerprint = EXCLUDED.fingerprint,
      response = NULL, owner = EXCLUDED.owner, fence = r.fence + 1, lease_until = EXCLUDED.lease_until,
      created_at = now(), updated_at = now(), expires_at = EXCLUDED.expires_at
    WHERE r.expires_at <= clock_timestamp()
       OR (r.status <> 'DONE' AND r.lease_until IS NOT NULL AND r.lease_until <= clock_timestamp()
           AND (r.fingerprint IS NULL OR EXCLUDED.fingerprint IS NULL OR r.fingerprint = EXCLUDED.fingerprint))
  RETURNING r.fence, (r.xmax::text <> '0') AS reclaimed
)
SELECT true, fence, reclaimed, NULL::text, NULL::text, NULL::text, NULL::int8 FROM claim
UNION ALL
SELECT false, fence, false, status::text, fingerprint::text, response,
       (extract(epoch FROM (lease_until - clock_timestamp())) * 1000)::int8
FROM idem_records WHERE scope = $1 AND idem_key = $2 AND expires_at > clock_timestamp()
  AND NOT EXISTS (SELECT 1 FROM claim)";

const HELD: &str = "scope = $1 AND idem_key = $2 AND owner = $3 AND fence = $4 AND status = 'PROCESSING'";

// Completion may be repeated by the same holder (its reply was lost): the
// owner and fence stay on the completed row, so the repeat matches it.
const HELD_OR_DONE: &str =
    "scope = $1 AND idem_key = $2 AND owner = $3 AND fence = $4 AND status IN ('PROCESSING', 'DONE')";

type LeaseClaimRow = (bool, i64, bool, Option<String>, Option<String>, Option<String>, Option<i64>);

/// The condition of a purge's records, its placeholders numbered from
/// `first`: the cut-off (with `older_than`), then the scope (with one); bind
/// them with `bind_purgeable!`.
fn purgeable(f: &PurgeFilter<'_>, first: usize) -> String {
    let mut n = first;
    let mut cond = "expires_at <= now()".to_owned();
    if f.older_than.is_some() {
        cond = format!("({cond} OR (status <> 'PROCESSING' AND created_at <= now() - ${n}::interval))");
        n += 1;
    }
    if f.scope.is_some() {
        cond.push_str(&format!(" AND scope = ${n}"));
    }
    cond
}

macro_rules! bind_purgeable {
    ($q:expr, $f:expr) => {{
        let mut q = $q;
        if let Some(older) = $f.older_than {
            q = q.bind(older);
        }
        if let Some(scope) = $f.scope {
            q = q.bind(scope);
        }
        q
    }};
}

/// The admin reads' columns (see `admin::decode_admin`), on the statement's
/// clock (`now()`: an autocommit statement's start).
fn admin_columns() -> String {
    format!(
        "scope, idem_key, status, fingerprint, response, owner, fence, \
         (extract(epoch FROM lease_until) * 1000)::int8, (extract(epoch FROM created_at) * 1000)::int8, \
         (extract(epoch FROM updated_at) * 1000)::int8, (extract(epoch FROM expires_at) * 1000)::int8, \
         (extract(epoch FROM now()) * 1000)::int8, {}",
        state_sql("now()")
    )
}

impl super::sealed::Sealed for Postgres {}

impl SqlBackend for Postgres {
    const SCHEMA: &'static str = concat!(
        include_str!("../../../migrations/postgres/0001_idem_records.sql"),
        "\n",
        include_str!("../../../migrations/postgres/0002_idem_records_archive.sql")
    );

    const MIGRATIONS: &'static [(i64, &'static str, &'static str)] = &[
        (1, "idem_records", include_str!("../../../migrations/postgres/0001_idem_records.sql")),
        (2, "idem_records_archive", include_str!("../../../migrations/postgres/0002_idem_records_archive.sql")),
    ];

    const BACKEND: &'static str = "postgres";
    /// A `text` value holds at most 1 GB (and a protocol message as much):
    /// a longer answer would fail its statement, aborting the transaction.
    const MAX_RESPONSE: usize = (1 << 30) - (1 << 16);
}

impl RecordSql for Postgres {
    async fn claim(conn: &mut PgConnection, r: &NewRecord<'_>) -> Result<ClaimResult, sqlx::Error> {
        let done = sqlx::query(super::table::sql(CLAIM))
            .bind(r.scope)
            .bind(r.key)
            .bind(r.fingerprint)
            .bind(r.retention)
            .execute(conn)
            .await?;
        Ok(if done.rows_affected() == 1 { ClaimResult::Claimed } else { ClaimResult::Conflict })
    }

    async fn read(conn: &mut PgConnection, scope: &str, key: &str) -> Result<Option<ExistingRecord>, sqlx::Error> {
        let row = sqlx::query(super::table::sql(READ)).bind(scope).bind(key).fetch_optional(conn).await?;
        row.map(|row| super::decode_existing(&row)).transpose()
    }

    async fn complete(
        conn: &mut PgConnection,
        scope: &str,
        key: &str,
        response: Option<&str>,
    ) -> Result<u64, sqlx::Error> {
        // No `updated_at = now()`: the record was claimed in this same
        // transaction, and PostgreSQL's now() is the transaction's start, so
        // the claim already wrote that value.
        let done = sqlx::query(super::table::sql(
            "UPDATE idem_records SET status = 'DONE', response = $3 WHERE scope = $1 AND idem_key = $2",
        ))
        .bind(scope)
        .bind(key)
        .bind(response)
        .execute(conn)
        .await?;
        Ok(done.rows_affected())
    }

    async fn insert_done(
        conn: &mut PgConnection,
        r: &NewRecord<'_>,
        response: Option<&str>,
    ) -> Result<InsertDone, sqlx::Error> {
        let written = |sql| {
            sqlx::query(super::table::sql(sql))
                .bind(r.scope)
                .bind(r.key)
                .bind(r.fingerprint)
                .bind(r.retention)
                .bind(response)
        };
        if written(INSERT_DONE).execute(&mut *conn).await?.rows_affected() == 1 {
            return Ok(InsertDone::Written);
        }
        // TAKE_OVER only matches an expired record, so no read is needed first.
        if written(TAKE_OVER).execute(&mut *conn).await?.rows_affected() == 1 {
            return Ok(InsertDone::Written);
        }
        Ok(InsertDone::Conflict)
    }

    async fn restart(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        // One round trip: the simple-query protocol runs both statements.
        let sql = super::restart_sql::<Postgres>(conn);
        sqlx::raw_sql(sql).execute(conn).await?;
        Ok(())
    }

    async fn discard(conn: &mut PgConnection, scope: &str, key: &str) -> Result<u64, sqlx::Error> {
        let gone = sqlx::query(super::table::sql("DELETE FROM idem_records WHERE scope = $1 AND idem_key = $2"))
            .bind(scope)
            .bind(key)
            .execute(conn)
            .await?;
        Ok(gone.rows_affected())
    }

    async fn discard_expired(conn: &mut PgConnection, scope: &str, key: &str) -> Result<u64, sqlx::Error> {
        let gone = sqlx::query(super::table::sql(
            "DELETE FROM idem_records WHERE scope = $1 AND idem_key = $2 AND expires_at <= now()",
        ))
        .bind(scope)
        .bind(key)
        .execute(conn)
        .await?;
        Ok(gone.rows_affected())
    }

    async fn fetch(conn: &mut PgConnection, scope: &str, key: &str) -> Result<Option<DedupRecord>, sqlx::Error> {
        let row = sqlx::query(super::table::sql(FETCH)).bind(scope).bind(key).fetch_optional(conn).await?;
        row.map(|row| super::decode_record(&row)).transpose()
    }
}

impl StateSql for Postgres {
    async fn transition(conn: &mut PgConnection, cas: &Cas<'_>) -> Result<u64, sqlx::Error> {
        let sql = super::cas_sql(cas, 1, super::ph_dollar);
        let done = bind_keys!(sqlx::query(sqlx::AssertSqlSafe(sql)), cas.key, |u| *u).execute(conn).await?;
        Ok(done.rows_affected())
    }

    async fn read_state(
        conn: &mut PgConnection,
        cas: &Cas<'_>,
        mode: ReadMode,
    ) -> Result<Option<StoredState>, sqlx::Error> {
        let mut sql = super::state_read_sql(cas, super::ph_dollar, pg_cast);
        if mode == ReadMode::ForUpdate {
            sql.push_str(" FOR UPDATE");
        }
        let row = bind_keys!(sqlx::query(sqlx::AssertSqlSafe(sql)), cas.key, |u| *u).fetch_optional(conn).await?;
        row.map(|row| super::decode_state(&row, cas.states)).transpose()
    }

    /// One statement: the transition runs only if the claim inserted the
    /// record (it reads the claim's RETURNING rows), so a repeat changes
    /// nothing and waits on the record, not on the entity.
    async fn claim_transition(
        conn: &mut PgConnection,
        r: &NewRecord<'_>,
        cas: &Cas<'_>,
    ) -> Result<(ClaimResult, u64), sqlx::Error> {
        let sql = format!(
            "WITH claim AS ({claim} RETURNING 1), moved AS ({} AND EXISTS (SELECT 1 FROM claim) RETURNING 1) \
             SELECT (SELECT count(*) FROM claim), (SELECT count(*) FROM moved)",
            super::cas_sql(cas, 5, super::ph_dollar),
            // Only the claim is rewritten for the record table: the move
            // names the application's own table and columns.
            claim = super::table::sql(CLAIM),
        );
        let q = sqlx::query_as::<_, (i64, i64)>(sqlx::AssertSqlSafe(sql))
            .bind(r.scope)
            .bind(r.key)
            .bind(r.fingerprint)
            .bind(r.retention);
        let (claimed, moved) = bind_keys!(q, cas.key, |u| *u).fetch_one(conn).await?;
        let claim = if claimed == 1 { ClaimResult::Claimed } else { ClaimResult::Conflict };
        Ok((claim, u64::try_from(moved).unwrap_or(0)))
    }
}

impl LeaseSql for Postgres {
    async fn lease_claim(conn: &mut PgConnection, req: &LeaseRequest<'_>) -> Result<Option<LeaseClaim>, sqlx::Error> {
        let row: Option<LeaseClaimRow> = sqlx::query_as(super::table::sql(LEASE_CLAIM))
            .bind(req.scope)
            .bind(req.key)
            .bind(req.fingerprint)
            .bind(req.owner)
            .bind(req.lease)
            .bind(req.retention)
            .fetch_optional(conn)
            .await?;
        Ok(row.map(|(acquired, fence, reclaimed, status, fingerprint, response, lease_left_ms)| {
            if acquired {
                LeaseClaim::Acquired { fence, reclaimed }
            } else {
                let status = status.unwrap_or_default();
                crate::store::sql::lease::judge_row(req, LeaseRow { status, fingerprint, response, lease_left_ms })
            }
        }))
    }

    async fn lease_finish(
        conn: &mut PgConnection,
        held: &HeldLease<'_>,
        action: LeaseAction<'_>,
    ) -> Result<bool, sqlx::Error> {
        let sql = match action {
            LeaseAction::Complete(_) => format!(
                "UPDATE idem_records SET status = 'DONE', response = $5, lease_until = NULL, \
                 updated_at = clock_timestamp(), expires_at = clock_timestamp() + $6::interval WHERE {HELD_OR_DONE}"
            ),
            LeaseAction::Release => format!("DELETE FROM idem_records WHERE {HELD}"),
            LeaseAction::Extend => format!(
                "UPDATE idem_records SET lease_until = clock_timestamp() + $5::interval, updated_at = clock_timestamp(), \
                 expires_at = greatest(expires_at, clock_timestamp() + $5::interval) WHERE {HELD}"
            ),
        };
        let q = sqlx::query(sqlx::AssertSqlSafe(super::table::owned(sql)))
            .bind(held.scope)
            .bind(held.key)
            .bind(held.owner)
            .bind(held.fence);
        let q = match action {
            LeaseAction::Complete(response) => q.bind(response).bind(held.retention),
            LeaseAction::Release => q,
            LeaseAction::Extend => q.bind(held.lease),
        };
        Ok(q.execute(conn).await?.rows_affected() == 1)
    }
}

impl SchemaSql for Postgres {
    async fn purge_batch(
        conn: &mut PgConnection,
        batch: u32,
        archive: bool,
        f: &PurgeFilter<'_>,
    ) -> Result<u64, sqlx::Error> {
        // SKIP LOCKED: a purge never waits behind (or blocks) a live transaction
        // that is replaying one of these records. With `archive`, the deleted
        // completed records go to the archive in the same statement.
        let keep = if archive {
            format!(
                ", kept AS (INSERT INTO {archive} (scope, idem_key, status, fingerprint, response, owner, fence, \
                 lease_until, created_at, updated_at, expires_at, archived_at) \
                 SELECT scope, idem_key, status, fingerprint, response, owner, fence, lease_until, created_at, \
                 updated_at, expires_at, now() FROM gone WHERE status = 'DONE' ON CONFLICT DO NOTHING)",
                archive = f.archive_table
            )
        } else {
            String::new()
        };
        let sql = format!(
            "WITH gone AS (DELETE FROM {t} WHERE (scope, idem_key) IN (\
                SELECT scope, idem_key FROM {t} WHERE {purgeable} \
                LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING *){keep} SELECT count(*) FROM gone",
            t = f.table,
            purgeable = purgeable(f, 2),
        );
        let query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(i64::from(batch));
        let gone: i64 = bind_purgeable!(query, f).fetch_one(conn).await?;
        Ok(u64::try_from(gone).unwrap_or(0))
    }

    async fn migrate(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        use sqlx::Connection;
        // Two processes running CREATE TABLE IF NOT EXISTS at the same moment can
        // both pass the check and one fails on pg_type's unique index; the
        // advisory lock makes start-up migrations take turns.
        let mut tx = conn.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(7236012365449411584)").execute(&mut *tx).await?;
        sqlx::raw_sql(super::table::schema(Self::SCHEMA)).execute(&mut *tx).await?;
        tx.commit().await
    }

    fn is_missing_table(err: &sqlx::Error) -> bool {
        // 42P01: undefined_table
        err.as_database_error().and_then(|e| e.code()).is_some_and(|c| c == "42P01")
    }
}

impl AdminSql for Postgres {
    async fn admin_fetch(conn: &mut PgConnection, table: &str, id: &RecordId) -> Result<Option<Record>, sqlx::Error> {
        let sql = format!("SELECT {} FROM {table} WHERE scope = $1 AND idem_key = $2", admin_columns());
        let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id.scope()).bind(id.key()).fetch_optional(conn).await?;
        row.map(|row| super::admin::decode_admin(&row)).transpose()
    }

    async fn admin_stuck(
        conn: &mut PgConnection,
        table: &str,
        scope: Option<&str>,
        after: Option<&RecordId>,
        limit: u32,
    ) -> Result<Vec<Record>, sqlx::Error> {
        let sql = format!(
            "SELECT {} FROM {table} WHERE {} AND ($1::text IS NULL OR scope = $1) \
             AND ($2::text IS NULL OR (scope, idem_key) > ($2, $3)) ORDER BY scope, idem_key LIMIT $4",
            admin_columns(),
            stuck_sql("now()")
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
        conn: &mut PgConnection,
        table: &str,
        id: &RecordId,
        fence: i64,
    ) -> Result<u64, sqlx::Error> {
        let sql =
            format!("DELETE FROM {table} WHERE scope = $1 AND idem_key = $2 AND fence = $3 AND {}", stuck_sql("now()"));
        let gone =
            sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id.scope()).bind(id.key()).bind(fence).execute(conn).await?;
        Ok(gone.rows_affected())
    }

    async fn purge_count(conn: &mut PgConnection, f: &PurgeFilter<'_>) -> Result<(u64, u64), sqlx::Error> {
        let sql = format!(
            "SELECT count(*), coalesce(sum(CASE WHEN status = 'DONE' THEN 1 ELSE 0 END), 0)::int8 FROM {} WHERE {}",
            f.table,
            purgeable(f, 1)
        );
        let query = sqlx::query_as::<_, (i64, i64)>(sqlx::AssertSqlSafe(sql));
        let (all, done) = bind_purgeable!(query, f).fetch_one(conn).await?;
        Ok((u64::try_from(all).unwrap_or(0), u64::try_from(done).unwrap_or(0)))
    }
}
