//! [`TxContext`]: the caller's transaction as the guards that write in it
//! see it. Its hidden methods are the steps a guard takes on it (get
//! ready, claim the record, store the answer, start over), each with the
//! plain behaviour of a `sqlx::Transaction` as its default; an
//! [`idem::Tx`](crate::Tx) (feature `tx`) overrides them in its own module
//! to send the claim with `BEGIN` and the answer with `COMMIT`.

use std::future::Future;

use crate::error::Error;
use crate::future::BoxFuture;
use crate::guard::Prepared;
use crate::machine::Cas;
use crate::store::sql::{
    ClaimResult, ExistingRecord, InsertDone, NewRecord, SqlBackend, classify, in_transaction, record,
};

/// Claims can loop when a record disappears between statements (its
/// transaction rolled back, or it expired and was purged). Bounded.
pub(crate) const MAX_ATTEMPTS: usize = 5;

/// A transaction a dedup record can be written in.
///
/// Implemented for `sqlx::Transaction<'_, DB>` and [`idem::Tx<DB>`][Tx]
/// of every supported database. A type of your own (a unit-of-work wrapper)
/// can implement it by handing out the connection of a transaction it
/// holds: the record must commit or roll back together with the business
/// change, so never hand out a connection that is not inside a
/// transaction. (A wrapper of an `idem::Tx` passes the `Tx` itself to the
/// guards: through `connection` alone its claims would not ride on
/// `BEGIN`, and the `Tx`'s connection panics before it has begun unless
/// `Tx::open` was called.)
#[doc = links!()]
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a transaction idem can write its dedup record in",
    label = "not a supported transaction",
    note = "take `&mut sqlx::Transaction<'_, DB>` or (feature `tx`) `&mut idem::Tx<DB>` with DB = sqlx::Postgres, sqlx::MySql or sqlx::Sqlite (or a type implementing `idem::sql::TxContext`)",
    note = "a pool or a bare connection would commit the record apart from your business change: begin a transaction and pass it"
)]
pub trait TxContext: Send {
    /// The database.
    type Db: SqlBackend;

    /// The connection the open transaction runs on.
    fn connection(&mut self) -> &mut <Self::Db as sqlx::Database>::Connection;

    /// The connection for the guard's own statements (a precheck's read,
    /// a transition, a removal). Not a stable API.
    #[doc(hidden)]
    fn guard_connection(&mut self) -> &mut <Self::Db as sqlx::Database>::Connection {
        self.connection()
    }

    /// Get ready for the guard's statements: the transaction must be open.
    /// `claim_next`: the guard's first statement is its claim (which an
    /// `idem::Tx` sends with its `BEGIN`). Not a stable API.
    #[doc(hidden)]
    fn ready_for_guard(&mut self, p: &Prepared, claim_next: bool) -> impl Future<Output = Result<(), Error>> + Send {
        let _ = claim_next;
        std::future::ready(require_transaction::<Self::Db>(self.guard_connection(), p))
    }

    /// Insert the record (and, with `cas`, make the transition in the same
    /// step if the insert won), or find the live record that holds the key.
    /// Not a stable API.
    #[doc(hidden)]
    fn claim_record(
        &mut self,
        p: &Prepared,
        cas: Option<&Cas<'_>>,
    ) -> impl Future<Output = Result<Claimed, Error>> + Send {
        claim::<Self::Db>(self.guard_connection(), p, cas)
    }

    /// Store a first call's answer in its record (`None`: completed, the
    /// answer not kept). Not a stable API.
    #[doc(hidden)]
    fn store_answer(&mut self, p: &Prepared, json: Option<String>) -> impl Future<Output = Result<(), Error>> + Send {
        store_answer::<Self::Db>(self.guard_connection(), p, json)
    }

    /// `claim = "after"`: write the record with its answer (`None`: not
    /// kept) after the body, taking over an expired one. If that fails
    /// (not on the key: a lock wait timed out, say; MySQL keeps the
    /// transaction open after that), the transaction is rolled back to its
    /// start (`claim = "after"` is its first work): a caller that commits
    /// anyway must not keep the body's writes without their record, or a
    /// retry would run the body again. Not a stable API.
    #[doc(hidden)]
    fn insert_done(
        &mut self,
        p: &Prepared,
        json: Option<&str>,
    ) -> impl Future<Output = Result<InsertDone, Error>> + Send {
        let conn = self.guard_connection();
        async move {
            let inserted = insert_done::<Self::Db>(&mut *conn, p, json).await;
            if inserted.is_err() {
                let _ = record::restart::<Self::Db>(conn).await;
            }
            inserted
        }
    }

    /// `claim = "commit"`: write the record with its answer (`None`: not
    /// kept) and commit the transaction, the record's text going with
    /// `COMMIT`. `Ok(None)`: this transaction is not one idem commits (a
    /// `sqlx::Transaction`): the record is written as with `claim =
    /// "after"`, and the caller commits. `Claimed::Fresh`: committed;
    /// `Claimed::Existing`: a live record held the key, nothing of this
    /// call was committed. Not a stable API.
    #[doc(hidden)]
    fn commit_with_record(
        &mut self,
        p: &Prepared,
        json: Option<&str>,
    ) -> impl Future<Output = Result<Option<Claimed>, Error>> + Send {
        let _ = (p, json);
        std::future::ready(Ok(None))
    }

