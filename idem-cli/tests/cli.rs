//! The `idem` binary end to end, against real servers: records are made
//! through the runtime's public API (a lease whose worker "crashed": claimed
//! and never completed; a completed call; an unfinished dedup record), then
//! the binary inspects, lists, releases and purges them, and the guard is
//! run again to see the effect.
//!
//! Every test works in scopes (and on Redis under a key prefix) of its own,
//! so parallel tests and other runs sharing the servers never see each
//! other's records; nothing outside them is deleted. PostgreSQL, MySQL and
//! Redis come from `IDEM_PG_URL`, `IDEM_MYSQL_URL`, `IDEM_REDIS_URL`; a
//! server that cannot be reached skips its tests (fails them with
//! `IDEM_REQUIRE_SERVICES=1`).

// The runtime under the name the facade gives it (which re-exports it).
extern crate idem_runtime as idem;

use idem_test_support as common;

use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use common::unique;
use http_body_util::Full;
use idem::admin::{self, RecordId, RecordState};
use idem::http::{IdempotencyLayer, ResponseBody};
use idem::lease::{LeaseStore, StepKey};
use idem::{Claim, Guard, Key};
use serde_json::Value;
use tower_service::Service as _;

/// A lease short enough to pass within a test, and long enough for the
/// few `idem` commands a test runs while it is live (each a process that
/// connects: over a second on a loaded 2-core machine).
const SHORT_LEASE: Duration = Duration::from_secs(5);

/// Where the binary looks for its stores.
enum Store<'a> {
    Sql(&'a str),
    Redis { url: &'a str, prefix: &'a str },
    Etcd { url: &'a str, prefix: &'a str },
}

/// Run `idem` with `args` on `store`, stdin not a terminal, and no store
/// from the environment (the test suite's own IDEM_REDIS_URL included).
fn idem(store: &Store<'_>, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
    cmd.env_remove("IDEM_DATABASE_URL").env_remove("IDEM_REDIS_URL").env_remove("IDEM_REDIS_PREFIX");
    cmd.env_remove("IDEM_ETCD_URL").env_remove("IDEM_ETCD_PREFIX");
    // The tests' broker URLs are `idem relay`'s too: a test gives them.
    cmd.env_remove("IDEM_AMQP_URL").env_remove("IDEM_NATS_URL");
    match store {
        Store::Sql(url) => cmd.args(["--database-url", url]),
        Store::Redis { url, prefix } => cmd.args(["--redis-url", url, "--redis-prefix", prefix]),
        Store::Etcd { url, prefix } => cmd.args(["--etcd-url", url, "--etcd-prefix", prefix]),
    };
    cmd.args(args).stdin(Stdio::null()).output().expect("run the idem binary")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Run with `--json` and expect exit code `code`; the one JSON document.
fn idem_json(store: &Store<'_>, args: &[&str], code: i32) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = idem(store, &all);
    assert_eq!(out.status.code(), Some(code), "idem {args:?}: stdout {} stderr {}", stdout(&out), stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("idem {args:?}: not JSON ({e}): {}", stdout(&out)))
}

/// The record a store's entry in a document holds (`null` when none).
fn record_in(doc: &Value) -> &Value {
    let stores = doc["stores"].as_array().expect("a `stores` array");
    assert_eq!(stores.len(), 1, "{doc}");
    &stores[0]["record"]
}

/// Claim `key` with a short lease and drop the ticket without running the
/// body: a worker that died mid-work. The record stays PROCESSING.
async fn crash(store: &dyn LeaseStore, scope: &str, key: &str) {
    match Guard::new(scope.to_owned()).key(key).lease::<u32>(store, SHORT_LEASE).await.unwrap() {
        Claim::Run(ticket) => drop(ticket),
        Claim::Replay(_) => panic!("a fresh key"),
    }
}

/// Run the guard of `key` with a body answering 7: whether the body ran.
async fn run(store: &dyn LeaseStore, scope: &str, key: &str) -> bool {
    match Guard::new(scope.to_owned()).key(key).lease::<u32>(store, Duration::from_secs(30)).await.unwrap() {
        Claim::Run(ticket) => {
            assert_eq!(ticket.run(async { Ok::<u32, idem::Error>(7) }).await.unwrap(), 7);
            true
        }
        Claim::Replay(answer) => {
            assert_eq!(answer, 7);
            false
        }
    }
}

/// `key` as records store it (escaped, hashed when long): what `stuck`
/// lists and `--stored` takes.
fn stored(key: &str) -> String {
    Key::new(key).unwrap().as_str().to_owned()
}

/// A handler behind the HTTP layer: answers 201 with these headers and body.
#[derive(Clone)]
struct Handler {
    headers: Vec<(&'static str, &'static [u8])>,
    body: Bytes,
}

impl tower_service::Service<http::Request<Full<Bytes>>> for Handler {
    type Response = http::Response<Full<Bytes>>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<Full<Bytes>>) -> Self::Future {
        let mut response = http::Response::new(Full::new(self.body.clone()));
        *response.status_mut() = http::StatusCode::CREATED;
        for (name, value) in &self.headers {
            response.headers_mut().append(*name, http::HeaderValue::from_bytes(value).unwrap());
        }
        std::future::ready(Ok(response))
    }
}

/// A POST with `Idempotency-Key: "<key>"` through the HTTP layer of
/// `scope` (with a tenant function naming `tenant`, if given), answered by
/// `handler`: the record is the layer's own.
async fn post(
    store: &Arc<dyn LeaseStore>,
    scope: &str,
    tenant: Option<&str>,
    key: &str,
    handler: Handler,
) -> http::Response<ResponseBody> {
    let mut layer = IdempotencyLayer::new(store.clone()).scope(scope.to_owned());
    if let Some(tenant) = tenant {
        let tenant = tenant.to_owned();
        layer = layer.tenant(move |_| Some(tenant.clone()));
    }
    let mut service = tower_layer::Layer::layer(&layer, handler);
    let request = http::Request::post("/orders")
        .header("idempotency-key", format!("\"{key}\""))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    service.call(request).await.unwrap()
}

fn json_handler() -> Handler {
    Handler {
        headers: vec![("content-type", b"application/json"), ("x-order", b"7")],
        body: Bytes::from_static("{\"id\":7,\n\"note\":\"für\"}".as_bytes()),
    }
}

