//! The gRPC idempotency layer with a real tonic server and a real tonic
//! client over loopback, on every lease store: memory, SQLite, PostgreSQL,
//! MySQL/MariaDB, Redis and a Redis Cluster.

use idem_test_support as common;

use std::sync::Arc;
use std::time::Duration;

use common::unique;
use idem::grpc::{IdempotencyLayer, RETRY_PUSHBACK};
use idem::lease::LeaseStore;
use idem_grpc_demo::{PayRequest, Payment, PaymentsClient, Shop, WATCH, keyed, replayed, serve};
use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Response, Status};

/// A server with the layer over `store`, keys scoped per client
/// (`x-client`), `Watch` passed through; a client on it, and the shop.
async fn server(
    store: Arc<dyn LeaseStore>,
    tune: impl FnOnce(IdempotencyLayer) -> IdempotencyLayer,
) -> (PaymentsClient, Shop) {
    served(IdempotencyLayer::new(store), tune).await
}

/// A server with `layer`, configured as [`server`] does.
async fn served(
    layer: IdempotencyLayer,
    tune: impl FnOnce(IdempotencyLayer) -> IdempotencyLayer,
) -> (PaymentsClient, Shop) {
    let layer = layer
        .scope(format!("tests.grpc.{}", unique("s")))
        .required(true)
        .pass_through([WATCH])
        .tenant(|request| request.headers.get("x-client").and_then(|v| v.to_str().ok()).map(str::to_owned))
        .max_response_body(64 * 1024)
        .max_request_body(16 * 1024);
    let shop = Shop::default();
    let addr = serve(shop.clone(), tune(layer)).await;
    (PaymentsClient::connect(addr).await.expect("the server accepts"), shop)
}

fn pay(amount_cents: i64) -> PayRequest {
    PayRequest { amount_cents, ..Default::default() }
}

/// The metadata entries the handler sets, each with all its values.
fn handler_metadata(metadata: &MetadataMap) -> Vec<(String, Vec<String>)> {
    ["content-type", "x-payment-id", "x-audit", "x-failed-payment"]
        .into_iter()
        .map(|name| {
            let values = metadata.get_all(name).iter().map(|v| v.to_str().unwrap().to_owned()).collect();
            (name.to_owned(), values)
        })
        .collect()
}

/// A call's outcome as its client sees it: the message and the handler's
/// metadata, or the status's code, message and metadata.
#[derive(Debug, PartialEq)]
enum Seen {
    Ok(Payment, Vec<(String, Vec<String>)>),
    Err(Code, String, Vec<(String, Vec<String>)>),
}

fn seen(result: &Result<Response<Payment>, Status>) -> Seen {
    match result {
        Ok(response) => Seen::Ok(response.get_ref().clone(), handler_metadata(response.metadata())),
        Err(status) => Seen::Err(status.code(), status.message().to_owned(), handler_metadata(status.metadata())),
    }
}

fn was_replayed(result: &Result<Response<Payment>, Status>) -> bool {
    match result {
        Ok(response) => replayed(response.metadata()),
        Err(status) => replayed(status.metadata()),
    }
}

/// `n` calls of `message` with `key` (client `alice`) sent at once; their
/// answers.
async fn at_once(
    client: &PaymentsClient,
    key: &str,
    message: &PayRequest,
    n: usize,
) -> Vec<Result<Response<Payment>, Status>> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (mut client, key, message) = (client.clone(), key.to_owned(), message.clone());
            tokio::spawn(async move { client.pay(keyed(&key, "alice", message)).await })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