    /// Roll the transaction back to its start and continue in a fresh one
    /// (`claim = "after"` found a repeat). Not a stable API.
    #[doc(hidden)]
    fn restart(&mut self) -> impl Future<Output = Result<(), Error>> + Send {
        let conn = self.guard_connection();
        async move { record::restart::<Self::Db>(conn).await.map_err(classify::<Self::Db>) }
    }

    /// A guarded body starts running on this transaction (its claim said
    /// `Run`), and, below, it ended. Not a stable API.
    #[doc(hidden)]
    fn body_started(&mut self) {}

    #[doc(hidden)]
    fn body_ended(&mut self) {}
}

impl<DB: SqlBackend> TxContext for sqlx::Transaction<'_, DB>
where
    DB::Connection: Send,
{
    type Db = DB;
    fn connection(&mut self) -> &mut DB::Connection {
        self
    }
}

/// How the record's steps make a `dedup+state` transition ([`Cas`]): with
/// the claim (in the claim's own statement where the database can), after
/// a claim of its own, and back when the body fails. Implemented by the
/// state strategies' SQL (`state::sql`), which the record's steps do not
/// otherwise see.
pub(crate) trait EntityMove<DB: SqlBackend> {
    /// Claim `record` and, only if this call inserted it, make the move: the
    /// claim and the rows moved. A move that fails leaves no claimed record
    /// behind where the transaction survives the failure.
    fn claim_and_move<'a>(
        &'a self,
        conn: &'a mut DB::Connection,
        record: &'a NewRecord<'a>,
    ) -> impl Future<Output = Result<(ClaimResult, u64), Error>> + Send + 'a;

    /// Make the move: the rows moved.
    fn make<'a>(&'a self, conn: &'a mut DB::Connection) -> impl Future<Output = Result<u64, Error>> + Send + 'a;
}

/// What [`TxContext::claim_record`] found.
pub enum Claimed {
    /// This call inserted the record; with a transition, the rows it moved.
    Fresh { moved: u64 },
    /// A live record of an earlier call holds the key.
    Existing(ExistingRecord),
}

pub(crate) fn require_transaction<DB: SqlBackend>(conn: &DB::Connection, p: &Prepared) -> Result<(), Error> {
    if in_transaction::<DB>(conn) { Ok(()) } else { Err(Error::NoTransaction { scope: p.scope.to_string() }) }
}

/// [`TxContext::claim_record`] with the statements of the open transaction.
pub(crate) async fn claim<DB: SqlBackend>(
    conn: &mut DB::Connection,
    p: &Prepared,
    cas: Option<&Cas<'_>>,
) -> Result<Claimed, Error> {
    let new = new_record(p);
    for _ in 0..MAX_ATTEMPTS {
        let (claim, moved) = match cas {
            None => (record::claim::<DB>(conn, &new).await.map_err(classify::<DB>)?, 0),
            Some(cas) => EntityMove::<DB>::claim_and_move(cas, conn, &new).await?,
        };
        if claim == ClaimResult::Claimed {
            return Ok(Claimed::Fresh { moved });
        }
        let Some(existing) = record::read::<DB>(conn, new.scope, new.key).await.map_err(classify::<DB>)? else {
            continue; // the holder rolled back, or the record was purged: claim again
        };
        if existing.expired {
            // Past retention but not yet purged: the old answer no longer
            // counts. Remove it (only if still expired) and claim afresh.
            record::discard_expired::<DB>(conn, new.scope, new.key).await.map_err(classify::<DB>)?;
            continue;
        }
        return Ok(Claimed::Existing(existing));
    }
    Err(p.in_progress(None))
}

/// [`TxContext::store_answer`] as a statement of its own.
pub(crate) async fn store_answer<DB: SqlBackend>(
    conn: &mut DB::Connection,
    p: &Prepared,
    json: Option<String>,
) -> Result<(), Error> {
    match record::complete::<DB>(conn, &p.stored_scope, p.key.as_str(), json.as_deref()).await {
        Ok(1) => Ok(()),
        Ok(_) => Err(Error::RecordVanished { scope: p.scope.to_string() }),
        Err(e) => Err(classify::<DB>(e)),
    }
}

/// [`TxContext::insert_done`] as a statement of its own.
pub(crate) async fn insert_done<DB: SqlBackend>(
    conn: &mut DB::Connection,
    p: &Prepared,
    json: Option<&str>,
) -> Result<InsertDone, Error> {
    record::insert_done::<DB>(conn, &new_record(p), json).await.map_err(classify::<DB>)
}

/// The record a claim inserts for `p`.
pub(crate) fn new_record(p: &Prepared) -> NewRecord<'_> {
    NewRecord {
        scope: &p.stored_scope,
        key: p.key.as_str(),
        fingerprint: p.fingerprint.as_ref().map(|f| f.as_str()),
        retention: p.retention,
    }
}

