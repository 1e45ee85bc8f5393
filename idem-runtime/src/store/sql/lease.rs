//! Lease records in SQLite, PostgreSQL or MySQL/MariaDB: the `idem_records`
//! table of the dedup strategy, each step its own short autocommit statement.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use tokio::time::Instant;

use super::{SqlBackend, classify};
use crate::error::Error;
use crate::lease::store::{HeldLease, LeaseClaim, LeaseRequest, LeaseStore};
use crate::store::BoxFuture;

/// Lease records in a SQL database, through a connection pool. The lease
/// deadline and expiry use the database's clock.
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

/// What a lease-finishing statement does.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub enum LeaseAction<'a> {
    /// The answer, or `None`: completed, answer not kept.
    Complete(Option<&'a str>),
    Release,
    Extend,
}

/// An existing record a claim did not take over.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[doc(hidden)]
#[derive(Debug)]
pub struct LeaseRow {
    pub status: String,
    pub fingerprint: Option<String>,
    pub response: Option<String>,
    /// Milliseconds left on the lease by the database's clock (may be negative).
    pub lease_left_ms: Option<i64>,
}

/// The columns of the backends' lease reads, in order: status, fingerprint,
/// response, milliseconds left on the lease.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) type LeaseRowColumns = (String, Option<String>, Option<String>, Option<i64>);

#[cfg(any(feature = "mysql", feature = "sqlite"))]
impl From<LeaseRowColumns> for LeaseRow {
    fn from((status, fingerprint, response, lease_left_ms): LeaseRowColumns) -> LeaseRow {
        LeaseRow { status, fingerprint, response, lease_left_ms }
    }
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
                let done = tokio::time::timeout_at(deadline, DB::lease_claim(&mut conn, req)).await;
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

    fn peek<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<Option<LeaseClaim>, Error>> {
        Box::pin(async move {
            let deadline = Instant::now() + self.timeout;
            let mut conn = self.acquire(deadline).await?;
            let done = tokio::time::timeout_at(deadline, DB::read(&mut conn, req.scope, req.key)).await;
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
        let done = tokio::time::timeout_at(deadline, DB::lease_finish(&mut conn, held, action)).await;
        self.settle(&mut conn, done)
    }
}
