//! Dedup records in SQL databases, written in the caller's own transaction,
//! and lease records in SQL ([`SqlStore`]).
//!
//! The SQL is written once, per concern, over a dialect per database:
//! - `dialect`: what a database is to idem ([`Dialect`](dialect::Dialect):
//!   placeholders, clocks, how values travel, its own few statements and
//!   steps) over the sqlx driver, and a statement as one database takes it;
//! - `postgres`, `mysql`, `sqlite`: the dialects, each with its real
//!   differences and the reasons for them;
//! - `record`: the dedup record's statements and steps (claim, read,
//!   complete, take over, remove, fetch); `lease`: [`SqlStore`];
//!   `schema`: migrations and purging; `admin`: the operator's functions;
//!   `outbox`: the outbox table's statements, for the handle and the
//!   relay, and `outbox_admin`, the operator's (feature `outbox`);
//! - `texts`: what an `idem::Tx` needs of a database (its texts live in
//!   the `Tx`'s module).
//!
//! Every statement is built once for the record table of the installed
//! [`Stores`](crate::Stores) ([`Statements`], on its first use).

use crate::error::Error;

/// The migrations in `idem-runtime/migrations/<dir>/` as
/// [`SqlBackend::SCHEMA`] and [`SqlBackend::MIGRATIONS`].
macro_rules! migrations {
    ($dir:literal) => {
        const SCHEMA: &'static str = concat!(
            include_str!(concat!("../../../migrations/", $dir, "/0001_idem_records.sql")),
            "\n",
            include_str!(concat!("../../../migrations/", $dir, "/0002_idem_records_archive.sql")),
            "\n",
            include_str!(concat!("../../../migrations/", $dir, "/0003_idem_records_fillfactor.sql")),
            "\n",
            include_str!(concat!("../../../migrations/", $dir, "/0004_idem_outbox.sql"))
        );

        const MIGRATIONS: &'static [(i64, &'static str, &'static str)] = &[
            (1, "idem_records", include_str!(concat!("../../../migrations/", $dir, "/0001_idem_records.sql"))),
            (
                2,
                "idem_records_archive",
                include_str!(concat!("../../../migrations/", $dir, "/0002_idem_records_archive.sql")),
            ),
            (
                3,
                "idem_records_fillfactor",
                include_str!(concat!("../../../migrations/", $dir, "/0003_idem_records_fillfactor.sql")),
            ),
            (4, "idem_outbox", include_str!(concat!("../../../migrations/", $dir, "/0004_idem_outbox.sql"))),
        ];
    };
}

pub mod admin;
pub(crate) mod dialect;
mod lease;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "outbox")]
pub(crate) mod outbox;
#[cfg(feature = "outbox")]
pub(crate) mod outbox_admin;
#[cfg(feature = "postgres")]
mod postgres;
pub(crate) mod record;
pub(crate) mod schema;
#[cfg(feature = "sqlite")]
mod sqlite;
mod steps;
pub(crate) mod texts;
pub(crate) mod unique;

pub use lease::SqlStore;
pub use schema::{PurgeOptions, PurgeReport, find_record, migrate, migrator, purge_expired};

use crate::table::RecordTable;

/// The default name of the record table on every backend (see
/// [`StoresBuilder::record_table`](crate::StoresBuilder::record_table) for
/// another).
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

/// What [`record::insert_done`] found.
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
    pub retention: std::time::Duration,
}

/// How a read of a row locks it (an entity's status, read by the state
/// strategies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[doc(hidden)]
pub enum ReadMode {
    /// The latest committed value: a plain read on PostgreSQL (a new statement
    /// sees every commit under READ COMMITTED) and SQLite, a shared locking read
    /// on MySQL (whose plain reads see the transaction's first snapshot).
    Latest,
    /// Lock the row for the move that follows (`FOR UPDATE`; SQLite takes its
    /// one write lock first).
    ForUpdate,
}

