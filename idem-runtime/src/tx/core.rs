//! The state of an [`idem::Tx`](super::Tx) and the texts it sends: `BEGIN`
//! with a claim, `ROLLBACK` with a read, the answers with `COMMIT`.

use sqlx_core::transaction::TransactionManager;

use crate::error::Error;
use crate::store::sql::texts::{Texts, read_text_record, texts};
use crate::store::sql::{ExistingRecord, InsertDone, NewRecord, SqlBackend, classify, record as sql_record};

type Tm<DB> = <DB as sqlx::Database>::TransactionManager;

/// JSON answers up to this size ride with `COMMIT` (as a literal: at most
/// six times as long); larger ones are bound as a parameter, one round
/// trip more.
pub(crate) const INLINE_ANSWER_MAX: usize = 256 * 1024;

/// Where a [`Tx`](super::Tx) stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    /// Nothing sent: `BEGIN` waits for the first claim or `Tx::open`.
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
    /// A `claim = "commit"` guard ended it: committed with its record, or
    /// rolled back on a repeat. `Tx::commit` and `Tx::rollback` send
    /// nothing; nothing else may use it.
    Ended,
}

/// The bookkeeping of an [`idem::Tx`](super::Tx).
pub(crate) struct TxCore {
    pub(super) state: State,
    /// The statement that begins the transaction.
    pub(super) begin: String,
    /// Guard statements that go out with `COMMIT` (`; `-separated).
    pub(super) pending: String,
    /// The scopes of the answers in `pending`, for an error that finds
    /// one's record gone.
    pub(super) pending_scopes: String,
    /// Guarded bodies running on this transaction (claimed, not completed).
    pub(super) bodies: u32,
    /// `Tx::open` was called: the connection may be used outside bodies.
    pub(super) opened: bool,
    /// A claim naming idem's prepared statement failed in this
    /// transaction's session otherwise than by its absence (the name holds
    /// a statement of the application's), or preparing it failed: the
    /// claims of this transaction carry the statement in full. Known per
    /// transaction, not per connection: sqlx keeps no state of a library's
    /// on a connection, and behind a transaction-mode pooler each
    /// transaction may run on another server session anyway.
    pub(super) written_out: bool,
    /// The guard about to claim (with bound statements) began this
    /// transaction for its claim: nothing of the caller's is in it yet.
    pub(super) claim_first: bool,
}

