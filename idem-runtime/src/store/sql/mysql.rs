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
//! literals (`_utf8mb4 X'..'`, `X'..'` for the `VARBINARY` scope and key,
//! by an `idem::Tx`); and they are read as bytes (`CAST(response AS
//! BINARY)`, binary results are never converted) and decoded as UTF-8 by
//! idem.
//!
//! `UTC_TIMESTAMP(6)` is the clock throughout: the statement's start, in
//! UTC whatever the session's time zone.

use std::time::Duration;

use sqlx::MySql;
use sqlx::mysql::{MySqlConnection, MySqlQueryResult};

use super::SqlBackend;
use super::dialect::{Arg, Dialect, Driver, Placeholders, Query, Stmt, TakeOver, inserted};
use super::lease::{LeaseClaimSql, LeaseClaimed, LeaseStatements, claim_args, judge_row, read_holder};
use super::schema::{ARCHIVED, Cut, PurgeBatch, PurgeSql, archive_copy, cut_copy_delete};
use crate::lease::store::{LeaseClaim, LeaseRequest};
use crate::table::RecordTable;

impl super::sealed::Sealed for MySql {}

impl SqlBackend for MySql {
    migrations!("mysql");

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

impl Dialect for MySql {
    const PLACEHOLDERS: Placeholders = Placeholders::Positional;

    /// A blob parameter: the server takes it as binary, whatever the
    /// session's charset (a string parameter would be read in the session's
    /// charset and converted). `CONVERT(? USING utf8mb4)` stores it in a
    /// text column; a `VARBINARY` column and a comparison take it as it is.
    const TEXT_AS_BYTES: bool = true;

    /// In microseconds (`INTERVAL ? MICROSECOND`).
    fn bind_span(query: Query<Self>, span: Duration) -> Query<Self> {
        Self::bind_int(query, micros(span))
    }

    const NOW: &'static str = "UTC_TIMESTAMP(6)";

    fn interval(value: &str) -> String {
        format!("INTERVAL {value} MICROSECOND")
    }

    const INT: &'static str = "SIGNED";
    const TEXT: &'static str = "CHAR";

    fn ms_until(time: &str) -> String {
        format!("TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), {time}) DIV 1000")
    }

    fn epoch_ms(time: &str) -> String {
        format!("TIMESTAMPDIFF(MICROSECOND, '1970-01-01', {time}) DIV 1000")
    }

    fn text_value(value: &str) -> String {
        format!("CONVERT({value} USING utf8mb4)")
    }

    /// Binary results are never converted to the session's charset.
    fn text_column(column: &str) -> String {
        format!("CAST({column} AS BINARY)")
    }

    const ON_DUPLICATE: Option<&'static str> = None;

    /// Read first (a shared lock, like the other repeats' reads), and take
    /// over only an expired record: an UPDATE straight away would ask for
    /// an exclusive lock on a row every concurrent repeat holds shared, and
    /// InnoDB would resolve that as a deadlock.
    fn take_over(_: &RecordTable) -> TakeOver {
        TakeOver::ReadThenUpdate
    }

    /// A locking read: under REPEATABLE READ a plain SELECT would use the
    /// snapshot of the transaction's first read and could miss a record
    /// committed since; a locking read sees the latest committed version.
    const LATEST_READ: &'static str = " LOCK IN SHARE MODE";
    // MariaDB and MySQL 5.7 know no `FOR SHARE`.
    const FOR_SHARE: &'static str = " LOCK IN SHARE MODE";

    fn is_missing_table(err: &sqlx::Error) -> bool {
        // 42S02 / ER_NO_SUCH_TABLE (1146)
        err.as_database_error().and_then(|e| e.code()).is_some_and(|c| c == "42S02" || c == "1146")
    }
}

impl LeaseClaimSql for MySql {
    type Claim = Claim;

    fn claim_statements(t: &RecordTable) -> Self::Claim {
        Claim { insert: Stmt::new::<Self>(&lease_insert_sql(t)), take_over: Stmt::new::<Self>(&lease_take_over_sql(t)) }
    }

