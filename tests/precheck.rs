//! `precheck = "redis"` in front of `dedup` and `lease`: the marker is a
//! hint, the record decides. Against a real Redis, Redis Cluster, etcd (and
//! memory), with SQLite and PostgreSQL records.

use idem_test_support as common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

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
async fn apply<DB: Database + idem::sql::SqlBackend>(
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

async fn call<DB: Database + idem::sql::SqlBackend>(
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

/// The stores of this test binary: precheck markers in memory, for the
/// guards whose `store` names their lease or token store (their markers go
/// to the installed precheck store). Installed once; later calls find it.
fn install_markers() {
    match idem::Stores::builder().precheck(idem::store::MemoryStore::new()).install() {
        Ok(_) | Err(idem::Error::StoresAlreadyInstalled) => {}
        Err(e) => panic!("{e}"),
    }
}

/// A connection to Redis, standalone or Cluster, to flush markers with.
#[derive(Clone)]
enum Conn {
    Single(redis::aio::ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
    Etcd(idem::store::EtcdStore),
}

/// Markers in Redis under a prefix of their own, so a test can flush them.
async fn redis_marks() -> Option<(idem::store::RedisStore, Conn, String)> {
    let conn = common::redis().await?;
    let prefix = format!("{}:", unique("idem-precheck"));
    Some((idem::store::RedisStore::new(conn.clone(), prefix.clone()), Conn::Single(conn), prefix))
}

/// The same on the Redis Cluster: each marker on the master of its key's slot.
async fn cluster_marks() -> Option<(idem::store::RedisStore<redis::cluster_async::ClusterConnection>, Conn, String)> {
    let conn = common::redis_cluster().await?;
    let prefix = format!("{}:", unique("idem-precheck"));
    Some((idem::store::RedisStore::new(conn.clone(), prefix.clone()), Conn::Cluster(conn), prefix))
}

/// The same on the test binary's etcd cluster.
async fn etcd_marks() -> Option<(idem::store::EtcdStore, Conn, String)> {
    let prefix = format!("{}/", unique("idem-precheck"));
    let store = common::etcd_cluster::shared().await?.store(&prefix).await;
    Some((store.clone(), Conn::Etcd(store), prefix))
}

/// Delete every marker under `prefix`: with `SCAN` on the shared
/// standalone server (never `KEYS`, which blocks it on a big keyspace); on
/// the test cluster, which holds only test keys, `KEYS` (the cluster client
/// asks every master) and a `DEL` to each key's.
async fn flush(conn: &Conn, prefix: &str) {
    let flushed = match conn.clone() {
        Conn::Single(mut c) => common::scan_unlink(&mut c, &format!("{prefix}*")).await,
        Conn::Cluster(mut c) => {
            let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}*")).query_async(&mut c).await.unwrap();
            for k in &keys {
                let _: () = redis::cmd("DEL").arg(k).query_async(&mut c).await.unwrap();
            }
            keys.len()
        }
        Conn::Etcd(store) => {
            let options = etcd_client::DeleteOptions::new().with_prefix();
            store.client().delete(prefix, Some(options)).await.unwrap().deleted() as usize
        }
    };
    assert!(flushed > 0, "markers were written under {prefix}");
}

macro_rules! dedup_suite {
    (mod $m:ident; pool = $pool:expr;) => {
        dedup_suite! { mod $m; pool = $pool; marks = redis_marks(); }
    };
    (mod $m:ident; pool = $pool:expr; marks = $marks:expr;) => {
        mod $m {
            use super::*;

            #[tokio::test]
            async fn a_seen_key_replays_from_the_record_and_a_flush_costs_nothing_but_speed() {
                let Some(pool) = $pool else { return };
                let Some((marks, conn, prefix)) = $marks.await else { return };
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
                let Some((marks, _, _)) = $marks.await else { return };
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

            /// A precheck store that never answers costs a call at most
            /// `idem::precheck::WAIT`, then the database decides (the bound
            /// below is a liveness check, far above that wait).
            #[tokio::test]
            async fn a_silent_precheck_store_is_given_up_after_its_wait() {
                let Some(pool) = $pool else { return };
                let Some(silent) = common::silent_redis().await else { return };
                let (id, runs) = (unique("msg"), AtomicUsize::new(0));
                for expected in [Outcome::Executed, Outcome::Replayed] {
                    let call = tokio::time::timeout(Duration::from_secs(5), call(&pool, &silent, &id, 5, &runs, true));
                    let (result, outcome) = call.await.expect("the call waited on the silent store");
                    assert_eq!((result.unwrap(), outcome), (5, Some(expected)));
                }
                assert_eq!(runs.load(SeqCst), 1);
            }

            #[tokio::test]
            async fn memory_markers_work_the_same() {
                let Some(pool) = $pool else { return };
                let marks = idem::store::MemoryStore::new();
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

// Markers on etcd, records in SQLite.
dedup_suite! {
    mod sqlite_etcd_marks;
    pool = common::sqlite().await;
    marks = etcd_marks();
}

// Markers on the Redis Cluster, records in SQLite.
dedup_suite! {
    mod sqlite_cluster_marks;
    pool = common::sqlite().await;
    marks = cluster_marks();
}

#[tokio::test]
async fn a_seen_lease_record_replays_from_a_plain_read() {
    install_markers();
    let Some(pool) = common::postgres().await else { return };
    let leases = idem::store::SqlStore::new(pool);
    let (id, runs) = (unique("lease"), AtomicUsize::new(0));
    assert!(matches!(idem::observe(transfer(&leases, &id, &runs)).await, (Ok(()), Some(Outcome::Executed))));
    let before = idem::precheck::counters();
    assert!(matches!(idem::observe(transfer(&leases, &id, &runs)).await, (Ok(()), Some(Outcome::Replayed))));
    let after = idem::precheck::counters();
    assert!(after.confirmed > before.confirmed, "{before:?} {after:?}");
    assert_eq!(runs.load(SeqCst), 1);
}

/// `precheck` in front of the record of `dedup+state` and `token+dedup`:
/// a seen, completed key replays before the claim, the state change or the
/// token. SQLite records, Redis markers.
mod record_of_other_strategies {
    use super::*;
    use sqlx::Sqlite;

    #[derive(idem::StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
    #[allow(dead_code)]
    #[state(table = "idem_test_precheck_orders", key_column = "order_no", status_column = "status")]
    enum PayStatus {
        #[state(code = 1, to(Paid))]
        WaitPay,
        #[state(code = 2)]
        Paid,
    }

    #[idempotent(
        key = "order_no",
        strategy = "dedup+state",
        scope = "tests.precheck.paid",
        precheck = "redis",
        store = "marks",
        transition = "PayStatus::WaitPay -> PayStatus::Paid"
    )]
    async fn on_paid(
        tx: &mut Transaction<'_, Sqlite>,
        marks: &dyn PrecheckStore,
        order_no: &str,
        runs: &AtomicUsize,
    ) -> Result<(), AppError> {
        runs.fetch_add(1, SeqCst);
        Ok(())
    }

    #[idempotent(
        key = "request_id",
        strategy = "token+dedup",
        scope = "tests.precheck.submit",
        precheck = "redis",
        store = "tokens"
    )]
    async fn submit(
        tx: &mut Transaction<'_, Sqlite>,
        tokens: &idem::store::MemoryStore,
        request_id: &str,
        #[idem(token)] token: &str,
        runs: &AtomicUsize,
    ) -> Result<usize, AppError> {
        Ok(runs.fetch_add(1, SeqCst) + 1)
    }

    #[tokio::test]
    async fn dedup_state_replays_a_seen_completed_key_before_its_state_change() {
        let Some(pool) = common::sqlite().await else { return };
        let Some((marks, conn, prefix)) = redis_marks().await else { return };
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS idem_test_precheck_orders (order_no TEXT PRIMARY KEY, status INTEGER NOT NULL)",
        )
        .execute(&pool)
        .await
        .unwrap();
        let (order, runs) = (unique("order"), AtomicUsize::new(0));
        sqlx::query("INSERT INTO idem_test_precheck_orders VALUES (?, 1)").bind(&order).execute(&pool).await.unwrap();
        let pay = || async {
            let mut tx = pool.begin().await.unwrap();
            let out = idem::observe(on_paid(&mut tx, &marks, &order, &runs)).await;
            tx.commit().await.unwrap();
            out
        };
        assert!(matches!(pay().await, (Ok(()), Some(Outcome::Executed))));
        let before = idem::precheck::counters();
        let again = pay().await;
        assert!(matches!(again, (Ok(()), Some(Outcome::Replayed))), "{again:?}");
        assert!(idem::precheck::counters().confirmed > before.confirmed, "replayed from the precheck read");
        // Markers lost: the record still decides.
        flush(&conn, &prefix).await;
        assert!(matches!(pay().await, (Ok(()), Some(Outcome::Replayed))));
        assert_eq!(runs.load(SeqCst), 1);
        let status: i64 = sqlx::query_scalar("SELECT status FROM idem_test_precheck_orders WHERE order_no = ?")
            .bind(&order)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(status, 2);
    }

    #[tokio::test]
    async fn token_dedup_replays_a_seen_completed_key_without_its_token() {
        // `store` names the token store; the markers go to the installed
        // precheck store (a memory store here).
        install_markers();
        let Some(pool) = common::sqlite().await else { return };
        let tokens = idem::store::MemoryStore::new();
        let (request, runs) = (unique("req"), AtomicUsize::new(0));
        let token =
            idem::token::issue(&tokens, "tests.precheck.submit", std::time::Duration::from_secs(60)).await.unwrap();
        let send = |token: String| {
            let (pool, tokens, request, runs) = (&pool, &tokens, &request, &runs);
            async move {
                let mut tx = pool.begin().await.unwrap();
                let out = idem::observe(submit(&mut tx, tokens, request, &token, runs)).await;
                tx.commit().await.unwrap();
                out
            }
        };
        assert!(matches!(send(token.clone()).await, (Ok(1), Some(Outcome::Executed))));
        // The retry carries the spent token, or none at all: the record answers.
        let before = idem::precheck::counters();
        assert!(matches!(send(token).await, (Ok(1), Some(Outcome::Replayed))));
        assert!(matches!(send(String::new()).await, (Ok(1), Some(Outcome::Replayed))));
        assert!(idem::precheck::counters().confirmed >= before.confirmed + 2, "both replayed from the precheck read");
        assert_eq!(runs.load(SeqCst), 1);
    }
}
