//! The test kit (`idem::testing`) on real stores: duplicates fired at a
//! guarded callback on every database, an unguarded one caught, and each
//! kind of store fault against the lease stores users run (Redis,
//! PostgreSQL, MariaDB, SQLite, memory) and a precheck cache.

use idem_test_support as common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::{AppError, unique};
use idem::lease::LeaseStore;
use idem::precheck::PrecheckStore;
use idem::testing::{Duplicates, Fault, Faults, Op};
use idem::{Error, idempotent};
use sqlx::{Database, Transaction};

/// A coupon per trade, written in the caller's transaction.
#[idempotent(key = "trade_no", scope = "tests.testing.grant")]
async fn grant<DB: idem::sql::SqlBackend>(
    tx: &mut Transaction<'_, DB>,
    trade_no: &str,
    runs: &AtomicUsize,
) -> Result<usize, AppError> {
    let _ = tx;
    Ok(runs.fetch_add(1, SeqCst) + 1)
}

/// The same body with no guard: every copy runs it.
async fn grant_unguarded(runs: &AtomicUsize) -> Result<usize, AppError> {
    tokio::task::yield_now().await;
    Ok(runs.fetch_add(1, SeqCst) + 1)
}

async fn duplicates_grant_one<DB: idem::sql::SqlBackend>(pool: sqlx::Pool<DB>)
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let (trade, runs) = (unique("trade"), AtomicUsize::new(0));
    let report = Duplicates::new()
        .concurrent(50)
        .sequential(3)
        .fire(|_| async {
            let mut tx = pool.begin().await?;
            let coupon = grant(&mut tx, &trade, &runs).await?;
            tx.commit().await?;
            Ok::<_, AppError>(coupon)
        })
        .await;
    assert_eq!(report.answers().len(), 53);
    report.assert_idempotent(runs.load(SeqCst));
}

#[tokio::test]
async fn duplicates_of_a_guarded_callback_grant_one_coupon_on_sqlite() {
    let Some(pool) = common::sqlite().await else { return };
    duplicates_grant_one(pool).await;
}

#[tokio::test]
async fn duplicates_of_a_guarded_callback_grant_one_coupon_on_postgres() {
    let Some(pool) = common::postgres().await else { return };
    duplicates_grant_one(pool).await;
}

#[tokio::test]
async fn duplicates_of_a_guarded_callback_grant_one_coupon_on_mysql() {
    let Some(pool) = common::mysql().await else { return };
    duplicates_grant_one(pool).await;
}

/// What the kit is for: a handler that is not idempotent fails the
/// assertion, with the differing answers and the run count in its message.
#[tokio::test]
async fn an_unguarded_handler_fails_the_check_with_what_differed() {
    let runs = AtomicUsize::new(0);
    let report = Duplicates::new().concurrent(5).sequential(1).fire(|_| grant_unguarded(&runs)).await;
    let executions = runs.load(SeqCst);
    let text = report.check_idempotent(executions).unwrap_err();
    assert!(text.contains("6 copies of one call got 6 different answers"), "{text}");
    assert!(text.contains("the effect happened 6 times"), "{text}");
}

type Store = Arc<dyn LeaseStore>;

