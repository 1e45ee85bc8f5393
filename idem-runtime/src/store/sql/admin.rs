//! Operating idem's records: look one up, list the stuck ones, release one,
//! and see what a purge would delete. What the `idem` command-line tool
//! (the `idem-cli` package) does, as functions a program can call.
//!
//! The SQL functions work on PostgreSQL, MySQL/MariaDB and SQLite, on the
//! record table of the installed [`Stores`](crate::Stores) (`idem_records`
//! unless the application named another); the lease records
//! in Redis have their counterparts on [`RedisStore`][crate::store::RedisStore]
//! (`inspect_lease`, `stuck_leases`, `release_lease`). Purging is
//! [`purge_expired`](crate::sql::purge_expired), with
//! [`PurgeOptions::older_than`](crate::sql::PurgeOptions::older_than) for
//! records older than a cut-off whatever their retention;
//! [`purge_preview`] counts what it would delete.
//!
//! # Which records are stuck
//!
//! A record is judged by the store's clock ([`RecordState`]):
//!
//! - **lease passed** ([`RecordState::LeasePassed`]): a `lease` record
//!   still `PROCESSING` whose lease deadline has passed: its worker died or
//!   its call was dropped mid-body. The next call of the key takes it over
//!   by itself (fence + 1), so nothing waits on it; listed because the
//!   work it started may or may not have happened;
//! - **unfinished** ([`RecordState::Unfinished`]): a `PROCESSING` record
//!   with no lease, a dedup record committed without its answer (the
//!   guarded call was cancelled or panicked and the caller committed its
//!   transaction anyway). Every repeat gets
//!   [`Error::Unfinished`] until the record is
//!   deleted or its retention passes: reconcile the business state by
//!   hand, then [`release`] it. (A dedup record of a transaction still
//!   open is not visible to these reads, so it is never listed.)
//!
//! Not stuck: a `PROCESSING` record whose lease is live (its worker is
//! running: [`RecordState::Running`]), a `DONE` record, and any record past
//! its retention ([`RecordState::Expired`]: guards ignore it and take the
//! key over, and a purge deletes it).
//!
//! # Where a call stopped
//!
//! A record read here carries the steps its call recorded
//! ([`Record::steps`], see `lease::Steps`): each one's number, name,
//! result and stable key. Of a stuck lease record, the last one is where
//! its worker stopped, and the step after it was in flight (it may or may
//! not have taken effect outside: look it up there by the next step's key);
//! with none, it stopped before its first step. A take-over, or the next
//! call after a [`release`], replays the recorded steps and runs from the
//! first unrecorded one. The steps are rows of the record table too
//! (scope `\step:...`, `DONE`): never stuck, so never listed by
//! [`stuck`]; a purge deletes them with the records past their retention.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), idem_runtime::Error> {
//! use idem_runtime::admin::{self, RecordId, Release, StuckQuery};
//! for record in admin::stuck(&pool, &StuckQuery { scope: Some("bank.transfer".into()), ..Default::default() }).await? {
//!     println!("{} {} {:?} fence {}", record.scope, record.key, record.state, record.fence);
//!     // After checking with the bank that the transfer did not happen:
//!     match admin::release(&pool, &record.id(), record.fence).await? {
//!         Release::Released(_) => println!("released: the next call runs again"),
//!         other => println!("left alone: {other:?}"),
//!     }
//! }
//! let id = RecordId::new("bank.transfer", &idem_runtime::Key::new("T-1001")?);
//! if let Some(record) = admin::inspect(&pool, &id).await? {
//!     println!("{:?}", record.state);
//! }
//! # Ok(()) }
//! ```
#![doc = links!()]

use super::dialect::{Arg, Dialect, Stmt, text};
use super::schema::PurgeBatch;
use super::{PurgeOptions, SqlBackend, classify, statements};
use crate::error::Error;
use crate::lease::store::{Resolve, StartedStep, StepLog, StepOutcome};
pub use crate::record::{InFlightStep, Record, RecordId, RecordState, RecordStatus, RecordStep, Release, StuckQuery};
use crate::table::RecordTable;