/// 100 calls with one key at once: the handler runs once, the others are
/// told ABORTED (with a pushback) or get its response; every later retry
/// is that response, exactly: message, status and metadata.
async fn a_hundred_concurrent_duplicates(client: &PaymentsClient, shop: &Shop) {
    let key = unique("k");
    let message = PayRequest { amount_cents: 500, delay_ms: 300, ..Default::default() };
    let (mut answered, mut aborted) = (Vec::new(), 0);
    for answer in at_once(client, &key, &message, 100).await {
        match answer {
            Ok(response) => answered.push(Ok(response)),
            Err(status) if status.code() == Code::Aborted => {
                assert_eq!(status.metadata().get(RETRY_PUSHBACK).unwrap(), "1000", "ABORTED says when to retry");
                aborted += 1;
            }
            Err(status) => panic!("unexpected {status:?}"),
        }
    }
    assert_eq!(shop.runs(), 1, "exactly one call reached the handler");
    assert!(!answered.is_empty());
    let again = client.clone().pay(keyed(&key, "alice", message.clone())).await;
    assert!(was_replayed(&again));
    let first = seen(&again);
    let Seen::Ok(payment, metadata) = &first else { panic!("{first:?}") };
    assert_eq!(payment.payment_id, 1);
    assert_eq!(metadata[2].1, ["first", "second"], "repeated metadata replays in order");
    for response in &answered {
        assert_eq!(seen(response), first, "every answer is the same response");
    }
    assert_eq!(answered.iter().filter(|r| !was_replayed(r)).count(), 1, "one answer is the first call's own");
    assert_eq!(shop.runs(), 1);
    eprintln!("100 concurrent duplicates: {aborted} were told ABORTED");
}

