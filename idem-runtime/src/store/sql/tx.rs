//! [`Tx`]: a transaction idem begins and commits itself, so that a `dedup`
//! guard's claim travels with `BEGIN` and its answer with `COMMIT`. What it
//! sends when (round trips, texts, literals, prepared statements) and the
//! rules for its connection are documented for users in the `idem` crate's
//! `sql` module (`docs/dedup.md`, section "`idem::Tx`").

use std::fmt;

use sqlx::pool::PoolConnection;
use sqlx_core::transaction::TransactionManager;

use super::{ExistingRecord, NewRecord, SqlBackend, TxContext, classify};
use crate::error::Error;

type Tm<DB> = <DB as sqlx::Database>::TransactionManager;

/// JSON answers up to this size ride with `COMMIT` (as a literal: at most
/// six times as long on PostgreSQL, twice on MySQL, far below MySQL's
/// `max_allowed_packet`); larger ones are bound as a parameter, one round
/// trip more.
pub(crate) const INLINE_ANSWER_MAX: usize = 256 * 1024;

/// Where a [`Tx`] stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing sent: `BEGIN` waits for the first claim or [`Tx::open`].
    Deferred,
    /// The server is inside the transaction, and sqlx knows it (depth 1).
    Open,
    /// A text is in flight. If the future is dropped now, the server's state
    /// is known only when sqlx's depth says the transaction had begun.
    Busy,
    /// A text failed or was cancelled with the server's state unknown: the
    /// connection is closed when the `Tx` is dropped.
    Broken,
    /// The server is inside the transaction, but answers queued for
    /// `COMMIT` could not be stored (their text failed): it can only be
    /// rolled back.
    Failed,
    /// Committed or rolled back.
    Closed,
}

/// The bookkeeping of an [`idem::Tx`](Tx) that guards reach through
/// [`TxContext::tx_parts`]. Not a stable API.
#[doc(hidden)]
pub struct TxCore {
    state: State,
    /// The statement that begins the transaction.
    begin: String,
    /// Guard statements that go out with `COMMIT` (`; `-separated).
    pending: String,
    /// Guarded bodies running on this transaction (claimed, not completed).
    bodies: u32,
    /// [`Tx::open`] was called: the connection may be used outside bodies.
    opened: bool,
    /// A claim naming idem's prepared statement failed in this
    /// transaction's session otherwise than by its absence (the name holds
    /// a statement of the application's), or preparing it failed: the
    /// claims of this transaction carry the statement in full. Known per
    /// transaction, not per connection: sqlx keeps no state of a library's
    /// on a connection, and behind a transaction-mode pooler each
    /// transaction may run on another server session anyway.
    written_out: bool,
}

impl TxCore {
    fn new(begin: String) -> TxCore {
        TxCore { state: State::Deferred, begin, pending: String::new(), bodies: 0, opened: false, written_out: false }
    }

    /// Nothing has begun: a claim can travel with `BEGIN`.
    pub(crate) fn is_deferred(&self) -> bool {
        self.state == State::Deferred
    }

    pub(crate) fn is_open(&self) -> bool {
        self.state == State::Open
    }

    /// A guarded body starts on this transaction (its claim said `Run`).
    pub(crate) fn body_started(&mut self) {
        self.bodies += 1;
    }

    pub(crate) fn body_ended(&mut self) {
        self.bodies = self.bodies.saturating_sub(1);
    }

    /// Queue a guard statement to go out with `COMMIT`.
    pub(crate) fn queue(&mut self, statement: &str) {
        if !self.pending.is_empty() {
            self.pending.push_str("; ");
        }
        self.pending.push_str(statement);
    }

    fn unusable(&self) -> Option<Error> {
        match self.state {
            State::Broken | State::Busy => Some(Error::TxUnusable {
                reason: "an earlier statement of it was cancelled or failed with the server's state unknown",
            }),
            State::Failed => Some(Error::TxUnusable {
                reason: "the answer of an earlier guarded call in it could not be stored; roll it back",
            }),
            State::Closed => Some(Error::TxUnusable { reason: "it was committed or rolled back" }),
            _ => None,
        }
    }

