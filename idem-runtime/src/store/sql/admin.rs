//! Operating idem's records: look one up, list the stuck ones, release one,
//! and see what a purge would delete. What the `idem` command-line tool
//! (the `idem-cli` package) does, as functions a program can call.
//!
//! The SQL functions work on PostgreSQL, MySQL/MariaDB and SQLite, on the
//! record table ([`record_table`]: `idem_records` unless
//! the application named another); the lease records
//! in Redis have their counterparts on [`RedisStore`](crate::store::RedisStore)
//! (`inspect_lease`, `stuck_leases`, `release_lease`). Purging is
//! [`purge_expired`](crate::sql::purge_expired), with
//! [`PurgeOptions::older_than`](crate::sql::PurgeOptions::older_than) for
//! records older than a cut-off whatever their retention;
//! [`purge_preview`] counts what it would delete.
//!
//! # Which records are stuck
//!
//! A record is judged by the store's clock ([`RecordState`]):
//!
//! - **lease passed** ([`RecordState::LeasePassed`]): a `lease` record
//!   still `PROCESSING` whose lease deadline has passed: its worker died or
//!   its call was dropped mid-body. The next call of the key takes it over
//!   by itself (fence + 1), so nothing waits on it; listed because the
//!   work it started may or may not have happened;
//! - **unfinished** ([`RecordState::Unfinished`]): a `PROCESSING` record
//!   with no lease, a dedup record committed without its answer (the
//!   guarded call was cancelled or panicked and the caller committed its
//!   transaction anyway). Every repeat gets
//!   [`Error::Unfinished`] until the record is
//!   deleted or its retention passes: reconcile the business state by
//!   hand, then [`release`] it. (A dedup record of a transaction still
//!   open is not visible to these reads, so it is never listed.)
//!
//! Not stuck: a `PROCESSING` record whose lease is live (its worker is
//! running: [`RecordState::Running`]), a `DONE` record, and any record past
//! its retention ([`RecordState::Expired`]: guards ignore it and take the
//! key over, and a purge deletes it).
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), idem_runtime::Error> {
//! use idem_runtime::admin::{self, RecordId, Release, StuckQuery};
//! for record in admin::stuck(&pool, &StuckQuery { scope: Some("bank.transfer".into()), ..Default::default() }).await? {
//!     println!("{} {} {:?} fence {}", record.scope, record.key, record.state, record.fence);
//!     // After checking with the bank that the transfer did not happen:
//!     match admin::release(&pool, &record.id(), record.fence).await? {
//!         Release::Released(_) => println!("released: the next call runs again"),
//!         other => println!("left alone: {other:?}"),
//!     }
//! }
//! let id = RecordId::new("bank.transfer", &idem_runtime::Key::new("T-1001")?);
//! if let Some(record) = admin::inspect(&pool, &id).await? {
//!     println!("{:?}", record.state);
//! }
//! # Ok(()) }
//! ```

use std::future::Future;

use super::table::record_table;
use super::{PurgeOptions, SqlBackend, classify};
use crate::error::Error;
pub use crate::record::{Record, RecordId, RecordState, RecordStatus, Release, StuckQuery};

/// What [`purge_preview`] counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PurgePreview {
    /// Records a purge with these options would delete now.
    pub deleted: u64,
    /// Of these, the ones it would copy into the archive (the `DONE` ones,
    /// with [`PurgeOptions::archive`]; else 0).
    pub archived: u64,
}

/// Which records a purge deletes: on `table`, past their retention, or
/// (with `older_than`) created before the cut-off and not `PROCESSING`;
/// optionally one scope (as stored).
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct PurgeFilter<'a> {
    pub table: &'a str,
    /// Where `archive` copies completed records.
    pub archive_table: &'a str,
    pub scope: Option<&'a str>,
    pub older_than: Option<std::time::Duration>,
}

