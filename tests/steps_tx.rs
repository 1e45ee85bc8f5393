//! Steps in a transaction of their own (`Steps::run_tx`, an atomic phase)
//! on SQLite, PostgreSQL and MariaDB: a step's writes and its record
//! commit together, so a worker that stops mid-step leaves neither, and a
//! step that committed is never run again.

use idem_test_support as common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::unique;
use idem::{Claim, Error, Guard};

const SCOPE: &str = "tests.steps_tx.transfer";

/// What the body does after its `ledger` step.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Then {
    Complete,
    /// Fail the body (a retry resumes after `ledger`).
    Fail,
    /// Never end, inside `ledger`, after its row was written (the worker
    /// stops mid-step).
    HangInLedger,
}

macro_rules! steps_tx_suite {
    (mod $m:ident; db = $db:ty; pool = $pool:expr; insert = $insert:literal;) => {
        mod $m {
            use super::*;
            use idem::lease::{LeaseStore, Steps};
            use idem::store::SqlStore;

            type Pool = sqlx::Pool<$db>;

            async fn pool() -> Option<Pool> {
                let pool = $pool.await?;
                sqlx::raw_sql(
                    "CREATE TABLE IF NOT EXISTS idem_test_ledger (transfer_id VARCHAR(191) NOT NULL, cents BIGINT NOT NULL)",
                )
                .execute(&pool)
                .await
                .unwrap();
                Some(pool)
            }

            macro_rules! pool {
                () => {
                    match pool().await {
                        Some(pool) => pool,
                        None => return,
                    }
                };
            }

            async fn rows(pool: &Pool, id: &str) -> i64 {
                let count = sqlx::query_scalar::<_, i64>(concat!(
                    "SELECT COUNT(*) FROM idem_test_ledger WHERE transfer_id = ",
                    $insert
                ))
                .bind(id)
                .fetch_one(pool)
                .await
                .unwrap();
                count
            }

            /// reserve (recorded) -> ledger (a row, in the step's own
            /// transaction) -> what `then` says.
            async fn transfer(steps: Steps<'_>, pool: &Pool, id: &str, runs: &AtomicUsize, then: Then) -> Result<u64, Error> {
                let cents = steps.run("reserve", |_| async { Ok::<_, Error>(500i64) }).await?;
                let posted = steps
                    .run_tx("ledger", pool, |tx, _key| {
                        Box::pin(async move {
                            runs.fetch_add(1, SeqCst);
                            sqlx::query(concat!(
                                "INSERT INTO idem_test_ledger (transfer_id, cents) VALUES (",
                                $insert,
                                ", 500)"
                            ))
                            .bind(id)
                            .execute(&mut **tx)
                            .await?;
                            if then == Then::HangInLedger {
                                std::future::pending::<()>().await;
                            }
                            Ok::<_, Error>(cents as u64)
                        })
                    })
                    .await?;
                match then {
                    Then::Fail => Err(Error::Store { store: "notify", source: "the mail server is down".into() }),
                    _ => Ok(posted),
                }
            }

            async fn call(
                store: &dyn LeaseStore,
                pool: &Pool,
                id: &str,
                lease: Duration,
                runs: &AtomicUsize,
                then: Then,
            ) -> Result<u64, Error> {
                match Guard::new(SCOPE).key(id).lease::<u64>(store, lease).await? {
                    Claim::Replay(posted) => Ok(posted),
                    Claim::Run(ticket) => ticket.run_steps(|steps| transfer(steps, pool, id, runs, then)).await,
                }
            }

            /// The body fails after its ledger step committed: the retry
            /// replays the step's result without a transaction, and the
            /// ledger holds one row.
            #[tokio::test]
            async fn a_committed_step_is_replayed_not_run_again() {
                let pool = pool!();
                let store = SqlStore::new(pool.clone());
                let (id, runs) = (unique("tx-fail"), AtomicUsize::new(0));
                let lease = Duration::from_secs(5);
                let first = call(&store, &pool, &id, lease, &runs, Then::Fail).await;
                assert!(matches!(first, Err(Error::Store { store: "notify", .. })), "{first:?}");
                assert_eq!((runs.load(SeqCst), rows(&pool, &id).await), (1, 1), "the step committed with its row");
                assert_eq!(call(&store, &pool, &id, lease, &runs, Then::Complete).await.unwrap(), 500);
                assert_eq!((runs.load(SeqCst), rows(&pool, &id).await), (1, 1), "replayed, not run again");
                assert_eq!(call(&store, &pool, &id, lease, &runs, Then::Complete).await.unwrap(), 500);
                assert_eq!(rows(&pool, &id).await, 1);
            }

            /// A worker stops inside the step after writing its row (its
            /// future dropped): the row goes with the transaction, nothing
            /// is recorded, and the take-over writes the row once.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_worker_stopped_mid_step_leaves_neither_its_writes_nor_its_record() {
                let pool = pool!();
                let store = SqlStore::new(pool.clone());
                let (id, runs) = (unique("tx-crash"), AtomicUsize::new(0));
                let lease = Duration::from_millis(600);
                let dying = call(&store, &pool, &id, lease, &runs, Then::HangInLedger);
                assert!(tokio::time::timeout(Duration::from_millis(300), dying).await.is_err());
                assert_eq!(runs.load(SeqCst), 1);
                // The dropped transaction's rollback is sent as its
                // connection goes back to the pool.
                tokio::time::sleep(lease + Duration::from_millis(200)).await;
                assert_eq!(rows(&pool, &id).await, 0, "rolled back with the step");
                assert_eq!(call(&store, &pool, &id, lease, &runs, Then::Complete).await.unwrap(), 500);
                assert_eq!((runs.load(SeqCst), rows(&pool, &id).await), (2, 1), "run again by the take-over, once");
            }

            /// A worker whose lease was lost mid-step (its renewals fail
            /// until the lease passes) is stopped, its step rolled back; the
            /// take-over's step is the one that counts.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_step_of_a_worker_that_lost_its_lease_is_rolled_back() {
                use idem::testing::{Fault, Faults, Op};
                let pool = pool!();
                let faults = Faults::new();
                let store = faults.wrap(SqlStore::new(pool.clone()));
                let (id, runs) = (unique("tx-lost"), AtomicUsize::new(0));
                let lease = Duration::from_millis(600);
                faults.inject(Op::Extend, Fault::Fail);
                let lost = call(&store, &pool, &id, lease, &runs, Then::HangInLedger).await;
                assert!(matches!(lost, Err(Error::LeaseLost { .. })), "{lost:?}");
                faults.clear();
                tokio::time::sleep(Duration::from_millis(200)).await;
                assert_eq!(rows(&pool, &id).await, 0);
                assert_eq!(call(&store, &pool, &id, lease, &runs, Then::Complete).await.unwrap(), 500);
                assert_eq!(rows(&pool, &id).await, 1);
            }

            /// 100 duplicates at once: one runs the steps; one ledger row.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_hundred_concurrent_duplicates_write_one_row() {
                let pool = pool!();
                let store = SqlStore::new(pool.clone());
                let (id, runs) = (unique("tx-race"), AtomicUsize::new(0));
                let report = idem::testing::Duplicates::new()
                    .concurrent(100)
                    .sequential(2)
                    .fire(|_| async {
                        let claim = Guard::new(SCOPE).key(&id);
                        match claim.lease_or_wait::<u64>(&store, Duration::from_secs(5), Duration::from_secs(20)).await? {
                            Claim::Replay(posted) => Ok(posted),
                            Claim::Run(ticket) => {
                                ticket.run_steps(|steps| transfer(steps, &pool, &id, &runs, Then::Complete)).await
                            }
                        }
                    })
                    .await;
                report.assert_same_answers();
                assert_eq!((runs.load(SeqCst), rows(&pool, &id).await), (1, 1));
            }

            /// A call whose steps outlived their retention (its body
            /// failed, no retry came in time) runs from its first step
            /// again: the expired rows are no steps of it, and make way for
            /// its new ones.
            #[tokio::test]
            async fn steps_past_their_retention_make_way_for_new_ones() {
                let pool = pool!();
                let store = SqlStore::new(pool.clone());
                let (id, runs) = (unique("tx-expired"), AtomicUsize::new(0));
                let guard = || Guard::new(SCOPE).key(&id).retention(Duration::from_secs(1));
                let lease = Duration::from_secs(5);
                let Claim::Run(ticket) = guard().lease::<u64>(&store, lease).await.unwrap() else { panic!() };
                let failed = ticket.run_steps(|steps| transfer(steps, &pool, &id, &runs, Then::Fail)).await;
                assert!(failed.is_err());
                tokio::time::sleep(Duration::from_millis(1500)).await;
                let Claim::Run(ticket) = guard().lease::<u64>(&store, lease).await.unwrap() else { panic!() };
                let (pool_ref, id_ref, runs_ref) = (&pool, &id, &runs);
                let done = ticket.run_steps(|steps| async move {
                    assert_eq!(steps.recorded(), 0, "expired steps are not the call's");
                    transfer(steps, pool_ref, id_ref, runs_ref, Then::Complete).await
                });
                assert_eq!(done.await.unwrap(), 500);
                assert_eq!(runs.load(SeqCst), 2, "the expired ledger step ran again");
            }

            /// Lease records in memory: a step in a transaction of this
            /// database cannot be recorded with its writes; refused before
            /// it runs.
            #[tokio::test]
            async fn a_step_transaction_away_from_the_lease_records_is_refused() {
                let pool = pool!();
                let store = idem::store::MemoryStore::new();
                let (id, runs) = (unique("tx-elsewhere"), AtomicUsize::new(0));
                let refused = call(&store, &pool, &id, Duration::from_secs(5), &runs, Then::Complete).await;
                let Err(Error::Step { step, reason, .. }) = refused else { panic!("{refused:?}") };
                assert_eq!(step, "ledger");
                assert!(reason.contains("another database (`memory`)"), "{reason}");
                assert_eq!((runs.load(SeqCst), rows(&pool, &id).await), (0, 0));
            }
        }
    };
}

