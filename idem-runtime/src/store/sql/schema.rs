//! The record table's upkeep: creating it ([`migrate`], [`migrator`]),
//! purging expired records in bounded batches ([`purge_expired`]), and
//! reading one ([`find_record`]). A purge batch is each database's own (see
//! their dialects); the condition it deletes by is written once here.

use std::future::Future;
use std::time::{Duration, Instant};

use super::dialect::{Arg, Dialect};
use super::{RECORD_TABLE, SqlBackend, classify, statements};
use crate::error::Error;
use crate::future::BoxFuture;
use crate::key::Key;
use crate::record::DedupRecord;
use crate::table::RecordTable;

/// Create idem's tables if they do not exist yet: the record table of the
/// installed [`Stores`](crate::Stores) (`idem_records` by default), its
/// archive, and the outbox beside it (`idem_outbox`, see
/// [`RecordTable::outbox`]; created whether or not the feature `outbox` is
/// on, so that every build of a service runs the same migrations).
///
/// Idempotent and safe to run from several processes at once; call it at
/// start-up. If you run your own migrations, apply the SQL in
/// `idem-runtime/migrations/<backend>/` instead (it is [`SqlBackend::SCHEMA`]).
pub async fn migrate<DB: SqlBackend>(pool: &sqlx::Pool<DB>) -> Result<(), Error> {
    use sqlx::SqlSafeStr as _;
    let s = statements::<DB>();
    if let Some(schema) = s.table.schema().filter(|_| !DB::TAKES_SCHEMA) {
        let reason =
            format!("the record table `{}` names a schema (`{schema}`); on SQLite name the table alone", s.table);
        return Err(sqlx::Error::Configuration(reason.into()).into());
    }
    let text = || sqlx::AssertSqlSafe(s.schema.as_str()).into_sql_str();
    let mut conn = pool.acquire().await?;
    let Some(lock) = DB::MIGRATION_LOCK else {
        DB::execute_text(&mut *conn, text()).await?;
        return Ok(());
    };
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    DB::execute_text(&mut tx, sqlx::SqlStr::from_static(lock)).await?;
    DB::execute_text(&mut tx, text()).await?;
    tx.commit().await?;
    Ok(())
}