/// A caller's transaction as generated code takes it: one call per use,
/// spanned at the parameter's type, so a parameter that is no transaction
/// is reported once, there (the later uses see an error type and stay
/// quiet). Its steps are the transaction's own, through a `dyn`.
#[doc(hidden)]
pub struct Conn<'a, DB: SqlBackend>(&'a mut dyn DynContext<DB>);

#[doc(hidden)]
pub fn connection<T: TxContext>(tx: &mut T) -> Conn<'_, T::Db> {
    Conn(tx)
}

/// [`TxContext`] as an object: its steps return boxed futures.
#[doc(hidden)]
pub trait DynContext<DB: SqlBackend>: Send {
    fn connection(&mut self) -> &mut DB::Connection;
    fn guard_connection(&mut self) -> &mut DB::Connection;
    fn ready_for_guard<'a>(&'a mut self, p: &'a Prepared, claim_next: bool) -> BoxFuture<'a, Result<(), Error>>;
    fn claim_record<'a>(
        &'a mut self,
        p: &'a Prepared,
        cas: Option<&'a Cas<'a>>,
    ) -> BoxFuture<'a, Result<Claimed, Error>>;
    fn store_answer<'a>(&'a mut self, p: &'a Prepared, json: Option<String>) -> BoxFuture<'a, Result<(), Error>>;
    fn insert_done<'a>(
        &'a mut self,
        p: &'a Prepared,
        json: Option<&'a str>,
    ) -> BoxFuture<'a, Result<InsertDone, Error>>;
    fn commit_with_record<'a>(
        &'a mut self,
        p: &'a Prepared,
        json: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Claimed>, Error>>;
    fn restart(&mut self) -> BoxFuture<'_, Result<(), Error>>;
    fn body_started(&mut self);
    fn body_ended(&mut self);
}

impl<T: TxContext> DynContext<T::Db> for T {
    fn connection(&mut self) -> &mut <T::Db as sqlx::Database>::Connection {
        TxContext::connection(self)
    }
    fn guard_connection(&mut self) -> &mut <T::Db as sqlx::Database>::Connection {
        TxContext::guard_connection(self)
    }
    fn ready_for_guard<'a>(&'a mut self, p: &'a Prepared, claim_next: bool) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(TxContext::ready_for_guard(self, p, claim_next))
    }
    fn claim_record<'a>(
        &'a mut self,
        p: &'a Prepared,
        cas: Option<&'a Cas<'a>>,
    ) -> BoxFuture<'a, Result<Claimed, Error>> {
        Box::pin(TxContext::claim_record(self, p, cas))
    }
    fn store_answer<'a>(&'a mut self, p: &'a Prepared, json: Option<String>) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(TxContext::store_answer(self, p, json))
    }
    fn insert_done<'a>(
        &'a mut self,
        p: &'a Prepared,
        json: Option<&'a str>,
    ) -> BoxFuture<'a, Result<InsertDone, Error>> {
        Box::pin(TxContext::insert_done(self, p, json))
    }
    fn commit_with_record<'a>(
        &'a mut self,
        p: &'a Prepared,
        json: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Claimed>, Error>> {
        Box::pin(TxContext::commit_with_record(self, p, json))
    }
    fn restart(&mut self) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(TxContext::restart(self))
    }
    fn body_started(&mut self) {
        TxContext::body_started(self)
    }
    fn body_ended(&mut self) {
        TxContext::body_ended(self)
    }
}

// Not to be suggested to a user whose parameter is no transaction.
#[diagnostic::do_not_recommend]
impl<DB: SqlBackend> TxContext for Conn<'_, DB>
where
    DB::Connection: Send,
{
    type Db = DB;
    fn connection(&mut self) -> &mut DB::Connection {
        self.0.connection()
    }
    fn guard_connection(&mut self) -> &mut DB::Connection {
        self.0.guard_connection()
    }
    async fn ready_for_guard(&mut self, p: &Prepared, claim_next: bool) -> Result<(), Error> {
        self.0.ready_for_guard(p, claim_next).await
    }
    async fn claim_record(&mut self, p: &Prepared, cas: Option<&Cas<'_>>) -> Result<Claimed, Error> {
        self.0.claim_record(p, cas).await
    }
    async fn store_answer(&mut self, p: &Prepared, json: Option<String>) -> Result<(), Error> {
        self.0.store_answer(p, json).await
    }
    async fn insert_done(&mut self, p: &Prepared, json: Option<&str>) -> Result<InsertDone, Error> {
        self.0.insert_done(p, json).await
    }
    async fn commit_with_record(&mut self, p: &Prepared, json: Option<&str>) -> Result<Option<Claimed>, Error> {
        self.0.commit_with_record(p, json).await
    }
    fn restart(&mut self) -> impl Future<Output = Result<(), Error>> + Send {
        self.0.restart()
    }
    fn body_started(&mut self) {
        self.0.body_started()
    }
    fn body_ended(&mut self) {
        self.0.body_ended()
    }
}
