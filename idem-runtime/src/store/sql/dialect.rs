//! What a database is to idem's SQL: a [`Dialect`] (how its statements are
//! written: placeholders, clocks, how a duration or one of idem's texts
//! travels, the few statements and steps that really differ), over the
//! sqlx driver ([`Driver`]: binding, reading, sending, the same for every
//! database). The statements themselves are written once, per concern
//! (`record`, `lease`, `schema`, `admin`, and `state::sql` for the state
//! machines), from the dialect's pieces; [`Stmt`] is one of them as one
//! database takes it.

use std::sync::Arc;
use std::time::Duration;

use crate::future::BoxFuture;
use crate::table::RecordTable;

/// A statement of idem's, its values not yet all bound.
pub(crate) type Query<DB> = sqlx::query::Query<'static, DB, <DB as sqlx::Database>::Arguments>;

/// What idem needs of a sqlx driver: send a statement, bind an integer or
/// a string, read a column. Implemented once, for every database whose
/// driver can (a blanket impl carrying the bounds), so that code generic
/// over a [`Dialect`] needs no bound of its own.
#[doc(hidden)]
pub trait Driver: sqlx::Database {
    /// Run `query`: what it changed.
    fn execute(
        conn: &mut Self::Connection,
        query: Query<Self>,
    ) -> BoxFuture<'_, Result<Self::QueryResult, sqlx::Error>>;
    /// Run `query`: its row, if any.
    fn fetch_optional(
        conn: &mut Self::Connection,
        query: Query<Self>,
    ) -> BoxFuture<'_, Result<Option<Self::Row>, sqlx::Error>>;
    /// Run `query`: its one row.
    fn fetch_one(conn: &mut Self::Connection, query: Query<Self>) -> BoxFuture<'_, Result<Self::Row, sqlx::Error>>;
    /// Run `query`: its rows.
    fn fetch_all(conn: &mut Self::Connection, query: Query<Self>)
    -> BoxFuture<'_, Result<Vec<Self::Row>, sqlx::Error>>;
    /// Run a text of `;`-separated statements (the simple protocol).
    fn execute_text(
        conn: &mut Self::Connection,
        text: sqlx::SqlStr,
    ) -> BoxFuture<'_, Result<Self::QueryResult, sqlx::Error>>;
    /// Run a text whose only rows are its last statement's: the first row.
    fn fetch_text(
        conn: &mut Self::Connection,
        text: sqlx::SqlStr,
    ) -> BoxFuture<'_, Result<Option<Self::Row>, sqlx::Error>>;
    fn bind_int(query: Query<Self>, value: i64) -> Query<Self>;
    fn bind_str(query: Query<Self>, value: Option<&str>) -> Query<Self>;
    fn bind_bytes(query: Query<Self>, value: Option<&[u8]>) -> Query<Self>;
    /// `query`, not kept prepared for the session after it ran: a text
    /// written at run time, which another run would not send again.
    fn once(query: Query<Self>) -> Query<Self>;
    fn int(row: &Self::Row, i: usize) -> Result<i64, sqlx::Error>;
    fn opt_int(row: &Self::Row, i: usize) -> Result<Option<i64>, sqlx::Error>;
    fn opt_string(row: &Self::Row, i: usize) -> Result<Option<String>, sqlx::Error>;
    fn opt_bytes(row: &Self::Row, i: usize) -> Result<Option<Vec<u8>>, sqlx::Error>;
}