    /// Read first: a replay (the common repeat) or a live holder is then
    /// answered in one round trip. A fresh key costs the insert too; a
    /// record inserted in between fails the insert (only a unique-key
    /// violation counts) and the caller asks again, reading it.
    async fn lease_claim(
        conn: &mut MySqlConnection,
        s: &LeaseStatements<Self>,
        req: &LeaseRequest<'_>,
    ) -> LeaseClaimed {
        // The record's retention is never shorter than its lease.
        let mut values = claim_args(req);
        values[5] = Arg::Span(req.retention.max(req.lease));
        let Some((holder, expired)) = read_holder::<Self>(&mut *conn, s, req).await? else {
            return match Self::execute(conn, s.claim.insert.query::<Self>(&values)).await {
                Ok(done) => Ok(Some(LeaseClaim::Acquired { fence: granted_fence(&done), reclaimed: false })),
                // Inserted since the read: ask again.
                Err(e) => inserted::<Self>(Err(e)).map(|_| None),
            };
        };
        if !expired {
            let live = holder.status == "DONE" || holder.lease_left_ms.is_some_and(|ms| ms > 0);
            let mismatch = matches!((req.fingerprint, holder.fingerprint.as_deref()), (Some(a), Some(b)) if a != b);
            if live || mismatch {
                return Ok(Some(judge_row(req, holder)));
            }
        }
        // Past its lease or its retention: take it over, in one conditional
        // statement (it re-checks, so two reclaimers cannot both win).
        let taken = Self::execute(conn, s.claim.take_over.query::<Self>(&values)).await?;
        if taken.rows_affected() == 1 {
            return Ok(Some(LeaseClaim::Acquired { fence: granted_fence(&taken), reclaimed: true }));
        }
        Ok(None) // another caller took it over first: ask again
    }
}

impl PurgeSql for MySql {
    async fn purge_batch(conn: &mut MySqlConnection, p: &PurgeBatch<'_>) -> Result<u64, sqlx::Error> {
        let t = p.table;
        if !p.archive {
            let delete =
                format!("DELETE FROM {t} WHERE {} ORDER BY expires_at LIMIT $2", p.condition::<Self>(Self::NOW));
            let gone = Self::execute(conn, Stmt::new::<Self>(&delete).query::<Self>(&p.args(None))).await?;
            return Ok(gone.rows_affected());
        }
        // One cut-off and one order: the copy's shared locks keep the rows
        // it copied in place for the delete.
        let chosen =
            format!("{} ORDER BY expires_at, scope, idem_key LIMIT $2", p.condition::<Self>("CAST($1 AS DATETIME(6))"));
        let from = format!("(SELECT * FROM {t} WHERE {chosen}) AS expired WHERE {ARCHIVED}");
        let copy = archive_copy("INSERT INTO", t.archive(), Self::NOW, &from);
        let delete = format!("DELETE FROM {t} WHERE {chosen}");
        let cut = Cut::Text("SELECT CAST(UTC_TIMESTAMP(6) AS CHAR)");
        cut_copy_delete::<Self>(conn, cut, Some(&copy), &delete, p).await
    }
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// The statements of MySQL's lease claim: a read (`read_holder`), then an
/// insert or a take-over.
#[doc(hidden)]
pub struct Claim {
    insert: Stmt,
    take_over: Stmt,
}

/// The fence a lease insert or take-over set through `LAST_INSERT_ID(expr)`.
fn granted_fence(done: &MySqlQueryResult) -> i64 {
    i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX)
}

/// A claim of a key that had no record when it was read. A new record's
/// fence is the database's clock in microseconds (UTC, no time-zone
/// conversion), handed back like the take-over's through
/// `LAST_INSERT_ID(expr)`. Values: `claim_args`, `$6` the record's
/// retention.
fn lease_insert_sql(t: &RecordTable) -> String {
    format!(
        "INSERT INTO {t} (scope, idem_key, status, fingerprint, owner, fence, lease_until, created_at, updated_at, \
         expires_at) VALUES ($1, $2, 'PROCESSING', CONVERT($3 USING utf8mb4), CONVERT($4 USING utf8mb4), \
         LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))), \
         UTC_TIMESTAMP(6) + INTERVAL $5 MICROSECOND, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), \
         UTC_TIMESTAMP(6) + INTERVAL $6 MICROSECOND)"
    )
}

/// Take over a record read past its retention or lease (fingerprint
/// permitting): a take-over adds one to the old fence, and
/// `LAST_INSERT_ID(expr)` hands it back in the OK packet, so no read is
/// needed. The WHERE sees the row before the SET.
fn lease_take_over_sql(t: &RecordTable) -> String {
    format!(
        "UPDATE {t} SET status = 'PROCESSING', response = NULL, owner = CONVERT($4 USING utf8mb4), \
         fence = LAST_INSERT_ID(fence + 1), lease_until = UTC_TIMESTAMP(6) + INTERVAL $5 MICROSECOND, \
         created_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6), \
         expires_at = UTC_TIMESTAMP(6) + INTERVAL $6 MICROSECOND, fingerprint = CONVERT($3 USING utf8mb4) \
         WHERE scope = $1 AND idem_key = $2 AND (expires_at <= UTC_TIMESTAMP(6) \
           OR (status <> 'DONE' AND lease_until IS NOT NULL AND lease_until <= UTC_TIMESTAMP(6) \
               AND (fingerprint IS NULL OR $3 IS NULL OR fingerprint = $3)))"
    )
}

/// The candidates are chosen by a plain read, then locked by a `SELECT ...
/// FOR UPDATE SKIP LOCKED` of those rows alone, which checks each again
/// (it reads the latest version), then claimed by an `UPDATE`, in one
/// short transaction at READ COMMITTED. A locking read that chose them
/// itself would lock every row its index scan passed on the way, other
/// relays' candidates and other scopes' rows included, and a claim meeting
/// those locks would skip a row it should take; at READ COMMITTED a
/// locking read takes no gap locks either, which would hold up the inserts
/// of publishing transactions. (The `UPDATE` cannot choose the rows
/// itself: MySQL updates no table a subquery of the statement reads.)
#[cfg(feature = "outbox")]
impl super::outbox::OutboxSql for MySql {
    type BatchClaim = OutboxClaim;