impl TxCore {
    pub(super) fn new(begin: String) -> TxCore {
        TxCore {
            state: State::Deferred,
            begin,
            pending: String::new(),
            pending_scopes: String::new(),
            bodies: 0,
            opened: false,
            written_out: false,
            claim_first: false,
        }
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

    /// Queue an answer's statement (of a guard of `scope`) to go out with
    /// `COMMIT`.
    pub(crate) fn queue(&mut self, statement: &str, scope: &str) {
        if !self.pending.is_empty() {
            self.pending.push_str("; ");
            self.pending_scopes.push_str(", ");
        }
        self.pending.push_str(statement);
        self.pending_scopes.push_str(scope);
    }

    /// A bound statement of the guard's goes out: until it
    /// [`landed`](Self::landed), dropping the `Tx` closes its connection
    /// (the server rolls back). SQLite, in the process and with nothing in
    /// flight on a wire, rolls back instead (`Busy`: closing a `:memory:`
    /// database's one connection would lose the database). The state to
    /// return to.
    pub(super) fn in_flight<DB: SqlBackend>(&mut self) -> State {
        let flying = if DB::BACKEND == "sqlite" { State::Busy } else { State::Broken };
        std::mem::replace(&mut self.state, flying)
    }

    /// The bound statement [`in_flight`](Self::in_flight) sent came back:
    /// back to `before` when the server answered (or idem refused), else
    /// `Broken`: the connection failed under the statement, and whether it
    /// ran is unknown.
    pub(super) fn landed<T>(&mut self, before: State, result: &Result<T, Error>) {
        use sqlx::Error as E;
        let known = match result {
            Ok(_) => true,
            Err(Error::Database(e)) => matches!(
                e,
                E::Database(_)
                    | E::RowNotFound
                    | E::ColumnDecode { .. }
                    | E::ColumnNotFound(_)
                    | E::ColumnIndexOutOfBounds { .. }
                    | E::TypeNotFound { .. }
                    | E::Decode(_)
                    | E::Encode(_)
            ),
            Err(_) => true,
        };
        self.state = if known { before } else { State::Broken };
    }

    /// A bound write of the guard's (a record, an answer) came back, as
    /// [`landed`](Self::landed); if it failed, the transaction can only
    /// roll back.
    pub(super) fn wrote<T>(&mut self, before: State, result: &Result<T, Error>) {
        self.landed(before, result);
        if result.is_err() {
            self.roll_back_only();
        }
    }

    /// A guard's bound claim, record or answer failed: the transaction can only
    /// roll back (the error may have rolled it back on the server already:
    /// a deadlock, or any error on PostgreSQL).
    pub(super) fn roll_back_only(&mut self) {
        if self.state == State::Open {
            self.state = State::Failed;
        }
    }

    /// The queued statements and their scopes, taken out.
    pub(super) fn take_pending(&mut self) -> (String, String) {
        (std::mem::take(&mut self.pending), std::mem::take(&mut self.pending_scopes))
    }

    pub(super) fn unusable(&self) -> Option<Error> {
        match self.state {
            State::Broken | State::Busy => Some(Error::TxUnusable {
                reason: "an earlier statement of it was cancelled or failed with the server's state unknown",
            }),
            State::Failed => Some(Error::TxUnusable {
                reason: "an earlier guarded call in it could not write its record or answer; roll it back",
            }),
            State::Closed => Some(Error::TxUnusable { reason: "it was committed or rolled back" }),
            State::Ended => Some(Error::TxUnusable {
                reason: "a guard with `claim = \"commit\"` ended it (its call is the whole transaction)",
            }),
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
            let (text, scopes) = self.take_pending();
            self.state = State::Busy;
            let sent = DB::execute_text(&mut *conn, sql(text)).await;
            // A failure leaves the server inside the transaction (aborted on
            // PostgreSQL) without the answers: it must not commit now.
            self.state = if sent.is_ok() { State::Open } else { State::Failed };
            if let Err(e) = sent {
                let error = pending_error::<DB>(e, &scopes);
                if !matches!(error, Error::RecordVanished { .. }) {
                    return Err(error);
                }
                // Ended here, to look at the session's statements (an
                // aborted transaction runs nothing); still `Failed`: a
                // commit is refused, a rollback sends nothing more.
                return Err(match Tm::<DB>::rollback(conn).await {
                    Ok(()) => vanished_or_taken::<DB>(conn, error).await,
                    Err(_) => error,
                });
            }
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
            None => DB::execute_text(&mut *conn, sql(DB::ROLLBACK.to_owned())).await.map(|_| None),
            Some(read) => read_text_record::<DB>(&mut *conn, sql(format!("{}; {read}", DB::ROLLBACK))).await,
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
        texts: &Texts,
        record: &NewRecord<'_>,
        take_over: bool,
    ) -> Result<Option<Option<ExistingRecord>>, Error> {
        if let Some(e) = self.unusable() {
            return Err(e);
        }
        debug_assert!(self.state == State::Deferred);
        // At most three texts: the claim naming the prepared statement; if
        // the session has none, rolling that back, preparing it and the
        // claim again, in one; if that fails too, or the name holds another
        // statement (an application's `PREPARE` under idem's name: wrong
        // parameters), the claim written out.
        let mut prepare_first = false;
        loop {
            let exec = texts.prepared.is_some() && !self.written_out;
            let text = self.claim_text::<DB>(texts, record, take_over, exec, prepare_first);
            self.state = State::Busy;
            match Tm::<DB>::begin(conn, Some(sql(text))).await {
                Ok(()) => {
                    self.state = State::Open;
                    return Ok(None);
                }
                Err(e) if e.as_database_error().is_some_and(|d| d.is_unique_violation()) => {
                    let found = self.read_refused::<DB>(conn, texts, record, exec).await;
                    return Ok(Some(found.map_err(classify::<DB>)?));
                }
                Err(e) if exec && !prepare_first && texts.prepared.as_ref().is_some_and(|p| (p.is_unprepared)(&e)) => {
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

    /// The text of [`claim_with_begin`](Self::claim_with_begin): `BEGIN`,
    /// then (`prepare_first`: after rolling back the block a text that
    /// found its statement missing left open) the `PREPARE`, the removal
    /// of an expired record (`take_over`), and the claim (`exec`: naming
    /// the prepared statement).
    fn claim_text<DB: SqlBackend>(
        &self,
        texts: &Texts,
        record: &NewRecord<'_>,
        take_over: bool,
        exec: bool,
        prepare_first: bool,
    ) -> String {
        let mut text = String::new();
        let prepare = texts.prepared.as_ref().filter(|_| prepare_first).map(|p| p.claim.as_str());
        if prepare.is_some() {
            text.push_str(DB::ROLLBACK);
            text.push_str("; ");
        }
        text.push_str(&self.begin);
        text.push_str("; ");
        // After the BEGIN, not before: a statement before it would run in
        // an implicit transaction that the BEGIN then takes over, and its
        // isolation level could no longer be set (25001). A statement
        // prepared in a transaction stays when it rolls back.
        if let Some(prepare) = prepare {
            text.push_str(prepare);
            text.push_str("; ");
        }
        if take_over {
            text.push_str(&(texts.discard_expired)(texts, record.scope, record.key));
            text.push_str("; ");
        }
        text.push_str(&(texts.claim)(texts, record, exec));
        text
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
        texts: &Texts,
        record: &NewRecord<'_>,
        exec: bool,
    ) -> Result<Option<ExistingRecord>, sqlx::Error> {
        let read = |prepared| (texts.read)(texts, record.scope, record.key, prepared);
        let found = self.end_failed_begin::<DB>(conn, Some(read(exec))).await;
        match &found {
            Err(e) if exec && self.state == State::Deferred && of_the_statement(e) => {
                if let Some(p) = texts.prepared.as_ref().filter(|p| (p.is_unprepared)(e)) {
                    let text = format!("{}; {}", p.read, read(true));
                    match read_text_record::<DB>(&mut *conn, sql(text)).await {
                        Err(e) if of_the_statement(&e) => {}
                        found => return found,
                    }
                }
                read_text_record::<DB>(&mut *conn, sql(read(false))).await
            }
            _ => found,
        }
    }

    /// `claim = "commit"`: the statements queued for `COMMIT`, the record
    /// with its answer, and `COMMIT`, in one text. A unique-key error on
    /// the record (or a deadlock, whose victim InnoDB has rolled back
    /// whole, or a serialization failure) stops the text before its `COMMIT`: the transaction is then
    /// rolled back, the body's writes with it, and the record read in one
    /// more text (`ROLLBACK; BEGIN; read`: sqlx still counts the block
    /// open, and the `ROLLBACK` queued for it ends the fresh one). Either
    /// way the `Tx` has ended.
    pub(crate) async fn commit_with_record<DB: SqlBackend>(
        &mut self,
        conn: &mut DB::Connection,
        texts: &Texts,
        record: &NewRecord<'_>,
        answer: Option<&str>,
    ) -> Result<Committed, Error> {
        if let Some(e) = self.unusable() {
            return Err(e);
        }
        debug_assert!(self.state == State::Open);
        let (mut text, scopes) = self.take_pending();
        if !text.is_empty() {
            text.push_str("; ");
        }
        text.push_str(&(texts.insert_done)(texts, record, answer));
        text.push_str("; ");
        text.push_str(texts.commit);
        self.state = State::Busy;
        let sent = DB::execute_text(&mut *conn, sql(text)).await;
        let refused = match sent {
            Ok(_) => {
                // sqlx's depth, lowered by a queued ROLLBACK (see `Tx::commit`).
                Tm::<DB>::start_rollback(conn);
                self.state = State::Ended;
                return Ok(Committed::Kept);
            }
            Err(e) if record_duplicate(&e, texts) => None,
            Err(e) => {
                let server_said = e.as_database_error().is_some();
                let error = pending_error::<DB>(e, &scopes);
                if !error.is_deadlock() {
                    // Nothing committed: a database error stops the text
                    // before its COMMIT, or is the COMMIT's own (a deferred
                    // constraint). `Closed`: a `Tx::commit` after it fails too.
                    Tm::<DB>::start_rollback(conn);
                    self.state = if server_said { State::Closed } else { State::Broken };
                    return Err(vanished_or_taken::<DB>(conn, error).await);
                }
                Some(error)
            }
        };
        let read = (texts.read)(texts, record.scope, record.key, false);
        let text = format!("{}; {}; {read}", DB::ROLLBACK, self.begin);
        let found = read_text_record::<DB>(&mut *conn, sql(text)).await;
        Tm::<DB>::start_rollback(conn);
        self.state = match &found {
            Ok(_) => State::Ended,
            Err(sqlx::Error::Database(_)) => State::Closed,
            Err(_) => State::Broken,
        };
        Ok(Committed::Refused { found: found.map_err(classify::<DB>)?, deadlock: refused })
    }

    /// [`commit_with_record`](Self::commit_with_record) with the bound
    /// statements of `claim = "after"` (an answer too large to ride as
    /// text, or SQLite, which has no texts): the statements queued for
    /// `COMMIT`, the record with its answer (an expired record taken over
    /// in place), then `COMMIT`; on a live record, `ROLLBACK` and a read.
    pub(crate) async fn commit_with_bound_record<DB: SqlBackend>(
        &mut self,
        conn: &mut DB::Connection,
        record: &NewRecord<'_>,
        answer: Option<&str>,
    ) -> Result<Committed, Error> {
        self.ready::<DB>(&mut *conn).await?;
        // Dropped mid-flight: the connection is closed (the server rolls
        // back; see `in_flight`). The state is set below.
        self.in_flight::<DB>();
        let done = match sql_record::insert_done::<DB>(&mut *conn, record, answer).await {
            Ok(InsertDone::Written) => Tm::<DB>::commit(&mut *conn).await.map(|()| Committed::Kept),
            Ok(InsertDone::Conflict) => match Tm::<DB>::rollback(&mut *conn).await {
                Ok(()) => sql_record::read::<DB>(&mut *conn, record.scope, record.key)
                    .await
                    .map(|found| Committed::Refused { found, deadlock: None }),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        // Ends a block a failure left open (nothing if there is none).
        Tm::<DB>::start_rollback(conn);
        self.state = match &done {
            Ok(_) => State::Ended,
            Err(sqlx::Error::Database(_)) => State::Closed,
            Err(_) => State::Broken,
        };
        done.map_err(classify::<DB>)
    }

    /// A `claim = "commit"` guard fails after its text: nothing of its
    /// call committed, and a `Tx::commit` must not say otherwise.
    pub(crate) fn refuse_commit(&mut self) {
        if self.state == State::Ended {
            self.state = State::Closed;
        }
    }

    /// After a refused `claim = "commit"` text found the record expired
    /// (its retention over, not yet purged): remove it, only if still
    /// expired (in autocommit), so that the next call can write its own.
    pub(crate) async fn discard_expired<DB: SqlBackend>(
        &mut self,
        conn: &mut DB::Connection,
        texts: &Texts,
        record: &NewRecord<'_>,
    ) -> Result<(), Error> {
        // In autocommit, after the ROLLBACK queued for sqlx's depth.
        let text = (texts.discard_expired)(texts, record.scope, record.key);
        self.state = State::Busy;
        DB::execute_text(&mut *conn, sql(text)).await.map_err(classify::<DB>)?;
        self.state = State::Ended;
        Ok(())
    }

    /// `claim = "after"` found a repeat: roll back to the transaction's
    /// start and begin again with the Tx's own statement (its isolation
    /// level); the answers queued for `COMMIT` went with the rollback.
    pub(crate) async fn restart<DB: SqlBackend>(&mut self, conn: &mut DB::Connection) -> Result<(), sqlx::Error> {
        if Tm::<DB>::get_transaction_depth(conn) > 1 {
            return crate::store::sql::record::restart::<DB>(conn).await;
        }
        self.take_pending();
        self.state = State::Busy;
        DB::execute_text(conn, sql(format!("{}; {}", DB::ROLLBACK, self.begin))).await?;
        self.state = State::Open;
        Ok(())
    }
}

/// What a `claim = "commit"` text did.
pub(crate) enum Committed {
    /// The record with its answer committed, and the body's writes.
    Kept,
    /// Nothing committed: the record's key was held; `found`: the record
    /// that holds it, read after the rollback. `deadlock`: the text was
    /// not refused on the key but a deadlock's victim or a serialization
    /// failure, both retryable.
    Refused { found: Option<ExistingRecord>, deadlock: Option<Error> },
}

/// A unique-key error of the record table: a duplicate. A unique-key
/// error of another table comes from the body's deferred constraint
/// failing at `COMMIT` (PostgreSQL names the table; MySQL has no deferred
/// constraints).
fn record_duplicate(e: &sqlx::Error, texts: &Texts) -> bool {
    e.as_database_error()
        .is_some_and(|d| d.is_unique_violation() && d.table().is_none_or(|t| t.eq_ignore_ascii_case(&texts.table_name)))
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

/// After a text of queued answers failed with `error` and its transaction
/// ended: an answer that found no record ([`Error::RecordVanished`]) may
/// come from a claim that named a statement of the application's under
/// idem's name, with the claim's parameter types, which ran, wrote nothing
/// and failed nothing (no claim idem could send on that session would
/// write a record again). If the session holds such a statement it is
/// deallocated, so that the next claim prepares idem's, and the error
/// names it. Only this failure pays for the look: claims are never checked.
pub(super) async fn vanished_or_taken<DB: SqlBackend>(conn: &mut DB::Connection, error: Error) -> Error {
    let Some(p) = texts::<DB>().and_then(|t| t.prepared.as_ref()) else { return error };
    if !matches!(error, Error::RecordVanished { .. }) {
        return error;
    }
    match DB::fetch_text(&mut *conn, sql(p.claim_taken.clone())).await {
        Ok(Some(_)) => {
            if let Err(e) = DB::execute_text(conn, sql(format!("DEALLOCATE {}", p.claim_name))).await {
                tracing::warn!(target: "idem", statement = %p.claim_name, error = %e,
                    "a statement of the application's under idem's claim name could not be deallocated");
            }
            Error::StatementTaken { name: p.claim_name.clone() }
        }
        _ => error,
    }
}

pub(super) fn sql(text: String) -> sqlx::SqlStr {
    use sqlx::SqlSafeStr as _;
    // Every dynamic value in these texts is an escaped or hex literal, an
    // integer idem formats, or the validated table name (see the docs of `Tx`).
    sqlx::AssertSqlSafe(text).into_sql_str()
}

/// A queued statement failed: an answer's `UPDATE` that found no record
/// says so with the error its text raises on purpose
/// ([`Texts::no_record`]).
pub(crate) fn pending_error<DB: SqlBackend>(e: sqlx::Error, scope: &str) -> Error {
    let ours = texts::<DB>().map(|t| t.no_record);
    if e.as_database_error().and_then(|d| d.code()).is_some_and(|c| Some(c.as_ref()) == ours) {
        return Error::RecordVanished { scope: scope.to_owned() };
    }
    classify::<DB>(e)
}