macro_rules! grpc_suite {
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
                let (client, shop) = server(store!(), |l| l).await;
                a_hundred_concurrent_duplicates(&client, &shop).await;
            }

            /// The layer takes its store from a `Stores` value, as every
            /// guard can.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_hundred_concurrent_duplicates_through_stores_run_the_handler_once() {
                let stores = idem::Stores::builder().lease(store!()).build();
                let (client, shop) = served(IdempotencyLayer::with_stores(stores), |l| l).await;
                a_hundred_concurrent_duplicates(&client, &shop).await;
            }

            /// With `.wait`, duplicates that arrive while the first call
            /// runs are held and answered with its response: none is told
            /// ABORTED, the handler runs once.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn with_wait_a_hundred_concurrent_duplicates_all_get_the_first_response() {
                let (client, shop) = server(store!(), |l| l.wait(Duration::from_secs(10))).await;
                let key = unique("k");
                let message = PayRequest { amount_cents: 500, delay_ms: 300, ..Default::default() };
                let answers = at_once(&client, &key, &message, 100).await;
                for answer in &answers {
                    assert!(answer.is_ok(), "a held duplicate is answered, not refused: {answer:?}");
                }
                assert_eq!(shop.runs(), 1, "exactly one call reached the handler");
                assert_eq!(answers.iter().filter(|a| !was_replayed(a)).count(), 1, "99 replays");
                let first = seen(&answers[0]);
                assert!(answers.iter().all(|a| seen(a) == first), "every answer is the same response");
            }

            /// A duplicate held while the first call fails (a status not
            /// kept: its record removed) runs the handler itself.
            #[tokio::test]
            async fn with_wait_a_duplicate_of_a_failed_first_call_runs_it_again() {
                let (client, shop) = server(store!(), |l| l.wait(Duration::from_secs(10))).await;
                let key = unique("k");
                let failing = PayRequest {
                    amount_cents: 5,
                    delay_ms: 300,
                    fail_with: Code::Internal as i32,
                    ..Default::default()
                };
                let first = {
                    let (mut client, key, failing) = (client.clone(), key.clone(), failing.clone());
                    tokio::spawn(async move { client.pay(keyed(&key, "alice", failing)).await })
                };
                tokio::time::sleep(Duration::from_millis(100)).await;
                let held = client.clone().pay(keyed(&key, "alice", failing)).await;
                let first = first.await.unwrap();
                assert!(matches!(seen(&first), Seen::Err(Code::Internal, ..)), "{first:?}");
                assert!(matches!(seen(&held), Seen::Err(Code::Internal, ..)), "{held:?}");
                assert!(!was_replayed(&held), "a failure is not replayed");
                assert_eq!(shop.runs(), 2, "the held duplicate ran the handler after the first failed");
            }

            /// A handler that blocks its thread for four times the layer's
            /// lease keeps it: every duplicate meanwhile is ABORTED, none
            /// reaches the handler, and the one response carries the
            /// lease's fence (from the request's extensions).
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_handler_that_blocks_its_thread_for_four_leases_is_never_joined() {
                let (client, shop) = server(store!(), |l| l.lease(Duration::from_secs(1))).await;
                let key = unique("k");
                let message = PayRequest { amount_cents: 5, block_ms: 4000, ..Default::default() };
                let first = {
                    let (mut client, key, message) = (client.clone(), key.clone(), message.clone());
                    tokio::spawn(async move { client.pay(keyed(&key, "alice", message)).await })
                };
                while shop.runs() == 0 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let mut aborted = 0;
                while !first.is_finished() {
                    let retry = client.clone().pay(keyed(&key, "alice", message.clone())).await;
                    match &retry {
                        Err(status) if status.code() == Code::Aborted => aborted += 1,
                        Ok(_) if first.is_finished() && was_replayed(&retry) => {}
                        other => panic!("a duplicate while the first ran: {other:?}"),
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                let first = first.await.unwrap();
                assert!(first.is_ok(), "{first:?}");
                assert!(aborted >= 10, "{aborted}");
                assert_eq!(shop.runs(), 1, "the handler ran once");
                let again = client.clone().pay(keyed(&key, "alice", message)).await;
                assert!(was_replayed(&again));
                let fence: i64 =
                    again.as_ref().unwrap().metadata().get("x-fence").unwrap().to_str().unwrap().parse().unwrap();
                assert!(fence > 0, "the handler saw its fence");
                assert_eq!(seen(&again), seen(&first));
            }

            /// The store takes no renewal while the handler blocks its
            /// thread past the lease: a duplicate takes the record over and
            /// runs. The late handler's response is not kept, and its
            /// client is told it was taken over (ABORTED), not that the
            /// store failed; retries replay the call that took over.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_late_handler_whose_renewals_failed_is_told_it_was_taken_over() {
                let faults = idem::testing::Faults::new();
                faults.inject(idem::testing::Op::Extend, idem::testing::Fault::Fail);
                let store: Arc<dyn LeaseStore> = Arc::new(faults.wrap(store!()));
                let (client, shop) = server(store, |l| l.lease(Duration::from_millis(600))).await;
                let key = unique("k");
                let message = PayRequest { amount_cents: 5, block_ms: 2000, ..Default::default() };
                let first = {
                    let (mut client, key, message) = (client.clone(), key.clone(), message.clone());
                    tokio::spawn(async move { client.pay(keyed(&key, "alice", message)).await })
                };
                tokio::time::sleep(Duration::from_millis(900)).await;
                let second = client.clone().pay(keyed(&key, "alice", message.clone())).await;
                assert!(second.is_ok() && !was_replayed(&second), "the lease had passed: taken over: {second:?}");
                let status = first.await.unwrap().unwrap_err();
                assert_eq!(status.code(), Code::Aborted, "{status:?}");
                assert!(status.message().contains("took this one over"), "{status:?}");
                assert_eq!(shop.runs(), 2, "both handlers ran: the first stalled past its lease");
                let again = client.clone().pay(keyed(&key, "alice", message)).await;
                assert!(was_replayed(&again));
                assert_eq!(seen(&again), seen(&second), "retries replay the call that took over");
            }

            /// A handler runs recorded steps under the layer's own record:
            /// its first run charges the card and then fails (not kept);
            /// the retry replays the charge and answers. One charge.
            #[tokio::test]
            async fn a_handler_resumes_after_its_recorded_step() {
                let (client, shop) = server(store!(), |l| l).await;
                let key = unique("k");
                let message = PayRequest {
                    amount_cents: 5,
                    charge_step: true,
                    fail_first_after_charge: true,
                    ..Default::default()
                };
                let first = client.clone().pay(keyed(&key, "alice", message.clone())).await;
                assert_eq!(first.unwrap_err().code(), Code::Unavailable);
                assert_eq!(shop.charges(), 1);
                let retry = client.clone().pay(keyed(&key, "alice", message.clone())).await.unwrap();
                assert_eq!(retry.metadata().get("x-steps-replayed").unwrap(), "1", "the charge was replayed");
                assert_eq!((shop.runs(), shop.charges()), (2, 1), "the handler ran twice, the card was charged once");
                let again = client.clone().pay(keyed(&key, "alice", message)).await;
                assert!(was_replayed(&again));
                assert_eq!((shop.runs(), shop.charges()), (2, 1));
            }

            #[tokio::test]
            async fn a_retry_while_the_first_runs_is_aborted_with_a_pushback() {
                let (client, shop) = server(store!(), |l| l).await;
                let key = unique("k");
                let slow = PayRequest { amount_cents: 5, delay_ms: 800, ..Default::default() };
                let first = {
                    let (mut client, key, slow) = (client.clone(), key.clone(), slow.clone());
                    tokio::spawn(async move { client.pay(keyed(&key, "alice", slow)).await })
                };
                tokio::time::sleep(Duration::from_millis(200)).await;
                let retry = client.clone().pay(keyed(&key, "alice", slow)).await.unwrap_err();
                assert_eq!(retry.code(), Code::Aborted, "{retry:?}");
                // A second, not the 30 s lease: the first call ends long before.
                assert_eq!(retry.metadata().get(RETRY_PUSHBACK).unwrap(), "1000");
                assert!(first.await.unwrap().is_ok());
                assert_eq!(shop.runs(), 1);
            }

            #[tokio::test]
            async fn the_same_key_with_another_message_is_failed_precondition_and_runs_nothing() {
                let (mut client, shop) = server(store!(), |l| l).await;
                let key = unique("k");
                client.pay(keyed(&key, "alice", pay(500))).await.unwrap();
                let other = client.pay(keyed(&key, "alice", pay(999))).await.unwrap_err();
                assert_eq!(other.code(), Code::FailedPrecondition, "{other:?}");
                assert_eq!(shop.runs(), 1);
            }

            #[tokio::test]
            async fn a_missing_or_malformed_key_is_invalid_argument() {
                let (mut client, shop) = server(store!(), |l| l).await;
                let mut missing = Request::new(pay(1));
                missing.metadata_mut().insert("x-client", "alice".parse().unwrap());
                for (request, what) in [
                    (missing, "no key"),
                    (keyed("\"\"", "alice", pay(1)), "an empty key"),
                    (keyed("\"unclosed", "alice", pay(1)), "an unclosed quote"),
                ] {
                    let status = client.pay(request).await.unwrap_err();
                    assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
                    assert!(status.message().contains("idempotency-key"), "{what}: {status:?}");
                }
                let mut twice = keyed("a", "alice", pay(1));
                twice.metadata_mut().append("idempotency-key", "b".parse().unwrap());
                assert_eq!(client.pay(twice).await.unwrap_err().code(), Code::InvalidArgument);
                // A bare key (no quotes) and a quoted one are the same key.
                let key = unique("k");
                assert!(client.pay(keyed(&key, "alice", pay(1))).await.is_ok());
                let quoted = client.pay(keyed(&format!("\"{key}\""), "alice", pay(1))).await;
                assert!(was_replayed(&quoted));
                assert_eq!(shop.runs(), 1);
            }

            #[tokio::test]
            async fn keys_are_scoped_per_tenant() {
                let (mut client, shop) = server(store!(), |l| l).await;
                let key = unique("k");
                let alice = client.pay(keyed(&key, "alice", pay(5))).await.unwrap().into_inner();
                let bob = client.pay(keyed(&key, "bob", pay(5))).await;
                assert!(!was_replayed(&bob), "bob's key is not alice's");
                assert_ne!(bob.unwrap().into_inner().payment_id, alice.payment_id);
                let alice_again = client.pay(keyed(&key, "alice", pay(5))).await;
                assert!(was_replayed(&alice_again));
                assert_eq!(alice_again.unwrap().into_inner(), alice);
                let mut nobody = Request::new(pay(5));
                nobody.metadata_mut().insert("idempotency-key", key.parse().unwrap());
                assert_eq!(client.pay(nobody).await.unwrap_err().code(), Code::Unauthenticated, "a key nobody owns");
                assert_eq!(shop.runs(), 2);
            }

            #[tokio::test]
            async fn a_failed_call_leaves_no_record_and_its_retry_runs_again() {
                let (mut client, shop) = server(store!(), |l| l).await;
                let key = unique("k");
                let failing = PayRequest { amount_cents: 5, fail_with: Code::Internal as i32, ..Default::default() };
                let first = client.pay(keyed(&key, "alice", failing.clone())).await;
                assert!(matches!(seen(&first), Seen::Err(Code::Internal, ..)), "{first:?}");
                let second = client.pay(keyed(&key, "alice", failing)).await;
                assert!(!was_replayed(&second), "a failure is not kept");
                assert_eq!(shop.runs(), 2, "the retry ran again");
            }

            /// A status the layer is told to keep replays exactly: code,
            /// message and its metadata, as tonic sent them.
            #[tokio::test]
            async fn a_kept_error_status_replays_exactly() {
                let keep = |code| code == Code::Ok || code == Code::InvalidArgument;
                let (mut client, shop) = server(store!(), |l| l.keep(keep)).await;
                let key = unique("k");
                let refused =
                    PayRequest { amount_cents: -5, fail_with: Code::InvalidArgument as i32, ..Default::default() };
                let first = client.pay(keyed(&key, "alice", refused.clone())).await;
                let expected = Seen::Err(
                    Code::InvalidArgument,
                    "payment 1 failed".to_owned(),
                    vec![
                        ("content-type".to_owned(), vec!["application/grpc".to_owned()]),
                        ("x-payment-id".to_owned(), vec![]),
                        ("x-audit".to_owned(), vec![]),
                        ("x-failed-payment".to_owned(), vec!["1".to_owned()]),
                    ],
                );
                assert_eq!(seen(&first), expected);
                assert!(!was_replayed(&first));
                let retry = client.pay(keyed(&key, "alice", refused)).await;
                assert!(was_replayed(&retry));
                assert_eq!(seen(&retry), expected);
                assert_eq!(shop.runs(), 1);
            }

            #[tokio::test]
            async fn a_panicking_handler_is_internal_and_leaves_no_record() {
                let (mut client, shop) = server(store!(), |l| l).await;
                let key = unique("k");
                let panicking = PayRequest { amount_cents: 5, panic: true, ..Default::default() };
                let status = client.pay(keyed(&key, "alice", panicking)).await.unwrap_err();
                assert_eq!(status.code(), Code::Internal, "{status:?}");
                assert!(client.pay(keyed(&key, "alice", pay(5))).await.is_ok(), "the retry runs");
                assert_eq!(shop.runs(), 2);
            }

            /// A streaming method passes through: each call streams all its
            /// messages as they come, none replayed.
            #[tokio::test]
            async fn a_streaming_call_passes_through_unguarded() {
                let (mut client, _shop) = server(store!(), |l| l).await;
                let key = unique("k");
                for _ in 0..2 {
                    let payments = client.watch(keyed(&key, "alice", pay(7))).await.unwrap();
                    assert_eq!(payments.iter().map(|p| p.payment_id).collect::<Vec<_>>(), [1, 2, 3]);
                }
            }

            #[tokio::test]
            async fn bodies_over_the_limits() {
                let (mut client, shop) = server(store!(), |l| l).await;
                // A request over 16 KiB: refused, nothing run.
                let long = PayRequest { amount_cents: 5, memo: "m".repeat(20_000), ..Default::default() };
                let status = client.pay(keyed(&unique("k"), "alice", long)).await.unwrap_err();
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert_eq!(shop.runs(), 0);
                // A response over 64 KiB: sent once, its retries told it
                // was processed (ALREADY_EXISTS), the handler not run again.
                let key = unique("k");
                let padded = PayRequest { amount_cents: 5, response_bytes: 100_000, ..Default::default() };
                let first = client.pay(keyed(&key, "alice", padded.clone())).await.unwrap();
                assert_eq!(first.get_ref().padding.len(), 100_000);
                let retry = client.pay(keyed(&key, "alice", padded)).await;
                assert!(was_replayed(&retry));
                assert_eq!(retry.unwrap_err().code(), Code::AlreadyExists);
                assert_eq!(shop.runs(), 1);
            }
        }
    };
}