impl<DB> Driver for DB
where
    DB: sqlx::Database,
    DB::Arguments: sqlx::IntoArguments<DB> + 'static,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'a> Option<&'a str>: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    for<'a> Option<&'a [u8]>: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    for<'a> i64: sqlx::Encode<'a, DB> + sqlx::Decode<'a, DB> + sqlx::Type<DB>,
    for<'a> String: sqlx::Decode<'a, DB> + sqlx::Type<DB>,
    for<'a> Vec<u8>: sqlx::Decode<'a, DB> + sqlx::Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
    DB: sqlx::database::HasStatementCache,
{
    fn execute(
        conn: &mut Self::Connection,
        query: Query<Self>,
    ) -> BoxFuture<'_, Result<Self::QueryResult, sqlx::Error>> {
        sqlx::Executor::execute(conn, query)
    }

    fn fetch_optional(
        conn: &mut Self::Connection,
        query: Query<Self>,
    ) -> BoxFuture<'_, Result<Option<Self::Row>, sqlx::Error>> {
        sqlx::Executor::fetch_optional(conn, query)
    }

    fn fetch_one(conn: &mut Self::Connection, query: Query<Self>) -> BoxFuture<'_, Result<Self::Row, sqlx::Error>> {
        sqlx::Executor::fetch_one(conn, query)
    }

    fn fetch_all(
        conn: &mut Self::Connection,
        query: Query<Self>,
    ) -> BoxFuture<'_, Result<Vec<Self::Row>, sqlx::Error>> {
        sqlx::Executor::fetch_all(conn, query)
    }

    fn execute_text(
        conn: &mut Self::Connection,
        text: sqlx::SqlStr,
    ) -> BoxFuture<'_, Result<Self::QueryResult, sqlx::Error>> {
        sqlx::Executor::execute(conn, sqlx::raw_sql(text))
    }

    fn fetch_text(
        conn: &mut Self::Connection,
        text: sqlx::SqlStr,
    ) -> BoxFuture<'_, Result<Option<Self::Row>, sqlx::Error>> {
        sqlx::Executor::fetch_optional(conn, sqlx::raw_sql(text))
    }

    fn bind_int(query: Query<Self>, value: i64) -> Query<Self> {
        query.bind(value)
    }

    fn bind_str(query: Query<Self>, value: Option<&str>) -> Query<Self> {
        query.bind(value)
    }

    fn bind_bytes(query: Query<Self>, value: Option<&[u8]>) -> Query<Self> {
        query.bind(value)
    }

    fn once(query: Query<Self>) -> Query<Self> {
        query.persistent(false)
    }

    fn int(row: &Self::Row, i: usize) -> Result<i64, sqlx::Error> {
        sqlx::Row::try_get(row, i)
    }

    fn opt_int(row: &Self::Row, i: usize) -> Result<Option<i64>, sqlx::Error> {
        sqlx::Row::try_get(row, i)
    }

    fn opt_string(row: &Self::Row, i: usize) -> Result<Option<String>, sqlx::Error> {
        sqlx::Row::try_get(row, i)
    }

    fn opt_bytes(row: &Self::Row, i: usize) -> Result<Option<Vec<u8>>, sqlx::Error> {
        sqlx::Row::try_get(row, i)
    }
}

/// The rows a statement changed, as each driver's result tells them.
#[doc(hidden)]
pub trait RowsChanged {
    fn rows(&self) -> u64;
}

macro_rules! rows_changed {
    ($($feature:literal $result:ty),*) => {$(
        #[cfg(feature = $feature)]
        impl RowsChanged for $result {
            fn rows(&self) -> u64 {
                self.rows_affected()
            }
        }
    )*};
}

rows_changed!(
    "postgres" sqlx::postgres::PgQueryResult,
    "mysql" sqlx::mysql::MySqlQueryResult,
    "sqlite" sqlx::sqlite::SqliteQueryResult
);

/// How a statement names its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placeholders {
    /// Numbered after this prefix (`$1`, `?1`): each value is bound once and
    /// may be named several times, in any order.
    Numbered(&'static str),
    /// `?`, one per value in the order of the text: a value named twice is
    /// bound twice (MySQL).
    Positional,
}

/// How `claim = "after"` takes over a record past its retention when its
/// insert meets it.
#[derive(Clone, Debug)]
pub enum TakeOver {
    /// An `UPDATE` of the record, only if it has expired, after the insert
    /// did nothing (rare, so not worth an upsert on every first call).
    Update,
    /// Read the record first, then that `UPDATE` only if it has expired.
    ReadThenUpdate,
    /// The insert itself takes it over: this is its conflict clause.
    InTheInsert(String),
}