    /// Make the transaction ready for statements of the guard's own: begin
    /// it if nothing has begun (one round trip), and send the statements
    /// queued for `COMMIT` first, so that a guard on the same transaction
    /// sees the answers of the ones before it.
    pub(crate) async fn ready<DB: SqlBackend>(&mut self, conn: &mut DB::Connection) -> Result<(), Error> {
        if let Some(e) = self.unusable() {
            return Err(e);
        }
        if self.state == State::Deferred {
            self.state = State::Busy;
            if let Err(e) = Tm::<DB>::begin(conn, Some(sql(self.begin.clone()))).await {
                // sqlx's depth is 0 while the server may still be inside a
                // block (sqlx 0.9 does not end it): end it, or give up the
                // connection.
                self.end_failed_begin::<DB>(conn, None).await.ok();
                return Err(classify::<DB>(e));
            }
            self.state = State::Open;
            return Ok(());
        }
        if !self.pending.is_empty() {
            let text = std::mem::take(&mut self.pending);
            self.state = State::Busy;
            let sent = DB::execute_text(&mut *conn, sql(text)).await;
            // A failure leaves the server inside the transaction (aborted on
            // PostgreSQL) without the answers: it must not commit now.
            self.state = if sent.is_ok() { State::Open } else { State::Failed };
            sent.map_err(|e| pending_error::<DB>(e))?;
        }
        Ok(())
    }

    /// After a refused `BEGIN` text: `ROLLBACK` (with a read riding along),
    /// in one round trip. Back to `Deferred` when it went through,
    /// `Broken` when not.
    async fn end_failed_begin<DB: SqlBackend>(
        &mut self,
        conn: &mut DB::Connection,
        read: Option<String>,
    ) -> Result<Option<ExistingRecord>, sqlx::Error> {
        self.state = State::Busy;
        let found = match read {
            None => DB::execute_text(&mut *conn, sql(DB::ROLLBACK_TEXT.to_owned())).await.map(|_| None),
            Some(read) => DB::read_text_record(&mut *conn, sql(format!("{}; {read}", DB::ROLLBACK_TEXT))).await,
        };
        // Only an I/O error leaves the server's state unknown; an error of
        // the read itself (a missing table) came after the ROLLBACK.
        self.state = match &found {
            Err(sqlx::Error::Database(_)) | Ok(_) => State::Deferred,
            Err(_) => State::Broken,
        };
        found
    }

