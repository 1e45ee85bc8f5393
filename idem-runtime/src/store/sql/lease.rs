//! Lease records in SQLite, PostgreSQL or MySQL/MariaDB: the `idem_records`
//! table of the dedup strategy, each step its own short autocommit statement.

use std::sync::{Arc, OnceLock};

use super::{SqlBackend, classify};
use crate::Error;
use crate::store::BoxFuture;
use crate::store::lease::{HeldLease, LeaseClaim, LeaseRequest, LeaseStore};

/// Lease records in a SQL database, through a connection pool. The lease
/// deadline and expiry use the database's clock.
///
/// ```no_run
/// # extern crate idem_runtime as idem;
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), idem::Error> {
/// idem::migrate(&pool).await?;
/// idem::Stores::builder().lease(idem::lease::SqlStore::new(pool)).install()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct SqlStore<DB: SqlBackend> {
    pool: sqlx::Pool<DB>,
    /// The longest answer the server holds, once asked (see `answer_limit`).
    answer_limit: Arc<OnceLock<usize>>,
}

// By hand: derived, it would ask `DB: Clone` of the database type.
impl<DB: SqlBackend> Clone for SqlStore<DB> {
    fn clone(&self) -> Self {
        SqlStore { pool: self.pool.clone(), answer_limit: self.answer_limit.clone() }
    }
}

impl<DB: SqlBackend> SqlStore<DB> {
    /// A store on `pool` (run [`crate::migrate`] on it first).
    pub fn new(pool: sqlx::Pool<DB>) -> SqlStore<DB> {
        SqlStore { pool, answer_limit: Arc::default() }
    }

    /// The pool.
    pub fn pool(&self) -> &sqlx::Pool<DB> {
        &self.pool
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
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
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
            if let Some(&limit) = self.answer_limit.get() {
                return limit;
            }
            // Asked once; if the server cannot be asked now, the column's
            // limit stands for this answer and the next one asks again.
            let Ok(mut conn) = self.pool.acquire().await else { return DB::MAX_RESPONSE };
            match DB::answer_limit(&mut conn).await {
                Ok(limit) => *self.answer_limit.get_or_init(|| limit),
                Err(_) => DB::MAX_RESPONSE,
            }
        })
    }

    fn claim<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<LeaseClaim, Error>> {
        Box::pin(async move {
            let mut conn = self.pool.acquire().await?;
            // A record committed while the claim waited can be invisible to
            // its snapshot: the statement then finds nothing; ask again.
            for _ in 0..5 {
                if let Some(claim) = DB::lease_claim(&mut conn, req).await.map_err(classify::<DB>)? {
                    return Ok(claim);
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
            let mut conn = self.pool.acquire().await?;
            let existing = DB::read(&mut conn, req.scope, req.key).await.map_err(classify::<DB>)?;
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
        let mut conn = self.pool.acquire().await?;
        DB::lease_finish(&mut conn, held, action).await.map_err(classify::<DB>)
    }
}
