//! The state strategies' SQL, written once over the dialect: an entity's
//! compare-and-set ([`Cas`]), its status, and the claim of `dedup+state`
//! with its move. The entity's table, key and status columns are the
//! application's, as its state machine names them (checked by the derive:
//! plain identifiers, stored names without quotes or backslashes), so they
//! are written into the SQL as they are; only the key is bound.

use crate::dedup::context::EntityMove;
use crate::error::Error;
use crate::key::SqlKey;
use crate::machine::{Cas, StateCode, StateTable, StoredState};
use crate::store::sql::dialect::{Dialect, Query, placeholder};
use crate::store::sql::{ClaimResult, NewRecord, ReadMode, SqlBackend, classify, record, write_lock_sql};

/// `UPDATE <table> SET <status> = <to> WHERE <key> AND <status> IN (<from>...)`,
/// the key's placeholders numbered from `first`.
fn cas_sql<DB: Dialect>(cas: &Cas<'_>, first: usize) -> String {
    let t = cas.states;
    let from = cas.from.iter().map(|c| literal(*c)).collect::<Vec<_>>().join(", ");
    format!(
        "UPDATE {table} SET {col} = {to} WHERE {key} AND {col} IN ({from})",
        table = t.table,
        col = t.status_column,
        to = literal(cas.to),
        key = key_where::<DB>(t, first),
    )
}

fn key_where<DB: Dialect>(t: &StateTable, first: usize) -> String {
    let column = |(i, c): (usize, &&str)| format!("{c} = {}", placeholder::<DB>(first + i));
    t.key_columns.iter().enumerate().map(column).collect::<Vec<_>>().join(" AND ")
}

fn literal(code: StateCode) -> String {
    match code {
        StateCode::Int(i) => i.to_string(),
        StateCode::Text(s) => format!("'{}'", s.replace('\'', "''")),
    }
}

/// Bind the entity's key, in the order of its columns.
fn bind_key<DB: Dialect>(query: Query<DB>, key: &[SqlKey]) -> Query<DB> {
    key.iter().fold(query, |query, part| match part {
        SqlKey::Int(i) => DB::bind_int(query, *i),
        SqlKey::Text(s) => DB::bind_str(query, Some(s)),
        #[cfg(feature = "uuid")]
        SqlKey::Uuid(u) => DB::bind_uuid(query, u),
    })
}

fn query<DB: SqlBackend>(sql: String) -> Query<DB> {
    sqlx::query(sqlx::AssertSqlSafe(sql))
}

/// Make the move: the rows it changed.
pub(crate) async fn transition<DB: SqlBackend>(conn: &mut DB::Connection, cas: &Cas<'_>) -> Result<u64, Error> {
    let moved = bind_key::<DB>(query::<DB>(cas_sql::<DB>(cas, 1)), cas.key);
    let done = DB::execute(conn, moved).await.map_err(classify_state::<DB>(cas.states))?;
    Ok(DB::rows(&done))
}

/// The entity's current status, `None` when there is no such entity.
pub(crate) async fn read_state<DB: SqlBackend>(
    conn: &mut DB::Connection,
    cas: &Cas<'_>,
    mode: ReadMode,
) -> Result<Option<StoredState>, Error> {
    let t = cas.states;
    let failed = classify_state::<DB>(t);
    if mode == ReadMode::ForUpdate && DB::WRITE_LOCK_FIRST {
        let lock = query::<DB>(write_lock_sql(t.table, t.status_column));
        DB::execute(&mut *conn, lock).await.map_err(&failed)?;
    }
    let end = match mode {
        ReadMode::Latest => DB::LATEST_READ,
        ReadMode::ForUpdate => DB::FOR_UPDATE,
    };
    let int = matches!(t.codes.first(), Some(StateCode::Int(_)));
    let sql =
        format!("SELECT {} FROM {} WHERE {}{end}", DB::cast(t.status_column, int), t.table, key_where::<DB>(t, 1));
    let row = DB::fetch_optional(conn, bind_key::<DB>(query::<DB>(sql), cas.key)).await.map_err(&failed)?;
    row.map(|row| decode_state::<DB>(&row, t)).transpose().map_err(failed)
}

/// Column 0 of a status read, as the codes' type.
fn decode_state<DB: SqlBackend>(row: &DB::Row, states: &StateTable) -> Result<StoredState, sqlx::Error> {
    Ok(match states.codes.first() {
        Some(StateCode::Text(_)) => DB::opt_string(row, 0)?.map_or(StoredState::Null, StoredState::Text),
        _ => DB::opt_int(row, 0)?.map_or(StoredState::Null, StoredState::Int),
    })
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

impl<DB: SqlBackend> EntityMove<DB> for Cas<'_> {
    /// One statement where the dialect can (PostgreSQL, see
    /// [`Dialect::claim_and_move`]), else the claim and, if it inserted
    /// the record, the move.
    async fn claim_and_move(
        &self,
        conn: &mut DB::Connection,
        new: &NewRecord<'_>,
    ) -> Result<(ClaimResult, u64), Error> {
        let claim = record::claim_statement::<DB>();
        if let Some(both) = DB::claim_and_move(claim.sql(), &cas_sql::<DB>(self, claim.values() + 1)) {
            let both = bind_key::<DB>(claim.bind::<DB>(query::<DB>(both), &record::claim_args(new)), self.key);
            let counts = DB::fetch_one(conn, both).await.map_err(classify_state::<DB>(self.states))?;
            let (claimed, moved) = (DB::int(&counts, 0)?, DB::int(&counts, 1)?);
            let claim = if claimed == 1 { ClaimResult::Claimed } else { ClaimResult::Conflict };
            return Ok((claim, u64::try_from(moved).unwrap_or(0)));
        }
        if record::claim::<DB>(&mut *conn, new).await.map_err(classify_state::<DB>(self.states))?
            == ClaimResult::Conflict
        {
            return Ok((ClaimResult::Conflict, 0));
        }
        match transition::<DB>(&mut *conn, self).await {
            Ok(moved) => Ok((ClaimResult::Claimed, moved)),
            Err(e) => {
                // A failed statement leaves MySQL's and SQLite's transaction
                // usable: remove the record just claimed, so a caller that
                // commits anyway leaves no PROCESSING record behind.
                let _ = record::discard::<DB>(conn, new.scope, new.key).await;
                Err(e)
            }
        }
    }

    async fn make(&self, conn: &mut DB::Connection) -> Result<u64, Error> {
        transition::<DB>(conn, self).await
    }
}
