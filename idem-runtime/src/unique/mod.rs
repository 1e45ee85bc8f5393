//! `strategy = "unique"`: the business table's own unique key is the
//! guard. The body's insert into that table (`payment_record` with
//! `uk_pay_no`) is the claim, and nothing of idem's is written: no record,
//! no stored answer. A repeat's insert fails on exactly that constraint;
//! the guard rolls back to the savepoint it took before the body (or, where
//! the insert did not fail, nothing is to undo) and answers with the
//! replay function's reading of the existing row, in the same transaction,
//! marked as a replay ([`Outcome::Replayed`](crate::Outcome)). Any other
//! error is the body's, unchanged. Concurrent repeats wait on the index,
//! as any two inserts of one key do, and replay the winner's row.
//!
//! Which violation is the duplicate is the database's to say (see
//! `docs/unique.md`): PostgreSQL names the constraint (23505); MySQL and
//! MariaDB the key, at the end of error 1062's message; SQLite only the
//! columns (2067, 1555), so the index's columns are read once.
//!
//! - [`Guard::unique`](crate::Guard::unique) and
//!   [`Guard::unique_state`](crate::Guard::unique_state) (in `guard`);
//! - [`insert`]: the claim without a failing statement
//!   (`INSERT ... ON CONFLICT ON CONSTRAINT ... DO NOTHING`), so that
//!   PostgreSQL needs no savepoint;
//! - [`DatabaseFailure`]: how the guard finds the database's error inside
//!   the body's own error type.
//!
//! The user's guide is `docs/unique.md` (the facade's `idem::unique`).

pub(crate) mod guard;

use std::error::Error as StdError;

use sqlx::error::{DatabaseError, ErrorKind};

pub use guard::{Completed, Replaying, UniqueTicket};

use crate::store::sql::SqlBackend;

/// Run `query`, an `INSERT` whose conflict clause names `constraint` and
/// does nothing (`ON CONFLICT ON CONSTRAINT uk_pay_no DO NOTHING` on
/// PostgreSQL, `ON CONFLICT (pay_no) DO NOTHING` on SQLite): if it
/// inserted no row, the `Err` is a unique-key violation on `constraint`,
/// as the guard recognises it. The statement itself never fails on the
/// key, so on PostgreSQL the transaction stays usable and a guard with
/// `savepoint(false)` (`savepoint = false`) sends nothing of its own.
/// (On MySQL/MariaDB write a plain `INSERT`: a duplicate-key error there
/// rolls back only its statement; `INSERT IGNORE` would also swallow other
/// errors.)
///
/// Returns what the statement changed.
pub async fn insert<'c, 'q, DB, X, Q>(executor: X, constraint: &str, query: Q) -> Result<u64, sqlx::Error>
where
    DB: SqlBackend,
    X: sqlx::Executor<'c, Database = DB>,
    Q: sqlx::Execute<'q, DB> + 'q,
{
    let done = executor.execute(query).await?;
    match <DB as crate::store::sql::dialect::Dialect>::rows(&done) {
        0 => Err(sqlx::Error::Database(Box::new(AlreadyClaimed { constraint: constraint.to_owned() }))),
        rows => Ok(rows),
    }
}

/// What [`insert`] returns when its row was there already: a unique-key
/// violation on the constraint, told without a failed statement.
#[derive(Debug)]
struct AlreadyClaimed {
    constraint: String,
}

impl std::fmt::Display for AlreadyClaimed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "duplicate key on `{}` (the insert's conflict clause did nothing)", self.constraint)
    }
}

impl StdError for AlreadyClaimed {}

impl DatabaseError for AlreadyClaimed {
    fn message(&self) -> &str {
        "duplicate key: the insert's conflict clause did nothing"
    }

    fn as_error(&self) -> &(dyn StdError + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn StdError + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn StdError + Send + Sync + 'static> {
        self
    }

    fn constraint(&self) -> Option<&str> {
        Some(&self.constraint)
    }

    fn kind(&self) -> ErrorKind {
        ErrorKind::UniqueViolation
    }
}

/// An error type in which the guard of `strategy = "unique"` can find the
/// database's error: any `std::error::Error` whose chain of `source()`s
/// holds the `sqlx::Error` (a thiserror variant `Db(#[from] sqlx::Error)`,
/// `#[error(transparent)]` too) or is one.
#[diagnostic::on_unimplemented(
    message = "strategy `unique` cannot look for the database's error inside `{Self}`",
    label = "the body's error type",
    note = "implement `std::error::Error` for `{Self}` with the `sqlx::Error` as a `source()` (thiserror: a variant `Db(#[from] sqlx::Error)`): only a unique-key violation on the constraint found there is a duplicate"
)]
pub trait DatabaseFailure {
    /// The unique-key violation in this error, if it holds one of `DB`'s
    /// (or one [`insert`] returned).
    #[doc(hidden)]
    fn violation<DB: SqlBackend>(&self) -> Option<Found>;
}

/// A violation found in a body's error.
#[doc(hidden)]
#[derive(Debug)]
pub enum Found {
    /// [`insert`]'s: its constraint by name.
    Claimed(String),
    /// The database's own.
    Violation(crate::store::sql::unique::Violation),
}

impl<E: StdError + 'static> DatabaseFailure for E {
    fn violation<DB: SqlBackend>(&self) -> Option<Found> {
        let mut next: Option<&(dyn StdError + 'static)> = Some(self);
        while let Some(error) = next {
            let database = match error.downcast_ref::<sqlx::Error>() {
                Some(sqlx::Error::Database(database)) => Some(&**database),
                Some(_) => None,
                // What `sqlx::Error::source()` gives, seen past a
                // transparent variant.
                None => error.downcast_ref::<Box<dyn DatabaseError>>().map(|d| &**d),
            };
            if let Some(claimed) = database.and_then(|d| d.try_downcast_ref::<AlreadyClaimed>()) {
                return Some(Found::Claimed(claimed.constraint.clone()));
            }
            if let Some(claimed) = error.downcast_ref::<AlreadyClaimed>() {
                return Some(Found::Claimed(claimed.constraint.clone()));
            }
            if let Some(violation) = database.and_then(DB::violation) {
                return Some(Found::Violation(violation));
            }
            next = error.source();
        }
        None
    }
}
