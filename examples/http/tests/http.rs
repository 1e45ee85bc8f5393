//! The `Idempotency-Key` layer with a real axum server and a real HTTP
//! client over loopback, on every lease store: memory, SQLite, PostgreSQL,
//! MySQL/MariaDB, Redis and Redis Cluster.

use idem_test_support as common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::unique;
use idem::http::IdempotencyLayer;
use idem::lease::LeaseStore;
use idem::testing::{Fault, Faults, Op};
use idem_http_demo::{Payment, PaymentRequest, Shop, app, serve};
use reqwest::StatusCode;

/// A server with the layer over `store`; keys scoped per client (header
/// `x-client`); the base URL and the shop.
async fn server(store: Arc<dyn LeaseStore>, tune: impl FnOnce(IdempotencyLayer) -> IdempotencyLayer) -> (String, Shop) {
    served(IdempotencyLayer::new(store), tune).await
}

/// A server with `layer`, configured as [`server`] does.
async fn served(layer: IdempotencyLayer, tune: impl FnOnce(IdempotencyLayer) -> IdempotencyLayer) -> (String, Shop) {
    let layer = layer
        .scope(format!("tests.http.{}", unique("s")))
        .required(true)
        .tenant(|request| request.headers.get("x-client").and_then(|v| v.to_str().ok()).map(str::to_owned))
        .max_response_body(64 * 1024)
        .max_request_body(16 * 1024);
    let shop = Shop::default();
    let addr = serve(app(shop.clone(), tune(layer))).await;
    (format!("http://{addr}"), shop)
}

async fn post(client: &reqwest::Client, base: &str, key: Option<&str>, body: &PaymentRequest) -> reqwest::Response {
    let mut request =
        client.post(format!("{base}/payments")).header("x-client", "alice").header("content-type", "application/json");
    if let Some(key) = key {
        request = request.header("idempotency-key", format!("\"{key}\""));
    }
    request.body(serde_json::to_vec(body).unwrap()).send().await.expect("the server answers")
}

fn replayed(response: &reqwest::Response) -> bool {
    response.headers().get("idempotent-replayed").is_some_and(|v| v == "true")
}

/// Status, the headers the handler sets, and body.
async fn snapshot(response: reqwest::Response) -> (StatusCode, Vec<String>, String, bytes_len::Len) {
    let status = response.status();
    let audit = response.headers().get_all("x-audit").iter().map(|v| v.to_str().unwrap().to_owned()).collect();
    let location = response.headers().get("location").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    let body = response.text().await.unwrap();
    (status, audit, location, bytes_len::Len(body))
}

mod bytes_len {
    /// A body, compared whole but printed short.
    #[derive(PartialEq)]
    pub struct Len(pub String);
    impl std::fmt::Debug for Len {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{} bytes: {:?}", self.0.len(), &self.0[..self.0.len().min(80)])
        }
    }
}

/// 100 requests with one key at once, against a server over a fresh
/// shop: the handler runs once, and every 201 and later retry is its
/// response, exactly.
async fn a_hundred_concurrent_duplicates(base: &str, shop: &Shop) {
    let client = reqwest::Client::new();
    let key = unique("k");
    let body = PaymentRequest { amount_cents: 500, delay_ms: Some(300), ..Default::default() };
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let (client, base, key, body) = (client.clone(), base.to_owned(), key.clone(), body.clone());
        tasks.push(tokio::spawn(async move { post(&client, &base, Some(&key), &body).await }));
    }
    let (mut created, mut conflicts) = (Vec::new(), 0);
    for task in tasks {
        let response = task.await.unwrap();
        match response.status() {
            StatusCode::CREATED => created.push(response),
            StatusCode::CONFLICT => {
                assert!(response.headers().get("retry-after").is_some(), "409 says when to retry");
                conflicts += 1;
            }
            other => panic!("unexpected {other}: {}", response.text().await.unwrap()),
        }
    }
    assert_eq!(shop.runs(), 1, "exactly one request reached the handler");
    assert!(!created.is_empty());
    // Every retry after the first finished replays it, exactly.
    let first = snapshot(post(&client, base, Some(&key), &body).await).await;
    assert_eq!(first.0, StatusCode::CREATED);
    assert_eq!(first.1, ["first", "second"], "repeated headers replay in order");
    assert_eq!(first.2, "/payments/1");
    for response in created {
        assert_eq!(snapshot(response).await, first, "every 201 is the same response");
    }
    let again = post(&client, base, Some(&key), &body).await;
    assert!(replayed(&again));
    assert_eq!(snapshot(again).await, first);
    assert_eq!(shop.runs(), 1);
    eprintln!("100 concurrent duplicates: {conflicts} were told 409");
}

