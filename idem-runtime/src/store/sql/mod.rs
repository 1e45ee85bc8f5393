//! Dedup records in SQL databases, written in the caller's own transaction.
//!
//! One file per backend implements [`SqlBackend`]: the claim statement that is
//! right for that database, completion, removal, migration and purging.

use std::future::Future;
use std::time::Duration;

use crate::error::Error;
use crate::key::Key;
use crate::key::SqlKey;
use crate::lease::store::{HeldLease, LeaseClaim, LeaseRequest};
use crate::machine::{StateCode, StateTable, StoredState};
use crate::record::DedupRecord;

/// Bind entity key values (state strategies) to a query; `|u| expr` says how
/// a UUID binds on this backend.
macro_rules! bind_keys {
    ($q:expr, $keys:expr, |$u:ident| $uuid:expr) => {{
        let mut q = $q;
        for k in $keys {
            q = match k {
                $crate::key::SqlKey::Int(i) => q.bind(*i),
                $crate::key::SqlKey::Text(s) => q.bind(s.clone()),
                #[cfg(feature = "uuid")]
                $crate::key::SqlKey::Uuid($u) => q.bind($uuid),
            };
        }
        q
    }};
}

pub mod admin;
mod lease;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;
pub mod table;
pub(crate) mod texts;

#[doc(hidden)]
pub use lease::LeaseAction;
pub use lease::SqlStore;
// Read by the backends only (reachable by no public path).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[doc(hidden)]
pub use lease::LeaseRow;

/// The default name of the record table on every backend (see
/// [`set_record_table`](table::set_record_table) for another).
pub const RECORD_TABLE: &str = "idem_records";

/// What a claim statement found.
#[derive(Debug, PartialEq, Eq)]
#[doc(hidden)]
pub enum ClaimResult {
    /// This call inserted the record: it runs the body.
    Claimed,
    /// Another record holds the key: read it (a fresh statement, so under READ
    /// COMMITTED it also sees a record committed while the insert waited).
    Conflict,
}

/// The parts of an existing record a guard needs to judge a repeat.
#[derive(Debug)]
#[doc(hidden)]
pub struct ExistingRecord {
    pub status: String,
    pub fingerprint: Option<String>,
    pub response: Option<String>,
    pub expired: bool,
}

/// What [`SqlBackend::insert_done`] found.
#[derive(Debug)]
#[doc(hidden)]
pub enum InsertDone {
    Written,
    /// A live record holds the key; the caller reads it after restarting.
    Conflict,
}

/// A record to insert.
#[doc(hidden)]
pub struct NewRecord<'a> {
    pub scope: &'a str,
    pub key: &'a str,
    pub fingerprint: Option<&'a str>,
    pub retention: Duration,
}

/// A compare-and-set on an entity's status (state strategies).
#[doc(hidden)]
pub struct Cas<'a> {
    pub states: &'static StateTable,
    /// The states the entity may be in for the move to happen.
    pub from: &'a [StateCode],
    pub to: StateCode,
    /// One value per key column.
    pub key: &'a [SqlKey],
}

/// How [`SqlBackend::read_state`] reads an entity's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[doc(hidden)]
pub enum ReadMode {
    /// The latest committed value: a plain read on PostgreSQL (a new statement
    /// sees every commit under READ COMMITTED) and SQLite, a shared locking read
    /// on MySQL (whose plain reads see the transaction's first snapshot).
    Latest,
    /// Lock the row for the move that follows (`FOR UPDATE`; SQLite has one
    /// writer and needs none).
    ForUpdate,
}