/// A database idem can keep dedup records in: PostgreSQL, MySQL/MariaDB, SQLite.
///
/// Implemented for `sqlx::Postgres`, `sqlx::MySql` and `sqlx::Sqlite`
/// (each behind its cargo feature). Its hidden supertraits are how idem
/// writes its SQL for the database; applications call [`migrate`],
/// [`purge_expired`] and [`find_record`].
#[diagnostic::on_unimplemented(
    message = "idem cannot keep dedup records in `{Self}`",
    note = "supported databases: sqlx::Postgres, sqlx::MySql (MySQL and MariaDB) and sqlx::Sqlite, each behind the idem feature of the same name"
)]
pub trait SqlBackend:
    sqlx::Database
    + dialect::Dialect
    + lease::LeaseClaimSql
    + schema::PurgeSql
    + texts::TxSql
    + unique::UniqueSql
    + OutboxSql
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
    fn answer_limit(
        conn: &mut Self::Connection,
    ) -> impl std::future::Future<Output = Result<usize, sqlx::Error>> + Send {
        let _ = conn;
        std::future::ready(Ok(Self::MAX_RESPONSE))
    }
}

#[cfg(feature = "outbox")]
use outbox::OutboxSql;

/// Without the `outbox` feature: nothing.
#[cfg(not(feature = "outbox"))]
#[doc(hidden)]
pub trait OutboxSql {}

#[cfg(not(feature = "outbox"))]
impl<T> OutboxSql for T {}

mod sealed {
    /// Implemented by the backends of this crate only: the statements are
    /// idem's, bound to its schema.
    pub trait Sealed {}
}

/// Every statement of one database for one record table, built once (on
/// its first use) and kept with the table ([`crate::table::RecordSql`]).
#[doc(hidden)]
pub struct Statements<DB: SqlBackend> {
    pub(crate) table: RecordTable,
    pub(crate) record: record::RecordStatements,
    pub(crate) lease: lease::LeaseStatements<DB>,
    pub(crate) admin: admin::AdminStatements,
    pub(crate) steps: steps::StepStatements,
    #[cfg(feature = "outbox")]
    pub(crate) outbox: outbox::OutboxStatements,
    #[cfg(feature = "outbox")]
    pub(crate) outbox_admin: outbox_admin::OutboxAdminStatements,
    /// The schema ([`SqlBackend::SCHEMA`]) for the table.
    pub(crate) schema: String,
    /// An `idem::Tx`'s texts, if the database has them.
    #[cfg(feature = "tx")]
    pub(crate) tx: Option<texts::Texts>,
}

impl<DB: SqlBackend> Statements<DB> {
    fn new(table: &RecordTable) -> Statements<DB> {
        Statements {
            record: record::RecordStatements::new::<DB>(table),
            lease: lease::LeaseStatements::new(table),
            admin: admin::AdminStatements::new::<DB>(table),
            steps: steps::StepStatements::new::<DB>(table),
            #[cfg(feature = "outbox")]
            outbox: outbox::OutboxStatements::new::<DB>(table),
            #[cfg(feature = "outbox")]
            outbox_admin: outbox_admin::OutboxAdminStatements::new::<DB>(table),
            schema: crate::table::migration(DB::SCHEMA, table),
            #[cfg(feature = "tx")]
            tx: DB::texts(table),
            table: table.clone(),
        }
    }
}

/// The statements of `DB` for the record table in use (see
/// [`Stores`](crate::Stores)).
pub(crate) fn statements<DB: SqlBackend>() -> &'static Statements<DB> {
    crate::stores::record_sql().built(Statements::<DB>::new)
}

/// The statement that throws away everything the caller's transaction did
/// and continues in a fresh one (`claim = "after"` found a duplicate after
/// the body ran). Inside a savepoint (a nested `Transaction`), only the
/// savepoint is rolled back, by the name sqlx gave it.
pub(crate) fn restart_sql<DB: SqlBackend>(conn: &DB::Connection) -> sqlx::SqlStr {
    use sqlx::SqlSafeStr as _;
    use sqlx_core::transaction::TransactionManager;
    let depth = <DB::TransactionManager as TransactionManager>::get_transaction_depth(conn);
    let text = if depth <= 1 {
        "ROLLBACK; BEGIN".to_owned()
    } else {
        format!("ROLLBACK TO SAVEPOINT _sqlx_savepoint_{}", depth - 1)
    };
    sqlx::AssertSqlSafe(text).into_sql_str()
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

/// The write that takes SQLite's one write lock, changing nothing: what a
/// read for a change that follows sends first (see
/// [`Dialect::WRITE_LOCK_FIRST`](dialect::Dialect::WRITE_LOCK_FIRST)). It
/// waits for the busy timeout like any writer; after it no other writer
/// can commit.
pub(crate) fn write_lock_sql(table: &str, column: &str) -> String {
    format!("UPDATE {table} SET {column} = {column} WHERE 0")
}
