//! Lease records in SQLite, PostgreSQL or MySQL/MariaDB: the record table
//! of the dedup strategy, each step its own short autocommit statement.
//! Completing, releasing and extending are written once here; a claim is
//! each database's own (see their dialects), reading the holder with
//! [`read_holder`].

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use tokio::time::Instant;

use super::dialect::{Arg, Dialect, Stmt, text};
use super::{SqlBackend, classify, statements};
use crate::error::Error;
use crate::lease::store::{HeldLease, LeaseClaim, LeaseRequest, LeaseStore, NewStep, Resolve, StepLog, StepOutcome};
use crate::store::BoxFuture;
use crate::table::RecordTable;

/// Lease records in a SQL database, through a connection pool, in the
/// record table of the installed [`Stores`](crate::Stores) (`idem_records`
/// by default). The lease deadline and expiry use the database's clock.
///
/// ```no_run
/// # extern crate idem_runtime as idem;
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), idem::Error> {
/// idem::migrate(&pool).await?;
/// idem::Stores::builder().lease(idem::store::SqlStore::new(pool)).install()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct SqlStore<DB: SqlBackend> {
    pool: sqlx::Pool<DB>,
    /// The longest answer the server holds, once asked (see `answer_limit`).
    answer_limit: Arc<OnceLock<usize>>,
    /// The bound on each call (see [`SqlStore::timeout`]).
    timeout: Duration,
}

// By hand: derived, it would ask `DB: Clone` of the database type.
impl<DB: SqlBackend> Clone for SqlStore<DB> {
    fn clone(&self) -> Self {
        SqlStore { pool: self.pool.clone(), answer_limit: self.answer_limit.clone(), timeout: self.timeout }
    }
}

impl<DB: SqlBackend> SqlStore<DB> {
    /// A store on `pool` (run [`crate::migrate`] on it first).
    pub fn new(pool: sqlx::Pool<DB>) -> SqlStore<DB> {
        SqlStore { pool, answer_limit: Arc::default(), timeout: crate::store::DEFAULT_TIMEOUT }
    }

    /// The pool.
    pub fn pool(&self) -> &sqlx::Pool<DB> {
        &self.pool
    }

    /// How long one call may take, a connection from the pool included,
    /// before the guard fails with a retryable error (default
    /// [`DEFAULT_TIMEOUT`](crate::store::DEFAULT_TIMEOUT), 3 s): a database
    /// that is down is reported within it, not after the pool's
    /// `acquire_timeout`. A statement cut off closes its connection.
    pub fn timeout(mut self, timeout: Duration) -> SqlStore<DB> {
        self.timeout = timeout;
        self
    }

    /// A connection from the pool within `deadline`.
    async fn acquire(&self, deadline: Instant) -> Result<PoolConnection<DB>, Error> {
        match tokio::time::timeout_at(deadline, self.pool.acquire()).await {
            Ok(conn) => Ok(conn?),
            Err(_) => Err(crate::store::no_answer(DB::BACKEND, self.timeout)),
        }
    }

    /// What a call on `conn` given until a deadline (`timeout_at`) did;
    /// cut off, the connection is closed (the server may still be running
    /// the statement, and the client would read its reply as the next one's).
    fn settle<T>(
        &self,
        conn: &mut PoolConnection<DB>,
        done: Result<Result<T, sqlx::Error>, tokio::time::error::Elapsed>,
    ) -> Result<T, Error> {
        match done {
            Ok(done) => done.map_err(classify::<DB>),
            Err(_) => {
                conn.close_on_drop();
                Err(crate::store::no_answer(DB::BACKEND, self.timeout))
            }
        }
    }
}

/// `$op` on a connection of `$store`'s pool (`$conn`), a connection and
/// the statement both within the store's bound.
macro_rules! bounded {
    ($store:expr, |$conn:ident| $op:expr) => {{
        let deadline = Instant::now() + $store.timeout;
        let mut pooled = $store.acquire(deadline).await?;
        let $conn: &mut DB::Connection = &mut pooled;
        let done = tokio::time::timeout_at(deadline, $op).await;
        $store.settle(&mut pooled, done)
    }};
}

/// What a lease-finishing statement does.
#[derive(Clone, Copy, Debug)]
enum LeaseAction<'a> {
    /// The answer, or `None`: completed, answer not kept.
    Complete(Option<&'a str>),
    Release,
    Extend,
}

