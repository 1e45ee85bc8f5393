//! The layer's `wait`: duplicates that arrive while the first request runs
//! are held until it ends and get its response, on every lease store
//! (memory, SQLite, PostgreSQL, MariaDB, Redis with and without notices,
//! Redis Cluster). The store's claims are counted through the test kit:
//! waiting does not poll in a tight loop.

use idem_test_support as common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::unique;
use idem::http::IdempotencyLayer;
use idem::lease::LeaseStore;
use idem::testing::{Faults, Op};
use idem_http_demo::{PaymentRequest, Shop, app, serve};
use reqwest::StatusCode;

async fn server(store: Arc<dyn LeaseStore>, wait: Duration) -> (String, Shop, Faults) {
    let faults = Faults::new();
    let layer = IdempotencyLayer::new(faults.wrap(store)).scope(format!("tests.wait.{}", unique("s"))).wait(wait);
    let shop = Shop::default();
    let addr = serve(app(shop.clone(), layer)).await;
    (format!("http://{addr}"), shop, faults)
}

async fn post(client: &reqwest::Client, base: &str, key: &str, body: &PaymentRequest) -> reqwest::Response {
    client
        .post(format!("{base}/payments"))
        .header("idempotency-key", format!("\"{key}\""))
        .json(body)
        .send()
        .await
        .expect("the server answers")
}

/// 100 copies at once while the first takes 300 ms: one run, 99 replays
/// of its response, no 409; each copy asked the store a few times at most.
async fn a_hundred_waiting_duplicates(store: Arc<dyn LeaseStore>) {
    let notifies = store.notifies();
    let (base, shop, faults) = server(store, Duration::from_secs(10)).await;
    let client = reqwest::Client::new();
    let (key, body) = (unique("k"), PaymentRequest { amount_cents: 500, delay_ms: Some(300), ..Default::default() });
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let (client, base, key, body) = (client.clone(), base.clone(), key.clone(), body.clone());
            tokio::spawn(async move {
                let response = post(&client, &base, &key, &body).await;
                let replayed = response.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
                (response.status(), replayed, response.text().await.unwrap())
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    assert_eq!(shop.runs(), 1, "one request reached the handler");
    assert!(answers.iter().all(|(status, _, _)| *status == StatusCode::CREATED), "no 409: {answers:?}");
    assert_eq!(answers.iter().filter(|(_, replayed, _)| *replayed).count(), 99);
    assert!(answers.iter().all(|(_, _, body)| *body == answers[0].2), "every copy got the same body");
    // Woken by a notice: a claim and one after the wake (a notice missed
    // between the two costs one more). Backing off from 10 ms up to 250 ms
    // across the 300 ms: about six.
    let claims = faults.calls(Op::Claim);
    let most = if notifies { 100 * 4 } else { 100 * 10 };
    assert!(claims <= most, "{claims} claims for 100 copies (notices: {notifies})");
    eprintln!("100 waiting duplicates: {claims} claims (notices: {notifies})");
}

/// Past the bound, the wait ends in 409 with `Retry-After`, as without it.
async fn past_the_bound_the_answer_is_409(store: Arc<dyn LeaseStore>) {
    let (base, shop, _) = server(store, Duration::from_millis(300)).await;
    let client = reqwest::Client::new();
    let (key, body) = (unique("k"), PaymentRequest { amount_cents: 7, delay_ms: Some(2_000), ..Default::default() });
    let first = tokio::spawn({
        let (client, base, key, body) = (client.clone(), base.clone(), key.clone(), body.clone());
        async move { post(&client, &base, &key, &body).await.status() }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let second = post(&client, &base, &key, &body).await;
    assert_eq!(second.status(), StatusCode::CONFLICT);
    assert!(second.headers().get("retry-after").is_some());
    assert!(started.elapsed() >= Duration::from_millis(300), "it waited: {:?}", started.elapsed());
    assert_eq!(first.await.unwrap(), StatusCode::CREATED);
    assert_eq!(shop.runs(), 1);
}

/// The first request fails (a 5xx is not kept): the waiting duplicate is a
/// retry after it, so it runs the handler itself.
async fn a_waiting_duplicate_runs_when_the_first_fails(store: Arc<dyn LeaseStore>) {
    let (base, shop, _) = server(store, Duration::from_secs(10)).await;
    let client = reqwest::Client::new();
    let body = PaymentRequest { amount_cents: 9, delay_ms: Some(300), fail_with: Some(503), ..Default::default() };
    let key = unique("k");
    let first = tokio::spawn({
        let (client, base, key, body) = (client.clone(), base.clone(), key.clone(), body.clone());
        async move { post(&client, &base, &key, &body).await.status() }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = post(&client, &base, &key, &body).await;
    assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE, "it ran, and failed as asked");
    assert_eq!(first.await.unwrap(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(shop.runs(), 2);
}

macro_rules! wait_suite {
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
            async fn a_hundred_waiting_duplicates_get_the_first_response_and_no_409() {
                a_hundred_waiting_duplicates(store!()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn past_the_bound_a_waiting_duplicate_gets_409_with_retry_after() {
                past_the_bound_the_answer_is_409(store!()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_waiting_duplicate_runs_the_handler_when_the_first_fails() {
                a_waiting_duplicate_runs_when_the_first_fails(store!()).await;
            }
        }
    };
}

type Store = Arc<dyn LeaseStore>;

fn prefix() -> String {
    format!("{}:", unique("idem-wait"))
}

/// A Redis store with notices, over `conn`, subscribed through `client`.
async fn noticed<C>(conn: C, client: redis::Client) -> Option<Store>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let store = idem::store::RedisStore::new(conn, prefix()).notifications(&client).await.expect("subscribed");
    assert!(store.notifies());
    Some(Arc::new(store) as Store)
}

async fn redis_client() -> Option<redis::Client> {
    common::redis().await?;
    Some(redis::Client::open(std::env::var("IDEM_REDIS_URL").unwrap_or("redis://127.0.0.1:6379/".into())).unwrap())
}

wait_suite! {
    mod memory;
    store = Some(Arc::new(idem::store::MemoryStore::new()) as Store);
}

wait_suite! {
    mod sqlite;
    store = common::sqlite().await.map(|p| Arc::new(idem::store::SqlStore::new(p)) as Store);
}

wait_suite! {
    mod postgres;
    store = common::postgres().await.map(|p| Arc::new(idem::store::SqlStore::new(p)) as Store);
}

wait_suite! {
    mod mysql;
    store = common::mysql().await.map(|p| Arc::new(idem::store::SqlStore::new(p)) as Store);
}

wait_suite! {
    mod redis_backing_off;
    store = common::redis().await.map(|c| Arc::new(idem::store::RedisStore::new(c, prefix())) as Store);
}

wait_suite! {
    mod redis_with_notices;
    store = match (common::redis().await, redis_client().await) {
        (Some(conn), Some(client)) => noticed(conn, client).await,
        _ => None,
    };
}

// Classic pub/sub reaches every node of a Cluster: the store publishes
// through its cluster connection, and subscribes on one node.
wait_suite! {
    mod redis_cluster_with_notices;
    store = match common::redis_cluster().await {
        Some(conn) => noticed(conn, redis::Client::open(common::redis_cluster_urls()[0].as_str()).unwrap()).await,
        None => None,
    };
}