    /// No `RETURNING` on MySQL's `INSERT`: the row's `seq` is its
    /// `AUTO_INCREMENT` value.
    fn insert_sql(insert: &str) -> String {
        insert.to_owned()
    }

    fn insert(
        conn: &mut MySqlConnection,
        query: Query<Self>,
    ) -> crate::future::BoxFuture<'_, Result<i64, sqlx::Error>> {
        Box::pin(async move {
            let done = Self::execute(conn, query).await?;
            Ok(i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX))
        })
    }

    fn claim_statements(o: &str, scopes: usize) -> OutboxClaim {
        use super::outbox::{candidates_sql, claimable, message_columns};
        OutboxClaim {
            choose: Stmt::new::<Self>(&candidates_sql::<Self>(o, "c.seq", scopes)),
            lock: format!(
                "SELECT {} FROM {o} c WHERE {} AND c.seq IN ",
                message_columns::<Self>("c.", "c.attempts + 1"),
                claimable::<Self>(o, 0),
            ),
            claim: format!(
                "UPDATE {o} SET claimed_by = CONVERT($1 USING utf8mb4), \
                 claim_until = UTC_TIMESTAMP(6) + INTERVAL $2 MICROSECOND, attempts = attempts + 1 WHERE seq IN "
            ),
        }
    }

    fn purge_sql(o: &str, condition: &str) -> String {
        format!("DELETE FROM {o} WHERE {condition} ORDER BY seq LIMIT $1")
    }
}

/// MySQL's outbox claim: the choice, then the locking read and the
/// claim's `UPDATE`, each before its list of rows.
#[cfg(feature = "outbox")]
#[doc(hidden)]
pub struct OutboxClaim {
    choose: Stmt,
    lock: String,
    claim: String,
}

#[cfg(feature = "outbox")]
impl super::outbox::ClaimBatch<MySql> for OutboxClaim {
    fn claim<'a>(
        &'a self,
        conn: &'a mut MySqlConnection,
        request: &'a super::outbox::BatchRequest<'a>,
    ) -> crate::future::BoxFuture<'a, Result<Vec<sqlx::mysql::MySqlRow>, sqlx::Error>> {
        Box::pin(async move {
            use sqlx::Connection as _;
            let args = request.args();
            MySql::execute_text(conn, sqlx::SqlStr::from_static("SET TRANSACTION ISOLATION LEVEL READ COMMITTED"))
                .await?;
            let mut tx = conn.begin().await?;
            let chosen = MySql::fetch_all(&mut tx, self.choose.query::<MySql>(&args)).await?;
            let mut rows = Vec::new();
            if !chosen.is_empty() {
                let list = seq_list(&chosen)?;
                let lock = Stmt::new::<MySql>(&format!("{}({list}) FOR UPDATE SKIP LOCKED", self.lock));
                rows = MySql::fetch_all(&mut tx, MySql::once(lock.query::<MySql>(&[]))).await?;
            }
            if !rows.is_empty() {
                let update = Stmt::new::<MySql>(&format!("{}({})", self.claim, seq_list(&rows)?));
                MySql::execute(&mut tx, MySql::once(update.query::<MySql>(&args[..2]))).await?;
            }
            tx.commit().await?;
            Ok(rows)
        })
    }
}

/// The `seq`s (first column) of `rows`, as a list SQL takes.
#[cfg(feature = "outbox")]
fn seq_list(rows: &[sqlx::mysql::MySqlRow]) -> Result<String, sqlx::Error> {
    let seqs = rows.iter().map(|row| MySql::int(row, 0).map(|seq| seq.to_string())).collect::<Result<Vec<_>, _>>()?;
    Ok(seqs.join(", "))
}

/// A duplicate is error 1062 (`ER_DUP_ENTRY`), whose message ends with the
/// key's name: `... for key 'uk_pay_no'` (MariaDB before 10.5, MySQL
/// before 8.0.19) or `... for key 'payment_record.uk_pay_no'` (newer).
/// The entry's value comes earlier in the message, so only its end is read.
impl super::unique::UniqueSql for MySql {
    fn violation(error: &dyn sqlx::error::DatabaseError) -> Option<super::unique::Violation> {
        let mysql = error.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()?;
        (mysql.number() == 1062).then(|| {
            let message = mysql.message();
            let named = message
                .rfind(" for key '")
                .and_then(|at| message[at + " for key '".len()..].strip_suffix('\''))
                .map(|key| key.rsplit_once('.').map_or(key, |(_, name)| name).to_owned());
            super::unique::Violation { named, message: message.to_owned() }
        })
    }

    fn is_on<'a>(
        _: &'a mut MySqlConnection,
        violation: &'a super::unique::Violation,
        constraint: &'a str,
    ) -> crate::future::BoxFuture<'a, Result<bool, crate::error::Error>> {
        Box::pin(std::future::ready(Ok(violation.named.as_deref() == Some(constraint))))
    }
}