/// What [`purge_preview`] counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PurgePreview {
    /// Records a purge with these options would delete now.
    pub deleted: u64,
    /// Of these, the ones it would copy into the archive (the `DONE` ones,
    /// with [`PurgeOptions::archive`]; else 0).
    pub archived: u64,
}

/// The admin functions' statements, on the statement's clock (PostgreSQL:
/// `now()`, an autocommit statement's start). Scopes and keys are always
/// bound. Their values: `$1` scope, `$2` key, `$3` fence (release); `$1`
/// scope, `$2, $3` the last record of the page before, `$4` the limit
/// (a page of stuck records).
pub(crate) struct AdminStatements {
    fetch: Stmt,
    stuck: Stmt,
    release: Stmt,
}

impl AdminStatements {
    pub(crate) fn new<D: Dialect>(t: &RecordTable) -> AdminStatements {
        let now = D::NOW;
        let columns = format!("{}, {}, {}", super::record::columns::<D>(), D::epoch_ms(now), state_sql(now));
        let stuck = stuck_sql(now);
        AdminStatements {
            fetch: Stmt::new::<D>(&format!("SELECT {columns} FROM {t} WHERE scope = $1 AND idem_key = $2")),
            stuck: Stmt::new::<D>(&format!(
                "SELECT {columns} FROM {t} WHERE {stuck} AND {page} ORDER BY scope, idem_key LIMIT $4",
                page = D::PAGE
            )),
            release: Stmt::new::<D>(&format!(
                "DELETE FROM {t} WHERE scope = $1 AND idem_key = $2 AND fence = $3 AND {stuck}"
            )),
        }
    }
}

/// The state of a record as SQL computes it, with `now` the statement's
/// clock in the table's time type: the one definition the reads and the
/// release's compare-and-delete share (see [`stuck_sql`]).
fn state_sql(now: &str) -> String {
    format!(
        "CASE WHEN expires_at <= {now} THEN 'expired' WHEN status = 'DONE' THEN 'done' \
         WHEN status = 'FAILED' THEN 'failed' WHEN lease_until IS NULL THEN 'unfinished' \
         WHEN lease_until <= {now} THEN 'lease_passed' ELSE 'running' END"
    )
}

/// The condition of a stuck record: the states `unfinished` and
/// `lease_passed` of [`state_sql`].
fn stuck_sql(now: &str) -> String {
    format!("status = 'PROCESSING' AND expires_at > {now} AND (lease_until IS NULL OR lease_until <= {now})")
}

/// Decode the admin reads' columns: the record's
/// ([`decode_record`](super::record::decode_record)), then now (epoch
/// milliseconds) and the state (a literal of idem's, read as a plain
/// string).
fn decode_admin<DB: SqlBackend>(row: &DB::Row) -> Result<Record, sqlx::Error> {
    let r = super::record::decode_record::<DB>(row)?;
    let state = DB::opt_string(row, 12)?.unwrap_or_default();
    let state = RecordState::parse(&state).ok_or_else(|| sqlx::Error::ColumnDecode {
        index: "state".into(),
        source: format!("unknown record state {state:?}").into(),
    })?;
    Ok(Record {
        scope: r.scope,
        key: r.key,
        status: r.status,
        state,
        fingerprint: r.fingerprint,
        response: r.response,
        owner: r.owner,
        fence: r.fence,
        lease_until_ms: r.lease_until_ms,
        created_at_ms: Some(r.created_at_ms),
        updated_at_ms: Some(r.updated_at_ms),
        expires_at_ms: Some(r.expires_at_ms),
        now_ms: DB::int(row, 11)?,
        steps: Vec::new(),
        in_flight: None,
    })
}

