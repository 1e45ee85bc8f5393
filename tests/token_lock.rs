//! `strategy = "token"`, `"token+dedup"` and the lock strategies against the
//! memory store, a real Redis and etcd (tokens and locks), with SQLite for the
//! strategies that also write a record.

use idem_test_support as common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::{AppError, unique};
use idem::lock::{LockAttempt, LockStore};
use idem::store::RecordKind;
use idem::token::TokenStore;
use idem::{Error, Outcome, idempotent};
use sqlx::{Sqlite, Transaction};

/// Both kinds of store, as the tests hold them.
trait Store: TokenStore + LockStore {}
impl<S: TokenStore + LockStore> Store for S {}
type Shared = Arc<dyn Store>;

/// How much later than its TTL a token or a lock may end on `store`:
/// nothing, but on etcd, whose leases count whole seconds and end when the
/// leader's check (every 500 ms) finds them expired, 1.5 s.
fn slack(store: &dyn Store) -> Duration {
    if TokenStore::kind(store) == "etcd" { Duration::from_millis(1500) } else { Duration::ZERO }
}

const ORDERS: &str = "tests.orders.create";
/// The scope of the locks taken by hand.
const LOCKS: &str = "tests.locks";

#[idempotent(strategy = "token", scope = "tests.orders.create", store = "store")]
async fn create_order(store: &dyn TokenStore, #[idem(token)] token: &str, runs: &AtomicUsize) -> Result<u32, AppError> {
    runs.fetch_add(1, SeqCst);
    tokio::task::yield_now().await;
    Ok(7)
}

#[idempotent(strategy = "token", scope = "tests.orders.create", store = "store")]
async fn create_failing(store: &dyn TokenStore, #[idem(token)] token: Option<String>) -> Result<(), AppError> {
    Err(AppError::Rule(format!("rejected by the shop ({})", token.is_some())))
}

#[idempotent(strategy = "token", scope = "tests.orders.create", store = "store", on_store_error = "allow")]
async fn create_allowing(
    store: &dyn TokenStore,
    #[idem(token)] token: &str,
    runs: &AtomicUsize,
) -> Result<(), AppError> {
    runs.fetch_add(1, SeqCst);
    Ok(())
}

/// token+dedup: the record (under the request id) is claimed first, so a
/// retry of a completed submit replays instead of being rejected.
#[idempotent(key = "request_id", strategy = "token+dedup", scope = "tests.orders.submit", store = "store")]
async fn submit(
    tx: &mut Transaction<'_, Sqlite>,
    store: &dyn TokenStore,
    request_id: &str,
    #[idem(token)] token: &str,
    fail: bool,
) -> Result<String, AppError> {
    sqlx::query("INSERT INTO idem_test_coupons (trade_no) VALUES (?)").bind(request_id).execute(&mut **tx).await?;
    if fail {
        return Err(AppError::Rule("card declined".into()));
    }
    Ok(format!("order for {request_id}"))
}

/// Mutual exclusion only: counts how many run at once.
#[idempotent(
    key = "name",
    strategy = "lock",
    concurrency_only = true,
    ttl = "300ms",
    scope = "tests.lock.only",
    store = "store"
)]
async fn exclusive(
    store: &dyn LockStore,
    name: &str,
    inside: &AtomicUsize,
    most: &AtomicUsize,
    millis: u64,
    fail: bool,
) -> Result<i64, AppError> {
    let now = inside.fetch_add(1, SeqCst) + 1;
    most.fetch_max(now, SeqCst);
    tokio::time::sleep(Duration::from_millis(millis)).await;
    inside.fetch_sub(1, SeqCst);
    if fail {
        return Err(AppError::Rule("failed".into()));
    }
    Ok(idem::lock::current().expect("inside a lock").fence)
}

#[idempotent(
    key = "order_no",
    strategy = "lock+dedup",
    ttl = "2s",
    wait = "10s",
    scope = "tests.lock.dedup",
    store = "store"
)]
async fn grant(
    tx: &mut Transaction<'_, Sqlite>,
    store: &dyn LockStore,
    order_no: &str,
    runs: &AtomicUsize,
) -> Result<u64, AppError> {
    runs.fetch_add(1, SeqCst);
    sqlx::query("INSERT INTO idem_test_coupons (trade_no) VALUES (?)").bind(order_no).execute(&mut **tx).await?;
    tokio::time::sleep(Duration::from_millis(5)).await;
    Ok(42)
}