/// How a SQL database keeps idem's records: the pieces its statements are
/// written with, and the few statements and steps of its own. Implemented
/// in one file per database (`postgres.rs`, `mysql.rs`, `sqlite.rs`);
/// sealed. Items with a default are what most of them write. What a
/// database does its own way in a concern is a trait of that concern's
/// (`lease::LeaseClaimSql`, `schema::PurgeSql`).
#[doc(hidden)]
pub trait Dialect: Driver<QueryResult: RowsChanged> + super::sealed::Sealed {
    /// How the statements name their values.
    const PLACEHOLDERS: Placeholders;
    /// idem's own text values (scope, key, fingerprint, answer, owner) are
    /// bound and read as their UTF-8 bytes, never as strings.
    const TEXT_AS_BYTES: bool = false;
    /// Bind a duration as [`interval`](Self::interval) takes it.
    fn bind_span(query: Query<Self>, span: Duration) -> Query<Self>;
    /// Bind an entity's UUID key (as hyphenated text, unless the database
    /// has a type of its own).
    #[cfg(feature = "uuid")]
    fn bind_uuid(query: Query<Self>, uuid: &uuid::Uuid) -> Query<Self> {
        Self::bind_str(query, Some(&uuid.hyphenated().to_string()))
    }
    /// The rows a statement changed.
    fn rows(done: &Self::QueryResult) -> u64 {
        RowsChanged::rows(done)
    }

    /// The clock of what a statement in the caller's transaction writes and
    /// compares (`created_at`, a record past its retention).
    const NOW: &'static str;
    /// The statement's own clock: expiry and leases.
    const CLOCK: &'static str = Self::NOW;
    /// The duration bound as `value`, as a time takes it added or taken
    /// away.
    fn interval(value: &str) -> String;
    /// `time` plus the duration bound as `value`.
    fn after(time: &str, value: &str) -> String {
        format!("{time} + {}", Self::interval(value))
    }
    /// `time` less the duration bound as `value`.
    fn before(time: &str, value: &str) -> String {
        format!("{time} - {}", Self::interval(value))
    }
    /// Milliseconds from [`CLOCK`](Self::CLOCK) until `time` (negative once
    /// it has passed).
    fn ms_until(time: &str) -> String;
    /// A time column as milliseconds since the epoch.
    fn epoch_ms(time: &str) -> String {
        time.to_owned()
    }
    /// The type of a 64-bit integer, and of text, in a `CAST`.
    const INT: &'static str;
    const TEXT: &'static str;
    /// An expression as a 64-bit integer.
    fn int8(expression: &str) -> String {
        format!("CAST({expression} AS {})", Self::INT)
    }
    /// A condition as an integer: 1 true, 0 false.
    fn flag(condition: &str) -> String {
        Self::int8(condition)
    }
    /// One of idem's text values stored into a text column.
    fn text_value(value: &str) -> String {
        value.to_owned()
    }
    /// One of idem's text columns as a read returns it.
    fn text_column(column: &str) -> String {
        column.to_owned()
    }
    /// An entity's status column as an integer (`int`) or a text.
    fn cast(column: &str, int: bool) -> String {
        format!("CAST({column} AS {})", if int { Self::INT } else { Self::TEXT })
    }
    /// The function of the greater of two values.
    const GREATEST: &'static str = "greatest";

    /// What ends a claim's `INSERT` so that a duplicate key does nothing
    /// (no row changed); `None`: the insert fails with a unique-key error,
    /// the duplicate's signal.
    const ON_DUPLICATE: Option<&'static str> = Some(" ON CONFLICT (scope, idem_key) DO NOTHING");
    /// How `claim = "after"` takes over an expired record.
    fn take_over(table: &RecordTable) -> TakeOver {
        let _ = table;
        TakeOver::Update
    }
    /// Whether a completion sets `updated_at`.
    const COMPLETE_TOUCHES: bool = true;
    /// What ends a read that must see the latest committed row.
    const LATEST_READ: &'static str = "";
    /// What ends a read that locks its row for the change that follows.
    const FOR_UPDATE: &'static str = " FOR UPDATE";
    /// What ends a read that keeps its rows from changing until the
    /// transaction ends, without keeping others from reading them.
    const FOR_SHARE: &'static str = " FOR SHARE";
    /// No row locks: a read for a change that follows takes the database's
    /// write lock first.
    const WRITE_LOCK_FIRST: bool = false;
    /// The condition of a page of stuck records after `$2, $3` (scope, key;
    /// none: NULL), of scope `$1` (any: NULL).
    const PAGE: &'static str =
        "($1 IS NULL OR scope = $1) AND ($2 IS NULL OR scope > $2 OR (scope = $2 AND idem_key > $3))";
    /// `claim` and `moved` (a statement of the caller's table) as one
    /// statement that makes the move only if the claim inserted its record
    /// and returns both counts, where the database can.
    fn claim_and_move(claim: &str, moved: &str) -> Option<String> {
        let _ = (claim, moved);
        None
    }

