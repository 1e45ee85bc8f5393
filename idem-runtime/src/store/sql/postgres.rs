//! PostgreSQL: claims never fail inside the caller's transaction.
//!
//! A unique violation in PostgreSQL aborts the whole transaction, so the claim
//! is `INSERT ... ON CONFLICT DO NOTHING`, never a bare INSERT that may fail.
//! `now()` is the transaction's start, `clock_timestamp()` the statement's
//! clock: records written in the caller's transaction are dated `now()`,
//! their expiry and leases count from `clock_timestamp()`.

use std::time::Duration;

use sqlx::Postgres;
use sqlx::postgres::PgConnection;

use super::SqlBackend;
use super::dialect::{Dialect, Driver, Placeholders, Query, Stmt};
use super::lease::{LeaseClaimSql, LeaseClaimed, LeaseRow, LeaseStatements, claim_args, judge_row};
use super::schema::{ARCHIVED, PurgeBatch, PurgeSql, archive_copy};
use crate::lease::store::{LeaseClaim, LeaseRequest};
use crate::table::RecordTable;

impl super::sealed::Sealed for Postgres {}

impl SqlBackend for Postgres {
    migrations!("postgres");

    const BACKEND: &'static str = "postgres";
    /// A `text` value holds at most 1 GB (and a protocol message as much):
    /// a longer answer would fail its statement, aborting the transaction.
    const MAX_RESPONSE: usize = (1 << 30) - (1 << 16);
}

impl Dialect for Postgres {
    const PLACEHOLDERS: Placeholders = Placeholders::Numbered("$");

    /// As an `interval` (`$n::interval`).
    fn bind_span(query: Query<Self>, span: Duration) -> Query<Self> {
        query.bind(span)
    }

    #[cfg(feature = "uuid")]
    fn bind_uuid(query: Query<Self>, uuid: &uuid::Uuid) -> Query<Self> {
        query.bind(*uuid)
    }

    const NOW: &'static str = "now()";
    const CLOCK: &'static str = "clock_timestamp()";

    fn interval(value: &str) -> String {
        format!("{value}::interval")
    }

    fn ms_until(time: &str) -> String {
        format!("(extract(epoch FROM ({time} - clock_timestamp())) * 1000)::int8")
    }

    fn epoch_ms(time: &str) -> String {
        format!("(extract(epoch FROM {time}) * 1000)::int8")
    }

    const INT: &'static str = "int8";
    const TEXT: &'static str = "text";

    /// A boolean casts to `int` only.
    fn flag(condition: &str) -> String {
        format!("({condition})::int::int8")
    }

    /// No `updated_at = now()`: the record was claimed in this same
    /// transaction, and `now()` is the transaction's start, so the claim
    /// already wrote that value.
    const COMPLETE_TOUCHES: bool = false;

    /// A `$n IS NULL` alone gives the value no type: it is text.
    const PAGE: &'static str =
        "($1::text IS NULL OR scope = $1) AND ($2::text IS NULL OR (scope, idem_key) > ($2, $3))";

    /// The move runs only if the claim inserted the record (it reads the
    /// claim's RETURNING rows), so a repeat changes nothing and waits on the
    /// record, not on the entity.
    fn claim_and_move(claim: &str, moved: &str) -> Option<String> {
        Some(format!(
            "WITH claim AS ({claim} RETURNING 1), moved AS ({moved} AND EXISTS (SELECT 1 FROM claim) RETURNING 1) \
             SELECT (SELECT count(*) FROM claim), (SELECT count(*) FROM moved)"
        ))
    }

    /// Two processes running CREATE TABLE IF NOT EXISTS at the same moment
    /// can both pass the check and one fails on pg_type's unique index; the
    /// advisory lock makes start-up migrations take turns.
    const MIGRATION_LOCK: Option<&'static str> = Some("SELECT pg_advisory_xact_lock(7236012365449411584)");

    fn is_missing_table(err: &sqlx::Error) -> bool {
        // 42P01: undefined_table
        err.as_database_error().and_then(|e| e.code()).is_some_and(|c| c == "42P01")
    }
}

impl LeaseClaimSql for Postgres {
    type Claim = Stmt;

    fn claim_statements(t: &RecordTable) -> Self::Claim {
        Stmt::new::<Self>(&lease_claim_sql(t))
    }

    async fn lease_claim(conn: &mut PgConnection, s: &LeaseStatements<Self>, req: &LeaseRequest<'_>) -> LeaseClaimed {
        use sqlx::Row as _;
        let query = s.claim.query::<Self>(&claim_args(req));
        let Some(row) = Self::fetch_optional(conn, query).await? else { return Ok(None) };
        if row.try_get::<bool, _>(0)? {
            return Ok(Some(LeaseClaim::Acquired { fence: row.try_get(1)?, reclaimed: row.try_get(2)? }));
        }
        let status = row.try_get::<Option<String>, _>(3)?.unwrap_or_default();
        let holder = LeaseRow {
            status,
            fingerprint: row.try_get(4)?,
            response: row.try_get(5)?,
            lease_left_ms: row.try_get(6)?,
        };
        Ok(Some(judge_row(req, holder)))
    }
}

