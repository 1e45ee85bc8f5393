//! `strategy = "lease"` against the memory store, SQLite, PostgreSQL,
//! MySQL/MariaDB, Redis, Redis Cluster and etcd. One suite, stamped out per store.

use idem_test_support as common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::{AppError, unique};
use idem::lease::{HeldLease, LeaseClaim, LeaseRequest, LeaseStore};
use idem::store::RecordKind;
use idem::testing::{Fault, Faults, Op};
use idem::{Error, Outcome, idempotent};

type Store = Arc<dyn LeaseStore>;

/// Work outside any transaction: counts its runs, may fail, may be slow.
#[idempotent(
    key = "id",
    strategy = "lease",
    lease = "2s",
    scope = "tests.lease.work",
    store = "store",
    fingerprint = "amount"
)]
async fn work(
    store: &dyn LeaseStore,
    id: &str,
    amount: i64,
    runs: &AtomicUsize,
    millis: u64,
    fail: bool,
) -> Result<i64, AppError> {
    runs.fetch_add(1, SeqCst);
    tokio::time::sleep(Duration::from_millis(millis)).await;
    if fail {
        return Err(AppError::Rule("the bank said no".into()));
    }
    Ok(amount)
}

/// A short lease, kept alive by the runtime while the body runs for longer
/// (1.2 s, renewed every 400 ms: renewals queue behind other tests' writes
/// on a loaded 2-core machine running the cluster suites too; 600 ms once
/// lost a PostgreSQL renewal in CI, 300 ms lost SQLite's).
#[idempotent(key = "id", strategy = "lease", lease = "1200ms", scope = "tests.lease.long", store = "store")]
async fn long_work(store: &dyn LeaseStore, id: &str, runs: &AtomicUsize) -> Result<(), AppError> {
    runs.fetch_add(1, SeqCst);
    tokio::time::sleep(Duration::from_millis(3500)).await;
    Ok(())
}

/// A body that panics when asked, under a lease far longer than the test.
#[idempotent(key = "id", strategy = "lease", lease = "60s", scope = "tests.lease.panics", store = "store")]
async fn panicking(store: &dyn LeaseStore, id: &str, panic: bool, runs: &AtomicUsize) -> Result<u32, AppError> {
    runs.fetch_add(1, SeqCst);
    if panic {
        panic!("the body panicked (on purpose, in a test)");
    }
    Ok(7)
}

#[idempotent(key = "id", strategy = "lease", scope = "tests.lease.falsy", store = "store")]
async fn falsy(store: &dyn LeaseStore, id: &str, which: u8) -> Result<serde_json::Value, AppError> {
    Ok(match which {
        0 => serde_json::json!(0),
        1 => serde_json::json!(false),
        2 => serde_json::json!(""),
        3 => serde_json::json!(null),
        _ => serde_json::json!([]),
    })
}

/// A callback handler whose duplicates wait for the first call.
#[idempotent(key = "id", strategy = "lease", wait = "10s", scope = "tests.lease.waits", store = "store")]
async fn callback(store: &dyn LeaseStore, id: &str, runs: &AtomicUsize) -> Result<u64, AppError> {
    let run = runs.fetch_add(1, SeqCst) as u64;
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(run + 100)
}

#[idempotent(key = "id", strategy = "lease", lease = "300ms", scope = "tests.lease.reclaim", store = "store")]
async fn reclaiming(store: &dyn LeaseStore, id: &str) -> Result<(i64, bool), AppError> {
    let lease = idem::lease::current().expect("inside a lease");
    Ok((lease.fence, lease.reclaimed))
}

/// How much later than its length a lease may end on `store`: nothing on
/// the stores that keep time to the millisecond; on etcd, whose leases
/// count whole seconds (at least 1 s on the test cluster) and end when the
/// leader's check, every 500 ms, finds them expired, 1.5 s. A test waiting
/// for a lease to pass waits this much longer.
fn slack(store: &dyn LeaseStore) -> Duration {
    if store.kind() == "etcd" { Duration::from_millis(1500) } else { Duration::ZERO }
}

fn request<'a>(scope: &'a str, key: &'a str, owner: &'a str, lease: Duration) -> LeaseRequest<'a> {
    LeaseRequest { scope, key, fingerprint: None, owner, lease, retention: Duration::from_secs(3600) }
}

/// The holder of `owner`'s claim at `fence`, without a fingerprint, as a
/// store's caller builds it.
fn holder<'a>(scope: &'a str, key: &'a str, owner: &'a str, fence: i64, lease: Duration) -> HeldLease<'a> {
    HeldLease { scope, key, owner, fingerprint: None, fence, lease, retention: Duration::from_secs(3600) }
}

/// A first call through `store` answering `answer`, then `repeats`
/// repeats: what each got, and how often the body ran.
async fn answer_then_repeat<T>(
    store: &dyn LeaseStore,
    scope: &'static str,
    id: &str,
    answer: impl Fn() -> T,
    repeats: usize,
) -> (Result<T, Error>, Vec<Result<T, Error>>, usize)
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let runs = AtomicUsize::new(0);
    let call = || async {
        match idem::Guard::new(scope).key(id).lease::<T>(store, Duration::from_secs(5)).await? {
            idem::Claim::Replay(value) => Ok(value),
            idem::Claim::Run(ticket) => {
                ticket
                    .run(async {
                        runs.fetch_add(1, SeqCst);
                        Ok::<T, Error>(answer())
                    })
                    .await
            }
        }
    };
    let first = call().await;
    let mut later = Vec::new();
    for _ in 0..repeats {
        later.push(call().await);
    }
    (first, later, runs.load(SeqCst))
}