macro_rules! http_suite {
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
            async fn a_hundred_concurrent_duplicates_run_the_handler_once() {
                let (base, shop) = server(store!(), |l| l).await;
                a_hundred_concurrent_duplicates(&base, &shop).await;
            }

            /// The layer takes its store from a `Stores` value, as every
            /// guard can: the same one run for 100 racers.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_hundred_concurrent_duplicates_through_stores_run_the_handler_once() {
                let stores = idem::Stores::builder().lease(store!()).build();
                let (base, shop) = served(IdempotencyLayer::with_stores(stores), |l| l).await;
                a_hundred_concurrent_duplicates(&base, &shop).await;
            }

            #[tokio::test]
            async fn a_retry_while_the_first_runs_is_409_with_retry_after() {
                let (base, shop) = server(store!(), |l| l).await;
                let client = reqwest::Client::new();
                let key = unique("k");
                let slow = PaymentRequest { amount_cents: 5, delay_ms: Some(800), ..Default::default() };
                let first = {
                    let (client, base, key, slow) = (client.clone(), base.clone(), key.clone(), slow.clone());
                    tokio::spawn(async move { post(&client, &base, Some(&key), &slow).await.status() })
                };
                tokio::time::sleep(Duration::from_millis(200)).await;
                let retry = post(&client, &base, Some(&key), &slow).await;
                assert_eq!(retry.status(), StatusCode::CONFLICT);
                // A second, not the 30 s lease: the first request ends long before.
                assert_eq!(retry.headers()["retry-after"], "1");
                let problem: serde_json::Value = retry.json().await.unwrap();
                assert_eq!(problem["status"], 409);
                assert_eq!(first.await.unwrap(), StatusCode::CREATED);
                assert_eq!(shop.runs(), 1);
            }

            /// A handler that blocks its thread for four times the layer's
            /// lease keeps it: every duplicate meanwhile is a 409, none
            /// reaches the handler, and the one response carries the
            /// lease's fence (from the request's extensions).
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_handler_that_blocks_its_thread_for_four_leases_is_never_joined() {
                let lease = Duration::from_secs(1);
                let (base, shop) = server(store!(), |l| l.lease(lease)).await;
                let client = reqwest::Client::new();
                let key = unique("k");
                let body = PaymentRequest { amount_cents: 5, block_ms: Some(4000), ..Default::default() };
                let first = {
                    let (client, base, key, body) = (client.clone(), base.clone(), key.clone(), body.clone());
                    tokio::spawn(async move { snapshot(post(&client, &base, Some(&key), &body).await).await })
                };
                while shop.runs() == 0 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let mut conflicts = 0;
                while !first.is_finished() {
                    let retry = post(&client, &base, Some(&key), &body).await;
                    match retry.status() {
                        StatusCode::CONFLICT => conflicts += 1,
                        StatusCode::CREATED if first.is_finished() && replayed(&retry) => {}
                        other => panic!("a duplicate while the first ran: {other} {}", retry.text().await.unwrap()),
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                let first = first.await.unwrap();
                assert_eq!(first.0, StatusCode::CREATED);
                assert!(conflicts >= 10, "{conflicts}");
                assert_eq!(shop.runs(), 1, "the handler ran once");
                let again = post(&client, &base, Some(&key), &body).await;
                assert!(replayed(&again));
                let fence = again.headers()["x-fence"].to_str().unwrap().parse::<i64>().unwrap();
                assert!(fence > 0, "the handler saw its fence");
                assert_eq!(snapshot(again).await, first);
            }

            /// The store takes no renewal (out of reach for them) while the
            /// handler blocks its thread past the lease: a duplicate takes
            /// the record over and runs. The late handler's response is not
            /// kept, and its client is told it was taken over (409), not
            /// that the store failed; retries replay the request that took
            /// over, whose fence is higher.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_late_handler_whose_renewals_failed_is_told_it_was_taken_over() {
                let faults = idem::testing::Faults::new();
                faults.inject(idem::testing::Op::Extend, idem::testing::Fault::Fail);
                let store: Arc<dyn LeaseStore> = Arc::new(faults.wrap(store!()));
                let (base, shop) = server(store, |l| l.lease(Duration::from_millis(600))).await;
                let client = reqwest::Client::new();
                let key = unique("k");
                let body = PaymentRequest { amount_cents: 5, block_ms: Some(2000), ..Default::default() };
                let first = {
                    let (client, base, key, body) = (client.clone(), base.clone(), key.clone(), body.clone());
                    tokio::spawn(async move { post(&client, &base, Some(&key), &body).await })
                };
                tokio::time::sleep(Duration::from_millis(900)).await;
                let second = snapshot(post(&client, &base, Some(&key), &body).await).await;
                assert_eq!(second.0, StatusCode::CREATED, "the lease had passed: taken over");
                let first = first.await.unwrap();
                assert_eq!(first.status(), StatusCode::CONFLICT);
                let problem: serde_json::Value = first.json().await.unwrap();
                let detail = problem["detail"].as_str().unwrap();
                assert!(detail.contains("took this one over"), "{detail}");
                assert_eq!(shop.runs(), 2, "both handlers ran: the first stalled past its lease");
                let again = post(&client, &base, Some(&key), &body).await;
                assert!(replayed(&again));
                assert_eq!(snapshot(again).await, second, "retries replay the request that took over");
            }

            /// A handler runs recorded steps under the layer's own record
            /// (its request's extensions): its first run charges the card
            /// and then fails (`503`, not kept); the retry replays the
            /// charge instead of running it, and answers. One charge.
            #[tokio::test]
            async fn a_handler_resumes_after_its_recorded_step() {
                let (base, shop) = server(store!(), |l| l).await;
                let client = reqwest::Client::new();
                let key = unique("k");
                let body = PaymentRequest {
                    amount_cents: 5,
                    charge_step: true,
                    fail_first_after_charge: true,
                    ..Default::default()
                };
                let first = post(&client, &base, Some(&key), &body).await;
                assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);
                assert_eq!(shop.charges(), 1);
                let retry = post(&client, &base, Some(&key), &body).await;
                assert_eq!(retry.status(), StatusCode::CREATED);
                assert_eq!(retry.headers()["x-steps-replayed"], "1", "the charge was recorded, and replayed");
                let charge = retry.headers()["x-charge"].to_str().unwrap().to_owned();
                assert!(charge.starts_with("ch_idem-step-"), "{charge}");
                assert_eq!((shop.runs(), shop.charges()), (2, 1), "the handler ran twice, the card was charged once");
                let again = post(&client, &base, Some(&key), &body).await;
                assert!(replayed(&again));
                assert_eq!(again.headers()["x-charge"], charge.as_str());
                assert_eq!((shop.runs(), shop.charges()), (2, 1));
            }

            #[tokio::test]
            async fn the_same_key_with_another_request_is_422_and_runs_nothing() {
                let (base, shop) = server(store!(), |l| l).await;
                let client = reqwest::Client::new();
                let key = unique("k");
                let first =
                    post(&client, &base, Some(&key), &PaymentRequest { amount_cents: 500, ..Default::default() }).await;
                assert_eq!(first.status(), StatusCode::CREATED);
                let other =
                    post(&client, &base, Some(&key), &PaymentRequest { amount_cents: 999, ..Default::default() }).await;
                assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
                assert_eq!(other.headers()["content-type"], "application/problem+json");
                assert_eq!(shop.runs(), 1);
            }

            #[tokio::test]
            async fn a_missing_or_malformed_key_is_400() {
                let (base, shop) = server(store!(), |l| l).await;
                let client = reqwest::Client::new();
                let body = serde_json::to_vec(&PaymentRequest { amount_cents: 1, ..Default::default() }).unwrap();
                let send = |key: Option<&'static [&'static str]>| {
                    let mut request = client
                        .post(format!("{base}/payments"))
                        .header("x-client", "alice")
                        .header("content-type", "application/json")
                        .body(body.clone());
                    for value in key.unwrap_or(&[]) {
                        request = request.header("idempotency-key", *value);
                    }
                    request.send()
                };
                for key in [
                    None,
                    Some(&["\"\""][..]),
                    Some(&["\"unclosed"][..]),
                    Some(&["\"a\", \"b\""][..]),
                    Some(&["\"a\"", "\"b\""][..]),
                ] {
                    let response = send(key).await.unwrap();
                    assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{key:?}");
                    let problem: serde_json::Value = response.json().await.unwrap();
                    assert_eq!(problem["status"], 400);
                    assert!(problem["detail"].as_str().unwrap().contains("dempotency-key"), "{problem}");
                }
                // A bare key (no quotes) is taken as it is.
                let bare = send(Some(&["bare-key-1"])).await.unwrap();
                assert_eq!(bare.status(), StatusCode::CREATED);
                assert_eq!(shop.runs(), 1);
            }

            #[tokio::test]
            async fn keys_are_scoped_per_tenant() {
                let (base, shop) = server(store!(), |l| l).await;
                let client = reqwest::Client::new();
                let key = unique("k");
                let body = serde_json::to_vec(&PaymentRequest { amount_cents: 5, ..Default::default() }).unwrap();
                let send = |client_id: Option<&'static str>| {
                    let mut request = client
                        .post(format!("{base}/payments"))
                        .header("idempotency-key", format!("\"{key}\""))
                        .header("content-type", "application/json")
                        .body(body.clone());
                    if let Some(id) = client_id {
                        request = request.header("x-client", id);
                    }
                    request.send()
                };
                let alice: Payment = send(Some("alice")).await.unwrap().json().await.unwrap();
                let bob = send(Some("bob")).await.unwrap();
                assert!(!replayed(&bob), "bob's key is not alice's");
                let bob: Payment = bob.json().await.unwrap();
                assert_ne!(alice.payment_id, bob.payment_id);
                let alice_again = send(Some("alice")).await.unwrap();
                assert!(replayed(&alice_again));
                assert_eq!(alice_again.json::<Payment>().await.unwrap(), alice);
                assert_eq!(send(None).await.unwrap().status(), StatusCode::UNAUTHORIZED, "a key nobody owns");
                assert_eq!(send(Some("")).await.unwrap().status(), StatusCode::UNAUTHORIZED, "an empty tenant");
                assert_eq!(shop.runs(), 2);
            }

            #[tokio::test]
            async fn a_failed_request_leaves_no_record() {
                let (base, shop) = server(store!(), |l| l).await;
                let client = reqwest::Client::new();
                // 500: not kept, so the retry runs again.
                let key = unique("k");
                let failing = PaymentRequest { amount_cents: 5, fail_with: Some(500), ..Default::default() };
                assert_eq!(
                    post(&client, &base, Some(&key), &failing).await.status(),
                    StatusCode::INTERNAL_SERVER_ERROR
                );
                let ok = PaymentRequest { amount_cents: 5, ..Default::default() };
                let retried = post(&client, &base, Some(&key), &ok).await;
                assert_eq!(retried.status(), StatusCode::CREATED);
                assert!(!replayed(&retried));
                assert_eq!(shop.runs(), 2);
                // A 404 is an answer: kept and replayed.
                let key = unique("k");
                let missing = PaymentRequest { amount_cents: 5, fail_with: Some(404), ..Default::default() };
                assert_eq!(post(&client, &base, Some(&key), &missing).await.status(), StatusCode::NOT_FOUND);
                let again = post(&client, &base, Some(&key), &missing).await;
                assert!(replayed(&again));
                assert_eq!(shop.runs(), 3);
                // 401 and 403 say "not you, not now": not kept, so a retry
                // with credentials (or after a grant) runs.
                for refused in [401u16, 403] {
                    let key = unique("k");
                    let denied = PaymentRequest { amount_cents: 5, fail_with: Some(refused), ..Default::default() };
                    assert_eq!(post(&client, &base, Some(&key), &denied).await.status().as_u16(), refused);
                    let granted = post(&client, &base, Some(&key), &ok).await;
                    assert_eq!(granted.status(), StatusCode::CREATED);
                    assert!(!replayed(&granted));
                }
                assert_eq!(shop.runs(), 7);
            }

            /// A handler that panics: the client gets a 500 problem (not a
            /// dropped connection), and nothing is kept, so a retry runs again.
            #[tokio::test]
            async fn a_panicking_handler_is_a_500_and_leaves_no_record() {
                let (base, shop) = server(store!(), |l| l).await;
                let client = reqwest::Client::new();
                let key = unique("k");
                let panics = PaymentRequest { amount_cents: 5, panic: true, ..Default::default() };
                let response = post(&client, &base, Some(&key), &panics).await;
                assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
                assert_eq!(response.headers()["content-type"], "application/problem+json");
                let ok = PaymentRequest { amount_cents: 5, ..Default::default() };
                let retried = post(&client, &base, Some(&key), &ok).await;
                assert_eq!(retried.status(), StatusCode::CREATED);
                assert!(!replayed(&retried));
                assert_eq!(shop.runs(), 2);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn an_abandoned_request_still_completes_and_its_retry_replays() {
                // The client goes away mid-request: the handler is not
                // stopped half-way (a payment sent, no answer stored), it
                // runs to its end and its answer is kept; the retry gets it
                // (409 while it still runs), and the handler ran once.
                let (base, shop) = server(store!(), |l| l).await;
                let client = reqwest::Client::new();
                let key = unique("k");
                let slow = PaymentRequest { amount_cents: 5, delay_ms: Some(1_000), ..Default::default() };
                let impatient = reqwest::Client::builder().timeout(Duration::from_millis(200)).build().unwrap();
                assert!(
                    impatient
                        .post(format!("{base}/payments"))
                        .header("x-client", "alice")
                        .header("idempotency-key", format!("\"{key}\""))
                        .header("content-type", "application/json")
                        .body(serde_json::to_vec(&slow).unwrap())
                        .send()
                        .await
                        .is_err()
                );
                let retry = post(&client, &base, Some(&key), &slow).await;
                assert_eq!(retry.status(), StatusCode::CONFLICT, "the abandoned request still runs");
                let started = std::time::Instant::now();
                let mut retry = retry;
                while retry.status() == StatusCode::CONFLICT && started.elapsed() < Duration::from_secs(10) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    retry = post(&client, &base, Some(&key), &slow).await;
                }
                assert_eq!(retry.status(), StatusCode::CREATED);
                assert!(replayed(&retry), "the abandoned request's answer was kept");
                assert_eq!(shop.runs(), 1);
            }

            #[tokio::test]
            async fn a_json_body_is_compared_as_json() {
                // A client that serializes its retry again (another key
                // order, other spacing) repeats the same request.
                let (base, shop) = server(store!(), |l| l).await;
                let client = reqwest::Client::new();
                let key = unique("k");
                let send = |body: &'static str| {
                    client
                        .post(format!("{base}/payments"))
                        .header("x-client", "alice")
                        .header("idempotency-key", format!("\"{key}\""))
                        .header("content-type", "application/json; charset=utf-8")
                        .body(body)
                        .send()
                };
                let first = send(r#"{"amount_cents":5,"currency":"EUR"}"#).await.unwrap();
                assert_eq!(first.status(), StatusCode::CREATED);
                let again = send("{ \"currency\": \"EUR\",\n  \"amount_cents\": 5 }").await.unwrap();
                assert!(replayed(&again), "the same JSON: {}", again.status());
                let other = send(r#"{"amount_cents":6,"currency":"EUR"}"#).await.unwrap();
                assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
                assert_eq!(shop.runs(), 1);
            }

            #[tokio::test]
            async fn bodies_over_the_limits() {
                let (base, shop) = server(store!(), |l| l).await;
                let client = reqwest::Client::new();
                // A request body over the limit: 413, the handler not run.
                let key = unique("k");
                let big = client
                    .post(format!("{base}/payments"))
                    .header("x-client", "alice")
                    .header("idempotency-key", format!("\"{key}\""))
                    .header("content-type", "application/json")
                    .body(vec![b' '; 20 * 1024])
                    .send()
                    .await
                    .unwrap();
                assert_eq!(big.status(), StatusCode::PAYLOAD_TOO_LARGE);
                assert_eq!(shop.runs(), 0);
                // A response over the limit: sent whole, not kept; its
                // retries are told so (410) and never run the handler again.
                let key = unique("k");
                let padded = PaymentRequest {
                    amount_cents: 5,
                    response_bytes: Some(100_000),
                    chunks: Some(8),
                    ..Default::default()
                };
                let first = post(&client, &base, Some(&key), &padded).await;
                assert_eq!(first.status(), StatusCode::CREATED);
                let payment: Payment = first.json().await.unwrap();
                assert_eq!(payment.padding.len(), 100_000, "never cut short");
                for _ in 0..2 {
                    let retry = post(&client, &base, Some(&key), &padded).await;
                    assert_eq!(retry.status(), StatusCode::GONE);
                    assert!(replayed(&retry), "a repeat, marked as one");
                    assert_eq!(retry.headers()["content-type"], "application/problem+json");
                    let problem: serde_json::Value = retry.json().await.unwrap();
                    assert!(problem["detail"].as_str().unwrap().contains("not kept"), "{problem}");
                }
                assert_eq!(shop.runs(), 1);
                // A streamed response within the limit: kept and replayed exactly.
                let key = unique("k");
                let streamed = PaymentRequest {
                    amount_cents: 7,
                    response_bytes: Some(1000),
                    chunks: Some(5),
                    ..Default::default()
                };
                let first = snapshot(post(&client, &base, Some(&key), &streamed).await).await;
                let again = post(&client, &base, Some(&key), &streamed).await;
                assert!(replayed(&again));
                assert_eq!(snapshot(again).await, first);
                assert_eq!(shop.runs(), 2);
            }

            /// `pass_through_oversized(true)`: a response over the limit is
            /// passed through and its record removed, so a retry runs again
            /// (for handlers that are safe to run twice).
            #[tokio::test]
            async fn pass_through_oversized_lets_a_retry_run_again() {
                let (base, shop) = server(store!(), |l| l.pass_through_oversized(true)).await;
                let client = reqwest::Client::new();
                let key = unique("k");
                let padded = PaymentRequest { amount_cents: 5, response_bytes: Some(100_000), ..Default::default() };
                for runs in 1..=2 {
                    let response = post(&client, &base, Some(&key), &padded).await;
                    assert_eq!(response.status(), StatusCode::CREATED);
                    assert!(!replayed(&response));
                    assert_eq!(response.json::<Payment>().await.unwrap().padding.len(), 100_000);
                    assert_eq!(shop.runs(), runs);
                }
            }

            /// A response limit whose stored form the store cannot hold is
            /// refused at the first guarded request, the handler not run.
            #[tokio::test]
            async fn a_response_limit_the_store_cannot_hold_is_refused_before_anything_runs() {
                let store = store!();
                if store.answer_limit().await == usize::MAX {
                    return; // memory: no limit
                }
                let huge = 1 << 31;
                let (base, shop) = server(store.clone(), |l| l.max_response_body(huge)).await;
                let client = reqwest::Client::new();
                let body = PaymentRequest { amount_cents: 5, ..Default::default() };
                let response = post(&client, &base, Some(&unique("k")), &body).await;
                assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
                let problem: serde_json::Value = response.json().await.unwrap();
                let detail = problem["detail"].as_str().unwrap();
                assert!(detail.contains("max_response_body") && detail.contains(store.kind()), "{detail}");
                assert_eq!(shop.runs(), 0);
            }

            #[tokio::test]
            async fn first_responses_and_replays_say_how_long_the_key_is_kept() {
                let (base, shop) = server(store!(), |l| l.retention(Duration::from_secs(3600))).await;
                let client = reqwest::Client::new();
                let (key, body) = (unique("k"), PaymentRequest { amount_cents: 5, ..Default::default() });
                let left = |r: &reqwest::Response| {
                    r.headers().get("idempotency-key-expires-in").and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                };
                let first = post(&client, &base, Some(&key), &body).await;
                assert_eq!(left(&first), Some(3600));
                tokio::time::sleep(Duration::from_millis(1100)).await;
                let retry = post(&client, &base, Some(&key), &body).await;
                assert!(replayed(&retry));
                let kept = left(&retry).expect("a replay says it too");
                assert!((3590..3600).contains(&kept), "{kept}");
                assert_eq!(shop.runs(), 1);
            }

            /// A 7-byte response whose completion lands but each of whose
            /// replies is lost (the connection drops after the write): the
            /// layer falls back to completing the record without it, which
            /// leaves the stored response. The retry gets it back (200, the
            /// same bytes), never 410 Gone.
            #[tokio::test]
            async fn a_small_response_whose_completion_replies_are_lost_is_replayed() {
                let faults = Faults::new();
                faults.inject_when(Op::Complete, Fault::DropAfterWrite, |call| call.response.is_some());
                let scope = format!("tests.http.{}", unique("s"));
                let layer = IdempotencyLayer::new(faults.wrap(store!())).scope(scope).required(true);
                let runs = Arc::new(AtomicUsize::new(0));
                let counted = runs.clone();
                let receipt = move || {
                    counted.fetch_add(1, SeqCst);
                    std::future::ready("receipt")
                };
                let app = axum::Router::new().route("/receipts", axum::routing::post(receipt)).layer(layer);
                let addr = serve(app).await;
                let (client, key) = (reqwest::Client::new(), unique("k"));
                let send = || {
                    let request = client.post(format!("http://{addr}/receipts"));
                    async { request.header("idempotency-key", format!("\"{key}\"")).send().await.unwrap() }
                };
                let first = send().await;
                assert_eq!((first.status(), replayed(&first)), (StatusCode::OK, false));
                assert_eq!(first.bytes().await.unwrap(), "receipt");
                let retry = send().await;
                assert_eq!((retry.status(), replayed(&retry)), (StatusCode::OK, true), "not 410 Gone");
                assert_eq!(retry.bytes().await.unwrap(), "receipt");
                assert_eq!(runs.load(SeqCst), 1);
                assert_eq!(faults.calls(Op::Complete), 4, "three tries with the response, one without");
            }

            #[tokio::test]
            async fn unguarded_methods_pass_through() {
                let (base, shop) = server(store!(), |l| l).await;
                let count = reqwest::get(format!("{base}/payments/count")).await.unwrap();
                assert_eq!(count.status(), StatusCode::OK);
                assert!(!replayed(&count));
                assert_eq!(count.text().await.unwrap(), "0");
                assert_eq!(shop.runs(), 0);
            }
        }
    };
}

