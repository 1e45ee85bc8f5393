//! The `Idempotency-Key` layer when its store fails: down before a
//! request, gone while a handler runs, and MariaDB's deadlock victims among
//! concurrent duplicates. Redis here is a server of the test's own
//! (`idem_test_support::redis_server`), killed by the test; the shared servers
//! are never touched.

use idem_test_support as common;
use idem_test_support::redis_server;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::unique;
use idem::http::IdempotencyLayer;
use idem::lease::LeaseStore;
use idem_http_demo::{PaymentRequest, Shop, app, serve};
use redis_server::RedisServer;
use reqwest::StatusCode;

/// The default bound on a store call, and what a test allows past it.
const BOUND: Duration = idem::store::DEFAULT_TIMEOUT;
const SLACK: Duration = Duration::from_secs(2);

async fn server(store: Arc<dyn LeaseStore>, lease: Duration) -> (String, Shop) {
    let layer = IdempotencyLayer::new(store)
        .scope(format!("tests.http.faults.{}", unique("s")))
        .required(true)
        .tenant(|request| request.headers.get("x-client").and_then(|v| v.to_str().ok()).map(str::to_owned))
        .lease(lease);
    let shop = Shop::default();
    let addr = serve(app(shop.clone(), layer)).await;
    (format!("http://{addr}"), shop)
}

async fn post(client: &reqwest::Client, base: &str, key: &str, body: &PaymentRequest) -> reqwest::Response {
    client
        .post(format!("{base}/payments"))
        .header("x-client", "alice")
        .header("content-type", "application/json")
        .header("idempotency-key", format!("\"{key}\""))
        .body(serde_json::to_vec(body).unwrap())
        .send()
        .await
        .expect("the server answers")
}

/// A problem the layer itself answered (not the handler).
fn from_the_layer(response: &reqwest::Response) -> bool {
    response.headers().get("content-type").is_some_and(|v| v == "application/problem+json")
}

async fn redis_store(server: &RedisServer) -> Arc<dyn LeaseStore> {
    let client = redis::Client::open(server.url()).unwrap();
    let conn = redis::aio::ConnectionManager::new(client).await.unwrap();
    Arc::new(idem::store::RedisStore::new(conn, "idem-faults:"))
}

/// Redis stopped before the request: a retryable 503 within the store's
/// bound (not the connection's ~9 s reconnect cycle), the handler not run.
#[tokio::test]
async fn a_store_down_before_the_request_is_a_503_within_its_bound() {
    let Some(mut redis) = RedisServer::start() else { return };
    let store = redis_store(&redis).await;
    let (base, shop) = server(store, Duration::from_secs(30)).await;
    redis.kill();
    let started = Instant::now();
    let response = post(&reqwest::Client::new(), &base, &unique("k"), &PaymentRequest::default()).await;
    let took = started.elapsed();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "1");
    assert!(from_the_layer(&response));
    assert!(took < BOUND + SLACK, "answered after {took:?}");
    assert_eq!(shop.runs(), 0);
}

/// A SQL database that cannot be reached (nothing listens on its port):
/// the same, within the bound rather than the pool's 30 s acquire timeout.
#[tokio::test]
async fn a_database_that_cannot_be_reached_is_a_503_within_its_bound() {
    let pool = sqlx::postgres::PgPoolOptions::new().connect_lazy("postgres://postgres@127.0.0.1:1/test").unwrap();
    let (base, shop) = server(Arc::new(idem::store::SqlStore::new(pool)), Duration::from_secs(30)).await;
    let started = Instant::now();
    let response = post(&reqwest::Client::new(), &base, &unique("k"), &PaymentRequest::default()).await;
    let took = started.elapsed();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(from_the_layer(&response));
    assert!(took < BOUND + SLACK, "answered after {took:?}");
    assert_eq!(shop.runs(), 0);
}

/// Redis gone while the handler runs: the lease cannot be renewed, so the
/// handler is stopped before another worker could take the record over,
/// and the client is told to retry (503 with Retry-After: the lease), not
/// 500 (which tells it not to).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_gone_while_the_handler_runs_is_a_503_with_retry_after() {
    let Some(mut redis) = RedisServer::start() else { return };
    let store = redis_store(&redis).await;
    let (base, shop) = server(store, Duration::from_millis(1500)).await;
    let slow = PaymentRequest { amount_cents: 5, delay_ms: Some(10_000), ..Default::default() };
    let key = unique("k");
    let request = tokio::spawn(async move {
        let started = Instant::now();
        (post(&reqwest::Client::new(), &base, &key, &slow).await, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.kill();
    let (response, took) = request.await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "1", "the lease, in whole seconds");
    assert!(from_the_layer(&response));
    assert!(took < Duration::from_millis(1500) + SLACK, "stopped within the lease: {took:?}");
    assert_eq!(shop.runs(), 1, "the handler had started");
}

/// MariaDB: concurrent duplicates of a first request that fails wait on
/// its record, and InnoDB picks some as deadlock victims (1213). Their
/// claims are statements of their own, sent again: no duplicate is answered
/// with a store error, and the handler runs only for claims it won.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_deadlock_victims_among_duplicates_are_claimed_again() {
    let Some(pool) = common::mysql().await else { return };
    let (base, shop) = server(Arc::new(idem::store::SqlStore::new(pool)), Duration::from_secs(30)).await;
    let client = reqwest::Client::new();
    let mut layer_errors = Vec::new();
    for round in 0..3 {
        let key = unique("deadlock");
        let failing =
            PaymentRequest { amount_cents: 5, fail_with: Some(500), delay_ms: Some(100), ..Default::default() };
        let mut tasks = Vec::new();
        for _ in 0..30 {
            let (client, base, key, failing) = (client.clone(), base.clone(), key.clone(), failing.clone());
            tasks.push(tokio::spawn(async move { post(&client, &base, &key, &failing).await }));
        }
        for task in tasks {
            let response = task.await.unwrap();
            let status = response.status();
            if status.is_server_error() && from_the_layer(&response) {
                layer_errors.push((round, status, response.text().await.unwrap()));
            }
        }
    }
    assert!(layer_errors.is_empty(), "duplicates answered with a store error: {layer_errors:?}");
    assert!(shop.runs() >= 3, "each round's first request ran");
}