    /// `BEGIN` and a claim in one text. `Ok(None)`: claimed, the
    /// transaction is open. `Ok(Some(found))`: the key is held (the claim's
    /// unique-key error); the failed block was rolled back and `found` read
    /// in the same round trip (`None`: gone meanwhile, claim again). With
    /// `take_over`, an expired record is deleted first, in the same text.
    pub(crate) async fn claim_with_begin<DB: SqlBackend>(
        &mut self,
        conn: &mut DB::Connection,
        record: &NewRecord<'_>,
        take_over: bool,
    ) -> Result<Option<Option<ExistingRecord>>, Error> {
        if let Some(e) = self.unusable() {
            return Err(e);
        }
        debug_assert!(self.state == State::Deferred);
        let prepare = DB::prepare_claim_text();
        // At most three texts: the claim naming the prepared statement; if
        // the session has none, rolling that back, preparing it and the
        // claim again, in one; if that fails too, or the name holds another
        // statement (an application's `PREPARE` under idem's name: wrong
        // parameters), the claim written out.
        let mut prepare_first = false;
        loop {
            let exec = prepare.is_some() && !self.written_out;
            let mut text = String::new();
            let prepare = prepare.as_deref().filter(|_| prepare_first);
            if prepare.is_some() {
                text.push_str(DB::ROLLBACK_TEXT);
                text.push_str("; ");
            }
            text.push_str(&self.begin);
            text.push_str("; ");
            // After the BEGIN, not before: a statement before it would run
            // in an implicit transaction that the BEGIN then takes over, and
            // its isolation level could no longer be set (25001). A
            // statement prepared in a transaction stays when it rolls back.
            if let Some(prepare) = prepare {
                text.push_str(prepare);
                text.push_str("; ");
            }
            if take_over {
                text.push_str(&DB::discard_expired_text(record.scope, record.key));
                text.push_str("; ");
            }
            text.push_str(&DB::claim_text(record, exec));
            self.state = State::Busy;
            match Tm::<DB>::begin(conn, Some(sql(text))).await {
                Ok(()) => {
                    self.state = State::Open;
                    return Ok(None);
                }
                Err(e) if e.as_database_error().is_some_and(|d| d.is_unique_violation()) => {
                    let found = self.read_refused::<DB>(conn, record, exec).await;
                    return Ok(Some(found.map_err(classify::<DB>)?));
                }
                Err(e) if exec && !prepare_first && DB::is_unprepared(&e) => {
                    // The block the failed text began is still open: the
                    // next text rolls it back first (depth 0, so a dropped
                    // future closes the connection).
                    prepare_first = true;
                }
                Err(e) => {
                    self.end_failed_begin::<DB>(conn, None).await.ok();
                    if self.state != State::Deferred || !exec || !of_the_statement(&e) {
                        return Err(classify::<DB>(e));
                    }
                    // A real error of the statement (a missing table) comes
                    // back from the claim written out.
                    tracing::debug!(target: "idem", error = %e,
                        "idem's claim statement is not usable in this session; sending it in full");
                    (prepare_first, self.written_out) = (false, true);
                }
            }
        }
    }

    /// After a claim refused on the key: `ROLLBACK` and the read in one
    /// text. If the read named a statement the session has not prepared,
    /// it is prepared and read again in one more; if its name holds
    /// another statement, or preparing fails, the read is written out.
    /// (The read runs after the `ROLLBACK`, outside any transaction: a
    /// failed one costs nothing but its round trip.)
    async fn read_refused<DB: SqlBackend>(
        &mut self,
        conn: &mut DB::Connection,
        record: &NewRecord<'_>,
        exec: bool,
    ) -> Result<Option<ExistingRecord>, sqlx::Error> {
        let found = self.end_failed_begin::<DB>(conn, Some(DB::read_text(record.scope, record.key, exec))).await;
        match &found {
            Err(e) if exec && self.state == State::Deferred && of_the_statement(e) => {
                if let Some(prepare) = DB::prepare_read_text().filter(|_| DB::is_unprepared(e)) {
                    let text = format!("{prepare}; {}", DB::read_text(record.scope, record.key, true));
                    match DB::read_text_record(&mut *conn, sql(text)).await {
                        Err(e) if of_the_statement(&e) => {}
                        found => return found,
                    }
                }
                DB::read_text_record(&mut *conn, sql(DB::read_text(record.scope, record.key, false))).await
            }
            _ => found,
        }
    }
}

impl TxCore {
    /// `claim = "after"` found a repeat: roll back to the transaction's
    /// start and begin again with the Tx's own statement (its isolation
    /// level); the answers queued for `COMMIT` went with the rollback.
    pub(crate) async fn restart<DB: SqlBackend>(&mut self, conn: &mut DB::Connection) -> Result<(), sqlx::Error> {
        if Tm::<DB>::get_transaction_depth(conn) > 1 {
            return DB::restart(conn).await;
        }
        self.pending.clear();
        self.state = State::Busy;
        DB::execute_text(conn, sql(format!("{}; {}", DB::ROLLBACK_TEXT, self.begin))).await?;
        self.state = State::Open;
        Ok(())
    }
}

/// An error of the statement a text named, not of the server's state (a
/// lock or statement timeout, a deadlock, which a claim written out would
/// only meet again): its SQLSTATE's class is 42 (the name holds a
/// statement taking other parameters, or preparing failed: `42P05`, it
/// exists), 22 (a parameter of another type) or 26 (no such statement).
fn of_the_statement(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c.starts_with("42") || c.starts_with("22") || c.starts_with("26"))
}