/// A database idem can keep dedup records in: PostgreSQL, MySQL/MariaDB, SQLite.
///
/// Implemented for [`sqlx::Postgres`], [`sqlx::MySql`] and [`sqlx::Sqlite`]
/// (each behind its cargo feature). The methods are the building blocks of the
/// guards; applications call [`migrate`], [`purge_expired`] and
/// [`find_record`] instead.
#[diagnostic::on_unimplemented(
    message = "idem cannot keep dedup records in `{Self}`",
    note = "supported databases: sqlx::Postgres, sqlx::MySql (MySQL and MariaDB) and sqlx::Sqlite, each behind the idem feature of the same name"
)]
pub trait SqlBackend:
    sqlx::Database + RecordSql + StateSql + LeaseSql + SchemaSql + admin::AdminSql + texts::TxSql
{
    /// The schema, as shipped in `idem-runtime/migrations/<NAME>/`.
    const SCHEMA: &'static str;
    /// `postgres`, `mysql` or `sqlite`.
    const BACKEND: &'static str;
    /// The migrations of [`SCHEMA`](Self::SCHEMA), one per file: version,
    /// description, text (written for `idem_records`).
    #[doc(hidden)]
    const MIGRATIONS: &'static [(i64, &'static str, &'static str)];

    /// Whether `=` on the state table's text columns ignores case (MySQL's
    /// default collations), so a status stored `Pending` matches `PENDING`.
    const TEXT_IGNORES_CASE: bool = false;

    /// The most bytes the record's `response` column holds: a longer answer
    /// is not kept (its record says so, [`Error::AnswerNotKept`] for its
    /// repeats) instead of reaching the server (where MySQL, by its
    /// `sql_mode`, might cut it short or drop the connection).
    const MAX_RESPONSE: usize = usize::MAX;

    /// Whether [`answer_limit`](Self::answer_limit) asks the server (else
    /// it is [`MAX_RESPONSE`](Self::MAX_RESPONSE), and no connection is
    /// needed to know it).
    #[doc(hidden)]
    const ASKS_ANSWER_LIMIT: bool = false;

    /// The most bytes of JSON an answer on this connection's server can
    /// have: [`MAX_RESPONSE`](Self::MAX_RESPONSE), less where the server's
    /// configuration sets a lower bound (MySQL's `max_allowed_packet`, asked
    /// of the server). A longer answer is not kept.
    #[doc(hidden)]
    fn answer_limit(conn: &mut Self::Connection) -> impl Future<Output = Result<usize, sqlx::Error>> + Send {
        let _ = conn;
        std::future::ready(Ok(Self::MAX_RESPONSE))
    }
}

/// The statements of the dedup record in the caller's transaction: claim, read, complete, remove. Sealed: implemented for the supported databases only.
#[doc(hidden)]
pub trait RecordSql: sqlx::Database + sealed::Sealed {
    #[doc(hidden)]
    fn claim(
        conn: &mut Self::Connection,
        record: &NewRecord<'_>,
    ) -> impl Future<Output = Result<ClaimResult, sqlx::Error>> + Send;

