//! The one explicit configuration of stores: a guard that needs a store,
//! names none and finds none installed fails loudly (no silent in-process
//! fallback); installing twice is refused; a configuration can also be a
//! value a guard names as its `store`.
//!
//! One test, in a binary of its own: it watches the process-wide
//! configuration from before it is installed to after.

use idem_test_support as common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::{AppError, unique};
use idem::{Error, Stores, idempotent};
use sqlx::{Sqlite, Transaction};

#[idempotent(key = "id", strategy = "lease", scope = "tests.stores.lease")]
async fn transfer(id: &str, runs: &AtomicUsize) -> Result<usize, AppError> {
    Ok(runs.fetch_add(1, SeqCst) + 1)
}

#[idempotent(strategy = "token", scope = "tests.stores.token", on_store_error = "allow")]
async fn submit(#[idem(token)] token: &str, runs: &AtomicUsize) -> Result<(), AppError> {
    runs.fetch_add(1, SeqCst);
    Ok(())
}

#[idempotent(key = "sku", strategy = "lock", concurrency_only = true, ttl = "5s", scope = "tests.stores.lock")]
async fn restock(sku: &str, runs: &AtomicUsize) -> Result<(), AppError> {
    runs.fetch_add(1, SeqCst);
    Ok(())
}

#[idempotent(key = "id", scope = "tests.stores.precheck", precheck = "redis")]
async fn apply(tx: &mut Transaction<'_, Sqlite>, id: &str, runs: &AtomicUsize) -> Result<(), AppError> {
    runs.fetch_add(1, SeqCst);
    Ok(())
}

/// A configuration as a value, named by the guard.
#[idempotent(key = "id", strategy = "lease", scope = "tests.stores.value", store = "stores")]
async fn with_stores(stores: &Stores, id: &str, runs: &AtomicUsize) -> Result<usize, AppError> {
    Ok(runs.fetch_add(1, SeqCst) + 1)
}

fn no_store(result: Result<impl std::fmt::Debug, AppError>, role: &str) {
    match result {
        Err(AppError::Idem(e @ Error::NoStore { role: r })) if r == role => {
            let text = e.to_string();
            assert!(text.contains(&format!("idem::Stores::builder().{role}(store).install()")), "{text}");
            assert!(!e.is_retryable());
        }
        other => panic!("expected NoStore {{ role: {role} }}, got {other:?}"),
    }
}

#[tokio::test]
async fn a_guard_without_a_store_fails_until_one_is_installed_and_installing_twice_is_refused() {
    let runs = AtomicUsize::new(0);
    let pool = common::sqlite().await.unwrap();

    // Nothing installed: every guard that needs a store says which to
    // install, and runs nothing (a token guard told to allow calls while
    // its store is down does not take a missing store for an outage).
    assert!(matches!(Stores::installed(), Err(Error::StoresNotInstalled)));
    no_store(transfer(&unique("t"), &runs).await, "lease");
    no_store(submit("0123456789abcdef", &runs).await, "token");
    no_store(restock("sku-1", &runs).await, "lock");
    let mut tx = pool.begin().await.unwrap();
    no_store(apply(&mut tx, &unique("p"), &runs).await, "precheck");
    drop(tx);
    assert_eq!(runs.load(SeqCst), 0, "no body ran");

    // A configuration as a value works without installing anything, and
    // a role it lacks is the same clear error.
    let value = Stores::builder().lease(idem::store::MemoryStore::new()).build();
    let id = unique("v");
    assert_eq!(with_stores(&value, &id, &runs).await.unwrap(), 1);
    assert_eq!(with_stores(&value, &id, &runs).await.unwrap(), 1, "replayed from the value's lease store");
    assert!(matches!(value.lock(), Err(Error::NoStore { role: "lock" })));

    // etcd takes every role, as a value too.
    if let Some(etcd) = common::etcd_cluster::store().await {
        let value = Stores::builder().all(etcd).build();
        let (id, etcd_runs) = (unique("e"), AtomicUsize::new(0));
        assert_eq!(with_stores(&value, &id, &etcd_runs).await.unwrap(), 1);
        assert_eq!(with_stores(&value, &id, &etcd_runs).await.unwrap(), 1, "replayed from etcd");
        assert_eq!(value.lease().unwrap().kind(), "etcd");
        assert_eq!(value.lock().unwrap().kind(), "etcd");
        assert_eq!(value.token().unwrap().kind(), "etcd");
        assert_eq!(value.precheck().unwrap().kind(), "etcd");
    }

    // Installed: leases and tokens in memory, no lock store.
    let memory = std::sync::Arc::new(idem::store::MemoryStore::new());
    let installed = Stores::builder().lease(memory.clone()).token(memory.clone()).install().unwrap();
    let id = unique("t");
    assert_eq!(transfer(&id, &runs).await.unwrap(), 2);
    assert_eq!(transfer(&id, &runs).await.unwrap(), 2, "the repeat replays from the installed store");
    let token = idem::token::issue(installed.token().unwrap(), "tests.stores.token", Duration::from_secs(60)).await;
    let token = token.unwrap();
    submit(&token, &runs).await.unwrap();
    assert!(matches!(submit(&token, &runs).await, Err(AppError::Idem(Error::TokenRejected))));
    no_store(restock("sku-1", &runs).await, "lock");

    // A second configuration is refused; the first stays in force.
    let again = Stores::builder().all(idem::store::MemoryStore::new()).install();
    assert!(matches!(again, Err(Error::StoresAlreadyInstalled)), "{again:?}");
    no_store(restock("sku-1", &runs).await, "lock");
    assert_eq!(transfer(&id, &runs).await.unwrap(), 2, "still the first lease store");
}
