//! The name of the record table: `idem_records` unless the application
//! names another (a schema of its own, a prefix its conventions want)
//! with [`set_record_table`], once, at start-up.
//!
//! The statements are written against `idem_records`; with another name
//! each is rewritten once, on first use, and kept (the default costs one
//! atomic load per statement).

use std::collections::HashMap;
use std::sync::{OnceLock, RwLock};

use crate::error::Error;

/// The default record table.
const DEFAULT: &str = "idem_records";

/// A record table's name: `name` or `schema.name`, each part an unquoted
/// SQL identifier (ASCII letters, digits and `_`, not starting with a
/// digit, at most 48 bytes so that `<name>_archive` and
/// `<name>_expires_at` fit every database's limit). The archive table is
/// `<table>_archive`, beside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordTable {
    schema: Option<String>,
    name: String,
    /// `name` or `schema.name`, and its archive, as written into SQL.
    qualified: String,
    archive: String,
}

impl RecordTable {
    /// Parse and check `table` (`"idem_records"`, `"billing.idem_records"`).
    pub fn new(table: &str) -> Result<RecordTable, Error> {
        let invalid = |reason: String| Error::InvalidTable { table: table.to_owned(), reason };
        let (schema, name) = match table.split_once('.') {
            Some((schema, name)) => (Some(schema), name),
            None => (None, table),
        };
        for part in schema.into_iter().chain([name]) {
            if part.is_empty() || part.len() > 48 {
                return Err(invalid(format!("`{part}` must be 1 to 48 bytes")));
            }
            if part.as_bytes()[0].is_ascii_digit() || !part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(invalid(format!(
                    "`{part}` must be ASCII letters, digits and `_`, not starting with a digit (no quoting)"
                )));
            }
        }
        Ok(RecordTable::of(schema, name))
    }

    fn of(schema: Option<&str>, name: &str) -> RecordTable {
        let qualified = match schema {
            Some(schema) => format!("{schema}.{name}"),
            None => name.to_owned(),
        };
        RecordTable {
            schema: schema.map(str::to_owned),
            name: name.to_owned(),
            archive: format!("{qualified}_archive"),
            qualified,
        }
    }

    /// As written: `name` or `schema.name`.
    pub fn qualified(&self) -> &str {
        &self.qualified
    }

    /// The schema, if one is named.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The table's own name, without its schema.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The archive table (`<table>_archive`), qualified as the table is.
    pub fn archive(&self) -> &str {
        &self.archive
    }

    fn is_default(&self) -> bool {
        self.schema.is_none() && self.name == DEFAULT
    }
}

impl Default for RecordTable {
    fn default() -> Self {
        RecordTable::of(None, DEFAULT)
    }
}

impl std::fmt::Display for RecordTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.qualified)
    }
}

static TABLE: OnceLock<RecordTable> = OnceLock::new();

/// Keep records in `table` instead of `idem_records` (e.g.
/// `"billing.idem_records"`; the archive goes to `<table>_archive`), for
/// every guard, store, migration and purge of this process.
///
/// Call it once at start-up, before [`migrate`](crate::migrate) and the
/// first guard: the name is fixed at its first use. Calling it again with
/// the same name is harmless; another name, or any name once the default
/// was used, is [`Error::InvalidTable`]: a process whose guards wrote to
/// two tables would run a repeat of a call the other table saw. Every
/// process of a service must name the same table.
///
/// On SQLite a table takes no schema (`"name"` only); on PostgreSQL the
/// schema must exist; on MySQL/MariaDB the schema is a database.
pub fn set_record_table(table: &str) -> Result<(), Error> {
    let wanted = RecordTable::new(table)?;
    let fixed = TABLE.get_or_init(|| wanted.clone());
    if *fixed == wanted {
        return Ok(());
    }
    Err(Error::InvalidTable {
        table: table.to_owned(),
        reason: format!(
            "the record table is already `{fixed}` in this process (set it once, at start-up, before the first guard)"
        ),
    })
}

/// The record table of this process (fixed from here on).
pub fn record_table() -> &'static RecordTable {
    TABLE.get_or_init(RecordTable::default)
}

/// Rewritten statements, by the address and length of their text.
static REWRITTEN: OnceLock<RwLock<HashMap<(usize, usize), &'static str>>> = OnceLock::new();

/// `statement` for this process's table.
pub(crate) fn sql(statement: &'static str) -> &'static str {
    let table = record_table();
    if table.is_default() {
        return statement;
    }
    let id = (statement.as_ptr() as usize, statement.len());
    let cache = REWRITTEN.get_or_init(Default::default);
    if let Some(done) = cache.read().unwrap_or_else(|e| e.into_inner()).get(&id) {
        return done;
    }
    // Each distinct statement is leaked once: a fixed, small set.
    let done: &'static str = Box::leak(rewrite(statement, table).into_boxed_str());
    let kept: &'static str = cache.write().unwrap_or_else(|e| e.into_inner()).entry(id).or_insert(done);
    kept
}

/// `statement` (built at run time) for this process's table.
pub(crate) fn owned(statement: impl Into<String>) -> String {
    let statement = statement.into();
    let table = record_table();
    if table.is_default() { statement } else { rewrite(&statement, table) }
}

/// A migration's text for this process's table: the index is named after
/// the table alone (an index takes no schema of its own).
pub(crate) fn schema(text: &'static str) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(migration(text, record_table()))
}

pub(crate) fn migration(text: &str, table: &RecordTable) -> String {
    if table.is_default() {
        return text.to_owned();
    }
    const INDEX: &str = "idem_records_expires_at";
    text.split(INDEX).map(|part| rewrite(part, table)).collect::<Vec<_>>().join(&format!("{}_expires_at", table.name))
}

/// Every `idem_records` (and so `idem_records_archive`) names `table`.
fn rewrite(statement: &str, table: &RecordTable) -> String {
    statement.replace(DEFAULT, table.qualified())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(RecordTable::new("idem_records").is_ok());
        assert_eq!(RecordTable::new("billing.records").unwrap().archive(), "billing.records_archive");
        for bad in ["", ".x", "x.", "a.b.c", "1abc", "drop table; --", "name\"", "ä", &"x".repeat(49)] {
            assert!(RecordTable::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_migration_keeps_its_index_unqualified() {
        let table = RecordTable::new("billing.records").unwrap();
        let text = "CREATE TABLE IF NOT EXISTS idem_records (x INT);\n\
                    CREATE INDEX IF NOT EXISTS idem_records_expires_at ON idem_records (expires_at);\n\
                    CREATE TABLE IF NOT EXISTS idem_records_archive (x INT);";
        assert_eq!(
            migration(text, &table),
            "CREATE TABLE IF NOT EXISTS billing.records (x INT);\n\
             CREATE INDEX IF NOT EXISTS records_expires_at ON billing.records (expires_at);\n\
             CREATE TABLE IF NOT EXISTS billing.records_archive (x INT);"
        );
    }
}