/// The statements of the admin functions. Sealed: implemented for the
/// supported databases only. `table` is a plain identifier, written into the
/// SQL as it is (never user input); scopes and keys are always bound.
#[doc(hidden)]
pub trait AdminSql: sqlx::Database + super::sealed::Sealed {
    /// One record with the clock and its state.
    #[doc(hidden)]
    fn admin_fetch(
        conn: &mut Self::Connection,
        table: &str,
        id: &RecordId,
    ) -> impl Future<Output = Result<Option<Record>, sqlx::Error>> + Send;

    /// A page of stuck records, in (scope, key) order.
    #[doc(hidden)]
    fn admin_stuck(
        conn: &mut Self::Connection,
        table: &str,
        scope: Option<&str>,
        after: Option<&RecordId>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<Record>, sqlx::Error>> + Send;

    /// Delete the record only if it is stuck with this fence; rows deleted.
    #[doc(hidden)]
    fn admin_release(
        conn: &mut Self::Connection,
        table: &str,
        id: &RecordId,
        fence: i64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// The records a purge would delete now, and the `DONE` ones among them.
    #[doc(hidden)]
    fn purge_count(
        conn: &mut Self::Connection,
        filter: &PurgeFilter<'_>,
    ) -> impl Future<Output = Result<(u64, u64), sqlx::Error>> + Send;
}

/// The state of a record as SQL computes it, with `now` the statement's
/// clock in the table's time type: the one definition the reads and the
/// release's compare-and-delete share (see [`stuck_sql`]).
pub(crate) fn state_sql(now: &str) -> String {
    format!(
        "CASE WHEN expires_at <= {now} THEN 'expired' WHEN status = 'DONE' THEN 'done' \
         WHEN status = 'FAILED' THEN 'failed' WHEN lease_until IS NULL THEN 'unfinished' \
         WHEN lease_until <= {now} THEN 'lease_passed' ELSE 'running' END"
    )
}

/// The condition of a stuck record: the states `unfinished` and
/// `lease_passed` of [`state_sql`].
pub(crate) fn stuck_sql(now: &str) -> String {
    format!("status = 'PROCESSING' AND expires_at > {now} AND (lease_until IS NULL OR lease_until <= {now})")
}

/// Decode the admin reads' columns, in that order: scope, key, status,
/// fingerprint, response, owner, fence, lease_until, created_at, updated_at,
/// expires_at, now (timestamps as epoch milliseconds), state.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn decode_admin<R>(row: &R) -> Result<Record, sqlx::Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    decode_admin_as::<String, R>(row)
}

/// [`decode_admin`] with the record's text columns read as `S` (MySQL:
/// their bytes, whatever the session's charset); the state, a literal of
/// idem's, as a `String`.
pub(crate) fn decode_admin_as<S, R>(row: &R) -> Result<Record, sqlx::Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    S: Into<String>,
    for<'r> S: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let text = |i: usize| row.try_get::<Option<S>, _>(i).map(|s| s.map(Into::into));
    let status: String = row.try_get::<S, _>(2)?.into();
    let state: String = row.try_get(12)?;
    let bad = |what: &str, value: &str| sqlx::Error::ColumnDecode {
        index: what.into(),
        source: format!("unknown record {what} {value:?}").into(),
    };
    Ok(Record {
        scope: row.try_get::<S, _>(0)?.into(),
        key: row.try_get::<S, _>(1)?.into(),
        status: RecordStatus::parse(&status).ok_or_else(|| bad("status", &status))?,
        state: RecordState::parse(&state).ok_or_else(|| bad("state", &state))?,
        fingerprint: text(3)?,
        response: text(4)?,
        owner: text(5)?,
        fence: row.try_get(6)?,
        lease_until_ms: row.try_get(7)?,
        created_at_ms: Some(row.try_get(8)?),
        updated_at_ms: Some(row.try_get(9)?),
        expires_at_ms: Some(row.try_get(10)?),
        now_ms: row.try_get(11)?,
    })
}