/// `record` with the steps its call recorded ([`Record::steps`]) and the
/// one in flight ([`Record::in_flight`]), read on the same connection just
/// after it.
async fn with_steps<DB: SqlBackend>(conn: &mut DB::Connection, mut record: Record) -> Result<Record, Error> {
    let log = super::steps::read::<DB>(conn, &record.scope, &record.key).await.map_err(classify::<DB>)?;
    let marked = log.started.map(|step| (step.number, step.name));
    record.set_steps(log.recorded.into_iter().map(|step| (step.name, step.result)), marked);
    Ok(record)
}

/// [`LeaseStore::resolve_step`](crate::lease::LeaseStore::resolve_step)
/// on `conn`: the record read first (held with a live lease: left alone),
/// then the call's steps, then one statement per mark that compares the
/// mark read. (A worker that claims the record between the read and the
/// write finds the step marked, and checks it or stops in doubt; one that
/// is past its check already is the operator's to wait for.)
pub(crate) async fn resolve_step<DB: SqlBackend>(
    conn: &mut DB::Connection,
    (scope, key): (&str, &str),
    step: &str,
    outcome: StepOutcome<'_>,
) -> Result<Resolve, Error> {
    use super::steps;
    if let Some(record) = fetch::<DB>(conn, &RecordId::stored(scope, key)).await?
        && record.state == RecordState::Running
    {
        let left = record.lease_left_ms().unwrap_or(0).max(0);
        return Ok(Resolve::Held { lease_left: std::time::Duration::from_millis(left as u64) });
    }
    let (recorded, marks) = steps::read_rows::<DB>(conn, scope, key).await.map_err(classify::<DB>)?;
    let started = marks.first().map(|mark| StartedStep { number: mark.number, name: mark.name.clone() });
    let before = StepLog { recorded, started };
    let Some(mark) = marks.first().filter(|mark| mark.name == step) else {
        return Ok(Resolve::NotInFlight(before));
    };
    let resolved = match outcome {
        StepOutcome::Done { result } => {
            steps::record_resolved::<DB>(conn, (scope, key), (mark.number, step), result, &mark.key).await
        }
        StepOutcome::NotDone => {
            let keys: Vec<String> = marks.into_iter().map(|mark| mark.key).collect();
            steps::delete_marks::<DB>(conn, scope, key, &keys).await.map(|deleted| deleted > 0)
        }
    };
    if resolved.map_err(classify::<DB>)? {
        return Ok(Resolve::Resolved(before));
    }
    // Recorded or resolved meanwhile.
    Ok(Resolve::NotInFlight(steps::read::<DB>(conn, scope, key).await.map_err(classify::<DB>)?))
}

/// Read one record with its state, by the database's clock.
///
/// Like [`find_record`](crate::sql::find_record), plus the clock, what the
/// record means now ([`Record::state`]) and the steps its call recorded
/// ([`Record::steps`]).
pub async fn inspect<DB: SqlBackend>(pool: &sqlx::Pool<DB>, id: &RecordId) -> Result<Option<Record>, Error> {
    let mut conn = pool.acquire().await?;
    fetch::<DB>(&mut conn, id).await
}

/// One page of stuck records (see the [module](self) docs): `PROCESSING`
/// records whose lease has passed, and unfinished dedup records, not past
/// their retention; in (scope, key) order, at most `query.limit`. For the
/// next page, set `query.after` to the last record's [`Record::id`]. Each
/// with the steps its call recorded ([`Record::steps`]): where it stopped.
///
/// Each page is one statement; it reads the whole table's `PROCESSING`
/// rows (there is no index on status), which a table of live traffic keeps
/// few; then one read by primary key a record, of its steps.
pub async fn stuck<DB: SqlBackend>(pool: &sqlx::Pool<DB>, query: &StuckQuery) -> Result<Vec<Record>, Error> {
    let mut conn = pool.acquire().await?;
    let scope = query.scope.as_deref().map(crate::key::stored_scope);
    let after = query.after.as_ref();
    let values = [
        Arg::Text(scope.as_deref()),
        Arg::Text(after.map(RecordId::scope)),
        Arg::Text(after.map(RecordId::key)),
        Arg::Int(query.limit.max(1).into()),
    ];
    let page = statements::<DB>().admin.stuck.query::<DB>(&values);
    let rows = DB::fetch_all(&mut conn, page).await.map_err(classify::<DB>)?;
    let records: Vec<Record> = rows.iter().map(decode_admin::<DB>).collect::<Result<_, _>>().map_err(classify::<DB>)?;
    let mut stuck = Vec::with_capacity(records.len());
    for record in records {
        stuck.push(with_steps::<DB>(&mut conn, record).await?);
    }
    Ok(stuck)
}