/// A short lock, held by a body that outlives it (the guard renews it).
#[idempotent(key = "order_no", strategy = "lock+dedup", ttl = "300ms", scope = "tests.lock.slow", store = "store")]
async fn slow_grant(
    tx: &mut Transaction<'_, Sqlite>,
    store: &dyn LockStore,
    order_no: &str,
    millis: u64,
) -> Result<(), AppError> {
    sqlx::query("INSERT INTO idem_test_coupons (trade_no) VALUES (?)").bind(order_no).execute(&mut **tx).await?;
    tokio::time::sleep(Duration::from_millis(millis)).await;
    Ok(())
}

/// A long TTL, so that only a release frees the lock early.
#[idempotent(
    key = "name",
    strategy = "lock",
    concurrency_only = true,
    ttl = "30s",
    wait = "2s",
    scope = "tests.lock.long",
    store = "store"
)]
async fn long_held(store: &dyn LockStore, name: &str, millis: u64) -> Result<(), AppError> {
    tokio::time::sleep(Duration::from_millis(millis)).await;
    Ok(())
}

/// A body that blocks its thread (synchronous work, never yielding).
#[idempotent(
    key = "name",
    strategy = "lock",
    concurrency_only = true,
    ttl = "1s",
    scope = "tests.lock.blocking",
    store = "store"
)]
async fn blocking(store: &dyn LockStore, name: &str, millis: u64, inside: &AtomicUsize) -> Result<(), AppError> {
    inside.fetch_add(1, SeqCst);
    std::thread::sleep(Duration::from_millis(millis));
    Ok(())
}

async fn count(pool: &sqlx::SqlitePool, trade_no: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM idem_test_coupons WHERE trade_no = ?")
        .bind(trade_no)
        .fetch_one(pool)
        .await
        .unwrap()
}