    /// A statement that, in a transaction, makes migrations of concurrent
    /// start-ups take turns.
    const MIGRATION_LOCK: Option<&'static str> = None;
    /// A record table may name a schema.
    const TAKES_SCHEMA: bool = true;
    /// True when `err` says the record table does not exist.
    fn is_missing_table(err: &sqlx::Error) -> bool;
}

/// A value a statement binds.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg<'a> {
    /// One of idem's text values (`None`: NULL).
    Text(Option<&'a str>),
    /// Any other string (MySQL: a clock reading).
    #[cfg(feature = "mysql")]
    Str(&'a str),
    Int(i64),
    /// A duration, as the dialect binds one.
    Span(Duration),
    /// Bytes kept as they are (an outbox message's payload).
    #[cfg(feature = "outbox")]
    Bytes(&'a [u8]),
}

/// One of idem's text values.
pub(crate) fn text(value: &str) -> Arg<'_> {
    Arg::Text(Some(value))
}

impl Arg<'_> {
    fn bind<D: Dialect>(self, query: Query<D>) -> Query<D> {
        match self {
            Arg::Text(value) if D::TEXT_AS_BYTES => D::bind_bytes(query, value.map(str::as_bytes)),
            Arg::Text(value) => D::bind_str(query, value),
            #[cfg(feature = "mysql")]
            Arg::Str(value) => D::bind_str(query, Some(value)),
            Arg::Int(value) => D::bind_int(query, value),
            Arg::Span(span) => D::bind_span(query, span),
            #[cfg(feature = "outbox")]
            Arg::Bytes(bytes) => D::bind_bytes(query, Some(bytes)),
        }
    }
}

/// One of idem's statements as one database takes it: written with `$n`
/// for its n-th value (`$` stands nowhere else in idem's statements), it
/// names them in the dialect's placeholders and knows which value each
/// binds, so one text serves every database.
#[derive(Clone, Debug)]
#[doc(hidden)]
pub struct Stmt {
    sql: Arc<str>,
    /// For each value bound, in order, its index among the statement's.
    binds: Box<[usize]>,
}

impl Stmt {
    /// `text` in `D`'s placeholders. Numbered ones are renumbered without
    /// gaps (a database infers every parameter up to the highest), so a
    /// statement may leave some of its values out.
    pub(crate) fn new<D: Dialect>(text: &str) -> Stmt {
        let mut named = Vec::new();
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find('$') {
            let digits = rest[at + 1..].bytes().take_while(u8::is_ascii_digit).count();
            let n: usize = rest[at + 1..at + 1 + digits].parse().expect("`$` stands only before a value's number");
            parts.push(&rest[..at]);
            named.push(n);
            rest = &rest[at + 1 + digits..];
        }
        let mut used = named.clone();
        used.sort_unstable();
        used.dedup();
        let mut sql = String::with_capacity(text.len());
        for (part, n) in parts.into_iter().zip(&named) {
            sql.push_str(part);
            match D::PLACEHOLDERS {
                Placeholders::Numbered(prefix) => {
                    let rank = used.binary_search(n).expect("a value named is a value used") + 1;
                    sql.push_str(&format!("{prefix}{rank}"));
                }
                Placeholders::Positional => sql.push('?'),
            }
        }
        sql.push_str(rest);
        let binds = match D::PLACEHOLDERS {
            Placeholders::Numbered(_) => used,
            Placeholders::Positional => named,
        };
        Stmt { sql: sql.into(), binds: binds.into_iter().map(|n| n - 1).collect() }
    }