/// Delete one stuck record so the next call of its key runs again, only if
/// it is still stuck and still has the fence `fence` the caller saw (from
/// [`inspect`] or [`stuck`]): one compare-and-delete statement, so a record
/// a worker took over meanwhile (another fence), one that completed, or
/// one whose worker came back and renewed its lease, is left alone.
///
/// A `DONE` record is never released (a purge deletes records). For an
/// unfinished dedup record, first reconcile what its call did: after the
/// release a repeat runs the body again.
pub async fn release<DB: SqlBackend>(pool: &sqlx::Pool<DB>, id: &RecordId, fence: i64) -> Result<Release, Error> {
    let mut conn = pool.acquire().await?;
    let Some(seen) = fetch::<DB>(&mut conn, id).await? else {
        return Ok(Release::NotFound);
    };
    if seen.fence != fence {
        return Ok(Release::FenceChanged(seen));
    }
    if !seen.state.is_stuck() {
        return Ok(Release::NotStuck(seen));
    }
    let values = [text(id.scope()), text(id.key()), Arg::Int(fence)];
    let gone = DB::execute(&mut conn, statements::<DB>().admin.release.query::<DB>(&values)).await;
    if DB::rows(&gone.map_err(classify::<DB>)?) == 1 {
        return Ok(Release::Released(seen));
    }
    // Changed between the read and the delete: say how.
    Ok(match fetch::<DB>(&mut conn, id).await? {
        None => Release::NotFound,
        Some(now) if now.fence != fence => Release::FenceChanged(now),
        Some(now) => Release::NotStuck(now),
    })
}

async fn fetch<DB: SqlBackend>(conn: &mut DB::Connection, id: &RecordId) -> Result<Option<Record>, Error> {
    let read = statements::<DB>().admin.fetch.query::<DB>(&[text(id.scope()), text(id.key())]);
    let row = DB::fetch_optional(conn, read).await.map_err(classify::<DB>)?;
    match row.map(|row| decode_admin::<DB>(&row)).transpose().map_err(classify::<DB>)? {
        Some(record) => Ok(Some(with_steps::<DB>(conn, record).await?)),
        None => Ok(None),
    }
}

/// Count what [`purge_expired`](crate::sql::purge_expired) with `options` would
/// delete now (and archive), without deleting anything: a dry run. The
/// count is of this moment; records expire meanwhile.
pub async fn purge_preview<DB: SqlBackend>(
    pool: &sqlx::Pool<DB>,
    options: &PurgeOptions,
) -> Result<PurgePreview, Error> {
    let scope = options.scope.as_deref().map(crate::key::stored_scope);
    let purge = PurgeBatch::new(&statements::<DB>().table, scope.as_deref(), options)?;
    let count = format!(
        "SELECT count(*), {} FROM {} WHERE {}",
        DB::int8("coalesce(sum(CASE WHEN status = 'DONE' THEN 1 ELSE 0 END), 0)"),
        purge.table,
        purge.condition::<DB>(DB::NOW)
    );
    let mut conn = pool.acquire().await?;
    let query = Stmt::new::<DB>(&count).query::<DB>(&purge.args(None));
    let row = DB::fetch_one(&mut conn, query).await.map_err(classify::<DB>)?;
    let count = |i| DB::int(&row, i).map(|n| u64::try_from(n).unwrap_or(0)).map_err(classify::<DB>);
    let (deleted, done) = (count(0)?, count(1)?);
    Ok(PurgePreview { deleted, archived: if options.archive { done } else { 0 } })
}