/// What a database's lease claim found: `None` when the holder is not
/// visible yet (ask again).
#[doc(hidden)]
pub type LeaseClaimed = Result<Option<LeaseClaim>, sqlx::Error>;

/// A lease claim, each database's own (the steps differ: see the
/// dialects), with [`claim_args`] and [`read_holder`] written once here.
#[doc(hidden)]
pub trait LeaseClaimSql: Dialect {
    /// The claim's statements, built once for a table.
    type Claim: Send + Sync + 'static;
    fn claim_statements(table: &RecordTable) -> Self::Claim;

    /// `strategy = "lease"`: claim in autocommit, taking over a record whose
    /// lease or retention has passed, or report what holds the key.
    fn lease_claim<'a>(
        conn: &'a mut Self::Connection,
        s: &'a LeaseStatements<Self>,
        req: &'a LeaseRequest<'a>,
    ) -> impl Future<Output = LeaseClaimed> + Send + 'a;
}

/// The statements written once for every database. Their values: `$1`
/// scope, `$2` key, `$3` owner, `$4` fence, then `$5` the answer and `$6`
/// the retention (completion) or `$5` the lease (extension).
#[doc(hidden)]
pub struct LeaseStatements<D: LeaseClaimSql> {
    /// The database's own claim.
    pub(crate) claim: D::Claim,
    complete: Stmt,
    release: Stmt,
    extend: Stmt,
    /// The holder of a key: status, fingerprint, response, milliseconds
    /// left on the lease, past retention (0 or 1).
    #[cfg(any(feature = "mysql", feature = "sqlite"))]
    holder: Stmt,
}

impl<D: LeaseClaimSql> LeaseStatements<D> {
    pub(crate) fn new(t: &RecordTable) -> LeaseStatements<D> {
        let clock = D::CLOCK;
        let held = "scope = $1 AND idem_key = $2 AND owner = $3 AND fence = $4";
        let lease = D::after(clock, "$5");
        LeaseStatements {
            claim: D::claim_statements(t),
            // A stored answer is final. A completion may be repeated by its
            // holder (its reply was lost; then, after three tries, without
            // the answer): the owner and fence stay on the completed row, so
            // the repeat matches it and reports it completed, but a `DONE`
            // row keeps every column. MySQL assigns left to right, each
            // assignment seeing the ones before: `status` comes last, so
            // the others test the row as it was. A repeat thus changes
            // nothing, and MySQL counts only changed rows unless the client
            // sets CLIENT_FOUND_ROWS: sqlx-mysql always does (every
            // connection it opens, whatever its options), so a matched row
            // counts, as on PostgreSQL and SQLite. Chosen over a condition
            // that makes the repeat write something (a touched `updated_at`
            // would be a change to a final record); the repeat tests of
            // tests/lease.rs fail on MariaDB without the flag.
            complete: Stmt::new::<D>(&format!(
                "UPDATE {t} SET response = {answer}, updated_at = {now}, expires_at = {expires}, \
                 lease_until = NULL, status = 'DONE' WHERE {held} AND status IN ('PROCESSING', 'DONE')",
                answer = unless_done("response", &D::text_value("$5")),
                now = unless_done("updated_at", clock),
                expires = unless_done("expires_at", &D::after(clock, "$6")),
            )),
            release: Stmt::new::<D>(&format!("DELETE FROM {t} WHERE {held} AND status = 'PROCESSING'")),
            extend: Stmt::new::<D>(&format!(
                "UPDATE {t} SET lease_until = {lease}, updated_at = {clock}, \
                 expires_at = {greatest}(expires_at, {lease}) WHERE {held} AND status = 'PROCESSING'",
                greatest = D::GREATEST,
            )),
            #[cfg(any(feature = "mysql", feature = "sqlite"))]
            holder: Stmt::new::<D>(&format!(
                "SELECT {}, {}, {}, {}, {} FROM {t} WHERE scope = $1 AND idem_key = $2",
                D::text_column("status"),
                D::text_column("fingerprint"),
                D::text_column("response"),
                D::ms_until("lease_until"),
                D::flag(&format!("expires_at <= {clock}")),
            )),
        }
    }
}

/// `column` set to `value`, unless the row is `DONE` already.
fn unless_done(column: &str, value: &str) -> String {
    format!("CASE WHEN status = 'DONE' THEN {column} ELSE {value} END")
}

/// An existing record a claim did not take over.
#[derive(Debug)]
pub(crate) struct LeaseRow {
    pub(crate) status: String,
    pub(crate) fingerprint: Option<String>,
    pub(crate) response: Option<String>,
    /// Milliseconds left on the lease by the database's clock (may be negative).
    pub(crate) lease_left_ms: Option<i64>,
}