macro_rules! lease_suite {
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

            /// An answer JSON cannot carry exactly (`f64::NAN` is written as
            /// `null`): the first call gets it, its record says "answer not
            /// kept", and no repeat runs the body again.
            #[tokio::test]
            async fn an_answer_that_cannot_replay_is_returned_and_never_run_again() {
                let store: Store = store!();
                let id = unique("nan");
                let (first, later, runs) = answer_then_repeat(&*store, "tests.lease.nan", &id, || f64::NAN, 2).await;
                assert!(first.unwrap().is_nan(), "the first call gets its answer");
                for repeat in later {
                    assert!(matches!(repeat, Err(Error::AnswerNotKept { .. })), "{repeat:?}");
                }
                assert_eq!(runs, 1);
            }

            /// An answer that does not serialize at all (a map JSON cannot
            /// key: its keys are pairs): the first call gets it, and no repeat
            /// runs the body again.
            #[tokio::test]
            async fn an_answer_that_does_not_serialize_is_returned_and_never_run_again() {
                let store: Store = store!();
                let id = unique("unserializable");
                let answer = || std::collections::BTreeMap::from([((1, 2), 3)]);
                let (first, later, runs) = answer_then_repeat(&*store, "tests.lease.unserializable", &id, answer, 2).await;
                assert_eq!(first.unwrap(), answer(), "the first call gets its answer");
                for repeat in later {
                    assert!(matches!(repeat, Err(Error::AnswerNotKept { .. })), "{repeat:?}");
                }
                assert_eq!(runs, 1);
            }

            /// An answer longer than the store holds (here a limit of 65,000
            /// bytes given by the store; MariaDB's own is its packet size) is
            /// not sent: the record is completed without it.
            #[tokio::test]
            async fn an_answer_longer_than_the_store_holds_is_returned_and_never_run_again() {
                let inner: Store = store!();
                let store = Faults::new().wrap(inner).answer_limit(65_000);
                let id = unique("long");
                let long = || "x".repeat(70_000);
                let (first, later, runs) = answer_then_repeat(&store, "tests.lease.long_answer", &id, long, 2).await;
                assert_eq!(first.map(|a| a.len()).unwrap(), 70_000, "the first call gets its answer");
                for repeat in later {
                    assert!(matches!(repeat, Err(Error::AnswerNotKept { .. })), "{repeat:?}");
                }
                assert_eq!(runs, 1);
                // Under the limit, kept and replayed as ever.
                let id = unique("short");
                let (first, later, runs) = answer_then_repeat(&store, "tests.lease.long_answer", &id, || 5u8, 1).await;
                assert_eq!((first.unwrap(), later.into_iter().next().unwrap().unwrap(), runs), (5, 5, 1));
            }

            /// The store fails each time the answer is written (a packet
            /// refused, a value it will not take): after three tries the
            /// record is completed without the answer, the first call still
            /// gets it, and repeats are told it was not kept.
            #[tokio::test]
            async fn a_store_failing_as_the_answer_is_written_keeps_the_record_without_it() {
                let inner: Store = store!();
                let faults = Faults::new();
                faults.inject_when(Op::Complete, Fault::Fail, |call| call.response.is_some());
                let store = faults.wrap(inner);
                let id = unique("store-fails");
                let (first, later, runs) = answer_then_repeat(&store, "tests.lease.fails", &id, || 9u32, 2).await;
                assert_eq!(first.unwrap(), 9, "the first call gets its answer");
                for repeat in later {
                    assert!(matches!(repeat, Err(Error::AnswerNotKept { .. })), "{repeat:?}");
                }
                assert_eq!(runs, 1);
                assert_eq!(faults.calls(Op::Complete), 4, "three tries with the answer, one without");
            }

            /// Each write of the answer lands, and each reply is lost (the
            /// connection drops after the write): after three tries the
            /// record is completed without the answer, which must not
            /// replace the one that landed. Repeats replay it.
            #[tokio::test]
            async fn an_answer_that_landed_is_replayed_though_every_reply_was_lost() {
                let inner: Store = store!();
                let faults = Faults::new();
                faults.inject_when(Op::Complete, Fault::DropAfterWrite, |call| call.response.is_some());
                let store = faults.wrap(inner);
                let id = unique("reply-lost");
                let (first, later, runs) = answer_then_repeat(&store, "tests.lease.reply_lost", &id, || 9u32, 2).await;
                assert_eq!(first.unwrap(), 9, "the first call gets its answer");
                for repeat in later {
                    assert_eq!(repeat.unwrap(), 9, "a stored answer is final: replayed, not `AnswerNotKept`");
                }
                assert_eq!(runs, 1);
                assert_eq!(faults.calls(Op::Complete), 4, "three tries with the answer, one without");
            }

            /// Each write of the answer lands after its caller gave up on it
            /// (it was told the store did not answer in time): the first one
            /// lands while the runtime is still trying, the completion
            /// without the answer comes after it and leaves it, and the later
            /// writes change nothing. The record ends with the answer.
            #[tokio::test]
            async fn an_answer_that_lands_after_its_caller_gave_up_is_kept() {
                let inner: Store = store!();
                let faults = Faults::new();
                let late = Fault::LandsLate(Duration::from_millis(20));
                faults.inject_when(Op::Complete, late, |call| call.response.is_some());
                let store = faults.wrap(inner);
                let id = unique("late");
                let (first, later, runs) = answer_then_repeat(&store, "tests.lease.late", &id, || 4u32, 1).await;
                assert_eq!(first.unwrap(), 4, "the first call gets its answer");
                assert_eq!(later.into_iter().next().unwrap().unwrap(), 4, "replayed");
                assert_eq!(faults.calls(Op::Complete), 4, "three tries with the answer, each told it failed");
                // Every late write has landed by now.
                tokio::time::sleep(Duration::from_millis(500)).await;
                let (again, _, runs_again) = answer_then_repeat(&store, "tests.lease.late", &id, || 0u32, 0).await;
                assert_eq!((again.unwrap(), runs + runs_again), (4, 1), "the record ends with the answer");
            }

            /// Once a record holds its answer, nothing its holder or anyone
            /// else sends changes it: not a release, an extension, a step, a
            /// completion without the answer or with another one, nor a claim
            /// after the lease it was completed under.
            #[tokio::test]
            async fn a_completed_record_is_final() {
                let store: Store = store!();
                let (scope, key) = ("tests.lease.raw", unique("final"));
                let lease = Duration::from_millis(200);
                let LeaseClaim::Acquired { fence, .. } = store.claim(&request(scope, &key, "w", lease)).await.unwrap()
                else {
                    panic!("claim")
                };
                let held = holder(scope, &key, "w", fence, lease);
                assert!(store.complete(&held, Some("\"kept\"")).await.unwrap());
                assert!(!store.release(&held).await.unwrap(), "a release after completion removes nothing");
                assert!(!store.extend(&held).await.unwrap(), "nor does an extension hold it again");
                let step = idem::lease::NewStep { number: 0, name: "late", result: "1" };
                assert!(!store.record_step(&held, &step).await.unwrap(), "nor is a step recorded under it");
                assert!(store.complete(&held, None).await.unwrap(), "completed: true, and the answer stays");
                assert!(store.complete(&held, Some("\"other\"")).await.unwrap(), "the same: a no-op");
                tokio::time::sleep(Duration::from_millis(400)).await;
                let kept = LeaseClaim::Done { response: Some("\"kept\"".into()) };
                assert_eq!(store.claim(&request(scope, &key, "taker", lease)).await.unwrap(), kept, "past the lease");
                assert_eq!(store.claim(&request(scope, &key, "w", lease)).await.unwrap(), kept, "its own owner too");
            }

            /// A store that takes no completion while the lease lasts leaves
            /// the record as a crash would: taken over once the lease passed.
            /// The first call still gets its answer (not an error its caller
            /// would retry on at once), within about the lease.
            #[tokio::test]
            async fn a_store_down_at_completion_still_answers_the_first_call() {
                let inner: Store = store!();
                let faults = Faults::new();
                faults.inject(Op::Complete, Fault::Fail);
                let store = faults.wrap(inner);
                let id = unique("store-down");
                let started = std::time::Instant::now();
                let claim = idem::Guard::new("tests.lease.down").key(&id).lease::<u32>(&store, Duration::from_secs(1));
                let Ok(idem::Claim::Run(ticket)) = claim.await else { panic!("first call") };
                assert_eq!(ticket.run(async { Ok::<u32, Error>(3) }).await.unwrap(), 3);
                assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
                tokio::time::sleep(slack(&store)).await;
                let retry = idem::Guard::new("tests.lease.down").key(&id).lease::<u32>(&**store.inner(), Duration::from_secs(1));
                let retry = format!("{:?}", retry.await);
                assert!(retry.contains("Run(") && retry.contains("reclaimed: true"), "{retry}");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_dropped_call_keeps_its_record_until_its_lease_passes() {
                // What a dropped body started may still be landing: a retry
                // let in at once could do it twice. The record waits for its
                // lease; then a retry takes it over, fenced.
                let store: Store = store!();
                let id = unique("dropped");
                let lease = Duration::from_millis(600);
                let claim = idem::Guard::new("tests.lease.dropped").key(&id).lease::<u32>(&*store, lease).await;
                let Ok(idem::Claim::Run(ticket)) = claim else { panic!("first call") };
                let run = ticket.run(async {
                    tokio::time::sleep(Duration::from_secs(30)).await; // a caller that goes away
                    Ok::<u32, idem::Error>(1)
                });
                let _ = tokio::time::timeout(Duration::from_millis(50), run).await;
                let retry = idem::Guard::new("tests.lease.dropped").key(&id).lease::<u32>(&*store, lease).await;
                assert!(matches!(retry, Err(idem::Error::InProgress { .. })), "the lease still holds: {retry:?}");
                tokio::time::sleep(Duration::from_millis(800) + slack(&*store)).await;
                let retry = idem::Guard::new("tests.lease.dropped").key(&id).lease::<u32>(&*store, lease).await;
                let Ok(idem::Claim::Run(ticket)) = retry else { panic!("taken over after the lease: {retry:?}") };
                let reclaimed = ticket.run(async { Ok::<_, idem::Error>(idem::lease::current().map(|l| l.reclaimed)) }).await;
                assert_eq!(reclaimed.unwrap(), Some(true));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn concurrent_calls_on_a_fresh_key_run_once() {
                let store: Store = store!();
                let id = unique("conc");
                let runs = Arc::new(AtomicUsize::new(0));
                let mut tasks = Vec::new();
                for _ in 0..64 {
                    let (store, id, runs) = (store.clone(), id.clone(), runs.clone());
                    tasks.push(tokio::spawn(
                        async move { idem::observe(work(&*store, &id, 7, &runs, 200, false)).await },
                    ));
                }
                let (mut ran, mut busy, mut replayed) = (0, 0, 0);
                for t in tasks {
                    match t.await.unwrap() {
                        (Ok(7), Some(Outcome::Executed)) => ran += 1,
                        (Ok(7), Some(Outcome::Replayed)) => replayed += 1,
                        (Err(AppError::Idem(Error::InProgress { retry_after, .. })), _) => {
                            assert!(retry_after.is_some_and(|d| d <= Duration::from_secs(2)), "{retry_after:?}");
                            busy += 1
                        }
                        other => panic!("unexpected {other:?}"),
                    }
                }
                assert_eq!(ran, 1);
                assert_eq!(runs.load(SeqCst), 1);
                assert_eq!(ran + busy + replayed, 64);
                // After completion: a replay.
                let again = idem::observe(work(&*store, &id, 7, &runs, 0, false)).await;
                assert!(matches!(again, (Ok(7), Some(Outcome::Replayed))), "{again:?}");
            }

            #[tokio::test]
            async fn a_live_lease_is_never_reclaimed_as_an_orphan() {
                let store: Store = store!();
                let (scope, key) = ("tests.lease.raw", unique("live"));
                let first = store.claim(&request(scope, &key, "w1", Duration::from_secs(5))).await.unwrap();
                assert!(matches!(first, LeaseClaim::Acquired { fence, reclaimed: false } if fence > 0), "{first:?}");
                let second = store.claim(&request(scope, &key, "w2", Duration::from_secs(5))).await.unwrap();
                assert!(matches!(second, LeaseClaim::Busy { .. }), "{second:?}");
            }

            /// A token must never be granted twice for one key, even after
            /// its record was removed (a failed body) or taken over: a
            /// stalled holder of an old token must stay below every later
            /// holder's.
            #[tokio::test]
            async fn fences_keep_increasing_after_the_record_is_removed() {
                let store: Store = store!();
                let (scope, key) = ("tests.lease.raw", unique("fences"));
                let short = Duration::from_millis(150);
                let claim = |owner: &'static str, lease| {
                    let (store, key) = (store.clone(), key.clone());
                    async move {
                        match store.claim(&request(scope, &key, owner, lease)).await.unwrap() {
                            LeaseClaim::Acquired { fence, reclaimed } => (fence, reclaimed),
                            other => panic!("{owner}: {other:?}"),
                        }
                    }
                };
                let held = |owner, fence| holder(scope, &key, owner, fence, short);
                // A claims and stalls past its lease; B takes over.
                let (a, _) = claim("a", short).await;
                tokio::time::sleep(Duration::from_millis(300) + slack(&*store)).await;
                let (b, reclaimed) = claim("b", short).await;
                assert!(reclaimed && b > a, "take-over: {a} then {b}");
                // B's body fails: its record is removed. C claims afresh.
                assert!(store.release(&held("b", b)).await.unwrap());
                let (c, reclaimed) = claim("c", short).await;
                assert!(!reclaimed, "a fresh record");
                assert!(c > b, "after removal: {b} then {c}");
                // And once more, straight after.
                assert!(store.release(&held("c", c)).await.unwrap());
                let (d, _) = claim("d", short).await;
                assert!(d > c, "{c} then {d}");
                // A comes back with its old token: refused, nothing written.
                assert!(!store.complete(&held("a", a), Some("\"stale\"")).await.unwrap());
            }

            #[tokio::test]
            async fn a_refused_completion_does_not_renew_the_takers_lease() {
                let store: Store = store!();
                let (scope, key) = ("tests.lease.raw", unique("norenew"));
                let lease = Duration::from_millis(300);
                let LeaseClaim::Acquired { fence: stale, .. } =
                    store.claim(&request(scope, &key, "stale", lease)).await.unwrap()
                else {
                    panic!("claim")
                };
                tokio::time::sleep(Duration::from_millis(400) + slack(&*store)).await;
                let taken = store.claim(&request(scope, &key, "taker", lease)).await.unwrap();
                assert!(matches!(taken, LeaseClaim::Acquired { reclaimed: true, .. }), "{taken:?}");
                // The stale holder's completion is refused, and the taker's
                // lease keeps its deadline: when it passes, the next caller
                // takes over (the taker stopped too, say).
                tokio::time::sleep(Duration::from_millis(200)).await;
                assert!(!store.complete(&holder(scope, &key, "stale", stale, lease), Some("1")).await.unwrap());
                tokio::time::sleep(Duration::from_millis(170) + slack(&*store)).await;
                let next = store.claim(&request(scope, &key, "next", lease)).await.unwrap();
                assert!(matches!(next, LeaseClaim::Acquired { reclaimed: true, .. }), "{next:?}");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn racing_reclaimers_one_wins_and_the_stale_owner_cannot_complete() {
                let store: Store = store!();
                let (scope, key) = ("tests.lease.raw", unique("race"));
                let lease = Duration::from_millis(200);
                let LeaseClaim::Acquired { fence: old_fence, .. } =
                    store.claim(&request(scope, &key, "dead", lease)).await.unwrap()
                else {
                    panic!("first claim")
                };
                tokio::time::sleep(Duration::from_millis(400) + slack(&*store)).await;
                let mut tasks = Vec::new();
                for i in 0..8 {
                    let (store, key) = (store.clone(), key.clone());
                    tasks.push(tokio::spawn(async move {
                        let owner = format!("r{i}");
                        let claim = store.claim(&request(scope, &key, &owner, Duration::from_secs(5))).await.unwrap();
                        (owner, claim)
                    }));
                }
                let mut winners = Vec::new();
                for t in tasks {
                    let (owner, claim) = t.await.unwrap();
                    match claim {
                        LeaseClaim::Acquired { fence, reclaimed } => {
                            assert!(reclaimed);
                            assert!(fence > old_fence);
                            winners.push((owner, fence));
                        }
                        LeaseClaim::Busy { .. } => {}
                        other => panic!("{other:?}"),
                    }
                }
                assert_eq!(winners.len(), 1, "{winners:?}");
                let held = |owner, fence| holder(scope, &key, owner, fence, lease);
                // The worker that stalled comes back: its completion is refused.
                assert!(!store.complete(&held("dead", old_fence), Some("\"stale\"")).await.unwrap());
                assert!(!store.release(&held("dead", old_fence)).await.unwrap());
                assert!(!store.extend(&held("dead", old_fence)).await.unwrap());
                // The refused completion left the winner's lease as it was.
                let busy = store.claim(&request(scope, &key, "late", lease)).await.unwrap();
                assert!(matches!(busy, LeaseClaim::Busy { .. }), "{busy:?}");
                let (owner, fence) = &winners[0];
                assert!(store.complete(&held(owner, *fence), Some("\"fresh\"")).await.unwrap());
                // Once the winner is done, the stale worker cannot overwrite its answer either.
                assert!(!store.complete(&held("dead", old_fence), Some("\"stale\"")).await.unwrap());
                let replay = store.claim(&request(scope, &key, "late", lease)).await.unwrap();
                assert_eq!(replay, LeaseClaim::Done { response: Some("\"fresh\"".into()) });
            }

            #[tokio::test]
            async fn a_completion_keeps_the_fingerprint_of_the_claim() {
                let store: Store = store!();
                let (scope, key) = ("tests.lease.raw", unique("fpkeep"));
                let lease = Duration::from_secs(5);
                let (mine, theirs) = ("a".repeat(64), "b".repeat(64));
                let with = |owner, fp| LeaseRequest { fingerprint: Some(fp), ..request(scope, &key, owner, lease) };
                let LeaseClaim::Acquired { fence, .. } = store.claim(&with("w", &mine)).await.unwrap() else {
                    panic!("claim")
                };
                // A holder built by hand without the fingerprint: the record keeps the claim's.
                let held = holder(scope, &key, "w", fence, lease);
                assert!(store.complete(&held, Some("7")).await.unwrap());
                // Nor does the same completion repeated (its first reply lost) clear it.
                assert!(store.complete(&held, Some("7")).await.unwrap());
                assert_eq!(store.claim(&with("x", &theirs)).await.unwrap(), LeaseClaim::Mismatch);
                assert_eq!(store.claim(&with("y", &mine)).await.unwrap(), LeaseClaim::Done { response: Some("7".into()) });
            }

            #[tokio::test]
            async fn a_completion_repeated_by_its_holder_succeeds_again() {
                let store: Store = store!();
                let (scope, key) = ("tests.lease.raw", unique("twice"));
                let lease = Duration::from_secs(5);
                let LeaseClaim::Acquired { fence, .. } = store.claim(&request(scope, &key, "w", lease)).await.unwrap()
                else {
                    panic!("claim")
                };
                let held = holder(scope, &key, "w", fence, lease);
                // The first reply was lost: the runtime sends it again.
                assert!(store.complete(&held, Some("[1]")).await.unwrap());
                assert!(store.complete(&held, Some("[1]")).await.unwrap());
                let other = HeldLease { owner: "x", ..held.clone() };
                assert!(!store.complete(&other, Some("[2]")).await.unwrap(), "another owner is refused");
                let replay = store.claim(&request(scope, &key, "late", lease)).await.unwrap();
                assert_eq!(replay, LeaseClaim::Done { response: Some("[1]".into()) });
            }

            #[tokio::test]
            async fn fingerprint_is_checked_first_and_an_identical_retry_passes() {
                let store: Store = store!();
                let id = unique("fp");
                let runs = Arc::new(AtomicUsize::new(0));
                let slow = {
                    let (store, id, runs) = (store.clone(), id.clone(), runs.clone());
                    tokio::spawn(async move { work(&*store, &id, 100, &runs, 400, false).await })
                };
                tokio::time::sleep(Duration::from_millis(100)).await;
                // While the first call runs: another payload is a mismatch, not "in progress".
                let other = work(&*store, &id, 999, &runs, 0, false).await;
                assert!(matches!(other, Err(AppError::Idem(Error::KeyMismatch { .. }))), "{other:?}");
                assert_eq!(slow.await.unwrap().unwrap(), 100);
                // After completion too; the identical retry replays.
                let other = work(&*store, &id, 999, &runs, 0, false).await;
                assert!(matches!(other, Err(AppError::Idem(Error::KeyMismatch { .. }))), "{other:?}");
                assert_eq!(work(&*store, &id, 100, &runs, 0, false).await.unwrap(), 100);
                assert_eq!(runs.load(SeqCst), 1);
            }

            /// Records 0.2 wrote hold its fingerprint (64 hex digits of the
            /// payload's JSON, no version): an identical retry after the
            /// upgrade replays it, or takes it over once its holder's lease
            /// has passed, and the record keeps 0.2's fingerprint; another
            /// payload is a mismatch.
            #[tokio::test]
            async fn a_record_written_by_0_2_compares_in_its_version() {
                let store: Store = store!();
                // SHA-256 of `100`: `work`'s fingerprinted `amount`, as 0.2 hashed it.
                const V1: &str = "ad57366865126e55649ecb23ae1d48887544976efea46a48eb5d85a6eeb4d306";
                let (scope, runs, lease) = ("tests.lease.work", AtomicUsize::new(0), Duration::from_millis(300));
                let by_0_2 = |key| LeaseRequest { fingerprint: Some(V1), ..request(scope, key, "0.2", lease) };
                let done = unique("v1-done");
                let LeaseClaim::Acquired { fence, .. } = store.claim(&by_0_2(&done)).await.unwrap() else {
                    panic!("claim")
                };
                let held = HeldLease { fingerprint: Some(V1), ..holder(scope, &done, "0.2", fence, lease) };
                assert!(store.complete(&held, Some("100")).await.unwrap());
                assert_eq!(work(&*store, &done, 100, &runs, 0, false).await.unwrap(), 100);
                let other = work(&*store, &done, 999, &runs, 0, false).await;
                assert!(matches!(other, Err(AppError::Idem(Error::KeyMismatch { .. }))), "{other:?}");
                assert_eq!(runs.load(SeqCst), 0, "replayed");

                // Held by a 0.2 worker that stalled.
                let stalled = unique("v1-held");
                assert!(matches!(store.claim(&by_0_2(&stalled)).await.unwrap(), LeaseClaim::Acquired { .. }));
                let other = work(&*store, &stalled, 999, &runs, 0, false).await;
                assert!(matches!(other, Err(AppError::Idem(Error::KeyMismatch { .. }))), "{other:?}");
                let busy = work(&*store, &stalled, 100, &runs, 0, false).await;
                assert!(matches!(busy, Err(AppError::Idem(Error::InProgress { .. }))), "{busy:?}");
                tokio::time::sleep(lease + Duration::from_millis(200) + slack(&*store)).await;
                assert_eq!(work(&*store, &stalled, 100, &runs, 0, false).await.unwrap(), 100);
                assert_eq!(runs.load(SeqCst), 1, "taken over");
                let by_0_2_again = LeaseRequest { owner: "0.2 again", ..by_0_2(&stalled) };
                assert_eq!(store.claim(&by_0_2_again).await.unwrap(), LeaseClaim::Done { response: Some("100".into()) });
            }

            #[tokio::test]
            async fn falsy_values_replay_exactly() {
                let store: Store = store!();
                for which in 0..5u8 {
                    let id = unique("falsy");
                    let first = falsy(&*store, &id, which).await.unwrap();
                    let (again, outcome) = idem::observe(falsy(&*store, &id, which)).await;
                    assert_eq!(again.unwrap(), first);
                    assert_eq!(outcome, Some(Outcome::Replayed));
                }
            }

            #[tokio::test]
            async fn a_failed_body_removes_the_record_so_a_retry_runs() {
                let store: Store = store!();
                let id = unique("fail");
                let runs = AtomicUsize::new(0);
                assert!(matches!(work(&*store, &id, 5, &runs, 0, true).await, Err(AppError::Rule(_))));
                assert_eq!(work(&*store, &id, 5, &runs, 0, false).await.unwrap(), 5);
                assert_eq!(runs.load(SeqCst), 2);
            }

            /// A panicking body fails like one returning `Err`: its record is
            /// removed before the panic goes on, so a retry runs at once
            /// instead of meeting `InProgress` for the rest of the lease.
            #[tokio::test]
            async fn a_panicking_body_releases_its_record_and_the_panic_goes_on() {
                let store: Store = store!();
                let id = unique("panic");
                let runs = Arc::new(AtomicUsize::new(0));
                let first = {
                    let (store, id, runs) = (store.clone(), id.clone(), runs.clone());
                    tokio::spawn(async move { panicking(&*store, &id, true, &runs).await })
                };
                let err = first.await.unwrap_err();
                assert!(err.is_panic(), "the caller still sees the panic: {err:?}");
                assert_eq!(panicking(&*store, &id, false, &runs).await.unwrap(), 7);
                assert_eq!(runs.load(SeqCst), 2);
            }

            #[tokio::test]
            async fn a_record_stuck_by_a_killed_worker_is_reclaimed_after_its_lease() {
                let store: Store = store!();
                let id = unique("stuck");
                // A worker claimed the key and was killed: nobody completes it.
                let scope = "tests.lease.reclaim";
                let stuck = store.claim(&request(scope, &id, "killed", Duration::from_millis(300))).await.unwrap();
                assert!(matches!(stuck, LeaseClaim::Acquired { .. }));
                let busy = reclaiming(&*store, &id).await;
                assert!(matches!(busy, Err(AppError::Idem(Error::InProgress { .. }))), "{busy:?}");
                tokio::time::sleep(Duration::from_millis(500) + slack(&*store)).await;
                let LeaseClaim::Acquired { fence: stuck_fence, .. } = stuck else { unreachable!() };
                let (fence, reclaimed) = reclaiming(&*store, &id).await.unwrap();
                assert!(reclaimed);
                assert_eq!(fence, stuck_fence + 1, "a take-over adds one to the fence");
                assert_eq!(reclaiming(&*store, &id).await.unwrap(), (fence, true), "then it replays");
            }

            /// `wait` in the attribute: 50 concurrent copies of one callback
            /// all get the first call's answer, none `InProgress`, and the
            /// body runs once.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn with_wait_fifty_concurrent_callbacks_all_get_the_answer() {
                let store: Store = store!();
                let id = unique("waits");
                let runs = Arc::new(AtomicUsize::new(0));
                let tasks: Vec<_> = (0..50)
                    .map(|_| {
                        let (store, id, runs) = (store.clone(), id.clone(), runs.clone());
                        tokio::spawn(async move { callback(&*store, &id, &runs).await })
                    })
                    .collect();
                for task in tasks {
                    assert_eq!(task.await.unwrap().unwrap(), 100, "every copy gets the first answer");
                }
                assert_eq!(runs.load(SeqCst), 1);
            }

            /// A body that blocks its thread (synchronous work) for four
            /// times its lease keeps it: the renewal runs on a task of its
            /// own, on another worker. Duplicates all the while are told it
            /// is in progress; none runs the body.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_body_that_blocks_its_thread_for_four_leases_is_never_joined() {
                let store: Store = store!();
                let (scope, id) = ("tests.lease.blocking", unique("blocking"));
                let lease = Duration::from_secs(1);
                let runs = Arc::new(AtomicUsize::new(0));
                let run = |runs: Arc<AtomicUsize>, store: Store, id: String| async move {
                    let claim = idem::Guard::new(scope).key(&id).lease::<u64>(&*store, lease).await?;
                    let idem::Claim::Run(ticket) = claim else { return Ok((None, 0)) };
                    let fence = ticket
                        .run(async {
                            runs.fetch_add(1, SeqCst);
                            std::thread::sleep(lease * 4); // never yields
                            let lease = idem::lease::current().expect("inside a lease");
                            assert_eq!(lease.lost(), None, "the lease held all along");
                            Ok::<_, Error>(lease.fence as u64)
                        })
                        .await?;
                    Ok::<_, Error>((Some(fence), fence))
                };
                let first = tokio::spawn(run(runs.clone(), store.clone(), id.clone()));
                while runs.load(SeqCst) == 0 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let mut refused = 0;
                while !first.is_finished() {
                    match run(runs.clone(), store.clone(), id.clone()).await {
                        Err(Error::InProgress { .. }) => refused += 1,
                        // The first call completed between the check and the claim.
                        Ok((None, _)) if first.is_finished() => {}
                        other => panic!("a duplicate while the first call ran: {other:?}"),
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                let (ran, fence) = first.await.unwrap().unwrap();
                assert!(ran.is_some() && refused >= 10, "{ran:?} {refused}");
                assert_eq!(runs.load(SeqCst), 1, "only the first call ran the body");
                let replay = idem::Guard::new(scope).key(&id).lease::<u64>(&*store, lease).await.unwrap();
                assert!(matches!(replay, idem::Claim::Replay(f) if f == fence), "{replay:?}");
            }

            /// The lease cannot be renewed (the store out of reach for its
            /// renewals) while the body blocks its thread past the lease: a
            /// duplicate takes the record over and runs. The late holder
            /// learns it before its next outside write, its completion is
            /// refused, and its caller is told it was taken over.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_late_holder_whose_renewals_failed_is_refused_and_told_it_was_taken_over() {
                let inner: Store = store!();
                let faults = Faults::new();
                faults.inject(Op::Extend, Fault::Fail);
                let store = Arc::new(faults.wrap(inner.clone()));
                let pause = slack(&*inner);
                let (scope, id) = ("tests.lease.cut", unique("cut"));
                let lease = Duration::from_millis(600);
                let first = {
                    let (store, id) = (store.clone(), id.clone());
                    tokio::spawn(async move {
                        let claim = idem::Guard::new(scope).key(&id).lease::<String>(&*store, lease).await?;
                        let idem::Claim::Run(ticket) = claim else { panic!("the first call runs") };
                        let mut seen = None;
                        let mut watcher = None;
                        let done = ticket
                            .run(async {
                                // Work the body runs on a task of its own hears it too.
                                let lease = idem::lease::current().expect("inside a lease");
                                watcher = Some(tokio::spawn(async move { lease.until_lost().await }));
                                std::thread::sleep(Duration::from_millis(2000) + pause);
                                // Before its next outside write, the body asks.
                                seen = idem::lease::current().expect("inside a lease").lost();
                                Ok::<_, Error>("first".to_owned())
                            })
                            .await;
                        // It hears the latest word: not renewed, or (by the time it
                        // looks) the refused completion's.
                        let heard = watcher.expect("spawned").await.unwrap();
                        assert!(matches!(heard, idem::LostLease::NotRenewed | idem::LostLease::TakenOver), "{heard:?}");
                        Ok::<_, Error>((done, seen))
                    })
                };
                tokio::time::sleep(Duration::from_millis(900) + pause).await;
                let claim = idem::Guard::new(scope).key(&id).lease::<String>(&*inner, lease).await.unwrap();
                let idem::Claim::Run(ticket) = claim else { panic!("the lease passed: taken over") };
                assert_eq!(ticket.run(async { Ok::<_, Error>("second".to_owned()) }).await.unwrap(), "second");
                let (done, seen) = first.await.unwrap().unwrap();
                assert_eq!(seen, Some(idem::LostLease::NotRenewed), "the body learned it had lost the lease");
                match done {
                    Err(Error::LeaseLost { why: idem::LostLease::TakenOver, .. }) => {}
                    other => panic!("the late completion must be refused as taken over: {other:?}"),
                }
                let replay = idem::Guard::new(scope).key(&id).lease::<String>(&*inner, lease).await.unwrap();
                assert!(matches!(&replay, idem::Claim::Replay(a) if a == "second"), "{replay:?}");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_runtime_renews_the_lease_of_long_work() {
                let store: Store = store!();
                let id = unique("long");
                let runs = Arc::new(AtomicUsize::new(0));
                let first = {
                    let (store, id, runs) = (store.clone(), id.clone(), runs.clone());
                    tokio::spawn(async move { long_work(&*store, &id, &runs).await })
                };
                // Twice the lease later the first call still holds it.
                tokio::time::sleep(Duration::from_millis(2500)).await;
                let during = long_work(&*store, &id, &runs).await;
                assert!(matches!(during, Err(AppError::Idem(Error::InProgress { .. }))), "{during:?}");
                first.await.unwrap().unwrap();
                long_work(&*store, &id, &runs).await.unwrap();
                assert_eq!(runs.load(SeqCst), 1);
            }
        }
    };
}