/// Read one record with its state, by the database's clock.
///
/// Like [`find_record`](crate::sql::find_record), plus the clock and what the
/// record means now ([`Record::state`]).
pub async fn inspect<DB: SqlBackend>(pool: &sqlx::Pool<DB>, id: &RecordId) -> Result<Option<Record>, Error> {
    let mut conn = pool.acquire().await?;
    DB::admin_fetch(&mut conn, record_table().qualified(), id).await.map_err(classify::<DB>)
}

/// One page of stuck records (see the [module](self) docs): `PROCESSING`
/// records whose lease has passed, and unfinished dedup records, not past
/// their retention; in (scope, key) order, at most `query.limit`. For the
/// next page, set `query.after` to the last record's [`Record::id`].
///
/// Each page is one statement; it reads the whole table's `PROCESSING`
/// rows (there is no index on status), which a table of live traffic keeps
/// few.
pub async fn stuck<DB: SqlBackend>(pool: &sqlx::Pool<DB>, query: &StuckQuery) -> Result<Vec<Record>, Error> {
    let mut conn = pool.acquire().await?;
    let scope = query.scope.as_deref().map(crate::key::stored_scope);
    DB::admin_stuck(&mut conn, record_table().qualified(), scope.as_deref(), query.after.as_ref(), query.limit.max(1))
        .await
        .map_err(classify::<DB>)
}

/// Delete one stuck record so the next call of its key runs again, only if
/// it is still stuck and still has the fence `fence` the caller saw (from
/// [`inspect`] or [`stuck`]): one compare-and-delete statement, so a record
/// a worker took over meanwhile (another fence), one that completed, or
/// one whose worker came back and renewed its lease, is left alone.
///
/// A `DONE` record is never released (a purge deletes records). For an
/// unfinished dedup record, first reconcile what its call did: after the
/// release a repeat runs the body again.
pub async fn release<DB: SqlBackend>(pool: &sqlx::Pool<DB>, id: &RecordId, fence: i64) -> Result<Release, Error> {
    let mut conn = pool.acquire().await?;
    let Some(seen) = fetch::<DB>(&mut conn, id).await? else {
        return Ok(Release::NotFound);
    };
    if seen.fence != fence {
        return Ok(Release::FenceChanged(seen));
    }
    if !seen.state.is_stuck() {
        return Ok(Release::NotStuck(seen));
    }
    if DB::admin_release(&mut conn, record_table().qualified(), id, fence).await.map_err(classify::<DB>)? == 1 {
        return Ok(Release::Released(seen));
    }
    // Changed between the read and the delete: say how.
    Ok(match fetch::<DB>(&mut conn, id).await? {
        None => Release::NotFound,
        Some(now) if now.fence != fence => Release::FenceChanged(now),
        Some(now) => Release::NotStuck(now),
    })
}

async fn fetch<DB: SqlBackend>(conn: &mut DB::Connection, id: &RecordId) -> Result<Option<Record>, Error> {
    DB::admin_fetch(conn, record_table().qualified(), id).await.map_err(classify::<DB>)
}

/// Count what [`purge_expired`](crate::sql::purge_expired) with `options` would
/// delete now (and archive), without deleting anything: a dry run. The
/// count is of this moment; records expire meanwhile.
pub async fn purge_preview<DB: SqlBackend>(
    pool: &sqlx::Pool<DB>,
    options: &PurgeOptions,
) -> Result<PurgePreview, Error> {
    let scope = options.scope.as_deref().map(crate::key::stored_scope);
    let filter = purge_filter(scope.as_deref(), options)?;
    let mut conn = pool.acquire().await?;
    let (deleted, done) = DB::purge_count(&mut conn, &filter).await.map_err(classify::<DB>)?;
    Ok(PurgePreview { deleted, archived: if options.archive { done } else { 0 } })
}

/// The filter of a purge with `options` on the record table.
pub(crate) fn purge_filter<'a>(scope: Option<&'a str>, options: &PurgeOptions) -> Result<PurgeFilter<'a>, Error> {
    let older_than = options.older_than.map(|d| crate::error::check_ttl("older_than", d)).transpose()?;
    let table = record_table();
    Ok(PurgeFilter { table: table.qualified(), archive_table: table.archive(), scope, older_than })
}
