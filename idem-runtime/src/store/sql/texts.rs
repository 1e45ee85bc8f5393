//! What an `idem::Tx` (feature `tx`) needs of a database: the guard's
//! statements as texts that travel with `BEGIN` and `COMMIT` (PostgreSQL),
//! or none (MySQL/MariaDB and SQLite take the plain statements of a
//! `sqlx::Transaction`: the docs of `idem::Tx` say why). Implemented in the `Tx`'s
//! own module, one file per database, and built with the other statements
//! for the record table ([`Statements`](super::Statements)); without the
//! feature, the bound holds for every type and asks nothing.

#[cfg(feature = "tx")]
use super::{ExistingRecord, NewRecord, SqlBackend};
#[cfg(feature = "tx")]
use crate::table::RecordTable;

/// A database an `idem::Tx` runs on. Sealed: implemented for the supported
/// databases only.
#[cfg(feature = "tx")]
#[doc(hidden)]
pub trait TxSql: super::sealed::Sealed {
    /// The texts of the guard's statements on `table`; `None`: the `Tx`
    /// sends the plain statements, one by one.
    fn texts(table: &RecordTable) -> Option<Texts> {
        let _ = table;
        None
    }

    /// How the `Tx`'s texts roll back (MySQL: whatever the session's
    /// `completion_type`, no chained transaction and no disconnect).
    const ROLLBACK: &'static str = "ROLLBACK";
}

/// Without the `tx` feature: nothing.
#[cfg(not(feature = "tx"))]
#[doc(hidden)]
pub trait TxSql {}

#[cfg(not(feature = "tx"))]
impl<T> TxSql for T {}

/// The guard's statements as text, for one record table, values written in
/// as literals no value can break out of (see the docs of `idem::Tx`).
#[cfg(feature = "tx")]
#[doc(hidden)]
pub struct Texts {
    /// What ends a commit text. sqlx lowers its transaction depth only by
    /// rolling back, so `Tx::commit` queues a `ROLLBACK` after the text:
    /// PostgreSQL warns of a `ROLLBACK` outside a transaction (a log line
    /// per commit), so its text begins an empty one for it
    /// (`COMMIT; BEGIN`).
    pub commit: &'static str,
    /// The record table as written into the texts (a validated name).
    pub table: String,
    /// Where the claim and the read are prepared once per session and the
    /// texts name them (PostgreSQL).
    pub prepared: Option<Prepared>,
    /// The claim, a plain `INSERT` whose unique-key error stops the rest
    /// of the text; `true`: as an `EXECUTE` of the prepared statement.
    pub claim: fn(&Texts, &NewRecord<'_>, bool) -> String,
    /// The read of a refused claim's record (scope, key, prepared), for
    /// autocommit: after the `ROLLBACK` of the refused claim, a fresh
    /// statement that sees the latest commit.
    pub read: fn(&Texts, &str, &str, bool) -> String,
    /// The removal of an expired record (scope, key), before a claim.
    pub discard_expired: fn(&Texts, &str, &str) -> String,
    /// The answer (scope, key, JSON), failing (before a `COMMIT` after it)
    /// when it matches no record. Written out, naming no prepared
    /// statement: the body before it may have deallocated them.
    pub complete: fn(&Texts, &str, &str, &str) -> String,
    /// The SQLSTATE with which [`complete`](Self::complete) says it
    /// matched no record.
    pub no_record: &'static str,
    /// `claim = "commit"`: the record `DONE` with its answer (`None`:
    /// not kept), a plain `INSERT` whose unique-key error stops the text
    /// before the `COMMIT` after it. Written out, as `complete` is.
    pub insert_done: fn(&Texts, &NewRecord<'_>, Option<&str>) -> String,
    /// The record table's own name, as the server names the table of a
    /// unique-key error (PostgreSQL), to tell the record's duplicate from
    /// one of the body's deferred constraints failing at `COMMIT`.
    pub table_name: String,
}

/// Statements prepared once per session.
#[cfg(feature = "tx")]
#[doc(hidden)]
pub struct Prepared {
    /// The `PREPARE` of the claim, and the name it gives it.
    pub claim: String,
    pub claim_name: String,
    /// The `PREPARE` of the read, and the name it gives it.
    pub read: String,
    pub read_name: String,
    /// Whether an error says that a text named a statement the session has
    /// not prepared (PostgreSQL 26000).
    pub is_unprepared: fn(&sqlx::Error) -> bool,
    /// A row if the session holds a statement under the claim's name that
    /// is not the claim (the text that prepared it lacks the `PREPARE`
    /// above).
    pub claim_taken: String,
}

/// The texts of `DB` for the record table in use, if it has them.
#[cfg(feature = "tx")]
pub(crate) fn texts<DB: SqlBackend>() -> Option<&'static Texts> {
    super::statements::<DB>().tx.as_ref()
}

/// Run a text whose only rows are a [`Texts::read`]'s: the record.
#[cfg(feature = "tx")]
pub(crate) async fn read_text_record<DB: SqlBackend>(
    conn: &mut DB::Connection,
    text: sqlx::SqlStr,
) -> Result<Option<ExistingRecord>, sqlx::Error> {
    let row = DB::fetch_text(conn, text).await?;
    row.map(|row| super::record::decode_existing::<DB>(&row)).transpose()
}