lease_suite! {
    mod memory;
    store = Some(Arc::new(idem::store::MemoryStore::new()) as Store);
}

lease_suite! {
    mod sqlite;
    store = common::sqlite().await.map(|p| Arc::new(idem::store::SqlStore::new(p)) as Store);
}

lease_suite! {
    mod postgres;
    store = common::postgres().await.map(|p| Arc::new(idem::store::SqlStore::new(p)) as Store);
}

lease_suite! {
    mod mysql;
    store = common::mysql().await.map(|p| Arc::new(idem::store::SqlStore::new(p)) as Store);
}

lease_suite! {
    mod redis;
    store = common::redis().await.map(|c| Arc::new(idem::store::RedisStore::new(c, format!("{}:", unique("idem-test")))) as Store);
}

// Redis Cluster (`IDEM_REDIS_CLUSTER_URLS`), through a `ClusterConnection`:
// every script call goes to the master of its key's slot.
lease_suite! {
    mod redis_cluster;
    store = common::redis_cluster().await.map(|c| Arc::new(idem::store::RedisStore::new(c, format!("{}:", unique("idem-test")))) as Store);
}

// A 3-member etcd cluster the test binary starts (tests/support/etcd_cluster.rs).
lease_suite! {
    mod etcd;
    store = common::etcd_cluster::store().await.map(|s| Arc::new(s) as Store);
}