grpc_suite! {
    mod memory;
    store = Some(Arc::new(idem::store::MemoryStore::new()) as Arc<dyn LeaseStore>);
}

grpc_suite! {
    mod sqlite;
    store = common::sqlite().await.map(|p| Arc::new(idem::store::SqlStore::new(p)) as Arc<dyn LeaseStore>);
}

grpc_suite! {
    mod postgres;
    store = common::postgres().await.map(|p| Arc::new(idem::store::SqlStore::new(p)) as Arc<dyn LeaseStore>);
}

grpc_suite! {
    mod mysql;
    store = common::mysql().await.map(|p| Arc::new(idem::store::SqlStore::new(p)) as Arc<dyn LeaseStore>);
}

grpc_suite! {
    mod redis;
    store = common::redis().await.map(|c| Arc::new(idem::store::RedisStore::new(c, format!("{}:", unique("idem-grpc")))) as Arc<dyn LeaseStore>);
}

grpc_suite! {
    mod redis_cluster;
    store = common::redis_cluster().await.map(|c| Arc::new(idem::store::RedisStore::new(c, format!("{}:", unique("idem-grpc")))) as Arc<dyn LeaseStore>);
}

/// A guarded call refused with `INTERNAL`, its message naming the fix;
/// the handler not run.
async fn refused_for_want_of_a_store(client: &mut PaymentsClient, shop: &Shop) {
    let status = client.pay(keyed(&unique("k"), "alice", pay(5))).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal);
    assert!(status.message().contains("Stores::builder().lease(store)"), "{status:?}");
    assert_eq!(shop.runs(), 0);
}

#[tokio::test]
async fn a_layer_on_stores_without_a_lease_store_names_the_fix() {
    let stores = idem::Stores::builder().token(idem::store::MemoryStore::new()).build();
    let (mut client, shop) = served(IdempotencyLayer::with_stores(stores), |l| l).await;
    refused_for_want_of_a_store(&mut client, &shop).await;
}

/// A layer built before the stores are installed finds them at its calls,
/// as a guard naming no store does. The one test of this binary that
/// installs stores (once per process): the others give theirs.
#[tokio::test]
async fn a_layer_on_the_installed_stores_finds_them_once_installed() {
    let (mut client, shop) = served(IdempotencyLayer::installed(), |l| l).await;
    refused_for_want_of_a_store(&mut client, &shop).await;
    idem::Stores::builder().lease(idem::store::MemoryStore::new()).install().unwrap();
    let key = unique("k");
    let first = client.pay(keyed(&key, "alice", pay(5))).await;
    assert!(first.is_ok() && !was_replayed(&first), "{first:?}");
    let retry = client.pay(keyed(&key, "alice", pay(5))).await;
    assert!(was_replayed(&retry));
    assert_eq!(seen(&retry), seen(&first));
    assert_eq!(shop.runs(), 1);
}