/// The values of a lease claim: `$1` scope, `$2` key, `$3` fingerprint,
/// `$4` owner, `$5` lease, `$6` retention.
pub(crate) fn claim_args<'a>(req: &LeaseRequest<'a>) -> [Arg<'a>; 6] {
    [
        text(req.scope),
        text(req.key),
        Arg::Text(req.fingerprint),
        text(req.owner),
        Arg::Span(req.lease),
        Arg::Span(req.retention),
    ]
}

/// The record that holds `req`'s key, with whether it is past its
/// retention; `None`: there is none.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) async fn read_holder<DB: SqlBackend>(
    conn: &mut DB::Connection,
    s: &LeaseStatements<DB>,
    req: &LeaseRequest<'_>,
) -> Result<Option<(LeaseRow, bool)>, sqlx::Error> {
    let query = s.holder.query::<DB>(&[text(req.scope), text(req.key)]);
    let Some(row) = DB::fetch_optional(conn, query).await? else { return Ok(None) };
    use super::dialect::{read_required, read_text};
    let holder = LeaseRow {
        status: read_required::<DB>(&row, 0)?,
        fingerprint: read_text::<DB>(&row, 1)?,
        response: read_text::<DB>(&row, 2)?,
        lease_left_ms: DB::opt_int(&row, 3)?,
    };
    Ok(Some((holder, DB::int(&row, 4)? != 0)))
}

/// The fingerprint first, then completed, then busy.
pub(crate) fn judge_row(req: &LeaseRequest<'_>, row: LeaseRow) -> LeaseClaim {
    if let (Some(ours), Some(theirs)) = (req.fingerprint, row.fingerprint.as_deref())
        && ours != theirs
    {
        return LeaseClaim::Mismatch;
    }
    if row.status == "DONE" {
        return LeaseClaim::Done { response: row.response };
    }
    // At most the lease: on MySQL/MariaDB `UTC_TIMESTAMP(6)` is the time the
    // statement began, and a read that began before the claim and waited on
    // its row lock computes a little more than a whole lease left.
    let left = row.lease_left_ms.unwrap_or(0).clamp(0, crate::store::millis(req.lease));
    LeaseClaim::Busy { retry_after: std::time::Duration::from_millis(left as u64) }
}