impl PurgeSql for Postgres {
    async fn purge_batch(conn: &mut PgConnection, p: &PurgeBatch<'_>) -> Result<u64, sqlx::Error> {
        let t = p.table;
        // SKIP LOCKED: a purge never waits behind (or blocks) a live transaction
        // that is replaying one of these records. With `archive`, the deleted
        // completed records go to the archive in the same statement.
        let keep = if p.archive {
            let from = format!("gone WHERE {ARCHIVED} ON CONFLICT DO NOTHING");
            format!(", kept AS ({})", archive_copy("INSERT INTO", t.archive(), "now()", &from))
        } else {
            String::new()
        };
        let sql = format!(
            "WITH gone AS (DELETE FROM {t} WHERE (scope, idem_key) IN (\
                SELECT scope, idem_key FROM {t} WHERE {purgeable} \
                LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING *){keep} SELECT count(*) FROM gone",
            purgeable = p.condition::<Self>(Self::NOW),
        );
        let row = Self::fetch_one(conn, Stmt::new::<Self>(&sql).query::<Self>(&p.args(None))).await?;
        Ok(u64::try_from(Self::int(&row, 0)?).unwrap_or(0))
    }
}

/// Lease claim, one statement: insert, or take over a record whose retention
/// or lease has passed (fingerprint permitting), or return the record that
/// holds the key. The second SELECT sees the statement's snapshot: a record
/// committed while the insert waited is not in it, nor is one only visible in
/// an expired version (another caller took it over since); then nothing comes
/// back and the caller asks again. Values: [`claim_args`].
fn lease_claim_sql(t: &RecordTable) -> String {
    format!(
        "WITH claim AS (
  INSERT INTO {t} AS r (scope, idem_key, status, fingerprint, owner, fence, lease_until, created_at, updated_at, expires_at)
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
SELECT false, fence, false, status::text, fingerprint::text, response, {left}
FROM {t} WHERE scope = $1 AND idem_key = $2 AND expires_at > clock_timestamp()
  AND NOT EXISTS (SELECT 1 FROM claim)",
        left = Postgres::ms_until("lease_until"),
    )
}

#[cfg(feature = "outbox")]
impl super::outbox::OutboxSql for Postgres {
    type BatchClaim = Stmt;

    /// The insert that also wakes the relays listening on the outbox's
    /// channel (its name), on commit only: a rollback sends nothing.
    /// PostgreSQL folds a transaction's equal notifications into one.
    fn waking_insert_sql(insert: &str, outbox: &str) -> Option<String> {
        Some(format!("WITH m AS ({insert} RETURNING seq) SELECT m.seq FROM m, (SELECT pg_notify('{outbox}', '')) AS n"))
    }

    /// The candidates are locked as they are chosen, skipping those another
    /// relay's claim holds (it is taking them); a row whose claim committed
    /// meanwhile is checked again once locked, and left out.
    fn claim_statements(o: &str, scopes: usize) -> Stmt {
        use super::outbox::{candidates_sql, message_columns};
        let candidates = candidates_sql::<Self>(o, "c.seq", scopes);
        Stmt::new::<Self>(&format!(
            "WITH c AS MATERIALIZED ({candidates} FOR UPDATE OF c SKIP LOCKED) \
             UPDATE {o} AS m SET claimed_by = $1, claim_until = clock_timestamp() + $2::interval, \
             attempts = m.attempts + 1 FROM c WHERE m.seq = c.seq RETURNING {}",
            message_columns::<Self>("m.", "m.attempts")
        ))
    }

    /// SKIP LOCKED: a purge never waits behind a relay's claim.
    fn purge_sql(o: &str, condition: &str) -> String {
        format!("DELETE FROM {o} WHERE seq IN (SELECT seq FROM {o} WHERE {condition} LIMIT $1 FOR UPDATE SKIP LOCKED)")
    }

    /// `LISTEN` on the outbox's channel, on a connection of the pool held
    /// for it; a connection lost and found again, or a notification,
    /// wakes the relay (which then finds whatever committed meanwhile).
    fn wake_on_commit(
        pool: &sqlx::PgPool,
        outbox: &str,
        wake: std::sync::Arc<tokio::sync::Notify>,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let (pool, channel) = (pool.clone(), outbox.to_owned());
        Some(tokio::spawn(async move {
            loop {
                match listen(&pool, &channel, &wake).await {
                    Err(sqlx::Error::PoolClosed) => return,
                    Err(e) => tracing::warn!(target: "idem", error = %e, channel,
                        "outbox relay: LISTEN failed; polling until it is back"),
                    Ok(()) => {}
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }))
    }
}

/// Listen on `channel` until the connection fails for good, waking `wake`
/// once listening (a message may have committed before) and on each
/// notification.
#[cfg(feature = "outbox")]
async fn listen(pool: &sqlx::PgPool, channel: &str, wake: &tokio::sync::Notify) -> Result<(), sqlx::Error> {
    let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    wake.notify_one();
    loop {
        // `None`: the connection was lost and is back; what committed in
        // between was not heard.
        listener.try_recv().await?;
        wake.notify_one();
    }
}

/// A unique violation is SQLSTATE 23505, and the server names the
/// constraint (or unique index) in its own field: no message is parsed.
impl super::unique::UniqueSql for Postgres {
    const ERROR_ABORTS: bool = true;

    fn violation(error: &dyn sqlx::error::DatabaseError) -> Option<super::unique::Violation> {
        (error.code().as_deref() == Some("23505")).then(|| super::unique::Violation {
            named: error.constraint().map(str::to_owned),
            message: error.message().to_owned(),
        })
    }

    fn is_on<'a>(
        _: &'a mut PgConnection,
        violation: &'a super::unique::Violation,
        constraint: &'a str,
    ) -> crate::future::BoxFuture<'a, Result<bool, crate::error::Error>> {
        Box::pin(std::future::ready(Ok(violation.named.as_deref() == Some(constraint))))
    }
}