steps_tx_suite! {
    mod sqlite;
    db = sqlx::Sqlite;
    pool = common::sqlite();
    insert = "?";
}

steps_tx_suite! {
    mod postgres;
    db = sqlx::Postgres;
    pool = common::postgres();
    insert = "$1";
}

steps_tx_suite! {
    mod mysql;
    db = sqlx::MySql;
    pool = common::mysql();
    insert = "?";
}

/// Lease records in one SQLite file, the step's transaction in another: the
/// record is refused in that transaction, its writes rolled back, and the
/// call fails with what to do.
#[tokio::test]
async fn a_step_transaction_on_another_database_of_the_same_kind_is_refused() {
    let (Some(records), Some(other)) = (common::sqlite().await, common::sqlite().await) else { return };
    sqlx::raw_sql("CREATE TABLE ledger (id TEXT)").execute(&other).await.unwrap();
    let store = idem::store::SqlStore::new(records);
    let other = &other;
    let Claim::Run(ticket) = Guard::new(SCOPE).key("T-1").lease::<u8>(&store, Duration::from_secs(5)).await.unwrap()
    else {
        panic!("first call")
    };
    let refused = ticket
        .run_steps(|steps| async move {
            steps
                .run_tx("ledger", other, |tx, _| {
                    Box::pin(async move {
                        sqlx::query("INSERT INTO ledger VALUES ('T-1')").execute(&mut **tx).await?;
                        Ok::<u8, Error>(1)
                    })
                })
                .await
        })
        .await;
    let Err(Error::Step { reason, .. }) = refused else { panic!("{refused:?}") };
    assert!(reason.contains("another database"), "{reason}");
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM ledger").fetch_one(other).await.unwrap();
    assert_eq!(rows, 0, "rolled back");
}