    pub(crate) fn sql(&self) -> &str {
        &self.sql
    }

    /// How many values the text takes (numbered placeholders: the highest).
    pub(crate) fn values(&self) -> usize {
        self.binds.len()
    }

    /// The statement with its values bound: `args[n - 1]` is `$n`.
    pub(crate) fn query<D: Dialect>(&self, args: &[Arg<'_>]) -> Query<D> {
        self.bind::<D>(sqlx::query(sqlx::AssertSqlSafe(self.sql.clone())), args)
    }

    /// Bind this statement's values onto `query`, a statement built around
    /// its text (whose own values come after these).
    pub(crate) fn bind<D: Dialect>(&self, query: Query<D>, args: &[Arg<'_>]) -> Query<D> {
        self.binds.iter().fold(query, |query, &i| args[i].bind::<D>(query))
    }
}

/// The placeholder of a statement's `n`-th value, for a statement built
/// at run time whose values are bound in the order it names them.
pub(crate) fn placeholder<D: Dialect>(n: usize) -> String {
    match D::PLACEHOLDERS {
        Placeholders::Numbered(prefix) => format!("{prefix}{n}"),
        Placeholders::Positional => "?".to_owned(),
    }
}

/// One of idem's text columns, as written (`None`: NULL).
pub(crate) fn read_text<D: Dialect>(row: &D::Row, i: usize) -> Result<Option<String>, sqlx::Error> {
    if !D::TEXT_AS_BYTES {
        return D::opt_string(row, i);
    }
    let utf8 = |bytes| {
        String::from_utf8(bytes).map_err(|e| sqlx::Error::ColumnDecode { index: format!("{i}"), source: e.into() })
    };
    D::opt_bytes(row, i)?.map(utf8).transpose()
}

/// [`read_text`] of a column that is never NULL.
pub(crate) fn read_required<D: Dialect>(row: &D::Row, i: usize) -> Result<String, sqlx::Error> {
    read_text::<D>(row, i)?
        .ok_or_else(|| sqlx::Error::ColumnDecode { index: format!("{i}"), source: "unexpected NULL".into() })
}

/// Whether an insert wrote its row: one row changed, or, for a dialect
/// without [`ON_DUPLICATE`](Dialect::ON_DUPLICATE), no unique-key error
/// (only that error is a duplicate; everything else surfaces).
pub(crate) fn inserted<D: Dialect>(done: Result<D::QueryResult, sqlx::Error>) -> Result<bool, sqlx::Error> {
    match done {
        Ok(done) => Ok(D::rows(&done) == 1),
        Err(e) if D::ON_DUPLICATE.is_none() && e.as_database_error().is_some_and(|d| d.is_unique_violation()) => {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "UPDATE t SET a = $3, b = $5 WHERE k = $1 AND (c = $3 OR d IS NULL)";

    #[cfg(feature = "postgres")]
    #[test]
    fn numbered_placeholders_are_renumbered_without_gaps() {
        let s = Stmt::new::<sqlx::Postgres>(TEXT);
        assert_eq!(s.sql(), "UPDATE t SET a = $2, b = $3 WHERE k = $1 AND (c = $2 OR d IS NULL)");
        assert_eq!(&*s.binds, [0, 2, 4], "each value bound once, in the order of its number");
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_numbers_its_placeholders_after_a_question_mark() {
        let s = Stmt::new::<sqlx::Sqlite>(TEXT);
        assert_eq!(s.sql(), "UPDATE t SET a = ?2, b = ?3 WHERE k = ?1 AND (c = ?2 OR d IS NULL)");
        assert_eq!(&*s.binds, [0, 2, 4]);
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn positional_placeholders_bind_a_value_where_it_stands() {
        let s = Stmt::new::<sqlx::MySql>(TEXT);
        assert_eq!(s.sql(), "UPDATE t SET a = ?, b = ? WHERE k = ? AND (c = ? OR d IS NULL)");
        assert_eq!(&*s.binds, [2, 4, 0, 2], "a value named twice is bound twice");
    }
}