fn sql(text: String) -> sqlx::SqlStr {
    use sqlx::SqlSafeStr as _;
    // Every dynamic value in these texts is an escaped or hex literal, an
    // integer idem formats, or the validated table name (see the module docs).
    sqlx::AssertSqlSafe(text).into_sql_str()
}

/// A queued statement failed: an answer's `UPDATE` that found no record
/// says so (PostgreSQL: division by zero, 22012; MySQL: a subquery of
/// more than one row, 1242, both raised on purpose by the text).
fn pending_error<DB: SqlBackend>(e: sqlx::Error) -> Error {
    let ours = match DB::BACKEND {
        "postgres" => "22012",
        _ => "21000",
    };
    if e.as_database_error().and_then(|d| d.code()).is_some_and(|c| c == ours) {
        return Error::Database(sqlx::Error::Protocol(
            "a dedup record vanished inside its own transaction before its answer was stored (deleted by the \
             body, or the server rolled the transaction back); nothing was committed"
                .to_owned(),
        ));
    }
    classify::<DB>(e)
}

/// A transaction that idem begins and commits, so that a `dedup` guard's
/// claim rides on `BEGIN` and its answer on `COMMIT`: no round trip of the
/// guard's own on PostgreSQL and MySQL/MariaDB. What it sends when, and
/// the rules for its connection: the `idem::sql` module docs, section
/// "`idem::Tx`".
///
/// Begin one with [`begin`] (or [`begin_with`]), hand `&mut tx` to guarded
/// functions, end it with [`commit`](Tx::commit) or
/// [`rollback`](Tx::rollback); dropping it rolls back. Inside a guarded
/// body, `&mut **tx` is the connection; elsewhere use [`Tx::open`].
pub struct Tx<DB: SqlBackend> {
    conn: PoolConnection<DB>,
    core: TxCore,
}

/// An [`idem::Tx`](Tx) on PostgreSQL.
#[cfg(feature = "postgres")]
pub type PgTx = Tx<sqlx::Postgres>;
/// An [`idem::Tx`](Tx) on MySQL or MariaDB.
#[cfg(feature = "mysql")]
pub type MySqlTx = Tx<sqlx::MySql>;
/// An [`idem::Tx`](Tx) on SQLite.
#[cfg(feature = "sqlite")]
pub type SqliteTx = Tx<sqlx::Sqlite>;

/// A connection from `pool`, as an [`idem::Tx`](Tx) whose `BEGIN` waits
/// for the first guard (nothing is sent yet).
pub async fn begin<DB: SqlBackend>(pool: &sqlx::Pool<DB>) -> Result<Tx<DB>, Error> {
    Tx::new(pool.acquire().await?)
}

/// [`begin`] with the statement that begins the transaction, e.g.
/// `"BEGIN ISOLATION LEVEL REPEATABLE READ"` on PostgreSQL,
/// `"START TRANSACTION READ WRITE"` on MySQL, `"BEGIN IMMEDIATE"` on
/// SQLite. The first guard's claim is sent after it in one text, so it
/// must be `BEGIN` or `START TRANSACTION` and its options only (letters,
/// digits, spaces, commas, `_`; no `;` and no comment), else
/// [`Error::InvalidBegin`]. MySQL sets a transaction's isolation level in
/// a statement before `START TRANSACTION`: set it for the session instead
/// (e.g. in the pool's `after_connect`).
pub async fn begin_with<DB: SqlBackend>(
    pool: &sqlx::Pool<DB>,
    statement: impl sqlx::SqlSafeStr,
) -> Result<Tx<DB>, Error> {
    let statement = check_begin(statement.into_sql_str().as_str())?;
    Tx::with_begin(pool.acquire().await?, statement)
}

