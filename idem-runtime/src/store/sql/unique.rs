//! What `strategy = "unique"` needs of a database: which unique-key
//! violation an error is, and whether it is on the constraint the guard
//! names. Only that violation may count as a duplicate: another unique key
//! of the same table, a CHECK or a foreign key is the body's own error.
//! Each database says it its own way (`postgres.rs`, `mysql.rs`,
//! `sqlite.rs` implement [`UniqueSql`]).

use sqlx::error::DatabaseError;

use super::dialect::Dialect;
use crate::future::BoxFuture;

/// A unique-key violation as the database reported it, taken out of the
/// body's error (which need not be `Sync`) before anything is awaited.
#[derive(Debug)]
#[doc(hidden)]
pub struct Violation {
    /// The constraint or index the database named (PostgreSQL), or the key
    /// name it wrote in its message (MySQL/MariaDB). Read by those two.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) named: Option<String>,
    /// The database's message (SQLite names the index's columns in it).
    /// Read by SQLite.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) message: String,
}

/// How one database reports a unique-key violation.
#[doc(hidden)]
pub trait UniqueSql: Dialect {
    /// A failed statement aborts the whole transaction (PostgreSQL): a
    /// duplicate's plain `INSERT` needs a savepoint taken before it, or
    /// the replay cannot read anything.
    const ERROR_ABORTS: bool = false;

    /// `error`, if it is a unique-key violation (of any key).
    fn violation(error: &dyn DatabaseError) -> Option<Violation>;

    /// Whether `violation` is on `constraint`: its name (PostgreSQL,
    /// MySQL/MariaDB), or on SQLite the index of that name, whose columns
    /// the message lists (read once per index and kept), or columns written
    /// `table(a, b)`.
    fn is_on<'a>(
        conn: &'a mut Self::Connection,
        violation: &'a Violation,
        constraint: &'a str,
    ) -> BoxFuture<'a, Result<bool, crate::error::Error>>;
}