    #[doc(hidden)]
    fn read(
        conn: &mut Self::Connection,
        scope: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<ExistingRecord>, sqlx::Error>> + Send;

    /// [`SqlBackend::read`], in a transaction that may claim the key right
    /// after (the precheck's confirmation). SQLite takes its write lock
    /// first: a transaction that has read cannot wait for the lock later
    /// (its snapshot would be stale) and fails with "database is locked".
    fn read_then_claim(
        conn: &mut Self::Connection,
        scope: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<ExistingRecord>, sqlx::Error>> + Send {
        Self::read(conn, scope, key)
    }

    /// Store the response and mark the record `DONE`; returns rows changed.
    #[doc(hidden)]
    fn complete(
        conn: &mut Self::Connection,
        scope: &str,
        key: &str,
        response: Option<&str>,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// `claim = "after"`: write the record `DONE` with its response in one
    /// statement, taking over an expired record in place. `Written` when this
    /// call now owns the key; `Conflict` when a live record holds it (the
    /// caller's transaction still holds the body's writes).
    #[doc(hidden)]
    fn insert_done(
        conn: &mut Self::Connection,
        record: &NewRecord<'_>,
        response: Option<&str>,
    ) -> impl Future<Output = Result<InsertDone, sqlx::Error>> + Send;

    /// Roll the caller's transaction back to its start (see [`restart_sql`]).
    #[doc(hidden)]
    fn restart(conn: &mut Self::Connection) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Remove the record (the body failed); returns rows removed.
    #[doc(hidden)]
    fn discard(
        conn: &mut Self::Connection,
        scope: &str,
        key: &str,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Remove the record only if it has expired; returns rows removed.
    #[doc(hidden)]
    fn discard_expired(
        conn: &mut Self::Connection,
        scope: &str,
        key: &str,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    #[doc(hidden)]
    fn fetch(
        conn: &mut Self::Connection,
        scope: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<DedupRecord>, sqlx::Error>> + Send;
}

/// The statements of the state strategies: an entity's compare-and-set and its status. Sealed: implemented for the supported databases only.
#[doc(hidden)]
pub trait StateSql: RecordSql {
    /// `UPDATE <table> SET <status> = to WHERE <key> = ? AND <status> IN (from...)`;
    /// returns rows changed.
    #[doc(hidden)]
    fn transition(conn: &mut Self::Connection, cas: &Cas<'_>) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// The entity's current status, `None` when there is no such entity.
    #[doc(hidden)]
    fn read_state(
        conn: &mut Self::Connection,
        cas: &Cas<'_>,
        mode: ReadMode,
    ) -> impl Future<Output = Result<Option<StoredState>, sqlx::Error>> + Send;

    /// `dedup+state`: claim the record and, only if this call claimed it, make
    /// the transition. Returns the claim and the rows the transition changed.
    /// Two statements unless the backend does both in one (PostgreSQL).
    #[doc(hidden)]
    fn claim_transition(
        conn: &mut Self::Connection,
        record: &NewRecord<'_>,
        cas: &Cas<'_>,
    ) -> impl Future<Output = Result<(ClaimResult, u64), sqlx::Error>> + Send {
        async move {
            if Self::claim(&mut *conn, record).await? == ClaimResult::Conflict {
                return Ok((ClaimResult::Conflict, 0));
            }
            match Self::transition(&mut *conn, cas).await {
                Ok(moved) => Ok((ClaimResult::Claimed, moved)),
                Err(e) => {
                    // A failed statement leaves MySQL's and SQLite's transaction
                    // usable: remove the record just claimed, so a caller that
                    // commits anyway leaves no PROCESSING record behind.
                    let _ = Self::discard(conn, record.scope, record.key).await;
                    Err(e)
                }
            }
        }
    }
}

/// The statements of lease records ([`SqlStore`]): claim, and complete, release or extend if held. Sealed: implemented for the supported databases only.
#[doc(hidden)]
pub trait LeaseSql: sqlx::Database + sealed::Sealed {
    /// `strategy = "lease"`: claim in one autocommit statement (taking over a
    /// record whose lease or retention has passed), or report what holds the
    /// key. `None` when the holding record is not visible yet: ask again.
    #[doc(hidden)]
    fn lease_claim(
        conn: &mut Self::Connection,
        req: &LeaseRequest<'_>,
    ) -> impl Future<Output = Result<Option<LeaseClaim>, sqlx::Error>> + Send;

    /// Complete, release or extend a lease, only if `held` still holds it.
    #[doc(hidden)]
    fn lease_finish(
        conn: &mut Self::Connection,
        held: &HeldLease<'_>,
        action: LeaseAction<'_>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
}

/// The schema and its upkeep: migrations and purging. Sealed: implemented for the supported databases only.
#[doc(hidden)]
pub trait SchemaSql: sqlx::Database + sealed::Sealed {
    /// Delete at most `batch` records the filter selects (expired, or with
    /// `older_than` also older completed ones) in one short statement (with
    /// `archive`, copying the completed ones into the archive table in the
    /// same statement or transaction).
    #[doc(hidden)]
    fn purge_batch(
        conn: &mut Self::Connection,
        batch: u32,
        archive: bool,
        filter: &admin::PurgeFilter<'_>,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Create the record table if it is missing (safe to run concurrently).
    #[doc(hidden)]
    fn migrate(conn: &mut Self::Connection) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// True when `err` says the record table does not exist.
    #[doc(hidden)]
    fn is_missing_table(err: &sqlx::Error) -> bool;
}

mod sealed {
    /// Implemented by the backends of this crate only: the statements are
    /// idem's, bound to its schema.
    pub trait Sealed {}
}

/// The statement that throws away everything the caller's transaction did
/// and continues in a fresh one (`claim = "after"` found a duplicate after
/// the body ran). Inside a savepoint (a nested `Transaction`), only the
/// savepoint is rolled back, by the name sqlx gave it.
pub(crate) fn restart_sql<DB: SqlBackend>(conn: &DB::Connection) -> sqlx::AssertSqlSafe<String> {
    use sqlx_core::transaction::TransactionManager;
    let depth = <DB::TransactionManager as TransactionManager>::get_transaction_depth(conn);
    sqlx::AssertSqlSafe(if depth <= 1 {
        "ROLLBACK; BEGIN".to_owned()
    } else {
        format!("ROLLBACK TO SAVEPOINT _sqlx_savepoint_{}", depth - 1)
    })
}

/// `status = 2 WHERE order_no = $1 AND status IN (1)`: the part of a
/// transition's UPDATE after `SET`, with the key's placeholders numbered from
/// `first` by `ph`. Table, columns and stored names were checked by the
/// derive (plain identifiers; names without quotes or backslashes), so they
/// are written into the SQL as they are; only the key is bound.
pub(crate) fn cas_sql(cas: &Cas<'_>, first: usize, ph: fn(usize) -> String) -> String {
    let t = cas.states;
    let from = cas.from.iter().map(|c| literal(*c)).collect::<Vec<_>>().join(", ");
    format!(
        "UPDATE {table} SET {col} = {to} WHERE {key} AND {col} IN ({from})",
        table = t.table,
        col = t.status_column,
        to = literal(cas.to),
        key = key_where(t, first, ph),
    )
}

/// `SELECT <cast status> FROM <table> WHERE <key>`, with the status cast to
/// the type its codes have (`int_cast` / `text_cast` wrap the column name).
pub(crate) fn state_read_sql(cas: &Cas<'_>, ph: fn(usize) -> String, cast: fn(&str, bool) -> String) -> String {
    let t = cas.states;
    let int = matches!(t.codes.first(), Some(StateCode::Int(_)));
    format!("SELECT {} FROM {} WHERE {}", cast(t.status_column, int), t.table, key_where(t, 1, ph))
}

fn key_where(t: &StateTable, first: usize, ph: fn(usize) -> String) -> String {
    t.key_columns.iter().enumerate().map(|(i, c)| format!("{c} = {}", ph(first + i))).collect::<Vec<_>>().join(" AND ")
}

fn literal(code: StateCode) -> String {
    match code {
        StateCode::Int(i) => i.to_string(),
        StateCode::Text(s) => format!("'{}'", s.replace('\'', "''")),
    }
}

#[cfg(feature = "postgres")]
pub(crate) fn ph_dollar(i: usize) -> String {
    format!("${i}")
}

#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) fn ph_question(_: usize) -> String {
    "?".to_owned()
}

/// Decode column 0 of a status read as the codes' type.
pub(crate) fn decode_state<R>(row: &R, states: &StateTable) -> Result<StoredState, sqlx::Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(match states.codes.first() {
        Some(StateCode::Text(_)) => row.try_get::<Option<String>, _>(0)?.map_or(StoredState::Null, StoredState::Text),
        _ => row.try_get::<Option<i64>, _>(0)?.map_or(StoredState::Null, StoredState::Int),
    })
}

/// True when the connection is inside a transaction (or savepoint).
pub(crate) fn in_transaction<DB: SqlBackend>(conn: &DB::Connection) -> bool {
    use sqlx_core::transaction::TransactionManager;
    <DB::TransactionManager as TransactionManager>::get_transaction_depth(conn) > 0
}

pub(crate) fn classify<DB: SqlBackend>(err: sqlx::Error) -> Error {
    if DB::is_missing_table(&err) {
        Error::NotMigrated { backend: DB::BACKEND, source: err }
    } else {
        Error::Database(err)
    }
}

/// [`classify`] for a statement on a state machine's entity table, where a
/// guard's key or state codes of another type than their columns (a text key
/// for a `BIGINT` id: PostgreSQL compares strictly, SQLSTATE 42883 or 42804)
/// get an error that names the table and columns and says what to change,
/// rather than the database's advice to add casts.
pub(crate) fn classify_state<DB: SqlBackend>(states: &'static StateTable) -> impl Fn(sqlx::Error) -> Error {
    move |err| {
        let said = match err.as_database_error() {
            Some(d) if d.code().is_some_and(|c| c == "42883" || c == "42804") => d.message().to_owned(),
            _ => return classify::<DB>(err),
        };
        Error::StateTable {
            name: states.name,
            table: states.table,
            reason: format!(
                "a value its guard compares with a column has another type than the column (the database says: \
                 {said}): key the guard with a value of the type of {} (an integer for an integer column, text for \
                 a text column) and store the states as `{}` holds them (`code = N` for a numeric column, \
                 `stored_as = \"name\"` for text)",
                states.key_columns.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", "),
                states.status_column,
            ),
        }
    }
}

/// Create idem's record table if it does not exist yet.
///
/// Idempotent and safe to run from several processes at once; call it at
/// start-up. If you run your own migrations, apply the SQL in
/// `idem-runtime/migrations/<backend>/` instead (it is [`SqlBackend::SCHEMA`]).
pub async fn migrate<DB: SqlBackend>(pool: &sqlx::Pool<DB>) -> Result<(), Error> {
    let mut conn = pool.acquire().await?;
    DB::migrate(&mut conn).await?;
    Ok(())
}

/// idem's migrations as a versioned [`sqlx::migrate::Migrator`], for
/// applications that run their migrations with sqlx's tooling instead of
/// calling [`migrate`]: `idem::sql::migrator::<Postgres>().run(&pool).await?`.
///
/// Written for this process's record table ([`set_record_table`](table::set_record_table);
/// set it first). Its history is kept in `_idem_migrations` (or
/// `<table>_migrations` for a table named otherwise), not in your
/// `_sqlx_migrations`, so its versions (1, 2, ...) never collide with yours.
/// The migration files are frozen once released (sqlx checks each applied
/// one's checksum); a change to the schema comes as a new file.
/// Every migration is idempotent (`IF NOT EXISTS`): a database set up by
/// [`migrate`] before takes it as applied.
pub fn migrator<DB: SqlBackend>() -> sqlx::migrate::Migrator {
    use sqlx::SqlSafeStr as _;
    let table = table::record_table();
    let migrations = DB::MIGRATIONS
        .iter()
        .map(|(version, description, text)| {
            let sql = sqlx::AssertSqlSafe(table::migration(text, table)).into_sql_str();
            sqlx::migrate::Migration::new(
                *version,
                (*description).into(),
                sqlx::migrate::MigrationType::Simple,
                sql,
                false,
            )
        })
        .collect();
    let mut migrator = sqlx::migrate::Migrator::with_migrations(migrations);
    migrator.dangerous_set_table_name(migrations_table(table));
    migrator
}

/// Where [`migrator`] keeps its history: `_idem_migrations` for the default
/// table, `<table>_migrations` beside another (two services with tables of
/// their own in one database keep histories of their own).
fn migrations_table(table: &table::RecordTable) -> String {
    if table.qualified() == RECORD_TABLE { "_idem_migrations".to_owned() } else { format!("{table}_migrations") }
}

/// Options for [`purge_expired`].
#[derive(Clone, Debug)]
pub struct PurgeOptions {
    /// Records deleted per statement. Each batch is its own short statement,
    /// so no lock is held across batches. Default 1,000.
    pub batch_size: u32,
    /// Stop after this many batches (a time budget for one run); `None` goes on
    /// until no expired record is left. Default `None`.
    pub max_batches: Option<u32>,
    /// Pause between batches, to leave room for live traffic. Default 0.
    pub pause: Duration,
    /// Copy completed (`DONE`) records into `idem_records_archive` before
    /// deleting them, in the same statement or transaction: for
    /// reconciliation (which first answers were given, when). Default off.
    pub archive: bool,
    /// Only the records of this scope (as the guard names it); `None`, the
    /// default, purges every scope. For a service that shares its database
    /// with others and purges only its own records.
    pub scope: Option<String>,
    /// Also delete records written (or last taken over) longer ago than
    /// this, whatever their retention, except `PROCESSING` ones: a live
    /// lease is never cut short, and a stuck record is left to
    /// [`admin::release`] (or its retention), where an operator sees it
    /// first. `None`, the default, deletes only records past their
    /// retention. For clearing out records written with a long retention
    /// (a retention shortened since, a backlog after a purge job stopped).
    /// Judged by `created_at`, which has no index: each batch scans the
    /// table, so give it a larger `batch_size` on big tables, and run it by
    /// hand rather than on a schedule.
    pub older_than: Option<Duration>,
}

impl Default for PurgeOptions {
    fn default() -> Self {
        PurgeOptions {
            batch_size: 1000,
            max_batches: None,
            pause: Duration::ZERO,
            archive: false,
            scope: None,
            older_than: None,
        }
    }
}

/// What [`purge_expired`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Records deleted.
    pub deleted: u64,
    /// Statements run that deleted at least one record.
    pub batches: u32,
}

/// Delete records whose retention has passed, in bounded batches (with
/// [`PurgeOptions::older_than`], also older records that are not
/// `PROCESSING`; [`admin::purge_preview`] counts them first).
///
/// Expiry is judged by the database's clock. Schedule it (a cron job or a
/// `tokio::time::interval` task) at least once per retention period; records
/// not yet purged but expired are already ignored by guards.
pub async fn purge_expired<DB: SqlBackend>(pool: &sqlx::Pool<DB>, options: PurgeOptions) -> Result<PurgeReport, Error> {
    let batch = options.batch_size.max(1);
    let scope = options.scope.as_deref().map(crate::key::stored_scope);
    let filter = admin::purge_filter(scope.as_deref(), &options)?;
    let mut report = PurgeReport::default();
    let mut conn = pool.acquire().await?;
    loop {
        if options.max_batches.is_some_and(|m| report.batches >= m) {
            break;
        }
        let n = DB::purge_batch(&mut conn, batch, options.archive, &filter).await.map_err(classify::<DB>)?;
        if n == 0 {
            break;
        }
        report.deleted += n;
        report.batches += 1;
        if n < u64::from(batch) {
            break;
        }
        if !options.pause.is_zero() {
            tokio::time::sleep(options.pause).await;
        }
    }
    Ok(report)
}

/// Read one record, e.g. to check in a test or an admin tool what a guard stored.
///
/// `scope` is the guard's scope (its `scope = "..."` argument, or
/// `module_path::fn_name` by default).
pub async fn find_record<DB: SqlBackend>(
    pool: &sqlx::Pool<DB>,
    scope: &str,
    key: &Key,
) -> Result<Option<DedupRecord>, Error> {
    let mut conn = pool.acquire().await?;
    let scope = crate::key::stored_scope(scope);
    DB::fetch(&mut conn, &scope, key.as_str()).await.map_err(classify::<DB>)
}

#[cfg(feature = "sqlite")]
pub(crate) fn retention_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(feature = "mysql")]
pub(crate) fn retention_us(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// Decode the columns of the backends' READ statements, in that order: status,
/// fingerprint, response, expired (as an integer: 0 or 1).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn decode_existing<R>(row: &R) -> Result<ExistingRecord, sqlx::Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    decode_existing_as::<String, R>(row)
}

/// [`decode_existing`] with idem's text columns read as `S` (MySQL: their
/// bytes, whatever the session's charset).
pub(crate) fn decode_existing_as<S, R>(row: &R) -> Result<ExistingRecord, sqlx::Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    S: Into<String>,
    for<'r> S: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(ExistingRecord {
        status: row.try_get::<S, _>(0)?.into(),
        fingerprint: row.try_get::<Option<S>, _>(1)?.map(Into::into),
        response: row.try_get::<Option<S>, _>(2)?.map(Into::into),
        expired: row.try_get::<i64, _>(3)? != 0,
    })
}

/// Decode the columns of the backends' FETCH statements, in that order: scope,
/// key, status, fingerprint, response, owner, fence, lease_until, created_at,
/// updated_at, expires_at (timestamps as epoch milliseconds).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn decode_record<R>(row: &R) -> Result<DedupRecord, sqlx::Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    decode_record_as::<String, R>(row)
}

/// [`decode_record`] with idem's text columns read as `S` (MySQL: their
/// bytes, whatever the session's charset).
pub(crate) fn decode_record_as<S, R>(row: &R) -> Result<DedupRecord, sqlx::Error>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    S: Into<String>,
    for<'r> S: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let text = |i: usize| row.try_get::<Option<S>, _>(i).map(|s| s.map(Into::into));
    let status: String = row.try_get::<S, _>(2)?.into();
    Ok(DedupRecord {
        scope: row.try_get::<S, _>(0)?.into(),
        key: row.try_get::<S, _>(1)?.into(),
        status: crate::record::RecordStatus::parse(&status).ok_or_else(|| sqlx::Error::ColumnDecode {
            index: "status".into(),
            source: format!("unknown record status {status:?}").into(),
        })?,
        fingerprint: text(3)?,
        response: text(4)?,
        owner: text(5)?,
        fence: row.try_get(6)?,
        lease_until_ms: row.try_get(7)?,
        created_at_ms: row.try_get(8)?,
        updated_at_ms: row.try_get(9)?,
        expires_at_ms: row.try_get(10)?,
    })
}