/// `purge --older-than` takes completed records whatever their retention,
/// but not the recorded steps of a call still waiting for its take-over
/// (a purged step would run again: a second charge), and the archive keeps
/// completed calls, not steps.
#[tokio::test]
async fn a_purge_of_old_records_keeps_the_steps_of_a_stopped_call() {
    let Some(pool) = common::sqlite().await else { return };
    let store = idem::store::SqlStore::new(pool.clone());
    let lease = Duration::from_millis(300);
    let Claim::Run(ticket) = Guard::new(SCOPE).key("T-9").lease::<u8>(&store, lease).await.unwrap() else {
        panic!("first call")
    };
    let stopped = ticket.run_steps(|steps| async move {
        steps.run("charge", |_| async { Ok::<u8, Error>(7) }).await?;
        std::future::pending::<()>().await;
        Ok::<u8, Error>(0)
    });
    assert!(tokio::time::timeout(Duration::from_millis(100), stopped).await.is_err());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let options =
        idem::sql::PurgeOptions { older_than: Some(Duration::from_millis(1)), archive: true, ..Default::default() };
    idem::sql::purge_expired(&pool, options).await.unwrap();
    let archived: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_records_archive").fetch_one(&pool).await.unwrap();
    assert_eq!(archived, 0, "a step is no completed call");
    tokio::time::sleep(lease).await;
    let charges = &AtomicUsize::new(0);
    let Claim::Run(ticket) = Guard::new(SCOPE).key("T-9").lease::<u8>(&store, lease).await.unwrap() else {
        panic!("the take-over")
    };
    let charged = ticket
        .run_steps(|steps| async move {
            steps
                .run("charge", |_| async {
                    charges.fetch_add(1, SeqCst);
                    Ok::<u8, Error>(8)
                })
                .await
        })
        .await
        .unwrap();
    assert_eq!((charged, charges.load(SeqCst)), (7, 0), "the recorded charge replayed");
}
