//! The gRPC idempotency layer when its store fails: down before a call,
//! gone while a handler runs. Redis here is a server of the test's own
//! (`idem_test_support::redis_server`), killed by the test; the shared
//! servers are never touched.

use idem_test_support as common;
use idem_test_support::redis_server::RedisServer;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::unique;
use idem::grpc::{IdempotencyLayer, RETRY_PUSHBACK};
use idem::lease::LeaseStore;
use idem_grpc_demo::{PayRequest, PaymentsClient, Shop, keyed, serve};
use tonic::Code;

/// The default bound on a store call, and what a test allows past it.
const BOUND: Duration = idem::store::DEFAULT_TIMEOUT;
const SLACK: Duration = Duration::from_secs(2);

async fn server(store: Arc<dyn LeaseStore>, lease: Duration) -> (PaymentsClient, Shop) {
    let layer = IdempotencyLayer::new(store)
        .scope(format!("tests.grpc.faults.{}", unique("s")))
        .required(true)
        .tenant(|request| request.headers.get("x-client").and_then(|v| v.to_str().ok()).map(str::to_owned))
        .lease(lease);
    let shop = Shop::default();
    let addr = serve(shop.clone(), layer).await;
    (PaymentsClient::connect(addr).await.expect("the server accepts"), shop)
}

async fn redis_store(server: &RedisServer) -> Arc<dyn LeaseStore> {
    let conn = redis::aio::ConnectionManager::new(redis::Client::open(server.url()).unwrap()).await.unwrap();
    Arc::new(idem::store::RedisStore::new(conn, "idem-grpc-faults:"))
}

/// Redis stopped before the call: UNAVAILABLE with a pushback, within the
/// store's bound, the handler not run.
#[tokio::test]
async fn a_store_down_before_the_call_is_unavailable_within_its_bound() {
    let Some(mut redis) = RedisServer::start() else { return };
    let (mut client, shop) = server(redis_store(&redis).await, Duration::from_secs(30)).await;
    redis.kill();
    let started = Instant::now();
    let status = client.pay(keyed(&unique("k"), "alice", PayRequest::default())).await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(status.metadata().get(RETRY_PUSHBACK).unwrap(), "1000");
    assert!(took < BOUND + SLACK, "answered after {took:?}");
    assert_eq!(shop.runs(), 0);
}

/// Redis gone while the handler runs: the lease cannot be renewed, so the
/// handler is stopped before another worker could take the record over,
/// and the client is told to retry once the lease has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_gone_while_the_handler_runs_is_unavailable_with_the_lease_as_pushback() {
    let Some(mut redis) = RedisServer::start() else { return };
    let (client, shop) = server(redis_store(&redis).await, Duration::from_millis(1500)).await;
    let slow = PayRequest { amount_cents: 5, delay_ms: 10_000, ..Default::default() };
    let call = tokio::spawn(async move {
        let started = Instant::now();
        (client.clone().pay(keyed(&unique("k"), "alice", slow)).await, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.kill();
    let (answer, took) = call.await.unwrap();
    let status = answer.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(status.metadata().get(RETRY_PUSHBACK).unwrap(), "1500", "the lease, in milliseconds");
    assert!(took < Duration::from_millis(1500) + SLACK, "stopped within the lease: {took:?}");
    assert_eq!(shop.runs(), 1, "the handler had started");
}
