//! The record table: its name ([`RecordTable`]: `idem_records` unless the
//! application names another, with the outbox beside it) and what is built
//! for it ([`RecordSql`]:
//! each database's statements, built on first use). The installed
//! [`Stores`](crate::Stores) hold one, and every SQL step of idem takes its
//! statements from there.

use std::any::{Any, TypeId};
use std::sync::OnceLock;

use crate::error::Error;

/// The default record table.
const DEFAULT: &str = "idem_records";

/// The outbox beside the default record table.
const DEFAULT_OUTBOX: &str = "idem_outbox";

/// A record table's name: `name` or `schema.name`, each part an unquoted
/// SQL identifier (ASCII letters, digits and `_`, not starting with a
/// digit, at most 48 bytes so that `<name>_archive` and
/// `<name>_expires_at` fit every database's limit). The archive table is
/// `<table>_archive`, beside it, and the outbox (feature `outbox`) is
/// `idem_outbox` beside `idem_records`, `<table>_outbox` beside another.
///
/// A process keeps its records in one table, the one of the installed
/// [`Stores`](crate::Stores) ([`StoresBuilder::record_table`](crate::StoresBuilder::record_table)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordTable {
    schema: Option<String>,
    name: String,
    /// `name` or `schema.name`, and its archive, as written into SQL.
    qualified: String,
    archive: String,
    /// The outbox's own name, and as written into SQL.
    outbox_name: String,
    outbox: String,
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
        let in_schema = |name: &str| match schema {
            Some(schema) => format!("{schema}.{name}"),
            None => name.to_owned(),
        };
        let qualified = in_schema(name);
        let outbox_name = if name == DEFAULT { DEFAULT_OUTBOX.to_owned() } else { format!("{name}_outbox") };
        RecordTable {
            schema: schema.map(str::to_owned),
            name: name.to_owned(),
            archive: format!("{qualified}_archive"),
            outbox: in_schema(&outbox_name),
            outbox_name,
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

    /// The outbox table, qualified as the table is: `idem_outbox` beside
    /// `idem_records` (in its schema, if it names one), `<table>_outbox`
    /// beside a table named otherwise, so that two services with record
    /// tables of their own keep their messages apart.
    pub fn outbox(&self) -> &str {
        &self.outbox
    }

    /// `idem_records`, no schema.
    pub(crate) fn is_default(&self) -> bool {
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

/// A migration's text (written for `idem_records`) for `table`: every
/// `idem_records` (and so `idem_records_archive`) names `table`, every
/// `idem_outbox` its outbox, and the indexes are named after their table
/// alone (an index takes no schema of its own): `idem_records_expires_at`,
/// and the outbox's, each `idem_outbox_` and a suffix.
pub(crate) fn migration(text: &str, table: &RecordTable) -> String {
    if table.is_default() {
        return text.to_owned();
    }
    const INDEX: &str = "idem_records_expires_at";
    let outbox_index = format!("{}_", table.outbox_name);
    text.split(INDEX)
        .map(|part| {
            part.split(&format!("{DEFAULT_OUTBOX}_"))
                .map(|part| part.replace(DEFAULT, table.qualified()).replace(DEFAULT_OUTBOX, table.outbox()))
                .collect::<Vec<_>>()
                .join(&outbox_index)
        })
        .collect::<Vec<_>>()
        .join(&format!("{}_expires_at", table.name))
}

/// A record table and what is built for it: the statements of each
/// database (a type of `store::sql` per database), each built once, on
/// first use, and kept with the table for as long as it is in use.
pub(crate) struct RecordSql {
    table: RecordTable,
    /// One slot per kind of value built, taken in order: a database's
    /// statements are one kind, and three databases are all there are.
    built: [OnceLock<(TypeId, Box<dyn Any + Send + Sync>)>; 4],
}

impl RecordSql {
    pub(crate) fn new(table: RecordTable) -> RecordSql {
        RecordSql { table, built: Default::default() }
    }

    pub(crate) fn table(&self) -> &RecordTable {
        &self.table
    }

    /// The `T` built for this table, built by `build` if it is the first
    /// use. Without locks: the first empty slot takes the first kind that
    /// reaches it (a slot is filled once), so each kind is in one slot,
    /// found by every later look in the same order.
    pub(crate) fn built<T: Any + Send + Sync>(&self, build: impl FnOnce(&RecordTable) -> T) -> &T {
        let mut build = Some(build);
        for slot in &self.built {
            let (kind, value) = slot.get_or_init(|| {
                let build = build.take().expect("built once: the first empty slot is the last one tried");
                (TypeId::of::<T>(), Box::new(build(&self.table)))
            });
            if *kind == TypeId::of::<T>() {
                return value.downcast_ref().expect("a slot holds the kind it names");
            }
        }
        unreachable!("more kinds of statements than slots")
    }
}

/// On `idem_records`.
impl Default for RecordSql {
    fn default() -> Self {
        RecordSql::new(RecordTable::default())
    }
}

impl std::fmt::Debug for RecordSql {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RecordSql").field(&self.table.qualified).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(RecordTable::new("idem_records").is_ok());
        assert_eq!(RecordTable::new("billing.records").unwrap().archive(), "billing.records_archive");
        assert_eq!(RecordTable::new("billing.records").unwrap().outbox(), "billing.records_outbox");
        assert_eq!(RecordTable::new("billing.idem_records").unwrap().outbox(), "billing.idem_outbox");
        assert_eq!(RecordTable::default().outbox(), "idem_outbox");
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
        let text = "CREATE TABLE IF NOT EXISTS idem_outbox (x INT);\n\
                    CREATE INDEX IF NOT EXISTS idem_outbox_pending ON idem_outbox (x) WHERE y = 'idem_outbox';";
        assert_eq!(
            migration(text, &table),
            "CREATE TABLE IF NOT EXISTS billing.records_outbox (x INT);\n\
             CREATE INDEX IF NOT EXISTS records_outbox_pending ON billing.records_outbox (x) WHERE y = 'billing.records_outbox';"
        );
    }

    #[test]
    fn each_kind_is_built_once_for_its_table() {
        let sql = RecordSql::new(RecordTable::new("t").unwrap());
        let built = std::sync::atomic::AtomicUsize::new(0);
        let name = |t: &RecordTable| {
            built.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            t.qualified().to_owned()
        };
        assert_eq!(sql.built(name), "t");
        assert_eq!(*sql.built(|_| 7u8), 7);
        assert_eq!(sql.built(name), "t");
        assert_eq!(*sql.built(|_| 8u8), 7, "a kind is built once");
        assert_eq!(built.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
