//! [`Tx`] (feature `tx`): a transaction idem begins and commits itself.
//! `core` keeps its state and sends its texts; `context` is the guard's
//! steps on it ([`TxContext`](crate::dedup::context::TxContext)); one file
//! per database implements its texts.

mod context;
mod core;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::fmt;

use sqlx::pool::PoolConnection;
use sqlx_core::transaction::TransactionManager;

use self::core::{State, TxCore, pending_error, sql, vanished_or_taken};
use crate::error::Error;
use crate::store::sql::{SqlBackend, classify};

type Tm<DB> = <DB as sqlx::Database>::TransactionManager;

/// A transaction idem begins and commits itself, so that a `dedup`
/// guard's claim travels with `BEGIN` and its answer with `COMMIT`
/// (feature `tx`).
///
/// With a `sqlx::Transaction` the guard sends its own statements: a claim
/// after `BEGIN`, the answer before `COMMIT`, two round trips more than the
/// transaction alone. With an `idem::Tx` on PostgreSQL it sends none of its
/// own:
///
/// | | round trips (`sqlx::Transaction`) | round trips (`idem::Tx`) |
/// |---|---|---|
/// | first call | BEGIN, claim, body, answer, COMMIT | BEGIN + claim, body, answer + COMMIT |
/// | repeat | BEGIN, claim, read, COMMIT | claim (refused), ROLLBACK + read |
/// | first call, `claim = "commit"` | (as `"after"`) BEGIN, body, record, COMMIT | BEGIN, body, record + COMMIT |
/// | repeat, `claim = "commit"` | (as `"after"`) BEGIN, body, record (refused), ROLLBACK + BEGIN, read, COMMIT | BEGIN, body, record + COMMIT (refused), ROLLBACK + BEGIN + read |
///
/// `BEGIN` is held back until there is something to send with it: the
/// first guard's claim (`BEGIN; INSERT ...` as one text), or
/// [`Tx::open`]. The claim is a plain `INSERT`: on a repeat its unique-key
/// error stops the text before anything else runs, the guard rolls back and
/// reads the first answer (one more round trip), and nothing has begun, so
/// [`Tx::commit`] then sends nothing. The answer of a first call waits in
/// the `Tx` and goes out with `COMMIT` (`UPDATE ...; COMMIT`); if that
/// `UPDATE` finds no record the text fails before `COMMIT`, so a record is
/// never committed unfinished by it.
///
/// With `claim = "commit"` ([`Guard::claim_at_commit`](crate::Guard::claim_at_commit))
/// the guard writes once: after the body, the record with its answer is a
/// plain `INSERT` in the text of `COMMIT` (`INSERT ...; COMMIT`; on
/// PostgreSQL `INSERT ...; COMMIT; BEGIN`, for sqlx's `ROLLBACK`, as in
/// [`Tx::commit`]), so a first call
/// sends the statements of the transaction alone and one index insert
/// more. The guarded call ends the transaction: [`Tx::commit`] after it
/// sends nothing, and the connection serves nothing else. (Inside another
/// guard's body on the same `Tx` it is not the whole transaction: there it
/// is `claim = "after"`.) A repeat's
/// `INSERT` fails on the key, which stops the text before its `COMMIT`:
/// `ROLLBACK; BEGIN; <read>` then drops the body's writes and reads the
/// first answer, which the call returns. Only a unique-key error of the
/// record table counts as a repeat (PostgreSQL names the table: a
/// deferred constraint of the body's failing at `COMMIT` is an error); a
/// deadlock's victim replays a record committed meanwhile, or returns the
/// retryable deadlock. Any other error means nothing was committed, and
/// `Tx::commit` then fails too; a cancelled text leaves it unknown (as a
/// cancelled `COMMIT` does: the record and the body's writes commit
/// together or not at all), the `Tx` refuses to commit and a rerun
/// replays or runs. A record past its retention in the way cannot be
/// taken over (the body's writes went with the rollback): it is removed,
/// only if still expired, and the call returns [`Error::InProgress`] with
/// `retry_after` zero; the rerun writes its own. An answer over the
/// inline limit below, and MySQL/MariaDB and SQLite, take the bound
/// statements of `claim = "after"` (an expired record taken over in
/// place), then idem commits: the guarded call is still the whole
/// transaction.
///
/// Values in these texts (scope, key, fingerprint, answer) are literals no
/// value can break out of: escape-string literals in which every character
/// but ASCII letters, digits and a few marks is a Unicode escape
/// (`E'it\u0027s'`), or, for a value with non-ASCII characters, its UTF-8
/// in hex converted by the server, so neither depends on the session's
/// charset. The rest of the text is idem's own: integers it formats and
/// the validated record table name. The claim and the read
/// are prepared once per session and the texts name them
/// (`EXECUTE idem_claim_<hash>(...)`), so they are planned once, as sqlx's
/// own prepared statements are. A text that finds its statement missing
/// (a new session, a pooler's `DISCARD ALL`, an application's
/// `DEALLOCATE`) prepares it and runs again, one round trip more; one whose
/// name holds a statement of the application's (a `PREPARE` under idem's
/// name), or that cannot be prepared, is written out instead, for the rest
/// of the transaction. One of the application's that takes the claim's
/// own parameter types runs without an error and writes no record: the
/// answer then finds none, and the call fails with
/// [`Error::StatementTaken`], nothing committed (a repeat's body may have
/// run, its writes rolled back); idem deallocates that statement, and the
/// session's next claim prepares its own. (Checking every claim would cost
/// every call.) The answer is always written out: it goes with
/// `COMMIT`, after a body that may have deallocated the session's
/// statements, where a missing one would abort the transaction with the
/// body's writes and nothing left to retry; so are a `claim = "commit"`
/// record and the read after it. An answer over 256 KiB of JSON
/// is bound as a parameter instead (one more round trip).
///
/// **MySQL/MariaDB and SQLite** send the statements of a
/// `sqlx::Transaction`, bound and prepared, one by one: `BEGIN` (held back
/// until the first guard or [`Tx::open`]), the claim, the body, the answer,
/// `COMMIT`; `claim = "commit"` takes the statements of `claim = "after"`
/// there, then idem commits (the guarded call is still the whole
/// transaction). What the `Tx` still adds: a claim or answer cancelled
/// mid-flight closes the connection (SQLite: rolls back), a claim or
/// answer that failed forbids the commit, and
/// a first claim that InnoDB picks as a deadlock victim (claims waiting on
/// a first call that rolls back) is begun and sent again rather than
/// handed to the caller. SQLite has no network to save. On MySQL the texts
/// lost where the server is busy: at 16 clients they ran at 0.63 to 0.86 of
/// the guard on a `sqlx::Transaction`, on loopback and 500 µs away, and won
/// only with one client 500 µs away (BENCHMARKS.md, R1). Each text is
/// parsed at every call (MySQL has no statement a text could name without
/// session variables), and sqlx-mysql sends the `ROLLBACK` that lowers its
/// transaction depth after a text's `COMMIT` as a round trip of its own, so
/// a text saves at most one round trip of six.
///
/// ## Using it
///
/// ```no_run
/// # extern crate idem_runtime as idem;
/// # async fn demo(pool: sqlx::PgPool, trade_no: &str) -> Result<(), idem::Error> {
/// use idem::{Claim, Guard};
///
/// let mut tx = idem::begin(&pool).await?; // nothing sent yet
/// let coupon = match Guard::new("payments.on_pay").key(trade_no).dedup::<i64, _>(&mut tx).await? {
///     Claim::Replay(coupon) => coupon,
///     Claim::Run(ticket) => {
///         // In the body the transaction has begun: `*tx` is its connection
///         // (`**tx` in a function that takes `tx: &mut idem::Tx<_>`).
///         let id: i64 = sqlx::query_scalar("INSERT INTO coupons (trade_no) VALUES ($1) RETURNING id")
///             .bind(trade_no)
///             .fetch_one(&mut *tx)
///             .await?;
///         ticket.complete(&mut tx, Ok::<_, idem::Error>(id)).await??
///     }
/// };
/// tx.commit().await?; // the answer, then COMMIT, in one round trip
/// # let _ = coupon; Ok(()) }
/// ```
///
/// `#[idempotent]` functions take it like a `sqlx::Transaction`
/// (`tx: &mut idem::Tx<Postgres>`, or [`PgTx`]), and their bodies use
/// `&mut **tx` as before.
///
/// **Outside a guarded body, call [`Tx::open`] for the connection**
/// (`sqlx::query(..).execute(tx.open().await?)`): it sends `BEGIN` if
/// nothing has begun yet and is free after that. Deref (`&mut **tx`)
/// outside a guarded body panics unless `open` was called: after a
/// repeat nothing has begun, so a statement written after the guarded call
/// would otherwise run only on first calls and panic on every repeat; the
/// rule makes it panic on the first call, in your tests.
///
/// Dropping a `Tx` rolls it back, like a `sqlx::Transaction`. A claim or
/// read cancelled mid-flight (a dropped future, a timeout) leaves the
/// server's state unknown: the `Tx` then closes its connection instead of
/// returning it to the pool, and the server rolls back.
///
/// Isolation: [`begin_with`] takes the `BEGIN` statement
/// (`"BEGIN ISOLATION LEVEL REPEATABLE READ"`). Under REPEATABLE READ a
/// repeat replays directly (the claim's unique-key error, then a fresh
/// read), where a `sqlx::Transaction` answers with a serialization failure
/// to retry.
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
    /// or a `claim = "commit"` guard ended the transaction (committed, or
    /// rolled back on a repeat), nothing is sent.
    ///
    /// An error from the database means nothing was committed. An I/O
    /// error (or dropping this future) leaves it unknown, as with
    /// `sqlx::Transaction::commit`: running the whole call again is safe,
    /// it replays or runs.
    pub async fn commit(mut self) -> Result<(), Error> {
        if self.core.state == State::Ended {
            // A `claim = "commit"` guard committed it (or rolled it back
            // on a repeat): nothing is left to send.
            self.core.state = State::Closed;
            return Ok(());
        }
        if let Some(e) = self.core.unusable() {
            return Err(e);
        }
        if self.core.state == State::Deferred {
            self.core.state = State::Closed;
            return Ok(());
        }
        self.core.state = State::Busy;
        let conn = &mut *self.conn;
        let (pending, scopes) = self.core.take_pending();
        let Some(texts) = crate::store::sql::texts::texts::<DB>().filter(|_| !pending.is_empty()) else {
            Tm::<DB>::commit(conn).await.map_err(classify::<DB>)?;
            self.core.state = State::Closed;
            return Ok(());
        };
        // `COMMIT` (PostgreSQL: `COMMIT; BEGIN`), then sqlx's depth lowered
        // by a queued `ROLLBACK` (of the empty block): public sqlx lowers
        // its depth no other way. It goes out with the pool's ping when the
        // connection is returned.
        let text = format!("{pending}; {}", texts.commit);
        let sent = DB::execute_text(&mut *conn, sql(text)).await;
        Tm::<DB>::start_rollback(conn);
        self.core.state = State::Closed;
        match sent {
            Ok(_) => Ok(()),
            Err(e) => Err(vanished_or_taken::<DB>(conn, pending_error::<DB>(e, &scopes)).await),
        }
    }

    /// Roll back (nothing is sent if nothing has begun).
    pub async fn rollback(mut self) -> Result<(), Error> {
        match self.core.state {
            State::Deferred | State::Closed | State::Ended => {}
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
    /// elsewhere (see [`Tx`]).
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
            State::Deferred | State::Closed | State::Ended => {}
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