impl<DB: SqlBackend> LeaseStore for SqlStore<DB>
where
    DB::Connection: Send,
{
    fn kind(&self) -> &'static str {
        DB::BACKEND
    }

    fn answer_limit(&self) -> BoxFuture<'_, usize> {
        Box::pin(async move {
            if !DB::ASKS_ANSWER_LIMIT {
                return DB::MAX_RESPONSE;
            }
            if let Some(&limit) = self.answer_limit.get() {
                return limit;
            }
            // Asked once; if the server cannot be asked now, the column's
            // limit stands for this answer and the next one asks again.
            let deadline = Instant::now() + self.timeout;
            let Ok(mut conn) = self.acquire(deadline).await else { return DB::MAX_RESPONSE };
            let done = tokio::time::timeout_at(deadline, DB::answer_limit(&mut conn)).await;
            match self.settle(&mut conn, done) {
                Ok(limit) => *self.answer_limit.get_or_init(|| limit),
                Err(_) => DB::MAX_RESPONSE,
            }
        })
    }

    fn claim<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<LeaseClaim, Error>> {
        Box::pin(async move {
            let deadline = Instant::now() + self.timeout;
            let mut conn = self.acquire(deadline).await?;
            // A record committed while the claim waited can be invisible to
            // its snapshot: the statement then finds nothing; ask again.
            // InnoDB picks claims waiting on a record whose first call fails
            // as deadlock victims (1213): the claim is a statement of its
            // own, so it is sent again, within the store's bound.
            let (mut unseen, mut deadlocks) = (0, 0);
            while unseen < 5 {
                let claim = DB::lease_claim(&mut conn, &statements::<DB>().lease, req);
                let done = tokio::time::timeout_at(deadline, claim).await;
                match self.settle(&mut conn, done) {
                    Ok(Some(claim)) => return Ok(claim),
                    Ok(None) => unseen += 1,
                    Err(e) if e.is_deadlock() && deadlocks < 10 => {
                        deadlocks += 1;
                        tokio::time::sleep(Duration::from_millis(2 * deadlocks)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(LeaseClaim::Busy { retry_after: std::time::Duration::ZERO })
        })
    }

    fn complete<'a>(
        &'a self,
        held: &'a HeldLease<'a>,
        response: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.finish(held, LeaseAction::Complete(response)))
    }

    fn release<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.finish(held, LeaseAction::Release))
    }

    fn extend<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.finish(held, LeaseAction::Extend))
    }

    fn shared(&self) -> Option<Arc<dyn LeaseStore>> {
        Some(Arc::new(self.clone()))
    }

    fn steps<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<StepLog, Error>> {
        Box::pin(async move { bounded!(self, |conn| super::steps::read::<DB>(conn, scope, key)) })
    }

    fn record_step<'a>(&'a self, held: &'a HeldLease<'a>, step: &'a NewStep<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move { bounded!(self, |conn| super::steps::record::<DB>(conn, held, step)) })
    }

    fn mark_step<'a>(
        &'a self,
        held: &'a HeldLease<'a>,
        number: usize,
        name: &'a str,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move { bounded!(self, |conn| super::steps::mark::<DB>(conn, held, number, name)) })
    }

    fn unmark_step<'a>(&'a self, held: &'a HeldLease<'a>, number: usize) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            bounded!(self, |conn| super::steps::unmark::<DB>(conn, held.scope, held.key, number, held.fence))
        })
    }

    fn forget_steps<'a>(&'a self, scope: &'a str, key: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move { bounded!(self, |conn| super::steps::forget::<DB>(conn, scope, key)) })
    }

    fn resolve_step<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        step: &'a str,
        outcome: StepOutcome<'a>,
    ) -> BoxFuture<'a, Result<Resolve, Error>> {
        Box::pin(async move {
            let deadline = Instant::now() + self.timeout;
            let mut pooled = self.acquire(deadline).await?;
            let resolve = super::admin::resolve_step::<DB>(&mut pooled, (scope, key), step, outcome);
            let Ok(resolved) = tokio::time::timeout_at(deadline, resolve).await else {
                // As `settle` does: the server may still be running it.
                pooled.close_on_drop();
                return Err(crate::store::no_answer(DB::BACKEND, self.timeout));
            };
            resolved
        })
    }

    fn peek<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<Option<LeaseClaim>, Error>> {
        Box::pin(async move {
            let deadline = Instant::now() + self.timeout;
            let mut conn = self.acquire(deadline).await?;
            let read = super::record::read::<DB>(&mut conn, req.scope, req.key);
            let done = tokio::time::timeout_at(deadline, read).await;
            let existing = self.settle(&mut conn, done)?;
            Ok(existing.filter(|e| !e.expired).and_then(|e| {
                if let (Some(ours), Some(theirs)) = (req.fingerprint, e.fingerprint.as_deref())
                    && ours != theirs
                {
                    return Some(LeaseClaim::Mismatch);
                }
                match crate::record::RecordStatus::parse(&e.status) {
                    Some(crate::record::RecordStatus::Done) => Some(LeaseClaim::Done { response: e.response }),
                    _ => None,
                }
            }))
        })
    }
}

impl<DB: SqlBackend> SqlStore<DB>
where
    DB::Connection: Send,
{
    async fn finish(&self, held: &HeldLease<'_>, action: LeaseAction<'_>) -> Result<bool, Error> {
        let deadline = Instant::now() + self.timeout;
        let mut conn = self.acquire(deadline).await?;
        let done = tokio::time::timeout_at(deadline, finish::<DB>(&mut conn, held, action)).await;
        self.settle(&mut conn, done)
    }
}

/// Complete, release or extend a lease, only if `held` still holds it.
async fn finish<DB: SqlBackend>(
    conn: &mut DB::Connection,
    held: &HeldLease<'_>,
    action: LeaseAction<'_>,
) -> Result<bool, sqlx::Error> {
    let s = &statements::<DB>().lease;
    let (statement, fifth, sixth) = match action {
        LeaseAction::Complete(answer) => (&s.complete, Arg::Text(answer), Arg::Span(held.retention)),
        LeaseAction::Release => (&s.release, Arg::Text(None), Arg::Text(None)),
        LeaseAction::Extend => (&s.extend, Arg::Span(held.lease), Arg::Text(None)),
    };
    let values = [text(held.scope), text(held.key), text(held.owner), Arg::Int(held.fence), fifth, sixth];
    let done = DB::execute(conn, statement.query::<DB>(&values)).await?;
    Ok(DB::rows(&done) == 1)
}