// The whole suite through a router over two real databases: each key's
// operations all reach one of them.
lease_suite! {
    mod routed;
    store = match (common::postgres().await, common::mysql().await) {
        (Some(pg), Some(my)) => Some(Arc::new(idem::store::Routed::hashed(vec![
            Arc::new(idem::store::SqlStore::new(pg)) as Store,
            Arc::new(idem::store::SqlStore::new(my)) as Store,
        ])) as Store),
        _ => None,
    };
}

/// A key's record lives on the shard its route names, and only there; a
/// route to no shard is a clear, non-retryable error.
#[tokio::test]
async fn a_routed_record_lives_on_the_shard_of_its_key() {
    let (Some(pg), Some(my)) = (common::postgres().await, common::mysql().await) else { return };
    let shards: Vec<Store> = vec![Arc::new(idem::store::SqlStore::new(pg)), Arc::new(idem::store::SqlStore::new(my))];
    let routed = idem::store::Routed::new(shards.clone(), |_, key| {
        if key.starts_with("EU-") {
            0
        } else if key.starts_with("US-") {
            1
        } else {
            7
        }
    });
    let lease = Duration::from_secs(5);
    let scope = "tests.lease.routed";
    for (key, home, other) in [(unique("EU-"), 0, 1), (unique("US-"), 1, 0)] {
        let LeaseClaim::Acquired { fence, .. } = routed.claim(&request(scope, &key, "w", lease)).await.unwrap() else {
            panic!("claim {key}")
        };
        // Held on its home shard; the other one has never heard of it.
        assert!(matches!(
            shards[home].claim(&request(scope, &key, "x", lease)).await.unwrap(),
            LeaseClaim::Busy { .. }
        ));
        let LeaseClaim::Acquired { fence: probe, .. } =
            shards[other].claim(&request(scope, &key, "p", lease)).await.unwrap()
        else {
            panic!("{key} is on shard {other} too")
        };
        assert!(shards[other].release(&holder(scope, &key, "p", probe, lease)).await.unwrap());
        assert!(routed.complete(&holder(scope, &key, "w", fence, lease), Some("\"done\"")).await.unwrap());
        assert_eq!(
            shards[home].claim(&request(scope, &key, "y", lease)).await.unwrap(),
            LeaseClaim::Done { response: Some("\"done\"".into()) }
        );
    }
    let err = routed.claim(&request(scope, "JP-1", "w", lease)).await.unwrap_err();
    assert!(err.to_string().contains("shard 7, but there are 2"), "{err}");
    assert!(!err.is_retryable());
}