/// The statement, if it begins a transaction and does nothing else.
fn check_begin(statement: &str) -> Result<String, Error> {
    let trimmed = statement.trim();
    let trimmed = trimmed.strip_suffix(';').unwrap_or(trimmed).trim_end();
    let invalid = |reason| Error::InvalidBegin { statement: statement.to_owned(), reason };
    if !trimmed.bytes().all(|b| b.is_ascii_alphanumeric() || b" ,_\t\r\n".contains(&b)) {
        return Err(invalid("it holds a character other than letters, digits, spaces, commas and `_`"));
    }
    let words: Vec<String> = trimmed.split_whitespace().take(2).map(str::to_ascii_uppercase).collect();
    match words.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["BEGIN", ..] | ["START", "TRANSACTION"] => Ok(trimmed.to_owned()),
        _ => Err(invalid("it does not start with `BEGIN` or `START TRANSACTION`")),
    }
}

impl<DB: SqlBackend> Tx<DB> {
    /// An `idem::Tx` on a connection already taken from a pool (nothing is
    /// sent yet); [`Error::TxUnusable`] if the connection is inside a
    /// transaction.
    pub fn new(conn: PoolConnection<DB>) -> Result<Tx<DB>, Error> {
        Tx::with_begin(conn, "BEGIN".to_owned())
    }

    fn with_begin(conn: PoolConnection<DB>, begin: String) -> Result<Tx<DB>, Error> {
        if Tm::<DB>::get_transaction_depth(&conn) > 0 {
            return Err(Error::TxUnusable { reason: "its connection is already inside a transaction" });
        }
        Ok(Tx { conn, core: TxCore::new(begin) })
    }

    /// The transaction's connection for statements outside guarded bodies:
    /// sends `BEGIN` first if nothing has begun (one round trip), and
    /// whatever guards queued for `COMMIT` if they must come first. Free
    /// once the transaction has begun. After it, `&mut **tx` works
    /// everywhere.
    pub async fn open(&mut self) -> Result<&mut DB::Connection, Error> {
        self.core.ready::<DB>(&mut self.conn).await?;
        self.core.opened = true;
        Ok(&mut self.conn)
    }

    /// Whether the transaction has begun on the server (a guard claimed, or
    /// [`open`](Tx::open) was called).
    pub fn is_begun(&self) -> bool {
        self.core.state == State::Open
    }

    /// Commit: the answers guards queued, then `COMMIT`, in one round trip
    /// (and one `ROLLBACK` of sqlx's bookkeeping that goes out with the
    /// connection's next use). If nothing has begun (every guard replayed),
    /// nothing is sent.
    ///
    /// An error from the database means nothing was committed. An I/O
    /// error (or dropping this future) leaves it unknown, as with
    /// `sqlx::Transaction::commit`: running the whole call again is safe,
    /// it replays or runs.
    pub async fn commit(mut self) -> Result<(), Error> {
        if let Some(e) = self.core.unusable() {
            return Err(e);
        }
        if self.core.state == State::Deferred {
            self.core.state = State::Closed;
            return Ok(());
        }
        self.core.state = State::Busy;
        let conn = &mut *self.conn;
        if self.core.pending.is_empty() {
            Tm::<DB>::commit(conn).await.map_err(classify::<DB>)?;
            self.core.state = State::Closed;
            return Ok(());
        }
        // `COMMIT` (PostgreSQL: `COMMIT; BEGIN`), then sqlx's depth lowered
        // by a queued `ROLLBACK` (of the empty block): public sqlx lowers
        // its depth no other way. It goes out with the pool's ping when the
        // connection is returned.
        let text = format!("{}; {}", std::mem::take(&mut self.core.pending), DB::COMMIT_TEXT);
        let sent = DB::execute_text(&mut *conn, sql(text)).await;
        Tm::<DB>::start_rollback(conn);
        self.core.state = State::Closed;
        sent.map(drop).map_err(pending_error::<DB>)
    }

