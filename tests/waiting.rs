//! `Guard::lease_or_wait` at the edges: a completion that lands between the
//! waiter's busy claim and its wait still wakes it at once (the watch is
//! registered before the claim), on the stores that notify; a wait too long
//! for the clock is a long wait, not a panic.

use idem_test_support as common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::{Duration, Instant};

use common::unique;
use idem::lease::{HeldLease, LeaseClaim, LeaseRequest, LeaseStore, Watch};
use idem::store::BoxFuture;
use idem::{Claim, Error, Guard};

/// A store whose first busy claim lets the holder complete before it
/// answers: the worst moment for a waiter that registers late.
struct CompletesBehindTheBusy {
    inner: Arc<dyn LeaseStore>,
    holder: (String, String, String, i64),
    done: AtomicBool,
}

impl LeaseStore for CompletesBehindTheBusy {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn claim<'a>(&'a self, req: &'a LeaseRequest<'a>) -> BoxFuture<'a, Result<LeaseClaim, Error>> {
        Box::pin(async move {
            let claim = self.inner.claim(req).await?;
            if matches!(claim, LeaseClaim::Busy { .. }) && !self.done.swap(true, SeqCst) {
                let (scope, key, owner, fence) = &self.holder;
                let held = HeldLease {
                    scope,
                    key,
                    owner,
                    fingerprint: None,
                    fence: *fence,
                    lease: Duration::from_secs(10),
                    retention: Duration::from_secs(60),
                };
                assert!(self.inner.complete(&held, Some("7")).await?);
            }
            Ok(claim)
        })
    }
    fn complete<'a>(
        &'a self,
        held: &'a HeldLease<'a>,
        response: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.complete(held, response)
    }
    fn release<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.release(held)
    }
    fn extend<'a>(&'a self, held: &'a HeldLease<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.extend(held)
    }
    fn notifies(&self) -> bool {
        self.inner.notifies()
    }
    fn watch<'a>(&'a self, scope: &'a str, key: &'a str) -> Watch<'a> {
        self.inner.watch(scope, key)
    }
}

async fn woken_at_once(inner: Arc<dyn LeaseStore>) {
    assert!(inner.notifies());
    let (scope, key) = ("tests.waiting.race", unique("race"));
    let stored_scope = idem::key::stored_scope(scope).into_owned();
    let stored_key = idem::Key::new(&key).unwrap().as_str().to_owned();
    let req = LeaseRequest {
        scope: &stored_scope,
        key: &stored_key,
        fingerprint: None,
        owner: "holder",
        lease: Duration::from_secs(10),
        retention: Duration::from_secs(60),
    };
    let Ok(LeaseClaim::Acquired { fence, .. }) = inner.claim(&req).await else { panic!("the holder claims") };
    let store = CompletesBehindTheBusy {
        inner,
        holder: (stored_scope.clone(), stored_key.clone(), "holder".into(), fence),
        done: AtomicBool::new(false),
    };
    let started = Instant::now();
    let claim =
        Guard::new(scope).key(&key).lease_or_wait::<u32>(&store, Duration::from_secs(10), Duration::from_secs(5));
    let Ok(Claim::Replay(answer)) = claim.await else { panic!("the waiter replays") };
    assert_eq!(answer, 7);
    // A late registration would sleep out its whole pause (500 ms).
    assert!(started.elapsed() < Duration::from_millis(300), "woken after {:?}", started.elapsed());
}

#[tokio::test]
async fn a_completion_behind_the_busy_claim_wakes_the_memory_waiter_at_once() {
    woken_at_once(Arc::new(idem::store::MemoryStore::new())).await;
}

#[tokio::test]
async fn a_completion_behind_the_busy_claim_wakes_the_redis_waiter_at_once() {
    let Some(conn) = common::redis().await else { return };
    let client =
        redis::Client::open(std::env::var("IDEM_REDIS_URL").unwrap_or("redis://127.0.0.1:6379/".into())).unwrap();
    let store = idem::store::RedisStore::new(conn, format!("{}:", unique("idem-waiting")));
    woken_at_once(Arc::new(store.notifications(&client).await.unwrap())).await;
}

#[tokio::test]
async fn a_wait_too_long_for_the_clock_is_a_long_wait() {
    let store = idem::store::MemoryStore::new();
    let claim = Guard::new("tests.waiting.max").key(&unique("max")).lease_or_wait::<u8>(
        &store,
        Duration::from_secs(5),
        Duration::MAX,
    );
    let Ok(Claim::Run(ticket)) = claim.await else { panic!("a first call runs") };
    assert_eq!(ticket.run(async { Ok::<u8, Error>(1) }).await.unwrap(), 1);
}