lease_suite! {
    mod redis_unbatched;
    store = common::redis().await.map(|c| {
        Arc::new(idem::store::RedisStore::new(c, format!("{}:", unique("idem-test"))).batching(false)) as Store
    });
}

/// The Redis store's batching: under load, operations queued behind the
/// calls in flight go out together, and each caller gets its own answer.
mod redis_batching {
    use super::*;
    use idem::store::RedisStore;

    #[idempotent(key = "id", strategy = "lease", scope = "tests.lease.batch", store = "store")]
    async fn counted(store: &dyn LeaseStore, id: &str, n: usize, runs: &AtomicUsize) -> Result<usize, AppError> {
        runs.fetch_add(1, SeqCst);
        Ok(n)
    }

    async fn store() -> Option<(RedisStore, ::redis::aio::ConnectionManager)> {
        let conn = common::redis().await?;
        Some((RedisStore::new(conn.clone(), format!("{}:", unique("idem-batch"))), conn))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn many_keys_at_once_each_run_once_and_replay_their_own_answer() {
        let Some((store, _)) = store().await else { return };
        let store = Arc::new(store);
        let runs = Arc::new(AtomicUsize::new(0));
        let ids: Vec<String> = (0..300).map(|i| unique(&format!("b{i}-"))).collect();
        let calls = |ids: Vec<String>| {
            let (store, runs) = (store.clone(), runs.clone());
            async move {
                let tasks: Vec<_> = ids
                    .into_iter()
                    .enumerate()
                    .map(|(n, id)| {
                        let (store, runs) = (store.clone(), runs.clone());
                        tokio::spawn(async move { counted(&*store, &id, n, &runs).await })
                    })
                    .collect();
                let mut answers = Vec::new();
                for t in tasks {
                    answers.push(t.await.unwrap().unwrap());
                }
                answers
            }
        };
        let first = calls(ids.clone()).await;
        assert_eq!(first, (0..300).collect::<Vec<_>>(), "every call answered with its own value");
        assert_eq!(runs.load(SeqCst), 300);
        let again = calls(ids.clone()).await;
        assert_eq!(again, first, "replays carry each key's own stored answer");
        assert_eq!(runs.load(SeqCst), 300, "no body ran twice");
        let stats = store.stats();
        assert_eq!(stats.operations, 900, "300 claims, 300 completions, 300 replays: {stats:?}");
        assert!(stats.script_calls < stats.operations, "300 concurrent callers were batched: {stats:?}");
    }

    #[tokio::test]
    async fn a_refused_completion_puts_the_record_back_as_it_was() {
        let Some((store, mut conn)) = store().await else { return };
        let (scope, key) = ("tests.lease.putback", unique("putback"));
        let (short, hour) = (Duration::from_millis(100), Duration::from_secs(3600));
        let req = |owner| LeaseRequest { scope, key: &key, fingerprint: None, owner, lease: short, retention: hour };
        let held = |owner, fence, retention| HeldLease { retention, ..holder(scope, &key, owner, fence, short) };
        let LeaseClaim::Acquired { fence: stale, .. } = store.claim(&req("stale")).await.unwrap() else {
            panic!("claim")
        };
        tokio::time::sleep(Duration::from_millis(250)).await;
        let LeaseClaim::Acquired { fence, reclaimed: true } = store.claim(&req("taker")).await.unwrap() else {
            panic!("take-over")
        };
        assert!(store.complete(&held("taker", fence, hour), Some("1")).await.unwrap());
        let record = store.key(RecordKind::Lease, scope, &key);
        let get = ::redis::cmd("GET").arg(&record).clone();
        let before: String = get.query_async(&mut conn).await.unwrap();
        // The stale holder comes back, configured with a shorter retention:
        // refused, and the taker's answer keeps its content and its retention.
        assert!(!store.complete(&held("stale", stale, Duration::from_secs(1)), Some("2")).await.unwrap());
        let after: String = get.query_async(&mut conn).await.unwrap();
        assert_eq!(before, after);
        let ttl: i64 = ::redis::cmd("PTTL").arg(&record).query_async(&mut conn).await.unwrap();
        assert!(ttl > 3_000_000, "retention kept: {ttl} ms left");
        let _: () = ::redis::cmd("DEL").arg(&record).query_async(&mut conn).await.unwrap();
    }

    #[tokio::test]
    async fn an_owner_id_with_a_bar_is_refused_before_anything_is_written() {
        let Some((store, mut conn)) = store().await else { return };
        let (scope, key) = ("tests.lease.bar", unique("bar"));
        let req = LeaseRequest {
            scope,
            key: &key,
            fingerprint: None,
            owner: "a|b",
            lease: Duration::from_secs(5),
            retention: Duration::from_secs(60),
        };
        let err = store.claim(&req).await.unwrap_err().to_string();
        assert!(err.contains("owner id \"a|b\""), "{err}");
        let n: i64 =
            ::redis::cmd("EXISTS").arg(store.key(RecordKind::Lease, scope, &key)).query_async(&mut conn).await.unwrap();
        assert_eq!(n, 0);
    }

    #[tokio::test]
    async fn a_key_holding_something_else_is_an_error_not_a_record() {
        let Some((store, mut conn)) = store().await else { return };
        let (scope, key) = ("tests.lease.garbage", unique("garbage"));
        let record = store.key(RecordKind::Lease, scope, &key);
        let _: () = ::redis::cmd("SET").arg(&record).arg("not ours").query_async(&mut conn).await.unwrap();
        let req = LeaseRequest {
            scope,
            key: &key,
            fingerprint: None,
            owner: "w",
            lease: Duration::from_secs(5),
            retention: Duration::from_secs(60),
        };
        let err = store.claim(&req).await.unwrap_err().to_string();
        assert!(err.contains("not an idem lease record"), "{err}");
        let left: String = ::redis::cmd("GET").arg(&record).query_async(&mut conn).await.unwrap();
        assert_eq!(left, "not ours", "nothing written over it");
        let _: () = ::redis::cmd("DEL").arg(&record).query_async(&mut conn).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_operation_that_fails_on_the_server_fails_alone() {
        let Some((store, mut conn)) = store().await else { return };
        let store = Arc::new(store);
        let poisoned = unique("poisoned");
        // A hash where the record should be: GET on it is a WRONGTYPE error.
        let key = store.key(RecordKind::Lease, "tests.lease.batch", &poisoned);
        let _: () = ::redis::cmd("HSET").arg(&key).arg("f").arg("v").query_async(&mut conn).await.unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        let mut ids: Vec<String> = (0..100).map(|i| unique(&format!("p{i}-"))).collect();
        ids.insert(50, poisoned.clone());
        let tasks: Vec<_> = ids
            .iter()
            .cloned()
            .map(|id| {
                let (store, runs) = (store.clone(), runs.clone());
                tokio::spawn(async move { (counted(&*store, &id, 7, &runs).await, id) })
            })
            .collect();
        let mut failed = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                (Ok(n), _) => assert_eq!(n, 7),
                (Err(e), id) => failed.push((id, e.to_string())),
            }
        }
        assert_eq!(failed.len(), 1, "only the poisoned key fails: {failed:?}");
        assert_eq!(failed[0].0, poisoned);
        assert!(failed[0].1.contains("WRONGTYPE"), "the error names the server's complaint: {}", failed[0].1);
        assert_eq!(runs.load(SeqCst), 100, "every other body ran");
        let _: () = ::redis::cmd("DEL").arg(&key).query_async(&mut conn).await.unwrap();
    }
}