macro_rules! suite {
    (mod $m:ident; store = $store:expr;) => {
        mod $m {
            use super::*;

            macro_rules! store {
                () => {
                    match $store {
                        Some(store) => store,
                        None => return,
                    }
                };
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_hundred_concurrent_submits_of_one_token_pass_once_every_time() {
                let store: Shared = store!();
                for _round in 0..5 {
                    let token = idem::token::issue(&*store, ORDERS, Duration::from_secs(60)).await.unwrap();
                    let runs = Arc::new(AtomicUsize::new(0));
                    let barrier = Arc::new(tokio::sync::Barrier::new(100));
                    let mut tasks = Vec::new();
                    for _ in 0..100 {
                        let (store, token, runs, barrier) = (store.clone(), token.clone(), runs.clone(), barrier.clone());
                        tasks.push(tokio::spawn(async move {
                            barrier.wait().await;
                            create_order(&*store, &token, &runs).await
                        }));
                    }
                    let (mut passed, mut rejected) = (0, 0);
                    for t in tasks {
                        match t.await.unwrap() {
                            Ok(7) => passed += 1,
                            Err(AppError::Idem(Error::TokenRejected)) => rejected += 1,
                            other => panic!("unexpected {other:?}"),
                        }
                    }
                    assert_eq!((passed, rejected), (1, 99));
                    assert_eq!(runs.load(SeqCst), 1);
                }
            }

            #[tokio::test]
            async fn a_token_is_spent_by_success_and_by_failure_and_expires() {
                let store: Shared = store!();
                let runs = AtomicUsize::new(0);
                let token = idem::token::issue(&*store, ORDERS, Duration::from_secs(60)).await.unwrap();
                let first = idem::observe(create_order(&*store, &token, &runs)).await;
                assert!(matches!(first, (Ok(7), Some(Outcome::Executed))), "{first:?}");
                let again = idem::observe(create_order(&*store, &token, &runs)).await;
                assert!(matches!(again, (Err(AppError::Idem(Error::TokenRejected)), Some(Outcome::Rejected))), "{again:?}");
                assert_eq!(runs.load(SeqCst), 1);

                // A failed body spends its token too: a retry needs a new one.
                let token = idem::token::issue(&*store, ORDERS, Duration::from_secs(60)).await.unwrap();
                assert!(matches!(create_failing(&*store, Some(token.clone())).await, Err(AppError::Rule(_))));
                assert!(matches!(create_failing(&*store, Some(token)).await, Err(AppError::Idem(Error::TokenRejected))));

                let token = idem::token::issue(&*store, ORDERS, Duration::from_millis(150)).await.unwrap();
                tokio::time::sleep(Duration::from_millis(300) + slack(&*store)).await;
                let expired = create_order(&*store, &token, &runs).await;
                assert!(matches!(expired, Err(AppError::Idem(Error::TokenRejected))), "{expired:?}");
                assert_eq!(runs.load(SeqCst), 1);
            }

            #[tokio::test]
            async fn ttls_no_store_can_keep_are_refused_and_a_wait_of_duration_max_waits() {
                let store: Shared = store!();
                let year = Duration::from_secs(31_557_600);
                for ttl in [Duration::ZERO, Duration::from_micros(999), 101 * year, Duration::MAX] {
                    // A zero TTL used to issue a token that was never valid
                    // (and take a lock nobody held); a huge one failed in
                    // the store with its own words, or overflowed.
                    let r = idem::token::issue(&*store, ORDERS, ttl).await;
                    assert!(
                        matches!(r, Err(Error::InvalidDuration { what: "token TTL", duration, .. }) if duration == ttl),
                        "{ttl:?}: {r:?}"
                    );
                    let name = unique("lock.ttl");
                    let r = idem::lock::acquire(&*store, LOCKS, &name, ttl, Duration::ZERO).await.map(|held| held.fence());
                    assert!(matches!(r, Err(Error::InvalidDuration { what: "lock TTL", .. })), "{ttl:?}: {r:?}");
                    // Nothing was taken: the name is free.
                    let held = idem::lock::acquire(&*store, LOCKS, &name, Duration::from_secs(5), Duration::ZERO).await.unwrap();
                    assert!(held.release().await.unwrap());
                }
                let message = idem::token::issue(&*store, ORDERS, Duration::ZERO).await.unwrap_err().to_string();
                assert!(message.contains("token TTL of 0ns") && message.contains("at least a millisecond"), "{message}");
                // The edges pass.
                idem::token::issue(&*store, ORDERS, Duration::from_millis(1)).await.unwrap();
                idem::token::issue(&*store, ORDERS, 100 * year).await.unwrap();

                // `Duration::MAX` as the wait ("as long as it takes") used to
                // panic on the deadline's overflow. Here the holder lets go
                // after 100 ms and the waiter gets the lock.
                let name = unique("lock.wait");
                let first = idem::lock::acquire(&*store, LOCKS, &name, Duration::from_secs(5), Duration::ZERO).await.unwrap();
                let waiter = {
                    let (store, name) = (store.clone(), name.clone());
                    tokio::spawn(async move {
                        let held = idem::lock::acquire(&*store, LOCKS, &name, Duration::from_secs(5), Duration::MAX).await?;
                        held.release().await
                    })
                };
                tokio::time::sleep(Duration::from_millis(100)).await;
                assert!(first.release().await.unwrap());
                assert!(tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap().unwrap());
            }

            #[tokio::test]
            async fn forged_missing_and_foreign_tokens_are_rejected_without_spending_others() {
                let store: Shared = store!();
                let runs = AtomicUsize::new(0);
                for bad in ["", "not-issued", &"x".repeat(500), "has space", "new\nline"] {
                    let r = create_order(&*store, bad, &runs).await;
                    assert!(matches!(r, Err(AppError::Idem(Error::TokenRejected))), "{bad:?}: {r:?}");
                }
                assert!(matches!(create_failing(&*store, None).await, Err(AppError::Idem(Error::TokenRejected))));
                // A token of another scope does not pass, and stays valid there.
                let other = idem::token::issue(&*store, "tests.refunds", Duration::from_secs(60)).await.unwrap();
                let r = create_order(&*store, &other, &runs).await;
                assert!(matches!(r, Err(AppError::Idem(Error::TokenRejected))), "{r:?}");
                assert!(idem::token::consume(&*store, "tests.refunds", &other).await.unwrap());
                assert_eq!(runs.load(SeqCst), 0);
            }

            #[tokio::test]
            async fn token_dedup_replays_a_completed_submit_and_rejects_a_spent_token() {
                let store: Shared = store!();
                let Some(pool) = common::sqlite().await else { return };
                let scope = "tests.orders.submit";
                let (request, token) = (unique("req"), idem::token::issue(&*store, scope, Duration::from_secs(60)).await.unwrap());
                let mut tx = pool.begin().await.unwrap();
                let first = submit(&mut tx, &*store, &request, &token, false).await.unwrap();
                tx.commit().await.unwrap();
                // The answer was lost; the browser retries with the same token.
                let mut tx = pool.begin().await.unwrap();
                let retry = idem::observe(submit(&mut tx, &*store, &request, &token, false)).await;
                tx.commit().await.unwrap();
                assert_eq!(retry.1, Some(Outcome::Replayed));
                assert_eq!(retry.0.unwrap(), first);
                assert_eq!(count(&pool, &request).await, 1);
                // Another request with the spent token is a double submit.
                let other = unique("req");
                let mut tx = pool.begin().await.unwrap();
                let r = submit(&mut tx, &*store, &other, &token, false).await;
                assert!(matches!(r, Err(AppError::Idem(Error::TokenRejected))), "{r:?}");
                tx.commit().await.unwrap();
                assert!(idem::sql::find_record(&pool, scope, &idem::Key::new(&other).unwrap()).await.unwrap().is_none(), "no record for a rejected call");
                // A failed body leaves no record, and its token is spent.
                let (failing, token) = (unique("req"), idem::token::issue(&*store, scope, Duration::from_secs(60)).await.unwrap());
                let mut tx = pool.begin().await.unwrap();
                assert!(matches!(submit(&mut tx, &*store, &failing, &token, true).await, Err(AppError::Rule(_))));
                tx.commit().await.unwrap();
                assert!(idem::sql::find_record(&pool, scope, &idem::Key::new(&failing).unwrap()).await.unwrap().is_none());
                let mut tx = pool.begin().await.unwrap();
                let r = submit(&mut tx, &*store, &failing, &token, false).await;
                assert!(matches!(r, Err(AppError::Idem(Error::TokenRejected))), "{r:?}");
            }

            #[tokio::test]
            async fn a_late_release_by_an_expired_owner_leaves_the_new_holders_lock() {
                let store: Shared = store!();
                let name = unique("lock");
                let ttl = Duration::from_millis(200);
                let a = idem::lock::acquire(&*store, LOCKS, &name, ttl, Duration::ZERO).await.unwrap();
                tokio::time::sleep(Duration::from_millis(350) + slack(&*store)).await; // A stalls past its TTL
                let b = idem::lock::acquire(&*store, LOCKS, &name, Duration::from_secs(5), Duration::ZERO).await.unwrap();
                assert!(b.fence() > a.fence());
                assert!(!a.extend().await.unwrap(), "A no longer holds it");
                assert!(!a.release().await.unwrap(), "A's late release must not delete B's lock");
                let c = store.acquire(LOCKS, &name, "c", ttl).await.unwrap();
                assert!(matches!(c, LockAttempt::Busy { retry_after } if retry_after <= Duration::from_secs(5)), "{c:?}");
                assert!(b.release().await.unwrap());
                assert!(matches!(store.acquire(LOCKS, &name, "c", ttl).await.unwrap(), LockAttempt::Acquired { .. }));
            }

            #[tokio::test]
            async fn fencing_tokens_strictly_increase() {
                let store: Shared = store!();
                let name = unique("fence");
                let mut last = 0;
                for _ in 0..20 {
                    let held = idem::lock::acquire(&*store, LOCKS, &name, Duration::from_secs(5), Duration::ZERO).await.unwrap();
                    assert!(held.fence() > last, "{} after {last}", held.fence());
                    last = held.fence();
                    assert!(held.release().await.unwrap());
                }
                // Concurrent takers, queueing with a wait: every grant distinct.
                let mut tasks = Vec::new();
                for _ in 0..16 {
                    let (store, name) = (store.clone(), name.clone());
                    tasks.push(tokio::spawn(async move {
                        let held = idem::lock::acquire(&*store, LOCKS, &name, Duration::from_secs(5), Duration::from_secs(10)).await.unwrap();
                        let fence = held.fence();
                        held.release().await.unwrap();
                        fence
                    }));
                }
                let mut fences = Vec::new();
                for t in tasks {
                    fences.push(t.await.unwrap());
                }
                fences.sort();
                fences.dedup();
                assert_eq!(fences.len(), 16);
                assert!(fences[0] > last);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_lock_excludes_concurrent_callers_and_renewal_keeps_a_long_body_holding_it() {
                let store: Shared = store!();
                let name = unique("only");
                let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
                // The body runs 1s under a 300ms TTL: renewals keep it.
                let long = {
                    let (store, name, inside, most) = (store.clone(), name.clone(), inside.clone(), most.clone());
                    tokio::spawn(async move { exclusive(&*store, &name, &inside, &most, 1000, false).await })
                };
                tokio::time::sleep(Duration::from_millis(650)).await;
                let busy = exclusive(&*store, &name, &inside, &most, 0, false).await;
                match busy {
                    Err(AppError::Idem(Error::LockBusy { retry_after, .. })) => {
                        assert!(retry_after.is_some_and(|d| d <= Duration::from_millis(300)), "{retry_after:?}")
                    }
                    other => panic!("expected LockBusy, got {other:?}"),
                }
                let first = long.await.unwrap().unwrap();
                assert_eq!(most.load(SeqCst), 1);
                // Released after the body: the next caller gets it at once, with a higher fence.
                let next = exclusive(&*store, &name, &inside, &most, 0, false).await.unwrap();
                assert!(next > first);
                // Released after a failing body too.
                assert!(matches!(exclusive(&*store, &name, &inside, &most, 0, true).await, Err(AppError::Rule(_))));
                assert!(exclusive(&*store, &name, &inside, &most, 0, false).await.is_ok());
            }

            /// A body that blocks its thread for four times the TTL keeps
            /// the lock (renewed by a task of its own): every other caller
            /// meanwhile is told it is busy.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_body_that_blocks_its_thread_for_four_ttls_keeps_its_lock() {
                let store: Shared = store!();
                let name = unique("blocking");
                let inside = Arc::new(AtomicUsize::new(0));
                let first = {
                    let (store, name, inside) = (store.clone(), name.clone(), inside.clone());
                    tokio::spawn(async move { blocking(&*store, &name, 4000, &inside).await })
                };
                while inside.load(SeqCst) == 0 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let mut busy = 0;
                while !first.is_finished() {
                    match blocking(&*store, &name, 0, &AtomicUsize::new(0)).await {
                        Err(AppError::Idem(Error::LockBusy { .. })) => busy += 1,
                        Ok(()) if first.is_finished() => {}
                        other => panic!("a second holder while the first blocked: {other:?}"),
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                first.await.unwrap().unwrap();
                assert!(busy >= 10, "{busy}");
                assert_eq!(inside.load(SeqCst), 1);
            }

            /// A client that disconnects (its request future dropped) must
            /// not keep the key locked for the whole TTL.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_call_dropped_mid_body_releases_its_lock() {
                let store: Shared = store!();
                let name = unique("dropped");
                let call = {
                    let (store, name) = (store.clone(), name.clone());
                    tokio::spawn(async move { long_held(&*store, &name, 10_000).await })
                };
                tokio::time::sleep(Duration::from_millis(200)).await;
                call.abort();
                assert!(call.await.unwrap_err().is_cancelled());
                let started = std::time::Instant::now();
                long_held(&*store, &name, 0).await.expect("the lock was released when the call was dropped");
                assert!(started.elapsed() < Duration::from_secs(1), "waited {:?}", started.elapsed());
                // By hand: a held lock dropped without `release()` is released too.
                let held = idem::lock::acquire(&*store, LOCKS, &name, Duration::from_secs(30), Duration::ZERO).await.unwrap();
                drop(held);
                let again = idem::lock::acquire(&*store, LOCKS, &name, Duration::from_secs(30), Duration::from_secs(1)).await;
                assert!(again.expect("free again").release().await.unwrap());
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn lock_dedup_queues_concurrent_repeats_then_replays() {
                let store: Shared = store!();
                let Some(pool) = common::sqlite().await else { return };
                let order = unique("order");
                let runs = Arc::new(AtomicUsize::new(0));
                let mut tasks = Vec::new();
                for _ in 0..20 {
                    let (store, pool, order, runs) = (store.clone(), pool.clone(), order.clone(), runs.clone());
                    tasks.push(tokio::spawn(async move {
                        let mut tx = pool.begin().await?;
                        let (result, outcome) = idem::observe(grant(&mut tx, &*store, &order, &runs)).await;
                        let value = result?;
                        tx.commit().await?;
                        Ok::<_, AppError>((value, outcome))
                    }));
                }
                let mut executed = 0;
                for t in tasks {
                    let (value, outcome) = t.await.unwrap().unwrap();
                    assert_eq!(value, 42);
                    executed += usize::from(outcome == Some(Outcome::Executed));
                }
                assert_eq!(executed, 1);
                assert_eq!(runs.load(SeqCst), 1);
                assert_eq!(count(&pool, &order).await, 1);
            }
        }
    };
}

suite! {
    mod memory;
    store = Some(Arc::new(idem::store::MemoryStore::new()) as Shared);
}

suite! {
    mod redis;
    store = common::redis().await.map(|c| Arc::new(idem::store::RedisStore::new(c, format!("{}:", unique("idem-test")))) as Shared);
}

suite! {
    mod etcd;
    store = common::etcd_cluster::store().await.map(|s| Arc::new(s) as Shared);
}

suite! {
    mod redis_cluster;
    store = common::redis_cluster().await.map(|c| Arc::new(idem::store::RedisStore::new(c, format!("{}:", unique("idem-test")))) as Shared);
}

/// Redis only: the lock's key is visible, so the test can take it from
/// under a running body the way an expiry during a long stall would.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_lock_fails_the_completion_and_nothing_commits() {
    let Some(conn) = common::redis().await else { return };
    let Some(pool) = common::sqlite().await else { return };
    let store = idem::store::RedisStore::new(conn.clone(), format!("{}:", unique("idem-test")));
    let order = unique("lost");
    let body = {
        let (store, pool, order) = (store.clone(), pool.clone(), order.clone());
        tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            let result = slow_grant(&mut tx, &store, &order, 1500).await;
            if result.is_ok() {
                tx.commit().await.unwrap();
            }
            result
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Another worker takes the lock over (as after an expiry).
    let key = store.key(RecordKind::Lock, "tests.lock.slow", &order);
    let mut c = conn.clone();
    let _: () = ::redis::cmd("SET").arg(&key).arg("intruder").arg("PX").arg(10_000).query_async(&mut c).await.unwrap();
    let result = body.await.unwrap();
    assert!(matches!(result, Err(AppError::Idem(Error::LockLost { .. }))), "{result:?}");
    assert_eq!(count(&pool, &order).await, 0, "the lost holder's work must not commit");
    assert!(
        idem::sql::find_record(&pool, "tests.lock.slow", &idem::Key::new(&order).unwrap()).await.unwrap().is_none()
    );
    // The intruder still holds its lock: nothing of the lost holder deleted it.
    let held: Option<String> = ::redis::cmd("GET").arg(&key).query_async(&mut c).await.unwrap();
    assert_eq!(held.as_deref(), Some("intruder"));
}

/// Redis only: the fencing counter lost (flushed, or expired after a week
/// unused) restarts at the server's clock, above every earlier token.
#[tokio::test]
async fn fencing_tokens_keep_increasing_after_the_counter_is_lost() {
    let Some(conn) = common::redis().await else { return };
    let prefix = format!("{}:", unique("idem-test"));
    let store = idem::store::RedisStore::new(conn.clone(), prefix.clone());
    let name = unique("fence");
    let before = idem::lock::acquire(&store, LOCKS, &name, Duration::from_secs(5), Duration::ZERO).await.unwrap();
    let old = before.fence();
    assert!(before.release().await.unwrap());
    let mut c = conn.clone();
    let counter = store.key(RecordKind::Fence, LOCKS, &name);
    let deleted: i64 = ::redis::cmd("DEL").arg(counter).query_async(&mut c).await.unwrap();
    assert_eq!(deleted, 1, "the counter was where the store keeps it");
    let after = idem::lock::acquire(&store, LOCKS, &name, Duration::from_secs(5), Duration::ZERO).await.unwrap();
    assert!(after.fence() > old, "{} after {old}", after.fence());
}

#[tokio::test]
async fn a_down_token_store_rejects_by_default_and_allows_when_told() {
    let Some(down) = common::unreachable_redis().await else { return };
    let runs = AtomicUsize::new(0);
    let rejected = create_order(&down, "0123456789abcdef0123456789abcdef", &runs).await;
    match rejected {
        Err(AppError::Idem(e @ Error::Store { .. })) => assert!(e.is_retryable()),
        other => panic!("expected a store error, got {other:?}"),
    }
    assert_eq!(runs.load(SeqCst), 0);
    create_allowing(&down, "0123456789abcdef0123456789abcdef", &runs).await.unwrap();
    assert_eq!(runs.load(SeqCst), 1);
}

/// A lock whose TTL is shorter than the test's patience.
#[idempotent(
    key = "name",
    strategy = "lock",
    concurrency_only = true,
    ttl = "600ms",
    scope = "tests.lock.cut",
    store = "store"
)]
async fn cut_off(store: &dyn LockStore, name: &str, runs: &AtomicUsize) -> Result<(), AppError> {
    runs.fetch_add(1, SeqCst);
    tokio::time::sleep(Duration::from_secs(5)).await;
    Ok(())
}

/// A TCP relay in front of Redis that can be cut: then every connection
/// through it closes and new ones are refused, as when Redis goes down.
async fn cuttable_redis() -> Option<(idem::store::RedisStore, tokio::sync::watch::Sender<bool>)> {
    use tokio::io::{AsyncRead, AsyncWrite};

    async fn relay(
        mut from: impl AsyncRead + Unpin,
        mut to: impl AsyncWrite + Unpin,
        mut cut: tokio::sync::watch::Receiver<bool>,
    ) {
        tokio::select! {
            _ = tokio::io::copy(&mut from, &mut to) => {}
            _ = cut.wait_for(|cut| *cut) => {}
        }
    }

    common::redis().await?;
    let url = std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| common::DEFAULT_REDIS_URL.to_owned());
    let upstream = ::redis::Client::open(url.as_str()).unwrap().get_connection_info().addr().to_string();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (cut, cut_seen) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let mut stop = cut_seen.clone();
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = stop.wait_for(|cut| *cut) => return, // the listener closes: connections are refused
            };
            let Ok((client, _)) = accepted else { return };
            let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else { return };
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::spawn(relay(client_read, server_write, cut_seen.clone()));
            tokio::spawn(relay(server_read, client_write, cut_seen.clone()));
        }
    });
    // The client's defaults: it would retry for far longer than the lock lives.
    let client = ::redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let conn = ::redis::aio::ConnectionManager::new(client).await.unwrap();
    Some((idem::store::RedisStore::new(conn, format!("{}:", unique("idem-cut"))), cut))
}

/// Redis only: the lock is lost while Redis is down (renewals fail); the
/// caller learns `LockLost` within about the lock's TTL, not after the
/// client's own reconnect cycle: the release that follows is bounded by
/// the lock's timing too.
#[tokio::test]
async fn a_lock_lost_while_redis_is_down_is_reported_within_its_ttl() {
    let Some((store, cut)) = cuttable_redis().await else { return };
    let runs = AtomicUsize::new(0);
    let name = unique("cut");
    let call = cut_off(&store, &name, &runs);
    tokio::pin!(call);
    // Until the body runs (the lock is held), then Redis goes silent.
    let started = loop {
        tokio::select! {
            r = &mut call => panic!("finished early: {r:?}"),
            () = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
        if runs.load(SeqCst) == 1 {
            cut.send_replace(true);
            break std::time::Instant::now();
        }
    };
    let result = call.await;
    let waited = started.elapsed();
    assert!(matches!(result, Err(AppError::Idem(Error::LockLost { .. }))), "{result:?}");
    assert!(waited < Duration::from_secs(2), "LockLost came {waited:?} after the cut (TTL 600ms)");
}