async fn lease_stores() -> Vec<(&'static str, Store)> {
    let mut stores: Vec<(&'static str, Store)> = vec![("memory", Arc::new(idem::store::MemoryStore::new()))];
    if let Some(pool) = common::sqlite().await {
        stores.push(("sqlite", Arc::new(idem::store::SqlStore::new(pool))));
    }
    if let Some(pool) = common::postgres().await {
        stores.push(("postgres", Arc::new(idem::store::SqlStore::new(pool))));
    }
    if let Some(pool) = common::mysql().await {
        stores.push(("mysql", Arc::new(idem::store::SqlStore::new(pool))));
    }
    if let Some(conn) = common::redis().await {
        stores.push(("redis", Arc::new(idem::store::RedisStore::new(conn, format!("{}:", unique("idem-test"))))));
    }
    stores
}

/// A transfer under a lease that counts its runs.
async fn transfer(store: &dyn LeaseStore, id: &str, lease: Duration, runs: &AtomicUsize) -> Result<u32, Error> {
    match idem::Guard::new("tests.testing.transfer").key(id).lease::<u32>(store, lease).await? {
        idem::Claim::Replay(receipt) => Ok(receipt),
        idem::Claim::Run(ticket) => ticket.run(async { Ok::<u32, Error>(runs.fetch_add(1, SeqCst) as u32 + 40) }).await,
    }
}

/// The store down at the claim: the call fails with a store error and
/// nothing runs; back up, the call runs once and its repeats replay.
#[tokio::test]
async fn a_store_down_at_the_claim_runs_nothing() {
    for (name, inner) in lease_stores().await {
        let faults = Faults::new();
        let store = faults.wrap(inner);
        let (id, runs) = (unique("down"), AtomicUsize::new(0));
        faults.inject(Op::Claim, Fault::Fail);
        let refused = transfer(&store, &id, Duration::from_secs(5), &runs).await;
        assert!(matches!(refused, Err(Error::Store { .. })), "{name}: {refused:?}");
        assert_eq!(runs.load(SeqCst), 0, "{name}");
        faults.clear();
        let report = Duplicates::new()
            .concurrent(0)
            .sequential(4)
            .fire(|_| transfer(&store, &id, Duration::from_secs(5), &runs))
            .await;
        report.assert_idempotent(runs.load(SeqCst));
    }
}

/// The completion reached the store but its reply was lost: idem writes
/// it again (harmless for the same holder) and the body ran once.
#[tokio::test]
async fn a_reply_lost_after_the_completion_runs_the_body_once() {
    for (name, inner) in lease_stores().await {
        let faults = Faults::new();
        let store = faults.wrap(inner);
        let (id, runs) = (unique("reply-lost"), AtomicUsize::new(0));
        faults.inject_times(Op::Complete, Fault::DropAfterWrite, 1);
        let report = Duplicates::new()
            .concurrent(0)
            .sequential(3)
            .fire(|_| transfer(&store, &id, Duration::from_secs(5), &runs))
            .await;
        report.assert_idempotent(runs.load(SeqCst));
        assert_eq!(faults.calls(Op::Complete), 2, "{name}: written, then written again");
    }
}

/// An acknowledged completion the store lost (a failover, a flush): the
/// record is as a crash leaves it, so repeats are told the call is in
/// progress until its lease passes, and then one of them runs the body
/// again. The kit shows what a store that loses writes costs.
#[tokio::test]
async fn a_completion_the_store_lost_is_taken_over_once_its_lease_passes() {
    for (name, inner) in lease_stores().await {
        let faults = Faults::new();
        let store = faults.wrap(inner);
        let (id, runs, lease) = (unique("lost-write"), AtomicUsize::new(0), Duration::from_millis(400));
        faults.inject_times(Op::Complete, Fault::LoseWrite, 1);
        assert_eq!(transfer(&store, &id, lease, &runs).await.unwrap(), 40, "{name}");
        let busy = transfer(&store, &id, lease, &runs).await;
        assert!(matches!(busy, Err(Error::InProgress { .. })), "{name}: {busy:?}");
        tokio::time::sleep(lease + Duration::from_millis(200)).await;
        assert_eq!(transfer(&store, &id, lease, &runs).await.unwrap(), 41, "{name}: taken over, run again");
        assert_eq!(transfer(&store, &id, lease, &runs).await.unwrap(), 41, "{name}: then replayed");
        assert_eq!(runs.load(SeqCst), 2, "{name}");
    }
}

/// A claim that lands after its caller gave up on it (told the store did
/// not answer in time): the caller ran nothing, and the record it left
/// holds the key as a crashed worker's would, until its lease passes; then
/// one call runs the body.
#[tokio::test]
async fn a_claim_that_lands_after_its_caller_gave_up_holds_the_key_for_its_lease() {
    for (name, inner) in lease_stores().await {
        let faults = Faults::new();
        let store = faults.wrap(inner);
        let (id, runs, lease) = (unique("late-claim"), AtomicUsize::new(0), Duration::from_secs(1));
        faults.inject_times(Op::Claim, Fault::LandsLate(Duration::from_millis(50)), 1);
        let started = std::time::Instant::now();
        let refused = transfer(&store, &id, lease, &runs).await;
        assert!(matches!(refused, Err(Error::Store { .. })), "{name}: {refused:?}");
        assert!(started.elapsed() < Duration::from_millis(50), "{name}: told at once, {:?}", started.elapsed());
        tokio::time::sleep(Duration::from_millis(300)).await;
        let busy = transfer(&store, &id, lease, &runs).await;
        assert!(matches!(busy, Err(Error::InProgress { .. })), "{name}: the late claim landed: {busy:?}");
        tokio::time::sleep(lease).await;
        assert_eq!(transfer(&store, &id, lease, &runs).await.unwrap(), 40, "{name}: taken over");
        assert_eq!(runs.load(SeqCst), 1, "{name}");
    }
}

/// A slow store delays the call, nothing more.
#[tokio::test]
async fn a_slow_store_delays_the_call() {
    for (name, inner) in lease_stores().await {
        let faults = Faults::new();
        let store = faults.wrap(inner);
        let (id, runs) = (unique("slow"), AtomicUsize::new(0));
        faults.inject(Op::Claim, Fault::Delay(Duration::from_millis(300)));
        let started = std::time::Instant::now();
        assert_eq!(transfer(&store, &id, Duration::from_secs(5), &runs).await.unwrap(), 40, "{name}");
        assert!(started.elapsed() >= Duration::from_millis(300), "{name}: {:?}", started.elapsed());
        assert_eq!(faults.injected(), 1, "{name}");
    }
}

#[idempotent(key = "id", scope = "tests.testing.precheck", precheck = "redis", ttl = "1h", store = "marks")]
async fn consume<DB: Database + idem::sql::SqlBackend>(
    tx: &mut Transaction<'_, DB>,
    marks: &dyn PrecheckStore,
    id: &str,
    runs: &AtomicUsize,
) -> Result<usize, AppError>
where
    DB::Connection: Send,
{
    let _ = tx;
    Ok(runs.fetch_add(1, SeqCst) + 1)
}

/// The precheck is a cache: with Redis down (every marker call fails) or
/// losing its markers, the database still decides, and a redelivered
/// message takes effect once.
#[tokio::test]
async fn a_precheck_cache_down_or_forgetful_still_runs_once() {
    let (Some(pool), Some(conn)) = (common::postgres().await, common::redis().await) else { return };
    for fault in [Fault::Fail, Fault::LoseWrite] {
        let faults = Faults::new();
        let marks = faults.wrap(idem::store::RedisStore::new(conn.clone(), format!("{}:", unique("idem-test"))));
        faults.inject(Op::PrecheckMark, fault);
        let (id, runs) = (unique("redelivered"), AtomicUsize::new(0));
        let report = Duplicates::new()
            .concurrent(20)
            .sequential(3)
            .fire(|_| async {
                let mut tx = pool.begin().await?;
                let effect = consume(&mut tx, &marks, &id, &runs).await?;
                tx.commit().await?;
                Ok::<_, AppError>(effect)
            })
            .await;
        report.assert_idempotent(runs.load(SeqCst));
        assert_eq!(faults.injected(), 23, "{fault:?}: every marker call got the fault");
    }
}