/// A record the HTTP layer wrote for a tenant is found by `--tenant` and
/// `--key` (the header's key), by inspect and by release, and by nothing
/// else: not by the key alone, not under another tenant. A layer without
/// tenants is found by the key alone.
async fn http_records_are_found_by_tenant_and_key(store: Arc<dyn LeaseStore>, cli: &Store<'_>) {
    let scope = unique("cli.http");
    let tenant = "ac:me\\ é";
    let key = "order:1{x}%";
    assert_eq!(post(&store, &scope, Some(tenant), key, json_handler()).await.status(), 201);

    let doc = idem_json(cli, &["inspect", "--scope", &scope, "--tenant", tenant, "--key", key], 0);
    let record = record_in(&doc);
    assert_eq!(record["status"], "DONE", "{doc}");
    assert_eq!(record["key_parts"], serde_json::json!([tenant, key]), "{doc}");
    assert_eq!(record["key"].as_str(), Some(Key::from_parts(&[&tenant, &key]).unwrap().as_str()));
    let text = stdout(&idem(cli, &["inspect", "--scope", &scope, "--tenant", tenant, "--key", key]));
    assert!(text.contains(&format!("key ({tenant:?}, {key:?})")), "{text}");

    for other in [vec!["--key", key], vec!["--tenant", "someone-else", "--key", key]] {
        let mut args = vec!["inspect", "--scope", &scope];
        args.extend(other);
        let doc = idem_json(cli, &args, 0);
        assert!(record_in(&doc).is_null(), "{args:?}: {doc}");
    }
    // release reads the same record (and refuses it: it is DONE).
    let out = idem(cli, &["release", "--scope", &scope, "--tenant", tenant, "--key", key, "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("DONE"), "{}", stderr(&out));
    // --tenant names a guard's key parts, --stored the stored key: not both.
    let out = idem(cli, &["inspect", "--stored", "--scope", &scope, "--tenant", tenant, "--key", key]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    let shared = unique("cli.http.shared");
    assert_eq!(post(&store, &shared, None, key, json_handler()).await.status(), 201);
    let doc = idem_json(cli, &["inspect", "--scope", &shared, "--key", key], 0);
    assert_eq!(record_in(&doc)["key_parts"], serde_json::json!([key]), "{doc}");
}

/// A response the HTTP layer stored shows as its status, headers and body
/// (text, or hex when it is not text), not as the base64 the record holds;
/// any other answer shows as its JSON, as before.
async fn http_responses_show_decoded(store: Arc<dyn LeaseStore>, cli: &Store<'_>) {
    let scope = unique("cli.http.show");
    assert_eq!(post(&store, &scope, Some("t1"), "text", json_handler()).await.status(), 201);
    let inspect = ["inspect", "--scope", &scope, "--tenant", "t1", "--key", "text"];
    let text = stdout(&idem(cli, &inspect));
    for line in [
        "HTTP 201 (2 headers",
        "    content-type: application/json",
        "    x-order: 7",
        "{\"id\":7,\\n\"note\":\"für\"}",
    ] {
        assert!(text.contains(line), "{line:?} in {text}");
    }
    assert!(!text.contains("eyJpZCI6"), "no base64 of the body: {text}");
    let doc = idem_json(cli, &inspect, 0);
    let response = &record_in(&doc)["http_response"];
    assert_eq!(response["status"], 201, "{doc}");
    assert_eq!(response["headers"][0], serde_json::json!({ "name": "content-type", "value": "application/json" }));
    assert_eq!(response["body_text"], "{\"id\":7,\n\"note\":\"für\"}");
    assert_eq!(response["body_bytes"], 23);

    let binary: Vec<u8> = (0..100u8).map(|i| i.wrapping_mul(37)).collect();
    let handler = Handler { headers: vec![("content-type", b"image/png")], body: Bytes::from(binary.clone()) };
    assert_eq!(post(&store, &scope, Some("t1"), "binary", handler).await.status(), 201);
    let inspect = ["inspect", "--scope", &scope, "--tenant", "t1", "--key", "binary"];
    let hex: String = binary[..64].iter().map(|b| format!("{b:02x}")).collect();
    let text = stdout(&idem(cli, &inspect));
    assert!(text.contains(&format!("(hex, 100 bytes, the first 64 shown) {hex}…")), "{text}");
    let doc = idem_json(cli, &inspect, 0);
    let response = &record_in(&doc)["http_response"];
    assert_eq!((response["body_hex"].as_str(), response["body_text"].as_str()), (Some(hex.as_str()), None), "{doc}");
    assert_eq!(response["body_truncated"], true);

    // An answer of another guard is no HTTP response.
    let other = unique("plain");
    assert!(run(&*store, &scope, &other).await);
    let doc = idem_json(cli, &["inspect", "--scope", &scope, "--key", &other], 0);
    assert_eq!(
        (record_in(&doc)["response_preview"].as_str(), &record_in(&doc)["http_response"]),
        (Some("7"), &Value::Null)
    );
}

/// A DONE record whose answer was not kept (`drop_answer` empties it as
/// the store writes that) reads "answer not kept", in text and JSON.
async fn a_done_record_without_its_answer_reads_answer_not_kept<F, Fut>(
    store: &dyn LeaseStore,
    cli: &Store<'_>,
    drop_answer: F,
) where
    F: FnOnce(String, String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let scope = unique("cli.not-kept");
    let (kept, dropped) = (unique("kept"), unique("dropped"));
    assert!(run(store, &scope, &kept).await);
    assert!(run(store, &scope, &dropped).await);
    drop_answer(scope.clone(), stored(&dropped)).await;

    let doc = idem_json(cli, &["inspect", "--scope", &scope, "--key", &dropped], 0);
    assert_eq!(
        (record_in(&doc)["status"].as_str(), &record_in(&doc)["answer_kept"]),
        (Some("DONE"), &Value::Bool(false)),
        "{doc}"
    );
    let text = stdout(&idem(cli, &["inspect", "--scope", &scope, "--key", &dropped]));
    assert!(text.contains("answer not kept"), "{text}");
    let doc = idem_json(cli, &["inspect", "--scope", &scope, "--key", &kept], 0);
    assert_eq!(record_in(&doc)["answer_kept"], true, "{doc}");
    assert!(!stdout(&idem(cli, &["inspect", "--scope", &scope, "--key", &kept])).contains("not kept"));
}

/// Scope and key text that SQL quoting, `LIKE`, Redis glob patterns,
/// record names and terminals could each get wrong.
fn hostile(prefix: &str) -> String {
    format!("{}'\"%_{{x}}*?[a]\\ é日本 ;--", unique(prefix))
}

/// What every store's lease records must go through: a crashed worker's
/// record and a completed one, with hostile scope and keys (a 500-byte
/// key among them, stored hashed).
async fn lease_lifecycle(store: &dyn LeaseStore, cli: &Store<'_>) {
    let scope = hostile("cli.lease");
    let crashed = hostile("crashed");
    let long = format!("{}{}", unique("long"), "k".repeat(500));
    let done = hostile("done");
    crash(store, &scope, &crashed).await;
    crash(store, &scope, &long).await;
    assert!(run(store, &scope, &done).await);

    // While the lease is live the record is running: not stuck, not released.
    let out = idem(cli, &["release", "--scope", &scope, "--key", &crashed, "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("lease is live"), "{}", stderr(&out));
    let live = idem_json(cli, &["inspect", "--scope", &scope, "--key", &crashed], 0);
    assert_eq!(record_in(&live)["state"], "running", "{live}");
    let none = idem_json(cli, &["stuck", "--scope", &scope], 0);
    assert_eq!(none["stores"][0]["records"].as_array().unwrap().len(), 0, "{none}");

    // etcd's leases end when its leader finds them expired (it checks every
    // 500 ms), in whole seconds.
    let slack = if store.kind() == "etcd" { Duration::from_millis(1500) } else { Duration::ZERO };
    tokio::time::sleep(SHORT_LEASE + Duration::from_millis(300) + slack).await;

    // inspect, by the business key as the guard was given it.
    let doc = idem_json(cli, &["inspect", "--scope", &scope, "--key", &crashed], 0);
    let record = record_in(&doc);
    assert_eq!((record["status"].as_str(), record["state"].as_str()), (Some("PROCESSING"), Some("lease_passed")));
    assert_eq!(record["stuck"], true);
    assert!(record["owner"].is_string() && record["fence"].as_i64().unwrap() > 0, "{doc}");
    assert!(record["lease_left_ms"].as_i64().unwrap() < 0, "{doc}");
    let text = idem(cli, &["inspect", "--scope", &scope, "--key", &crashed]);
    assert_eq!(text.status.code(), Some(0));
    let text = stdout(&text);
    assert!(text.contains("PROCESSING") && text.contains("STUCK") && text.contains("fence"), "{text}");
    let long_doc = idem_json(cli, &["inspect", "--scope", &scope, "--key", &long], 0);
    let stored_long = stored(&long);
    assert!(stored_long.starts_with("\\sha256:"));
    assert_eq!(record_in(&long_doc)["key"].as_str(), Some(stored_long.as_str()), "{long_doc}");

    let done_doc = idem_json(cli, &["inspect", "--scope", &scope, "--key", &done], 0);
    let done_record = record_in(&done_doc);
    assert_eq!((done_record["status"].as_str(), done_record["state"].as_str()), (Some("DONE"), Some("done")));
    assert_eq!(done_record["response_preview"], "7");
    assert_eq!((&done_record["http_response"], &done_record["answer_kept"]), (&Value::Null, &Value::Bool(true)));

    // stuck lists the crashed records of this scope, not the completed one.
    let listed = idem_json(cli, &["stuck", "--scope", &scope], 0);
    let mut keys: Vec<&str> =
        listed["stores"][0]["records"].as_array().unwrap().iter().map(|r| r["key"].as_str().unwrap()).collect();
    keys.sort();
    let stored_crashed = stored(&crashed);
    let mut want = vec![stored_crashed.as_str(), stored_long.as_str()];
    want.sort();
    assert_eq!(keys, want, "{listed}");
    let limited = idem_json(cli, &["stuck", "--scope", &scope, "--limit", "1"], 0);
    assert_eq!(limited["stores"][0]["records"].as_array().unwrap().len(), 1);
    assert_eq!(limited["stores"][0]["more"], true);

    // Without --yes on a non-terminal: refused, nothing released.
    let out = idem(cli, &["release", "--scope", &scope, "--key", &crashed]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--yes"), "{}", stderr(&out));
    let still = idem_json(cli, &["inspect", "--scope", &scope, "--key", &crashed], 0);
    assert_eq!(record_in(&still)["state"], "lease_passed");

    // A completed record is never released.
    let out = idem(cli, &["release", "--scope", &scope, "--key", &done, "--yes"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("DONE"), "{}", stderr(&out));
    assert!(!run(store, &scope, &done).await, "the completed call still replays");

    // Nor is a record that is not there.
    let out = idem(cli, &["release", "--scope", &scope, "--key", &unique("absent"), "--yes"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no record"), "{}", stderr(&out));

    // --yes releases it; the next call runs the body again.
    let released = idem_json(cli, &["release", "--scope", &scope, "--key", &crashed, "--yes"], 0);
    assert_eq!(released["released"], 1, "{released}");
    assert_eq!(released["stores"][0]["outcome"], "released");
    let gone = idem_json(cli, &["inspect", "--scope", &scope, "--key", &crashed], 0);
    assert!(record_in(&gone).is_null(), "{gone}");
    assert!(run(store, &scope, &crashed).await, "a released key runs again");

    // The hashed one, named as `stuck` listed it.
    let out = idem(cli, &["release", "--stored", "--scope", &scope, "--key", &stored_long, "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("released"));
    assert!(run(store, &scope, &long).await);
    let none = idem_json(cli, &["stuck", "--scope", &scope], 0);
    assert_eq!(none["stores"][0]["records"].as_array().unwrap().len(), 0, "{none}");
}

/// A transfer in three recorded steps, `reserve` (answering "hold-7"),
/// `charge` (500) and `ledger`, answering 500. With `stop`, its worker dies
/// in `ledger`: the body's future is dropped once `ledger` starts, after
/// `reserve` and `charge` were recorded, and the record stays PROCESSING
/// until its lease passes.
async fn transfer(store: &dyn LeaseStore, scope: &str, key: &str, stop: bool) {
    let claim = Guard::new(scope.to_owned()).key(key).lease::<u64>(store, SHORT_LEASE).await.unwrap();
    let Claim::Run(ticket) = claim else { panic!("a fresh key, or one whose lease passed") };
    let in_ledger = &tokio::sync::Notify::new();
    let body = ticket.run_steps(|steps| async move {
        let hold = steps.run("reserve", |_| async { Ok::<_, idem::Error>("hold-7".to_owned()) }).await?;
        let charged = steps.run("charge", |_| async { Ok::<_, idem::Error>(500u64) }).await?;
        steps
            .run("ledger", |_| async move {
                if stop {
                    in_ledger.notify_one();
                    std::future::pending::<()>().await;
                }
                Ok::<_, idem::Error>(hold)
            })
            .await?;
        Ok::<_, idem::Error>(charged)
    });
    if !stop {
        assert_eq!(body.await.unwrap(), 500);
        return;
    }
    tokio::select! {
        done = body => panic!("the worker was to die in `ledger`: {done:?}"),
        () = in_ledger.notified() => {}
    }
}

/// The stable key of step `name` of the call of `scope` and `key` (as
/// the guard was given them).
fn step_key(scope: &str, key: &str, name: &str) -> String {
    StepKey::for_step(&idem::key::stored_scope(scope), &stored(key), name).to_string()
}

/// `inspect` of a call stopped after two of its three steps shows both
/// (number, name, result, stable key), in text and JSON.
fn shows_two_steps(cli: &Store<'_>, scope: &str, key: &str) {
    let doc = idem_json(cli, &["inspect", "--scope", scope, "--key", key], 0);
    let steps = record_in(&doc)["steps"].as_array().unwrap_or_else(|| panic!("a steps list: {doc}"));
    assert_eq!(steps.len(), 2, "{doc}");
    for (step, (number, name, result)) in steps.iter().zip([(0, "reserve", "\"hold-7\""), (1, "charge", "500")]) {
        assert_eq!((step["number"].as_u64(), step["name"].as_str()), (Some(number), Some(name)), "{doc}");
        assert_eq!(step["result_preview"].as_str(), Some(result), "{doc}");
        assert_eq!(step["key"].as_str(), Some(step_key(scope, key, name).as_str()), "{doc}");
    }
    let text = stdout(&idem(cli, &["inspect", "--scope", scope, "--key", key]));
    assert!(text.contains("steps       2 recorded"), "{text}");
    let reserve = format!("step 0 `reserve`: \"hold-7\" (key {})", step_key(scope, key, "reserve"));
    let charge = format!("step 1 `charge`: 500 (key {})", step_key(scope, key, "charge"));
    assert!(text.contains(&reserve) && text.contains(&charge), "{text}");
}

/// `inspect` of a call with no recorded steps shows none: nothing in
/// text, an empty list in JSON.
fn shows_no_steps(cli: &Store<'_>, scope: &str, key: &str) {
    let doc = idem_json(cli, &["inspect", "--scope", scope, "--key", key], 0);
    assert_eq!(record_in(&doc)["steps"], serde_json::json!([]), "{doc}");
    let text = stdout(&idem(cli, &["inspect", "--scope", scope, "--key", key]));
    assert!(!text.contains("step"), "{text}");
}

/// Recovery points as the operator sees them: a call whose worker died
/// after two of its three steps shows both in `inspect`, and `stuck` says
/// it stopped after the second (the third was in flight); one that died
/// before its first step says that; a completed call shows no steps (they
/// go with the completion), the taken-over one included.
async fn steps_show_where_a_call_stopped(store: &dyn LeaseStore, cli: &Store<'_>) {
    let scope = hostile("cli.transfer");
    let (stopped, fresh, done) = (hostile("stopped"), unique("fresh"), unique("done"));
    transfer(store, &scope, &stopped, true).await;
    crash(store, &scope, &fresh).await;
    transfer(store, &scope, &done, false).await;
    tokio::time::sleep(SHORT_LEASE + Duration::from_millis(300)).await;

    shows_two_steps(cli, &scope, &stopped);
    shows_no_steps(cli, &scope, &fresh);
    shows_no_steps(cli, &scope, &done);

    let listed = idem_json(cli, &["stuck", "--scope", &scope], 0);
    let records = listed["stores"][0]["records"].as_array().unwrap();
    assert_eq!(records.len(), 2, "the steps are no records of their own: {listed}");
    let record = |key: &str| records.iter().find(|r| r["key"] == stored(key)).unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(record(&stopped)["stopped"], "after step 1 `charge`", "{listed}");
    assert_eq!(record(&stopped)["stopped_after_step"], serde_json::json!({ "number": 1, "name": "charge" }));
    assert_eq!(record(&stopped)["steps"].as_array().map(Vec::len), Some(2), "{listed}");
    assert_eq!(
        (record(&fresh)["stopped"].as_str(), &record(&fresh)["stopped_after_step"]),
        (Some("before its first step"), &Value::Null)
    );
    let text = stdout(&idem(cli, &["stuck", "--scope", &scope]));
    assert!(text.contains("stopped after step 1 `charge`"), "{text}");
    assert!(text.contains("stopped before its first step"), "{text}");
    // Across every scope, no step shows as a stuck record.
    let all = idem_json(cli, &["stuck", "--limit", "1000"], 0);
    let scopes: Vec<&str> =
        all["stores"][0]["records"].as_array().unwrap().iter().filter_map(|r| r["scope"].as_str()).collect();
    assert!(scopes.iter().all(|s| !s.starts_with("\\step:")), "{scopes:?}");

    // The take-over replays `reserve` and `charge`, runs `ledger` and
    // completes: its steps go.
    transfer(store, &scope, &stopped, false).await;
    shows_no_steps(cli, &scope, &stopped);
    let doc = idem_json(cli, &["inspect", "--scope", &scope, "--key", &stopped], 0);
    assert_eq!(record_in(&doc)["response_preview"], "500", "{doc}");
}

/// An at-most-once payment, `quote` then `charge` (each charge counted in
/// `charges`, a gateway that does not deduplicate), answering 500. With
/// `stop`, its worker dies in `charge` just after the charge (the body's
/// future dropped), the step marked started and not recorded.
async fn pay_once(
    store: &dyn LeaseStore,
    scope: &str,
    key: &str,
    charges: &AtomicUsize,
    stop: bool,
) -> Result<u64, idem::Error> {
    let ticket = match Guard::new(scope.to_owned()).key(key).lease::<u64>(store, SHORT_LEASE).await? {
        Claim::Run(ticket) => ticket,
        Claim::Replay(answer) => return Ok(answer),
    };
    let charged = &tokio::sync::Notify::new();
    let body = ticket.run_steps(|steps| async move {
        let cents = steps.run("quote", |_| async { Ok::<_, idem::Error>(500u64) }).await?;
        let charge = steps.run_at_most_once("charge", |_| async move {
            charges.fetch_add(1, SeqCst);
            if stop {
                charged.notify_one();
                std::future::pending::<()>().await;
            }
            Ok::<_, idem::Error>(cents)
        });
        charge.await
    });
    if !stop {
        return body.await;
    }
    tokio::select! {
        done = body => panic!("the worker was to die in `charge`: {done:?}"),
        () = charged.notified() => {}
    }
    Ok(0)
}

/// A step in doubt as the operator meets it: a payment whose worker died
/// in its at-most-once `charge` reads "held" with the step in flight
/// (name and key) while its lease lasts, and cannot be resolved then;
/// `stuck` names the step; `release` says which steps stay; the next
/// attempt stops in doubt, and `inspect` still shows the call's steps
/// without its record; `steps resolve` refuses a step not in flight and
/// asks for confirmation; resolved done, the call completes with the
/// result given, charged once.
async fn a_step_in_doubt_is_shown_and_resolved(store: &dyn LeaseStore, cli: &Store<'_>) {
    let (scope, key, charges) = (hostile("cli.doubt"), hostile("pay"), AtomicUsize::new(0));
    let charge = step_key(&scope, &key, "charge");
    pay_once(store, &scope, &key, &charges, true).await.unwrap();
    let resolve = |step: &str, outcome: &[&str]| {
        let mut args = vec!["steps", "resolve", "--scope", &scope, "--key", &key, "--step", step];
        args.extend_from_slice(outcome);
        idem(cli, &args)
    };

    let text = stdout(&idem(cli, &["inspect", "--scope", &scope, "--key", &key]));
    assert!(text.contains("PROCESSING (held (lease live until "), "{text}");
    assert!(text.contains(&format!("in flight   step 1 `charge` (key {charge})")), "{text}");
    let doc = idem_json(cli, &["inspect", "--scope", &scope, "--key", &key], 0);
    let in_flight = serde_json::json!({ "number": 1, "name": "charge", "key": charge });
    assert_eq!(record_in(&doc)["in_flight"], in_flight, "{doc}");
    let out = resolve("charge", &["--not-done", "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stderr(&out).contains("held (lease live until"), "{}", stderr(&out));

    tokio::time::sleep(SHORT_LEASE + Duration::from_millis(300)).await;
    let text = stdout(&idem(cli, &["stuck", "--scope", &scope]));
    assert!(text.contains(&format!("stopped in step 1 `charge` (key {charge})")), "{text}");
    let out = idem(cli, &["release", "--scope", &scope, "--key", &key, "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = stdout(&out);
    assert!(said.contains("its 1 recorded step stays (`quote`): it replays it and resumes after it"), "{said}");
    assert!(said.contains("step 1 `charge` stays marked in flight"), "{said}");

    let doubt = pay_once(store, &scope, &key, &charges, false).await;
    let Err(idem::Error::InDoubt { step_key, .. }) = doubt else { panic!("{doubt:?}") };
    assert_eq!(step_key, charge);
    let text = stdout(&idem(cli, &["inspect", "--scope", &scope, "--key", &key]));
    assert!(text.contains("no record") && text.contains("in flight   step 1 `charge`"), "{text}");
    let doc = idem_json(cli, &["inspect", "--scope", &scope, "--key", &key], 0);
    assert_eq!((record_in(&doc), &doc["stores"][0]["in_flight"]), (&Value::Null, &in_flight), "{doc}");

    let out = resolve("quote", &["--not-done", "--yes"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no step `quote` is in flight (step 1 `charge` is)"), "{}", stderr(&out));
    let out = resolve("charge", &["--done", "--result", "500"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--yes"), "{}", stderr(&out));
    let out = resolve("charge", &["--done", "--result", "500", "--yes", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((&doc["resolved"], &doc["stores"][0]["outcome"]), (&Value::from(1), &Value::from("resolved")), "{doc}");

    assert_eq!(pay_once(store, &scope, &key, &charges, false).await.unwrap(), 500);
    assert_eq!(charges.load(SeqCst), 1, "charged by the worker that died alone");
}

/// A record a worker re-took after the operator looked is left alone: the
/// release compares the fence it saw.
async fn release_compares_the_fence<F, Fut>(store: &dyn LeaseStore, release: F)
where
    F: Fn(RecordId, i64) -> Fut,
    Fut: std::future::Future<Output = admin::Release>,
{
    let scope = unique("cli.fence");
    let key = unique("retaken");
    crash(store, &scope, &key).await;
    tokio::time::sleep(SHORT_LEASE + Duration::from_millis(300)).await;
    let id = RecordId::new(&scope, &Key::new(key.as_str()).unwrap());
    // What the operator saw: a stuck record with some fence; a worker
    // takes it over (fence + 1) and crashes again before the release.
    let seen = match release(id.clone(), -1).await {
        admin::Release::FenceChanged(r) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(seen.state, RecordState::LeasePassed);
    crash(store, &scope, &key).await;
    tokio::time::sleep(SHORT_LEASE + Duration::from_millis(300)).await;
    match release(id.clone(), seen.fence).await {
        admin::Release::FenceChanged(now) => {
            assert_eq!(now.fence, seen.fence + 1);
            assert_eq!(now.state, RecordState::LeasePassed);
        }
        other => panic!("{other:?}"),
    }
    match release(id, seen.fence + 1).await {
        admin::Release::Released(r) => assert_eq!(r.fence, seen.fence + 1),
        other => panic!("{other:?}"),
    }
    assert!(run(store, &scope, &key).await);
}

/// A record table of this test's own (`--table`): a plain identifier.
fn own_table(prefix: &str) -> String {
    unique(prefix).replace(|c: char| !c.is_ascii_alphanumeric(), "_")
}

/// The messages of a scope, in every state (what a test wrote, read back).
fn every_message(scope: &str) -> idem::outbox::MessageQuery {
    use idem::outbox::MessageState::*;
    idem::outbox::MessageQuery {
        states: vec![Pending, Failing, Dead, Sent],
        scope: Some(scope.to_owned()),
        ..Default::default()
    }
}

/// `url` as the command shows it: its password hidden.
fn redacted(url: &str) -> String {
    url.replacen("guest:guest@", "guest:***@", 1)
}

/// The `messages` of a `--json` `outbox list`: (id, state) each.
fn listed(doc: &Value) -> Vec<(String, String)> {
    let messages = doc["stores"][0]["messages"].as_array().unwrap_or_else(|| panic!("{doc}"));
    messages.iter().map(|m| (m["id"].as_str().unwrap().to_owned(), m["state"].as_str().unwrap().to_owned())).collect()
}

macro_rules! sql_tests {
    ($backend:ident, $db:ty, $connect:expr, $count_archived:expr, $drop_answer:expr, $forget_messages:expr) => {
        mod $backend {
            use super::*;

            type Pool = sqlx::Pool<$db>;

            /// The pool and the URL the binary is given, after `idem migrate`.
            async fn setup() -> Option<(Pool, String)> {
                let (pool, url): (Pool, String) = $connect.await?;
                let out = idem(&Store::Sql(&url), &["migrate"]);
                assert_eq!(out.status.code(), Some(0), "migrate: {}", stderr(&out));
                assert!(stdout(&out).contains("idem_records"));
                Some((pool, url))
            }

            #[tokio::test]
            async fn a_crashed_lease_is_inspected_listed_and_released_and_then_runs_again() {
                let Some((pool, url)) = setup().await else { return };
                let store = idem::store::SqlStore::new(pool);
                lease_lifecycle(&store, &Store::Sql(&url)).await;
            }

            #[tokio::test]
            async fn a_call_in_recorded_steps_shows_where_it_stopped() {
                let Some((pool, url)) = setup().await else { return };
                steps_show_where_a_call_stopped(&idem::store::SqlStore::new(pool), &Store::Sql(&url)).await;
            }

            #[tokio::test]
            async fn a_step_in_doubt_is_shown_and_resolved_by_the_operator() {
                let Some((pool, url)) = setup().await else { return };
                a_step_in_doubt_is_shown_and_resolved(&idem::store::SqlStore::new(pool), &Store::Sql(&url)).await;
            }

            #[tokio::test]
            async fn a_release_leaves_a_record_taken_over_since() {
                let Some((pool, _url)) = setup().await else { return };
                let store = idem::store::SqlStore::new(pool.clone());
                release_compares_the_fence(&store, |id, fence| {
                    let pool = pool.clone();
                    async move { admin::release(&pool, &id, fence).await.unwrap() }
                })
                .await;
            }

            /// A dedup record committed without its answer (the guarded call
            /// was cut off and the caller committed anyway) is stuck too:
            /// repeats fail until an operator releases it.
            #[tokio::test]
            async fn an_unfinished_dedup_record_is_listed_and_released() {
                let Some((pool, url)) = setup().await else { return };
                let cli = Store::Sql(&url);
                let scope = hostile("cli.unfinished");
                let key = hostile("cut-off");
                let mut tx = pool.begin().await.unwrap();
                match Guard::new(scope.clone()).key(&key).dedup::<u32, _>(&mut tx).await.unwrap() {
                    Claim::Run(ticket) => drop(ticket),
                    Claim::Replay(_) => panic!("a fresh key"),
                }
                tx.commit().await.unwrap();
                let mut tx = pool.begin().await.unwrap();
                let repeat = Guard::new(scope.clone()).key(&key).dedup::<u32, _>(&mut tx).await;
                assert!(matches!(repeat, Err(idem::Error::Unfinished { .. })), "{repeat:?}");
                // Now, not on the connection's next use: MySQL's read holds a
                // shared lock on the record until then.
                tx.rollback().await.unwrap();

                let listed = idem_json(&cli, &["stuck", "--scope", &scope], 0);
                let records = listed["stores"][0]["records"].as_array().unwrap();
                assert_eq!(records.len(), 1, "{listed}");
                assert_eq!(records[0]["key"].as_str(), Some(stored(&key).as_str()), "{listed}");
                assert_eq!(records[0]["state"], "unfinished");
                let text = stdout(&idem(&cli, &["stuck", "--scope", &scope]));
                assert!(text.contains("unfinished") && text.contains("1 stuck record"), "{text}");

                let out = idem(&cli, &["release", "--scope", &scope, "--key", &key, "--yes"]);
                assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
                let mut tx = pool.begin().await.unwrap();
                match Guard::new(scope.clone()).key(&key).dedup::<u32, _>(&mut tx).await.unwrap() {
                    Claim::Run(ticket) => {
                        assert_eq!(ticket.finish(&mut tx, Ok::<u32, idem::Error>(3)).await.unwrap(), 3)
                    }
                    Claim::Replay(_) => panic!("a released key runs again"),
                }
                tx.commit().await.unwrap();
            }

            #[tokio::test]
            async fn purge_by_scope_and_age_counts_first_and_spares_processing_and_other_scopes() {
                let Some((pool, url)) = setup().await else { return };
                let cli = Store::Sql(&url);
                let store = idem::store::SqlStore::new(pool.clone());
                let scope = hostile("cli.purge");
                let other = hostile("cli.purge.other");
                let done: Vec<String> = (0..3).map(|_| hostile("old")).collect();
                for key in &done {
                    assert!(run(&store, &scope, key).await);
                }
                let crashed = unique("crashed");
                crash(&store, &scope, &crashed).await;
                let live = unique("live");
                match Guard::new(scope.clone()).key(&live).lease::<u32>(&store, Duration::from_secs(60)).await.unwrap()
                {
                    Claim::Run(ticket) => drop(ticket),
                    Claim::Replay(_) => panic!("a fresh key"),
                }
                let elsewhere = unique("elsewhere");
                assert!(run(&store, &other, &elsewhere).await);
                tokio::time::sleep(Duration::from_millis(50)).await;

                // Nothing of this scope is past its retention (7 days).
                let expired_only = idem_json(&cli, &["purge", "--scope", &scope, "--dry-run"], 0);
                assert_eq!(expired_only["stores"][0]["deleted"], 0, "{expired_only}");

                let age = ["purge", "--scope", &scope, "--older-than", "10ms", "--archive"];
                let mut dry = age.to_vec();
                dry.push("--dry-run");
                let preview = idem_json(&cli, &dry, 0);
                assert_eq!(preview["stores"][0]["dry_run"], true);
                assert_eq!(
                    (preview["stores"][0]["deleted"].as_u64(), preview["stores"][0]["archived"].as_u64()),
                    (Some(3), Some(3)),
                    "{preview}"
                );
                let text = stdout(&idem(&cli, &dry));
                assert!(text.contains("would delete 3 records"), "{text}");
                for key in &done {
                    let found =
                        admin::inspect(&pool, &RecordId::new(&scope, &Key::new(key.as_str()).unwrap())).await.unwrap();
                    assert!(found.is_some(), "a dry run deletes nothing");
                }

                let mut paced = age.to_vec();
                paced.extend(["--batch-size", "2", "--pause", "1ms", "--pause-factor", "1"]);
                let purged = idem_json(&cli, &paced, 0);
                assert_eq!(purged["stores"][0]["deleted"], 3, "{purged}");
                assert_eq!(purged["stores"][0]["batches"], 2, "{purged}");
                for key in &done {
                    let found =
                        admin::inspect(&pool, &RecordId::new(&scope, &Key::new(key.as_str()).unwrap())).await.unwrap();
                    assert_eq!(found, None);
                    let archived: i64 = sqlx::query_scalar($count_archived)
                        .bind(&scope)
                        .bind(stored(key))
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                    assert_eq!(archived, 1, "the completed record was archived");
                }
                // PROCESSING records stay, live or stuck; so do other scopes'.
                for key in [&crashed, &live] {
                    let found =
                        admin::inspect(&pool, &RecordId::new(&scope, &Key::new(key.as_str()).unwrap())).await.unwrap();
                    assert_eq!(found.map(|r| r.status), Some(idem::admin::RecordStatus::Processing), "{key}");
                }
                assert!(!run(&store, &other, &elsewhere).await, "another scope's record survives");
                let again = idem_json(&cli, &age, 0);
                assert_eq!(again["stores"][0]["deleted"], 0, "{again}");
            }

            #[tokio::test]
            async fn an_http_record_of_a_tenant_is_found_with_tenant_and_key() {
                let Some((pool, url)) = setup().await else { return };
                let store: Arc<dyn LeaseStore> = Arc::new(idem::store::SqlStore::new(pool));
                http_records_are_found_by_tenant_and_key(store, &Store::Sql(&url)).await;
            }

            #[tokio::test]
            async fn a_stored_http_response_shows_as_status_headers_and_body() {
                let Some((pool, url)) = setup().await else { return };
                let store: Arc<dyn LeaseStore> = Arc::new(idem::store::SqlStore::new(pool));
                http_responses_show_decoded(store, &Store::Sql(&url)).await;
            }

            #[tokio::test]
            async fn a_done_record_with_no_response_reads_answer_not_kept() {
                let Some((pool, url)) = setup().await else { return };
                let store = idem::store::SqlStore::new(pool.clone());
                a_done_record_without_its_answer_reads_answer_not_kept(&store, &Store::Sql(&url), |scope, key| {
                    let pool = pool.clone();
                    async move {
                        let done = sqlx::query($drop_answer).bind(scope).bind(key).execute(&pool).await.unwrap();
                        assert_eq!(done.rows_affected(), 1);
                    }
                })
                .await;
            }

            /// A guarded call of `scope` and `key` whose body publishes
            /// `messages` (topic, payload) through its outbox handle, the
            /// first with a header: their ids.
            async fn publish(pool: &Pool, scope: &str, key: &str, messages: &[(&str, &[u8])]) -> Vec<idem::outbox::MessageId> {
                let mut tx = pool.begin().await.unwrap();
                let Claim::Run(ticket) = Guard::new(scope.to_owned()).key(key).dedup::<usize, _>(&mut tx).await.unwrap()
                else {
                    panic!("a fresh key")
                };
                let outbox = ticket.outbox();
                let mut ids = Vec::new();
                for (i, (topic, payload)) in messages.iter().enumerate() {
                    let headers: &[(&str, &str)] = if i == 0 { &[("trace-id", "t-42")] } else { &[] };
                    ids.push(outbox.publish_with_headers(&mut tx, topic, payload, headers).await.unwrap());
                }
                ticket.complete(&mut tx, Ok::<usize, idem::Error>(ids.len())).await.unwrap().unwrap();
                tx.commit().await.unwrap();
                ids
            }

            fn relay(pool: &Pool, broker: &idem::outbox::InProcess, scope: &str) -> idem::outbox::Relay<$db> {
                idem::outbox::Relay::new(pool.clone(), broker.clone())
                    .scope(scope)
                    .backoff(Duration::from_secs(3600), Duration::from_secs(3600))
            }

            /// Delete what the test left in the shared outbox (pending and
            /// dead rows are never purged).
            async fn forget_messages(pool: &Pool, scope: &str) {
                sqlx::query($forget_messages).bind(idem::key::stored_scope(scope).as_ref()).execute(pool).await.unwrap();
            }

            /// `idem relay --once` hands the outbox's messages to RabbitMQ
            /// and to NATS JetStream, each to the broker's confirmation, and
            /// marks them sent; a message the broker refuses is dead-lettered
            /// and the command exits 1 saying where to look.
            #[tokio::test]
            async fn the_relay_hands_the_outbox_to_rabbitmq_and_jetstream() {
                use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
                let Some((pool, url)) = setup().await else { return };
                let (Some(amqp), Some(nats)) = (common::amqp().await, common::nats().await) else { return };
                let cli = Store::Sql(&url);

                // RabbitMQ: the default exchange routes a topic to the queue of its name.
                let scope = unique("cli.relay");
                let queue = unique("idem-cli-relay");
                let conn = lapin::Connection::connect(&amqp, lapin::ConnectionProperties::default()).await.unwrap();
                let channel = conn.create_channel().await.unwrap();
                channel.queue_declare(queue.as_str().into(), QueueDeclareOptions::default(), Default::default()).await.unwrap();
                publish(&pool, &scope, "T-1", &[(&queue, b"grant T-1"), (&queue, b"grant T-1, again")]).await;
                let doc = idem_json(&cli, &["relay", "--once", "--amqp-url", &amqp, "--scope", &scope], 0);
                assert_eq!((doc["sent"].as_u64(), doc["dead"].as_u64(), doc["broker"].as_str()), (Some(2), Some(0), Some(redacted(&amqp).as_str())), "{doc}");
                let passive = QueueDeclareOptions { passive: true, ..Default::default() };
                let held = channel.queue_declare(queue.as_str().into(), passive, Default::default()).await.unwrap();
                assert_eq!(held.message_count(), 2);
                let states: Vec<_> = idem::outbox::list_messages(&pool, &every_message(&scope)).await.unwrap().into_iter().map(|m| m.state).collect();
                assert_eq!(states, [idem::outbox::MessageState::Sent; 2]);

                // A topic no queue takes: refused (mandatory), dead, exit 1.
                publish(&pool, &scope, "T-2", &[(&format!("{queue}.nowhere"), b"lost?")]).await;
                let out = idem(&cli, &["relay", "--once", "--amqp-url", &amqp, "--scope", &scope]);
                assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
                assert!(stdout(&out).contains("1 dead-lettered"), "{}", stdout(&out));
                assert!(stderr(&out).contains("idem outbox list --state dead"), "{}", stderr(&out));
                channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
                forget_messages(&pool, &scope).await;

                // NATS JetStream: a stream of the test's own captures the prefixed subject.
                let scope = unique("cli.relay");
                let stream = unique("idemcli").replace(['-', '.'], "_");
                let js = async_nats::jetstream::new(async_nats::connect(&nats).await.unwrap());
                let config = async_nats::jetstream::stream::Config {
                    name: stream.clone(),
                    subjects: vec![format!("{stream}.>")],
                    ..Default::default()
                };
                js.get_or_create_stream(config).await.unwrap();
                publish(&pool, &scope, "T-3", &[("coupons", b"grant T-3")]).await;
                let prefix = format!("{stream}.");
                let args = ["relay", "--once", "--nats-url", &nats, "--subject-prefix", &prefix, "--scope", &scope];
                let doc = idem_json(&cli, &args, 0);
                assert_eq!(doc["sent"].as_u64(), Some(1), "{doc}");
                let info = js.get_stream(&stream).await.unwrap().get_info().await.unwrap();
                assert_eq!(info.state.messages, 1);
                js.delete_stream(&stream).await.unwrap();
                forget_messages(&pool, &scope).await;
            }

            /// `idem relay` without --once runs until SIGTERM: a message
            /// committed while it runs goes out; then it stops after its
            /// round and says what it did.
            #[tokio::test]
            async fn the_relay_runs_until_sigterm() {
                use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
                let Some((pool, url)) = setup().await else { return };
                let Some(amqp) = common::amqp().await else { return };
                let scope = unique("cli.relay");
                let queue = unique("idem-cli-relay");
                let conn = lapin::Connection::connect(&amqp, lapin::ConnectionProperties::default()).await.unwrap();
                let channel = conn.create_channel().await.unwrap();
                channel.queue_declare(queue.as_str().into(), QueueDeclareOptions::default(), Default::default()).await.unwrap();
                let child = Command::new(env!("CARGO_BIN_EXE_idem"))
                    .env_remove("IDEM_AMQP_URL")
                    .env_remove("IDEM_NATS_URL")
                    .args(["--database-url", &url, "relay", "--amqp-url", &amqp, "--scope", &scope, "--poll-interval", "50ms"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap();
                publish(&pool, &scope, "T-1", &[(&queue, b"grant T-1")]).await;
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                loop {
                    let messages = idem::outbox::list_messages(&pool, &every_message(&scope)).await.unwrap();
                    if messages.iter().all(|m| m.state == idem::outbox::MessageState::Sent) {
                        break;
                    }
                    assert!(std::time::Instant::now() < deadline, "not sent: {messages:?}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let term = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
                assert!(term.success());
                let out = tokio::task::spawn_blocking(move || child.wait_with_output()).await.unwrap().unwrap();
                assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
                assert!(stdout(&out).contains("1 sent to"), "{}", stdout(&out));
                assert!(stderr(&out).contains("until stopped"), "{}", stderr(&out));
                channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
                forget_messages(&pool, &scope).await;
            }

            /// Messages published through guarded calls, some refused by
            /// the broker (dead), one failed once (failing), one not relayed
            /// yet (pending): the operator lists them, shows one, re-sends
            /// one and then all (asked to confirm), sees them in `stuck`,
            /// and purges them once sent.
            #[tokio::test]
            async fn the_outbox_is_listed_shown_resent_and_purged() {
                use idem::outbox::{InProcess, MessageState};
                let Some((pool, url)) = setup().await else { return };
                let cli = Store::Sql(&url);
                let scope = unique("cli.outbox");
                let binary: &[u8] = &[0xff, 0x00, 0xfe, b'x'];
                let first = publish(&pool, &scope, "T-1", &[("coupons", b"grant T-1"), ("poison", binary)]).await;
                let dead = publish(&pool, &scope, "T-2", &[("poison", b"{\"n\": 2}")]).await;
                let broker = InProcess::new();
                let refused = "no route to `poison` (mandatory): the exchange has no queue bound for it";
                broker.refuse("poison", refused);
                let report = relay(&pool, &broker, &scope).drain().await.unwrap();
                assert_eq!((report.sent, report.dead), (1, 2), "{report:?}");
                let failing = publish(&pool, &scope, "T-3", &[("coupons", b"grant T-3")]).await;
                broker.fail_next(1);
                assert_eq!(relay(&pool, &broker, &scope).drain().await.unwrap().retried, 1);
                let pending = publish(&pool, &scope, "T-4", &[("coupons", "grant für T-4\n".as_bytes())]).await;

                // list: pending, failing and dead by age; sent ones asked for.
                let doc = idem_json(&cli, &["outbox", "list", "--scope", &scope], 0);
                let expected = [(&first[1], "dead"), (&dead[0], "dead"), (&failing[0], "failing"), (&pending[0], "pending")];
                let expected: Vec<(String, String)> = expected.iter().map(|(id, s)| (id.to_string(), s.to_string())).collect();
                assert_eq!(listed(&doc), expected, "{doc}");
                let messages = doc["stores"][0]["messages"].as_array().unwrap();
                // Whole in JSON, cut short in the text.
                assert_eq!(messages[0]["last_error"], format!("refused by the broker: {refused}"), "{doc}");
                assert_eq!((messages[0]["attempts"].as_u64(), messages[0]["payload_bytes"].as_u64()), (Some(1), Some(4)));
                assert!(messages[2]["next_try_in_ms"].as_i64().unwrap() > 3_000_000, "a backoff of an hour: {doc}");
                assert_eq!(messages[3]["next_try_in_ms"], 0, "{doc}");
                let text = stdout(&idem(&cli, &["outbox", "list", "--scope", &scope]));
                assert!(text.contains("4 pending, failing or dead messages"), "{text}");
                assert!(!text.contains(refused) && text.contains("refused by the broker: no route to `poison` (mandatory): the…"), "{text}");
                for word in ["ID", "LAST ERROR", "NEXT TRY", "in 59m", "due now"] {
                    assert!(text.contains(word), "{word:?} in {text}");
                }
                let sent = idem_json(&cli, &["outbox", "list", "--scope", &scope, "--state", "sent"], 0);
                assert_eq!(listed(&sent), [(first[0].to_string(), "sent".to_owned())], "{sent}");
                let page = idem_json(&cli, &["outbox", "list", "--scope", &scope, "--state", "dead,pending", "--limit", "2"], 0);
                assert_eq!(listed(&page).len(), 2, "{page}");
                assert_eq!(page["stores"][0]["more"], true, "{page}");

                // show: a binary payload in hex (base64 in JSON), a text one as text.
                let text = stdout(&idem(&cli, &["outbox", "show", first[1].as_str()]));
                for word in ["state       dead", "topic       poison", "4 bytes, not UTF-8 text: in hex", "ff00fe78", "headers     (none)"] {
                    assert!(text.contains(word), "{word:?} in {text}");
                }
                let doc = idem_json(&cli, &["outbox", "show", first[1].as_str()], 0);
                let message = &doc["stores"][0]["message"];
                assert_eq!((&message["payload"]["encoding"], &message["payload"]["data"]), (&serde_json::json!("base64"), &serde_json::json!("/wD+eA==")), "{doc}");
                assert_eq!(message["key"], "T-1", "{doc}");
                let text = stdout(&idem(&cli, &["outbox", "show", pending[0].as_str()]));
                for word in ["state       pending", "UTF-8 text:\ngrant für T-4\n", "trace-id: t-42"] {
                    assert!(text.contains(word), "{word:?} in {text}");
                }
                let doc = idem_json(&cli, &["outbox", "show", pending[0].as_str()], 0);
                assert_eq!(doc["stores"][0]["message"]["headers"], serde_json::json!([{"name": "trace-id", "value": "t-42"}]));
                assert_eq!(doc["stores"][0]["message"]["payload"]["data"], "grant für T-4\n");
                let absent = idem::outbox::MessageId::for_call("cli.none", "none", 0);
                let doc = idem_json(&cli, &["outbox", "show", absent.as_str()], 0);
                assert!(doc["stores"][0]["message"].is_null(), "{doc}");

                // stuck reports the outbox beside the records.
                let doc = idem_json(&cli, &["stuck", "--scope", &scope], 0);
                let outbox = &doc["stores"][0]["outbox"];
                assert_eq!((outbox["pending"].as_u64(), outbox["failing"].as_u64(), outbox["dead"].as_u64()), (Some(1), Some(1), Some(2)), "{doc}");
                assert!(outbox["oldest_pending_age_ms"].as_i64().unwrap() >= 0, "{doc}");
                let text = stdout(&idem(&cli, &["stuck", "--scope", &scope]));
                assert!(text.contains("outbox: 1 pending, 1 failing, 2 dead; the oldest pending has waited"), "{text}");

                // resend one: pending, due now, tries from 0.
                let out = idem(&cli, &["outbox", "resend", dead[0].as_str()]);
                assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
                assert!(stdout(&out).contains("made pending, due now (it was dead after 1 try"), "{}", stdout(&out));
                let (entry, _) = idem::outbox::find_message(&pool, &dead[0]).await.unwrap().unwrap();
                assert_eq!((entry.state, entry.attempts), (MessageState::Pending, 0));
                assert!(entry.last_error.is_some(), "its error stays until the next try");

                // resend --all asks first: without a terminal, and without --yes, nothing changes.
                let out = idem(&cli, &["outbox", "resend", "--all", "--scope", &scope, "--state", "dead,failing"]);
                assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
                assert!(stdout(&out).contains("2 dead or failing messages of scope"), "{}", stdout(&out));
                assert!(stdout(&out).contains("(1 failing, 1 dead) to resend"), "{}", stdout(&out));
                assert!(stderr(&out).contains("pass --yes"), "{}", stderr(&out));
                let doc = idem_json(&cli, &["outbox", "resend", "--all", "--scope", &scope], 1);
                assert!(doc["error"].as_str().unwrap().contains("--yes"), "{doc}");
                assert_eq!(idem::outbox::find_message(&pool, &first[1]).await.unwrap().unwrap().0.state, MessageState::Dead);
                let doc = idem_json(&cli, &["outbox", "resend", "--all", "--scope", &scope, "--state", "dead,failing", "--yes"], 0);
                assert_eq!((doc["resent"].as_u64(), doc["stores"][0]["held_by_relay"].as_u64()), (Some(2), Some(0)), "{doc}");
                let rows = idem::outbox::list_messages(&pool, &every_message(&scope)).await.unwrap();
                let states: Vec<(MessageState, u32)> = rows.iter().map(|e| (e.state, e.attempts)).collect();
                assert_eq!(states, [(MessageState::Sent, 1), (MessageState::Pending, 0), (MessageState::Pending, 0), (MessageState::Pending, 0), (MessageState::Pending, 0)]);
                let out = idem(&cli, &["outbox", "resend", "--all", "--scope", &scope, "--state", "dead", "--yes"]);
                assert!(stdout(&out).contains("no dead messages of scope"), "{}", stdout(&out));

                // A message a relay holds right now is left to it.
                let held_scope = unique("cli.outbox.held");
                let held = publish(&pool, &held_scope, "T-1", &[("slow", b"s")]).await;
                let slow = InProcess::new();
                slow.latency(Duration::from_secs(30));
                let holder = relay(&pool, &slow, &held_scope).claim_lease(Duration::from_secs(60));
                let holding = tokio::spawn(async move { holder.run_once().await });
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while !idem::outbox::find_message(&pool, &held[0]).await.unwrap().unwrap().0.claimed {
                    assert!(std::time::Instant::now() < deadline, "the relay claims it");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let doc = idem_json(&cli, &["outbox", "resend", held[0].as_str()], 0);
                assert_eq!((&doc["stores"][0]["outcome"], doc["resent"].as_u64()), (&serde_json::json!("held_by_relay"), Some(0)), "{doc}");
                let text = stdout(&idem(&cli, &["outbox", "resend", held[0].as_str()]));
                assert!(text.contains("left to the relay that holds it right now"), "{text}");
                let text = stdout(&idem(&cli, &["outbox", "resend", "--all", "--scope", &held_scope, "--yes"]));
                assert!(text.contains("0 messages made pending, due now; 1 held by a relay right now left to it"), "{text}");
                holding.abort();

                // Sent messages go with `idem purge` (here: --older-than),
                // counted first; the others stay.
                let report = relay(&pool, &InProcess::new(), &scope).drain().await.unwrap();
                assert_eq!(report.sent, 4, "{report:?}");
                let doc = idem_json(&cli, &["purge", "--scope", &scope, "--older-than", "1ms", "--dry-run"], 0);
                assert_eq!(doc["stores"][0]["outbox"]["deleted"], 5, "{doc}");
                assert_eq!(idem::outbox::list_messages(&pool, &every_message(&scope)).await.unwrap().len(), 5);
                let out = idem(&cli, &["purge", "--scope", &scope, "--older-than", "1ms", "--batch-size", "2"]);
                assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
                assert!(stdout(&out).contains("deleted 5 sent outbox messages of scope"), "{}", stdout(&out));
                assert!(stdout(&out).contains("in 3 batches"), "{}", stdout(&out));
                assert_eq!(idem::outbox::list_messages(&pool, &every_message(&scope)).await.unwrap(), []);
                let text = stdout(&idem(&cli, &["stuck", "--scope", &scope]));
                assert!(text.contains("outbox: no messages waiting"), "{text}");
                forget_messages(&pool, &scope).await;
                forget_messages(&pool, &held_scope).await;
            }

            /// A bad message id is refused naming it and what is wrong; an
            /// id of no message is not resent.
            #[tokio::test]
            async fn a_bad_message_id_is_named() {
                let Some((_pool, url)) = setup().await else { return };
                let cli = Store::Sql(&url);
                for (args, says) in [
                    (&["outbox", "show", "idem-msg-12"][..], &["idem-msg-12", "2 hex digits"][..]),
                    (&["outbox", "resend", "msg-1"], &["msg-1", "starts with `idem-msg-`"]),
                    (&["outbox", "show", "idem-msg-0123456789abcdeZ0123456789abcdef"], &["'Z' at byte 24 is not a hex digit"]),
                ] {
                    let out = idem(&cli, args);
                    assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
                    for word in says {
                        assert!(stderr(&out).contains(word), "{args:?}: {word:?} in {}", stderr(&out));
                    }
                }
                let absent = idem::outbox::MessageId::for_call("cli.none", "none", 0);
                let out = idem(&cli, &["outbox", "resend", absent.as_str()]);
                assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
                assert!(stderr(&out).contains(&format!("no message {absent}")), "{}", stderr(&out));
                let out = idem(&cli, &["outbox", "resend", absent.as_str(), "--state", "dead"]);
                assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
                assert!(stderr(&out).contains("--all"), "{}", stderr(&out));
            }

            /// A database migrated before there was an outbox: `stuck` and
            /// `purge` say so and go on; `migrate` adds it.
            #[tokio::test]
            async fn a_database_without_the_outbox_table_is_stuck_and_purged() {
                let Some((pool, url)) = setup().await else { return };
                let cli = Store::Sql(&url);
                let table = own_table("cli_old");
                let out = idem(&cli, &["--table", &table, "migrate"]);
                assert!(stdout(&out).contains(&format!("the outbox {table}_outbox are in place")), "{}", stdout(&out));
                sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {table}_outbox"))).execute(&pool).await.unwrap();
                let doc = idem_json(&cli, &["--table", &table, "stuck"], 0);
                assert_eq!(doc["stores"][0]["outbox"]["table"], false, "{doc}");
                let text = stdout(&idem(&cli, &["--table", &table, "stuck"]));
                assert!(text.contains("no outbox table"), "{text}");
                for dry in [true, false] {
                    let mut args = vec!["--table", &table, "purge"];
                    args.extend(dry.then_some("--dry-run"));
                    let out = idem(&cli, &args);
                    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
                    assert!(stdout(&out).contains("no outbox table: no sent messages to purge"), "{}", stdout(&out));
                }
                let out = idem(&cli, &["--table", &table, "outbox", "list"]);
                assert_eq!(out.status.code(), Some(1));
                assert!(stderr(&out).contains("idem migrate"), "{}", stderr(&out));
                assert_eq!(idem(&cli, &["--table", &table, "migrate"]).status.code(), Some(0));
                let doc = idem_json(&cli, &["--table", &table, "stuck"], 0);
                assert_eq!(doc["stores"][0]["outbox"]["table"], true, "{doc}");
                for t in [format!("{table}_outbox"), format!("{table}_archive"), table.clone()] {
                    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {t}"))).execute(&pool).await.unwrap();
                }
            }

            #[tokio::test]
            async fn errors_name_the_problem() {
                let Some((_pool, url)) = setup().await else { return };
                let out = idem(&Store::Sql(&url), &["inspect", "--scope", "s", "--key", " "]);
                assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
                assert!(stderr(&out).contains("whitespace"), "{}", stderr(&out));
                let out = idem(&Store::Sql(&url), &["release", "--scope", "s"]);
                assert_eq!(out.status.code(), Some(2), "clap's usage error: {}", stderr(&out));
            }
        }
    };
}

fn pg_url() -> String {
    std::env::var("IDEM_PG_URL").unwrap_or_else(|_| common::DEFAULT_PG_URL.to_owned())
}

fn mysql_url() -> String {
    std::env::var("IDEM_MYSQL_URL").unwrap_or_else(|_| common::DEFAULT_MYSQL_URL.to_owned())
}

sql_tests!(
    postgres,
    sqlx::Postgres,
    async { Some((common::postgres().await?, pg_url())) },
    "SELECT count(*) FROM idem_records_archive WHERE scope = $1 AND idem_key = $2",
    "UPDATE idem_records SET response = NULL WHERE scope = $1 AND idem_key = $2",
    "DELETE FROM idem_outbox WHERE scope = $1"
);
sql_tests!(
    mysql,
    sqlx::MySql,
    async { Some((common::mysql().await?, mysql_url())) },
    "SELECT count(*) FROM idem_records_archive WHERE scope = ? AND idem_key = ?",
    "UPDATE idem_records SET response = NULL WHERE scope = ? AND idem_key = ?",
    "DELETE FROM idem_outbox WHERE scope = ?"
);
sql_tests!(
    sqlite,
    sqlx::Sqlite,
    async {
        // A file the binary creates with `idem migrate`; the test's pool
        // opens it after.
        let dir = std::env::temp_dir().join("idem-tests");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{}.db", unique("cli")));
        let url = format!("sqlite:{}", path.display());
        let out = idem(&Store::Sql(&url), &["migrate"]);
        assert_eq!(out.status.code(), Some(0), "migrate: {}", stderr(&out));
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(30));
        let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(4).connect_with(options).await.unwrap();
        Some((pool, url))
    },
    "SELECT count(*) FROM idem_records_archive WHERE scope = ?1 AND idem_key = ?2",
    "UPDATE idem_records SET response = NULL WHERE scope = ?1 AND idem_key = ?2",
    "DELETE FROM idem_outbox WHERE scope = ?1"
);

#[test]
fn a_database_that_does_not_exist_yet_is_not_created_but_by_migrate() {
    let path = std::env::temp_dir().join("idem-tests").join(format!("{}.db", unique("absent")));
    let url = format!("sqlite:{}", path.display());
    let out = idem(&Store::Sql(&url), &["stuck"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("idem migrate"), "{}", stderr(&out));
    assert!(!path.exists());
}

/// The outbox is a table of the database: on Redis alone, `idem outbox`
/// asks for the database.
#[test]
fn the_relay_asks_for_a_database_and_a_broker_and_names_one_out_of_reach() {
    let out = idem(&Store::Sql("sqlite::memory:"), &["relay", "--once"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--amqp-url"), "{}", stderr(&out));
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .env_remove("IDEM_DATABASE_URL")
        .env_remove("IDEM_REDIS_URL")
        .env_remove("IDEM_ETCD_URL")
        .env_remove("IDEM_AMQP_URL")
        .env_remove("IDEM_NATS_URL")
        .args(["relay", "--nats-url", "nats://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--database-url"), "{}", stderr(&out));
    let out =
        idem(&Store::Sql("sqlite::memory:"), &["relay", "--once", "--amqp-url", "amqp://guest:secret@127.0.0.1:1/%2f"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("cannot connect to amqp://guest:***@127.0.0.1:1"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("secret"), "{}", stderr(&out));
}

#[test]
fn the_outbox_asks_for_the_database() {
    let out = idem(&Store::Redis { url: "redis://127.0.0.1:1/", prefix: "x:" }, &["outbox", "list"]);
    assert_eq!(out.status.code(), Some(2));
    let said = stderr(&out);
    assert!(said.contains("the outbox lives in the SQL database") && said.contains("--database-url"), "{said}");
}

#[test]
fn unknown_schemes_and_missing_stores_are_usage_errors() {
    let out = idem(&Store::Sql("oracle://db/x"), &["stuck"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("unknown scheme `oracle`"), "{}", stderr(&out));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
    cmd.env_remove("IDEM_DATABASE_URL").env_remove("IDEM_REDIS_URL").args(["--json", "stuck"]);
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc["error"].as_str().unwrap().contains("no store given"), "{doc}");
    let out = idem(&Store::Redis { url: "redis://127.0.0.1:1/", prefix: "x:" }, &["purge"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--database-url"), "{}", stderr(&out));
}

/// With --json a script reads one JSON document on stdout whatever went
/// wrong, bad arguments included; a duration that is negative or not one
/// is refused naming the flag.
#[test]
fn with_json_bad_arguments_are_a_json_error_naming_the_flag() {
    let cli = Store::Sql("sqlite:/nonexistent/never-opened.db");
    for (args, says) in [
        (&["purge", "--older-than", "-5d"][..], &["--older-than", "-5d", "cannot be negative"][..]),
        (&["purge", "--older-than=-5d"], &["--older-than", "cannot be negative"]),
        (&["purge", "--older-than", "5x"], &["--older-than", "5x", "unknown time unit"]),
        (&["purge", "--older-than", "0s"], &["--older-than", "above zero"]),
        (&["purge", "--pause", "-10ms"], &["--pause", "cannot be negative"]),
        (&["purge", "--pause", "10"], &["--pause", "10ms"]),
        (&["purge", "--pause-factor", "-1"], &["--pause-factor", "-1"]),
        (&["stuck", "--limit", "0"], &["--limit"]),
        (&["stuck", "--frobnicate"], &["--frobnicate"]),
        (&["inspect", "--key", "k"], &["--scope"]),
        (&["steps", "resolve", "--scope", "s", "--key", "k", "--step", "c"], &["--done", "--not-done"]),
        (&["steps", "resolve", "--scope", "s", "--key", "k", "--step", "c", "--done"], &["--result"]),
        (
            &["steps", "resolve", "--scope", "s", "--key", "k", "--step", "c", "--done", "--result", "ch_1"],
            &["not JSON"],
        ),
        (
            &["steps", "resolve", "--scope", "s", "--key", "k", "--step", "c", "--not-done", "--result", "1"],
            &["--result"],
        ),
        (&[], &["no command given"]),
    ] {
        let doc = idem_json(&cli, args, 2);
        let error = doc["error"].as_str().unwrap_or_else(|| panic!("{args:?}: {doc}"));
        for word in says {
            assert!(error.contains(word), "{args:?}: {word:?} in {error:?}");
        }
        assert_eq!(doc["exit_code"], 2);
        // Without --json: clap's message on stderr, nothing on stdout.
        let out = idem(&cli, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty() && stderr(&out).starts_with("error: "), "{args:?}: {}", stderr(&out));
    }
    let help = idem(&cli, &["--json", "purge", "--help"]);
    assert_eq!(help.status.code(), Some(0), "--help is no error");
    assert!(stdout(&help).contains("--older-than"));
}

#[test]
fn an_unreachable_server_is_named_with_its_url_but_not_its_password() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("postgres://idem:secret@127.0.0.1:{port}/test");
    let out = idem(&Store::Sql(&url), &["stuck"]);
    assert_eq!(out.status.code(), Some(1));
    let said = stderr(&out);
    assert!(said.contains(&format!("postgres://idem:***@127.0.0.1:{port}/test")), "{said}");
    assert!(!said.contains("secret"), "{said}");
}

mod redis_store {
    use super::*;

    /// A store under a prefix of this test's own, and the URL; the prefix's
    /// keys are deleted when the guard drops.
    async fn setup() -> Option<(idem::store::RedisStore, String, Cleanup)> {
        let conn = common::redis().await?;
        let url = std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| common::DEFAULT_REDIS_URL.to_owned());
        let prefix = format!("{}:", unique("idem-cli-test"));
        let store = idem::store::RedisStore::new(conn.clone(), prefix.clone());
        Some((store, url, Cleanup { conn, prefix }))
    }

    /// Deletes this test's keys (SCAN + UNLINK of its own prefix only).
    struct Cleanup {
        conn: redis::aio::ConnectionManager,
        prefix: String,
    }

    impl Cleanup {
        async fn run(mut self) {
            let mut cursor: u64 = 0;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(format!("{}*", self.prefix))
                    .arg("COUNT")
                    .arg(500)
                    .query_async(&mut self.conn)
                    .await
                    .unwrap();
                for key in keys {
                    let _: () = redis::cmd("UNLINK").arg(&key).query_async(&mut self.conn).await.unwrap();
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
    }

    #[tokio::test]
    async fn a_crashed_lease_is_inspected_listed_and_released_and_then_runs_again() {
        let Some((store, url, cleanup)) = setup().await else { return };
        let prefix = cleanup.prefix.clone();
        lease_lifecycle(&store, &Store::Redis { url: &url, prefix: &prefix }).await;
        cleanup.run().await;
    }

    #[tokio::test]
    async fn a_call_in_recorded_steps_shows_where_it_stopped() {
        let Some((store, url, cleanup)) = setup().await else { return };
        let prefix = cleanup.prefix.clone();
        steps_show_where_a_call_stopped(&store, &Store::Redis { url: &url, prefix: &prefix }).await;
        cleanup.run().await;
    }

    #[tokio::test]
    async fn a_step_in_doubt_is_shown_and_resolved_by_the_operator() {
        let Some((store, url, cleanup)) = setup().await else { return };
        let prefix = cleanup.prefix.clone();
        a_step_in_doubt_is_shown_and_resolved(&store, &Store::Redis { url: &url, prefix: &prefix }).await;
        cleanup.run().await;
    }

    #[tokio::test]
    async fn a_release_leaves_a_record_taken_over_since() {
        let Some((store, _url, cleanup)) = setup().await else { return };
        release_compares_the_fence(&store, |id, fence| {
            let store = store.clone();
            async move { store.release_lease(&id, fence).await.unwrap() }
        })
        .await;
        cleanup.run().await;
    }

    /// `stuck` on Redis shows the key as the guard was given it (a
    /// composite key's parts), with the stored form `--stored` takes, and the
    /// record's times: its age from its fence (Redis's clock at the claim)
    /// and how long ago its lease passed (from the key's TTL).
    #[tokio::test]
    async fn stuck_shows_the_users_key_and_the_records_age() {
        let Some((store, url, cleanup)) = setup().await else { return };
        let prefix = cleanup.prefix.clone();
        let cli = Store::Redis { url: &url, prefix: &prefix };
        let scope = unique("cli.redis.stuck");
        let now_ms = || SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
        let before = now_ms();
        crash(&store, &scope, "cr{as}h:ed").await;
        match Guard::new(scope.clone()).key("ten:ant").key("k").lease::<u32>(&store, SHORT_LEASE).await.unwrap() {
            Claim::Run(ticket) => drop(ticket),
            Claim::Replay(_) => panic!("a fresh key"),
        }
        let claimed = now_ms();
        tokio::time::sleep(SHORT_LEASE + Duration::from_millis(300)).await;

        let text = stdout(&idem(&cli, &["stuck", "--scope", &scope]));
        assert!(text.contains("key cr{as}h:ed (stored cr{as}h\\:ed)"), "{text}");
        assert!(text.contains("key (\"ten:ant\", \"k\") (stored ten\\:ant:k)"), "{text}");
        assert_eq!(text.matches(", age ").count(), 2, "{text}");
        assert_eq!(text.matches(", lease passed ").count(), 2, "{text}");

        let doc = idem_json(&cli, &["stuck", "--scope", &scope], 0);
        let records = doc["stores"][0]["records"].as_array().unwrap();
        assert_eq!(records.len(), 2, "{doc}");
        for r in records {
            // Redis's clock and this one are the same machine's.
            let created = r["created_at_ms"].as_i64().unwrap_or_else(|| panic!("{r}"));
            assert!(before - 50 <= created && created <= claimed + 50, "{before} <= {created} <= {claimed}: {r}");
            assert!(r["age_ms"].as_i64().unwrap() >= SHORT_LEASE.as_millis() as i64, "{r}");
            assert!(r["lease_left_ms"].as_i64().unwrap() < 0, "{r}");
            assert!(r["updated_at_ms"].as_i64().unwrap() >= created, "{r}");
        }
        let parts: Vec<&Value> = records.iter().map(|r| &r["key_parts"]).collect();
        assert!(
            parts.contains(&&serde_json::json!(["cr{as}h:ed"]))
                && parts.contains(&&serde_json::json!(["ten:ant", "k"])),
            "{doc}"
        );

        // What it shows is what release takes.
        let out = idem(&cli, &["release", "--scope", &scope, "--tenant", "ten:ant", "--key", "k", "--yes"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let out = idem(&cli, &["release", "--stored", "--scope", &scope, "--key", "cr{as}h\\:ed", "--yes"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        cleanup.run().await;
    }

    #[tokio::test]
    async fn an_http_record_of_a_tenant_is_found_with_tenant_and_key() {
        let Some((store, url, cleanup)) = setup().await else { return };
        let prefix = cleanup.prefix.clone();
        http_records_are_found_by_tenant_and_key(Arc::new(store), &Store::Redis { url: &url, prefix: &prefix }).await;
        cleanup.run().await;
    }

    #[tokio::test]
    async fn a_stored_http_response_shows_as_status_headers_and_body() {
        let Some((store, url, cleanup)) = setup().await else { return };
        let prefix = cleanup.prefix.clone();
        http_responses_show_decoded(Arc::new(store), &Store::Redis { url: &url, prefix: &prefix }).await;
        cleanup.run().await;
    }

    /// A done record written without its answer (`D...|` and nothing after
    /// the bar) reads "answer not kept".
    #[tokio::test]
    async fn a_done_record_with_no_response_reads_answer_not_kept() {
        let Some((store, url, cleanup)) = setup().await else { return };
        let prefix = cleanup.prefix.clone();
        let conn = cleanup.conn.clone();
        let names = store.clone();
        a_done_record_without_its_answer_reads_answer_not_kept(
            &store,
            &Store::Redis { url: &url, prefix: &prefix },
            |scope, key| {
                let mut conn = conn.clone();
                async move {
                    let name = names.key(idem::store::RecordKind::Lease, &scope, &key);
                    let value: String = redis::cmd("GET").arg(&name).query_async(&mut conn).await.unwrap();
                    let (head, _answer) = value.split_once('|').unwrap();
                    let _: () = redis::cmd("SET")
                        .arg(&name)
                        .arg(format!("{head}|"))
                        .arg("KEEPTTL")
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                }
            },
        )
        .await;
        cleanup.run().await;
    }

    /// Another prefix's records (another application, another test) are
    /// neither listed nor reachable.
    #[tokio::test]
    async fn stuck_sees_only_its_prefix() {
        let Some((store, url, cleanup)) = setup().await else { return };
        let prefix = cleanup.prefix.clone();
        let scope = hostile("cli.prefix");
        crash(&store, &scope, "k1").await;
        let (other, _, other_cleanup) = setup().await.unwrap();
        crash(&other, &scope, "k2").await;
        tokio::time::sleep(SHORT_LEASE + Duration::from_millis(300)).await;
        let listed = idem_json(&Store::Redis { url: &url, prefix: &prefix }, &["stuck", "--scope", &scope], 0);
        let records = listed["stores"][0]["records"].as_array().unwrap();
        assert_eq!(records.len(), 1, "{listed}");
        assert_eq!(records[0]["key"], "k1");
        let all = idem_json(&Store::Redis { url: &url, prefix: &prefix }, &["stuck"], 0);
        assert_eq!(all["stores"][0]["records"].as_array().unwrap().len(), 1, "{all}");
        cleanup.run().await;
        other_cleanup.run().await;
    }
}

/// Redis Cluster: the runtime's reads on a `ClusterConnection` carry a
/// call's steps (they share its record's slot), and the binary, given the
/// primary that holds a record's slot (as the operator runs it: a
/// standalone store on each primary), shows them and where the call stopped.
mod redis_cluster {
    use super::*;

    use redis::cluster_async::ClusterConnection;

    /// The URL of the primary serving `name`'s slot (`CLUSTER SLOTS`).
    async fn primary_of(conn: &mut ClusterConnection, name: &str) -> String {
        use redis::Value;
        let slot: i64 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(name).query_async(conn).await.unwrap();
        let slots: Value = redis::cmd("CLUSTER").arg("SLOTS").query_async(conn).await.unwrap();
        let Value::Array(ranges) = slots else { panic!("CLUSTER SLOTS: {slots:?}") };
        for range in ranges {
            let Value::Array(range) = range else { continue };
            let [Value::Int(start), Value::Int(end), Value::Array(primary), ..] = range.as_slice() else { continue };
            if (*start..=*end).contains(&slot)
                && let [Value::BulkString(host), Value::Int(port), ..] = primary.as_slice()
            {
                return format!("redis://{}:{port}/", String::from_utf8_lossy(host));
            }
        }
        panic!("no primary serves slot {slot}")
    }

    /// Both calls' records on one primary (in two slots: a page of its
    /// `SCAN` that one script call cannot read), the stopped one stuck.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_in_recorded_steps_shows_where_it_stopped() {
        let Some(mut conn) = common::redis_cluster().await else { return };
        let prefix = format!("{}:", unique("idem-cli-cluster"));
        let store = idem::store::RedisStore::new(conn.clone(), prefix.clone());
        let scope = unique("cli.cluster.transfer");
        let names = |key: &str| {
            let stored_key = stored(key);
            [idem::store::RecordKind::Lease, idem::store::RecordKind::Steps]
                .map(|kind| store.key(kind, &idem::key::stored_scope(&scope), &stored_key))
        };
        let stopped = unique("stopped");
        let url = primary_of(&mut conn, &names(&stopped)[0]).await;
        let mut done = unique("done");
        while primary_of(&mut conn, &names(&done)[0]).await != url {
            done = unique("done");
        }
        transfer(&store, &scope, &stopped, true).await;
        transfer(&store, &scope, &done, false).await;
        tokio::time::sleep(SHORT_LEASE + Duration::from_millis(300)).await;

        // The runtime's own read, on the cluster connection.
        let id = RecordId::new(&scope, &Key::new(stopped.as_str()).unwrap());
        let record = store.inspect_lease(&id).await.unwrap().expect("the stopped call's record");
        let steps: Vec<(usize, &str)> = record.steps.iter().map(|s| (s.number, s.name.as_str())).collect();
        assert_eq!(steps, [(0, "reserve"), (1, "charge")]);
        assert_eq!(record.steps[1].result, "500");
        assert_eq!(record.steps[1].key, step_key(&scope, &stopped, "charge"));
        let completed = RecordId::new(&scope, &Key::new(done.as_str()).unwrap());
        assert_eq!(store.inspect_lease(&completed).await.unwrap().map(|r| r.steps), Some(Vec::new()));

        // The binary, on that primary.
        let cli = Store::Redis { url: &url, prefix: &prefix };
        shows_two_steps(&cli, &scope, &stopped);
        shows_no_steps(&cli, &scope, &done);
        let listed = idem_json(&cli, &["stuck", "--scope", &scope], 0);
        let records = listed["stores"][0]["records"].as_array().unwrap();
        assert_eq!(records.len(), 1, "{listed}");
        assert_eq!(records[0]["stopped"], "after step 1 `charge`", "{listed}");
        let text = stdout(&idem(&cli, &["stuck", "--scope", &scope]));
        assert!(text.contains("stopped after step 1 `charge`"), "{text}");

        for name in [names(&stopped), names(&done)].concat() {
            let _: i64 = redis::cmd("UNLINK").arg(&name).query_async(&mut conn).await.unwrap();
        }
    }
}

/// The lease records of an etcd cluster of the test binary's own, under a
/// prefix of the test's own, through `--etcd-url etcd://host:port,...`.
mod etcd {
    use super::*;

    #[tokio::test]
    async fn a_crashed_lease_is_inspected_listed_and_released_and_then_runs_again() {
        let Some(cluster) = common::etcd_cluster::shared().await else { return };
        let prefix = format!("{}/", unique("cli"));
        let store = cluster.store(&prefix).await;
        let hosts: Vec<String> = cluster.members.iter().map(|m| format!("127.0.0.1:{}", m.client_port)).collect();
        let url = format!("etcd://{}", hosts.join(","));
        lease_lifecycle(&store, &Store::Etcd { url: &url, prefix: &prefix }).await;
    }
}