/// idem's migrations as a versioned [`sqlx::migrate::Migrator`], for
/// applications that run their migrations with sqlx's tooling instead of
/// calling [`migrate`]: `idem::sql::migrator::<Postgres>().run(&pool).await?`.
///
/// Written for the record table of the installed [`Stores`](crate::Stores)
/// (install them first). Its history is kept in `_idem_migrations` (or
/// `<table>_migrations` for a table named otherwise), not in your
/// `_sqlx_migrations`, so its versions (1, 2, ...) never collide with yours.
/// The migration files are frozen once released (sqlx checks each applied
/// one's checksum); a change to the schema comes as a new file.
/// Every migration is idempotent (`IF NOT EXISTS`, a table option set
/// again): a database set up by [`migrate`] before takes it as applied.
pub fn migrator<DB: SqlBackend>() -> sqlx::migrate::Migrator {
    use sqlx::SqlSafeStr as _;
    let table = &statements::<DB>().table;
    let migrations = DB::MIGRATIONS
        .iter()
        .map(|(version, description, text)| {
            let sql = sqlx::AssertSqlSafe(crate::table::migration(text, table)).into_sql_str();
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
fn migrations_table(table: &RecordTable) -> String {
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
    /// After each batch, also pause this many times as long as the batch
    /// took: the purge paces itself by what a batch costs the server right
    /// now (a cold cache, a busy disk and lock waits lengthen a batch, and
    /// its pause with it). 4 keeps the purge deleting at most a fifth of
    /// the time, whatever the server; 0, the default, adds no pause. For a
    /// purge beside live traffic, where a fixed [`pause`](Self::pause)
    /// suits one server's speed and not another's.
    pub pause_factor: u32,
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
    /// [`admin::release`](super::admin::release) (or its retention), where an
    /// operator sees it first. `None`, the default, deletes only records
    /// past their retention. For clearing out records written with a long
    /// retention (a retention shortened since, a backlog after a purge job
    /// stopped). Judged by `created_at`, which has no index: each batch
    /// scans the table, so give it a larger `batch_size` on big tables, and
    /// run it by hand rather than on a schedule.
    pub older_than: Option<Duration>,
}

impl Default for PurgeOptions {
    fn default() -> Self {
        PurgeOptions {
            batch_size: 1000,
            max_batches: None,
            pause: Duration::ZERO,
            pause_factor: 0,
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
/// `PROCESSING`; [`admin::purge_preview`](super::admin::purge_preview)
/// counts them first).
///
/// Expiry is judged by the database's clock. Schedule it (a cron job or a
/// `tokio::time::interval` task) at least once per retention period; records
/// not yet purged but expired are already ignored by guards.
pub async fn purge_expired<DB: SqlBackend>(pool: &sqlx::Pool<DB>, options: PurgeOptions) -> Result<PurgeReport, Error> {
    let scope = options.scope.as_deref().map(crate::key::stored_scope);
    let purge = PurgeBatch::new(&statements::<DB>().table, scope.as_deref(), &options)?;
    in_batches::<DB>(pool, &options, &purge).await
}

/// One batch of a purge, run by [`in_batches`].
pub(crate) trait Batch<DB: SqlBackend>: Sync {
    /// Delete at most a batch of rows: how many went.
    fn run<'c>(&'c self, conn: &'c mut DB::Connection) -> BoxFuture<'c, Result<u64, Error>>;
}

impl<DB: SqlBackend> Batch<DB> for PurgeBatch<'_> {
    fn run<'c>(&'c self, conn: &'c mut DB::Connection) -> BoxFuture<'c, Result<u64, Error>> {
        Box::pin(batch::<DB>(conn, self))
    }
}

/// Run `batch` (which deletes at most `options.batch_size` rows: how many)
/// until it deletes fewer, or `options.max_batches` ran, pausing between
/// batches as `options` say, on one connection of `pool`.
pub(crate) async fn in_batches<DB: SqlBackend>(
    pool: &sqlx::Pool<DB>,
    options: &PurgeOptions,
    batch: &impl Batch<DB>,
) -> Result<PurgeReport, Error> {
    let mut report = PurgeReport::default();
    let mut conn = pool.acquire().await?;
    loop {
        if options.max_batches.is_some_and(|m| report.batches >= m) {
            break;
        }
        let started = Instant::now();
        let n = batch.run(&mut conn).await?;
        if n == 0 {
            break;
        }
        report.deleted += n;
        report.batches += 1;
        if n < u64::from(options.batch_size.max(1)) {
            break;
        }
        let pause = options.pause.saturating_add(started.elapsed().saturating_mul(options.pause_factor));
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    Ok(report)
}

/// Deadlock victims among a purge's batches it runs again: two purges at
/// once (two instances of a service on the same schedule) lock the same
/// rows in the same order, and MySQL's archiving copy can still deadlock
/// with the other's delete. A victim's batch was rolled back whole.
const MAX_DEADLOCKS: u32 = 10;

/// One batch, run again as a deadlock's victim (after 2, 4, ... ms).
async fn batch<DB: SqlBackend>(conn: &mut DB::Connection, purge: &PurgeBatch<'_>) -> Result<u64, Error> {
    let mut deadlocks = 0;
    loop {
        match DB::purge_batch(conn, purge).await.map_err(classify::<DB>) {
            Err(e) if e.is_deadlock() && deadlocks < MAX_DEADLOCKS => {
                deadlocks += 1;
                tokio::time::sleep(Duration::from_millis(2 * u64::from(deadlocks))).await;
            }
            done => return done,
        }
    }
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
    super::record::fetch::<DB>(&mut conn, &scope, key.as_str()).await.map_err(classify::<DB>)
}

/// A purge batch, each database's own (see the dialects), by the
/// condition written once here ([`PurgeBatch::condition`]).
#[doc(hidden)]
pub trait PurgeSql: Dialect {
    /// Delete at most `purge.batch` records in one short statement or
    /// transaction (with `purge.archive`, copying the completed ones into
    /// the archive in it); how many went.
    fn purge_batch<'a>(
        conn: &'a mut Self::Connection,
        purge: &'a PurgeBatch<'a>,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a;
}

/// One batch of a purge: which records it deletes (past their retention,
/// or with `older_than` created before the cut-off and not `PROCESSING`;
/// optionally of one scope, as stored), how many at most, and whether the
/// completed ones are archived.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct PurgeBatch<'a> {
    pub(crate) table: &'a RecordTable,
    pub(crate) scope: Option<&'a str>,
    pub(crate) older_than: Option<Duration>,
    pub(crate) batch: u32,
    pub(crate) archive: bool,
}

impl<'a> PurgeBatch<'a> {
    /// A batch of a purge with `options` on `table`, of `scope` as stored.
    pub(crate) fn new(
        table: &'a RecordTable,
        scope: Option<&'a str>,
        options: &PurgeOptions,
    ) -> Result<PurgeBatch<'a>, Error> {
        let older_than = options.older_than.map(|d| crate::error::check_ttl("older_than", d)).transpose()?;
        Ok(PurgeBatch { table, scope, older_than, batch: options.batch_size.max(1), archive: options.archive })
    }

    /// The condition of its records, by the clock `cut` (the statement's,
    /// or `$1`, a reading of it taken first). The values of a purge's
    /// statements: `$1` that reading, `$2` the batch, `$3` the age, `$4`
    /// the scope, `$5` the step rows' scope prefix ([`args`](Self::args)).
    ///
    /// `older_than` leaves the rows of recorded steps alone (they are
    /// `DONE`, but their call may still be running or waiting for its
    /// take-over, which would run a purged step again): they go with their
    /// retention, or with their call's completion.
    pub(crate) fn condition<D: Dialect>(&self, cut: &str) -> String {
        let mut condition = format!("expires_at <= {cut}");
        if self.older_than.is_some() {
            condition = format!(
                "({condition} OR (status <> 'PROCESSING' AND created_at <= {} AND {NOT_A_STEP}))",
                D::before(cut, "$3")
            );
        }
        if self.scope.is_some() {
            condition.push_str(" AND scope = $4");
        }
        condition
    }

    /// The values of a purge's statements (`cut`: the clock reading, if one
    /// was taken).
    pub(crate) fn args(&self, cut: Option<Arg<'a>>) -> [Arg<'a>; 5] {
        [
            cut.unwrap_or(Arg::Int(0)),
            Arg::Int(self.batch.into()),
            Arg::Span(self.older_than.unwrap_or_default()),
            Arg::Text(self.scope),
            Arg::Text(Some(super::steps::STEP_SCOPES)),
        ]
    }
}

/// Not the row of a recorded step (its scope's prefix bound as `$5`: a
/// value, so no database's escaping of the backslash matters).
const NOT_A_STEP: &str = "substr(scope, 1, 6) <> $5";

/// Which of a purge's rows go to the archive: completed calls' records,
/// not their steps'.
pub(crate) const ARCHIVED: &str = "status = 'DONE' AND substr(scope, 1, 6) <> $5";

/// The columns an archived record keeps, as the record table names them
/// (the archive adds `archived_at`).
const KEPT: &str =
    "scope, idem_key, status, fingerprint, response, owner, fence, lease_until, created_at, updated_at, expires_at";

/// `<insert> <archive> (...) SELECT ..., <archived_at> FROM <from>`: a copy
/// of records into the archive.
pub(crate) fn archive_copy(insert: &str, archive: &str, archived_at: &str, from: &str) -> String {
    format!("{insert} {archive} ({KEPT}, archived_at) SELECT {KEPT}, {archived_at} FROM {from}")
}

/// How a dialect reads the clock a purge in a transaction goes by.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) enum Cut {
    /// As an integer (SQLite: epoch milliseconds).
    #[cfg(feature = "sqlite")]
    Int(&'static str),
    /// As text (MySQL: a `DATETIME(6)` as written).
    #[cfg(feature = "mysql")]
    Text(&'static str),
}

/// A purge batch as one short transaction: read the clock once (`cut`),
/// copy what `copy` selects into the archive (with `archive`), delete what
/// `delete` selects; both select by that one cut-off in one order, so the
/// two see the same rows. Returns how many went.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) async fn cut_copy_delete<DB: SqlBackend>(
    conn: &mut DB::Connection,
    cut: Cut,
    copy: Option<&str>,
    delete: &str,
    purge: &PurgeBatch<'_>,
) -> Result<u64, sqlx::Error> {
    use super::dialect::Stmt;
    use sqlx::SqlSafeStr as _;
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    let read = |sql: &'static str| sqlx::query(sql.into_sql_str());
    let reading = match cut {
        #[cfg(feature = "sqlite")]
        Cut::Int(sql) => Reading::Int(DB::int(&DB::fetch_one(&mut tx, read(sql)).await?, 0)?),
        #[cfg(feature = "mysql")]
        Cut::Text(sql) => {
            Reading::Text(DB::opt_string(&DB::fetch_one(&mut tx, read(sql)).await?, 0)?.unwrap_or_default())
        }
    };
    let args = purge.args(Some(reading.arg()));
    if let Some(copy) = copy {
        DB::execute(&mut tx, Stmt::new::<DB>(copy).query::<DB>(&args)).await?;
    }
    let gone = DB::execute(&mut tx, Stmt::new::<DB>(delete).query::<DB>(&args)).await?;
    tx.commit().await?;
    Ok(DB::rows(&gone))
}

#[cfg(any(feature = "mysql", feature = "sqlite"))]
enum Reading {
    #[cfg(feature = "sqlite")]
    Int(i64),
    #[cfg(feature = "mysql")]
    Text(String),
}

#[cfg(any(feature = "mysql", feature = "sqlite"))]
impl Reading {
    fn arg(&self) -> Arg<'_> {
        match self {
            #[cfg(feature = "sqlite")]
            Reading::Int(ms) => Arg::Int(*ms),
            #[cfg(feature = "mysql")]
            Reading::Text(time) => Arg::Str(time),
        }
    }
}
