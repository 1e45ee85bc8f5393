//! Redis restarted between a lease claim and its completion.
//!
//! On a server of the test's own (`idem_test_support::redis_server`): a free
//! port, nothing kept on disk, stopped when the test ends. Restarting the
//! shared server would cut every other user's connections and drop their
//! keys. Without `redis-server` installed the test says it skipped (or
//! fails, with `IDEM_REQUIRE_SERVICES=1`).

use idem_test_support as common;
use idem_test_support::redis_server;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::{AppError, unique};
use idem::lease::LeaseStore;
use idem::store::RedisStore;
use idem::{Error, idempotent};
use redis_server::RedisServer;

#[idempotent(key = "id", strategy = "lease", lease = "10s", scope = "tests.redis_restart", store = "store")]
async fn transfer(
    store: &dyn LeaseStore,
    id: &str,
    runs: &AtomicUsize,
    go: tokio::sync::oneshot::Receiver<()>,
) -> Result<u64, AppError> {
    runs.fetch_add(1, SeqCst);
    let _ = go.await; // "calling the bank" until the test says go
    Ok(1)
}

#[tokio::test]
async fn a_restart_between_claim_and_completion_is_a_clear_error_not_a_second_run() {
    let Some(mut server) = RedisServer::start() else { return };
    let client = redis::Client::open(server.url()).unwrap();
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_number_of_retries(1);
    let conn = redis::aio::ConnectionManager::new_with_config(client, config).await.unwrap();
    let store = Arc::new(RedisStore::new(conn, format!("{}:", unique("restart"))));
    let id = unique("t");
    let runs = Arc::new(AtomicUsize::new(0));
    let (go, wait) = tokio::sync::oneshot::channel();
    let first = {
        let (store, id, runs) = (store.clone(), id.clone(), runs.clone());
        tokio::spawn(async move { transfer(&*store, &id, &runs, wait).await })
    };
    while runs.load(SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The server goes away with the record (it keeps nothing on disk), and
    // comes back empty on the same port while the body is still running.
    server.kill();
    server.start_again();
    go.send(()).unwrap();
    let result = first.await.unwrap();
    match result {
        Err(AppError::Idem(Error::LeaseLost { scope, .. })) => assert_eq!(scope, "tests.redis_restart"),
        // A server that kept the record (persistence on; not this one)
        // would let the call complete normally.
        Ok(1) => {}
        other => panic!("expected LeaseLost (the record is gone) or Ok, got {other:?}"),
    }
    assert_eq!(runs.load(SeqCst), 1, "idem never runs the body a second time by itself");
}
