//! `precheck = "redis"` in front of `dedup` and `lease`: the marker is a
//! hint, the record decides. Against a real Redis (and memory), with
//! SQLite and PostgreSQL records.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use common::{AppError, unique};
use idem::precheck::PrecheckStore;
use idem::{Error, Outcome, idempotent};
use sqlx::{Database, Transaction};

#[idempotent(
    key = "id",
    scope = "tests.precheck.apply",
    precheck = "redis",
    ttl = "1h",
    store = "marks",
    fingerprint = "amount"
)]
async fn apply<DB: Database + idem::SqlBackend>(
    tx: &mut Transaction<'_, DB>,
    marks: &dyn PrecheckStore,
    id: &str,
    amount: i64,
    runs: &AtomicUsize,
) -> Result<i64, AppError>
where
    DB::Connection: Send,
{
    runs.fetch_add(1, SeqCst);
    Ok(amount)
}

#[idempotent(key = "id", strategy = "lease", scope = "tests.precheck.lease", precheck = "redis", store = "leases")]
async fn transfer(leases: &dyn idem::lease::LeaseStore, id: &str, runs: &AtomicUsize) -> Result<(), AppError> {
    runs.fetch_add(1, SeqCst);
    Ok(())
}

async fn call<DB: Database + idem::SqlBackend>(
    pool: &sqlx::Pool<DB>,
    marks: &dyn PrecheckStore,
    id: &str,
    amount: i64,
    runs: &AtomicUsize,
    commit: bool,
) -> (Result<i64, AppError>, Option<Outcome>)
where
    DB::Connection: Send,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let mut tx = pool.begin().await.unwrap();
    let out = idem::observe(apply(&mut tx, marks, id, amount, runs)).await;
    if commit {
        tx.commit().await.unwrap();
    }
    out
}

/// Markers in Redis under a prefix of their own, so a test can flush them.
async fn redis_marks() -> Option<(idem::RedisStore, redis::aio::ConnectionManager, String)> {
    let conn = common::redis().await?;
    let prefix = format!("{}:", unique("idem-precheck"));
    Some((idem::RedisStore::new(conn.clone(), prefix.clone()), conn, prefix))
}

async fn flush(conn: &redis::aio::ConnectionManager, prefix: &str) {
    let mut c = conn.clone();
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}*")).query_async(&mut c).await.unwrap();
    for k in keys {
        let _: () = redis::cmd("DEL").arg(k).query_async(&mut c).await.unwrap();
    }
}

macro_rules! dedup_suite {
    (mod $m:ident; pool = $pool:expr;) => {
        mod $m {
            use super::*;

            #[tokio::test]
            async fn a_seen_key_replays_from_the_record_and_a_flush_costs_nothing_but_speed() {
                let Some(pool) = $pool else { return };
                let Some((marks, conn, prefix)) = redis_marks().await else { return };
                let (id, runs) = (unique("msg"), AtomicUsize::new(0));
                let before = idem::precheck::counters();
                assert!(matches!(call(&pool, &marks, &id, 5, &runs, true).await, (Ok(5), Some(Outcome::Executed))));
                let again = call(&pool, &marks, &id, 5, &runs, true).await;
                assert!(matches!(again, (Ok(5), Some(Outcome::Replayed))), "{again:?}");
                let after = idem::precheck::counters();
                assert!(after.seen > before.seen && after.confirmed > before.confirmed, "{before:?} {after:?}");
                // Every marker lost: the record still decides.
                flush(&conn, &prefix).await;
                let flushed = call(&pool, &marks, &id, 5, &runs, true).await;
                assert!(matches!(flushed, (Ok(5), Some(Outcome::Replayed))), "{flushed:?}");
                // The fingerprint is checked on the fast path too.
                let other = call(&pool, &marks, &id, 6, &runs, true).await;
                assert!(matches!(other.0, Err(AppError::Idem(Error::KeyMismatch { .. }))), "{other:?}");
                assert_eq!(runs.load(SeqCst), 1);
            }

            #[tokio::test]
            async fn a_marker_whose_record_rolled_back_runs_again() {
                let Some(pool) = $pool else { return };
                let Some((marks, _, _)) = redis_marks().await else { return };
                let (id, runs) = (unique("msg"), AtomicUsize::new(0));
                // The first delivery crashes before commit: marker written, record gone.
                assert!(matches!(call(&pool, &marks, &id, 5, &runs, false).await, (Ok(5), _)));
                let redelivered = call(&pool, &marks, &id, 5, &runs, true).await;
                assert!(matches!(redelivered, (Ok(5), Some(Outcome::Executed))), "{redelivered:?}");
                assert_eq!(runs.load(SeqCst), 2);
                let again = call(&pool, &marks, &id, 5, &runs, true).await;
                assert!(matches!(again, (Ok(5), Some(Outcome::Replayed))), "{again:?}");
            }

            #[tokio::test]
            async fn an_unreachable_precheck_store_leaves_the_database_to_decide() {
                let Some(pool) = $pool else { return };
                let Some(down) = common::unreachable_redis().await else { return };
                let (id, runs) = (unique("msg"), AtomicUsize::new(0));
                assert!(matches!(call(&pool, &down, &id, 5, &runs, true).await, (Ok(5), Some(Outcome::Executed))));
                let again = call(&pool, &down, &id, 5, &runs, true).await;
                assert!(matches!(again, (Ok(5), Some(Outcome::Replayed))), "{again:?}");
                assert_eq!(runs.load(SeqCst), 1);
            }

            #[tokio::test]
            async fn memory_markers_work_the_same() {
                let Some(pool) = $pool else { return };
                let marks = idem::MemoryStore::new();
                let (id, runs) = (unique("msg"), AtomicUsize::new(0));
                assert!(matches!(call(&pool, &marks, &id, 5, &runs, true).await, (Ok(5), Some(Outcome::Executed))));
                assert!(matches!(call(&pool, &marks, &id, 5, &runs, true).await, (Ok(5), Some(Outcome::Replayed))));
                assert_eq!(runs.load(SeqCst), 1);
            }
        }
    };
}

dedup_suite! {
    mod sqlite;
    pool = common::sqlite().await;
}

dedup_suite! {
    mod postgres;
    pool = common::postgres().await;
}

dedup_suite! {
    mod mysql;
    pool = common::mysql().await;
}

#[tokio::test]
async fn a_seen_lease_record_replays_from_a_plain_read() {
    let Some(pool) = common::postgres().await else { return };
    let leases = idem::lease::SqlStore::new(pool);
    let (id, runs) = (unique("lease"), AtomicUsize::new(0));
    assert!(matches!(idem::observe(transfer(&leases, &id, &runs)).await, (Ok(()), Some(Outcome::Executed))));
    let before = idem::precheck::counters();
    assert!(matches!(idem::observe(transfer(&leases, &id, &runs)).await, (Ok(()), Some(Outcome::Replayed))));
    let after = idem::precheck::counters();
    assert!(after.confirmed > before.confirmed, "{before:?} {after:?}");
    assert_eq!(runs.load(SeqCst), 1);
}