http_suite! {
    mod memory;
    store = Some(Arc::new(idem::store::MemoryStore::new()) as Arc<dyn LeaseStore>);
}

http_suite! {
    mod sqlite;
    store = common::sqlite().await.map(|p| Arc::new(idem::store::SqlStore::new(p)) as Arc<dyn LeaseStore>);
}

http_suite! {
    mod postgres;
    store = common::postgres().await.map(|p| Arc::new(idem::store::SqlStore::new(p)) as Arc<dyn LeaseStore>);
}

http_suite! {
    mod mysql;
    store = common::mysql().await.map(|p| Arc::new(idem::store::SqlStore::new(p)) as Arc<dyn LeaseStore>);
}

http_suite! {
    mod redis;
    store = common::redis().await.map(|c| Arc::new(idem::store::RedisStore::new(c, format!("{}:", unique("idem-http")))) as Arc<dyn LeaseStore>);
}

http_suite! {
    mod redis_cluster;
    store = common::redis_cluster().await.map(|c| Arc::new(idem::store::RedisStore::new(c, format!("{}:", unique("idem-http")))) as Arc<dyn LeaseStore>);
}

/// A guarded request refused with a `500` whose detail names the fix; the
/// handler not run.
async fn refused_for_want_of_a_store(base: &str, shop: &Shop) {
    let client = reqwest::Client::new();
    let body = PaymentRequest { amount_cents: 5, ..Default::default() };
    let response = post(&client, base, Some(&unique("k")), &body).await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let problem: serde_json::Value = response.json().await.unwrap();
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.contains("no lease store") && detail.contains("Stores::builder().lease(store)"), "{detail}");
    assert_eq!(shop.runs(), 0);
}

#[tokio::test]
async fn a_layer_on_stores_without_a_lease_store_names_the_fix() {
    let stores = idem::Stores::builder().token(idem::store::MemoryStore::new()).build();
    let (base, shop) = served(IdempotencyLayer::with_stores(stores), |l| l).await;
    refused_for_want_of_a_store(&base, &shop).await;
}

/// A layer built before the stores are installed finds them at its
/// requests, as a guard naming no store does. The one test of this binary
/// that installs stores (once per process): the others give theirs.
#[tokio::test]
async fn a_layer_on_the_installed_stores_finds_them_once_installed() {
    let (base, shop) = served(IdempotencyLayer::installed(), |l| l).await;
    refused_for_want_of_a_store(&base, &shop).await;
    idem::Stores::builder().lease(idem::store::MemoryStore::new()).install().unwrap();
    let client = reqwest::Client::new();
    let (key, body) = (unique("k"), PaymentRequest { amount_cents: 5, ..Default::default() });
    let first = post(&client, &base, Some(&key), &body).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(!replayed(&first));
    let retry = post(&client, &base, Some(&key), &body).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(replayed(&retry));
    assert_eq!(shop.runs(), 1);
}