    /// Roll back (nothing is sent if nothing has begun).
    pub async fn rollback(mut self) -> Result<(), Error> {
        match self.core.state {
            State::Deferred | State::Closed => {}
            State::Open | State::Failed => {
                self.core.state = State::Busy;
                Tm::<DB>::rollback(&mut self.conn).await?;
            }
            // Dropping the Tx closes the connection (the server rolls
            // back), or queues a ROLLBACK if sqlx knows a block is open.
            State::Busy | State::Broken => return Ok(()),
        }
        self.core.state = State::Closed;
        Ok(())
    }

    fn check_deref(&self) {
        match self.core.state {
            State::Open if self.core.bodies > 0 || self.core.opened => return,
            // Inside a body, a statement of a guard of its own was cut short:
            // the body's next statement reports what the server says.
            State::Busy | State::Broken | State::Failed if self.core.bodies > 0 => return,
            _ => {}
        }
        let why = match self.core.state {
            State::Deferred => "nothing has begun yet (a repeat that replayed leaves it so)",
            State::Open => "this is outside a guarded body",
            _ => "it is committed, rolled back or broken",
        };
        panic!(
            "`&mut **tx` on an idem::Tx outside a guarded body: {why}. Use `tx.open().await?` for statements \
             outside guarded functions (it begins the transaction if needed, and is free after that)"
        );
    }
}

impl<DB: SqlBackend> std::ops::Deref for Tx<DB> {
    type Target = DB::Connection;
    /// The connection, inside a guarded body or after [`Tx::open`]; panics
    /// elsewhere (see [`Tx::open`]).
    fn deref(&self) -> &DB::Connection {
        self.check_deref();
        &self.conn
    }
}

impl<DB: SqlBackend> std::ops::DerefMut for Tx<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.check_deref();
        &mut self.conn
    }
}

impl<DB: SqlBackend> Drop for Tx<DB> {
    fn drop(&mut self) {
        let depth = Tm::<DB>::get_transaction_depth(&self.conn);
        match self.core.state {
            State::Deferred | State::Closed => {}
            State::Busy if depth == 0 => self.conn.close_on_drop(),
            State::Broken => self.conn.close_on_drop(),
            // Queues the ROLLBACK; it goes out with the connection's next use.
            State::Open | State::Failed | State::Busy => Tm::<DB>::start_rollback(&mut self.conn),
        }
    }
}

impl<DB: SqlBackend> fmt::Debug for Tx<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tx")
            .field("state", &self.core.state)
            .field("begin", &self.core.begin)
            .field("pending_bytes", &self.core.pending.len())
            .field("bodies", &self.core.bodies)
            .finish_non_exhaustive()
    }
}

impl<DB: SqlBackend> TxContext for Tx<DB>
where
    DB::Connection: Send,
{
    type Db = DB;
    /// The connection, under the rules of `&mut **tx` (guards use
    /// `tx_parts`); a wrapper of an `idem::Tx` forwards `tx_parts` too.
    fn connection(&mut self) -> &mut DB::Connection {
        self.check_deref();
        &mut self.conn
    }
    fn tx_parts(&mut self) -> (&mut DB::Connection, Option<&mut TxCore>) {
        (&mut self.conn, Some(&mut self.core))
    }
}

#[cfg(test)]
mod tests {
    use super::check_begin;

    #[test]
    fn a_begin_statement_begins_and_does_nothing_else() {
        for good in [
            "BEGIN",
            "begin;",
            "BEGIN ISOLATION LEVEL REPEATABLE READ",
            "START TRANSACTION READ ONLY, WITH CONSISTENT SNAPSHOT",
            "BEGIN IMMEDIATE",
        ] {
            assert!(check_begin(good).is_ok(), "{good}");
        }
        for bad in [
            "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
            "BEGIN -- comment",
            "BEGIN /* c */",
            "BEGIN; DELETE FROM t",
            "BEGIN;;",
            "START",
            "STARTTRANSACTION",
            "BEGIN ISOLATION LEVEL 'x'",
            "",
        ] {
            assert!(check_begin(bad).is_err(), "{bad}");
        }
        assert_eq!(check_begin(" begin read write; ").unwrap(), "begin read write");
    }
}
