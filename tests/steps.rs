//! Recorded steps inside a lease body (`LeaseTicket::run_steps`), on every
//! lease store: memory, SQLite, PostgreSQL, MariaDB, Redis, Redis Cluster
//! and etcd. An outside
//! system that counts its calls per step key shows each recorded step
//! called once, a resumed call starting at its first unfinished step, and
//! a stale owner refused. A gateway that does not deduplicate shows a step
//! in flight at a crash charged once: checked by the take-over, or, at
//! most once, in doubt until resolved.

use idem_test_support as common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use common::unique;
use idem::lease::{
    HeldLease, LeaseClaim, LeaseRequest, LeaseStore, NewStep, Resolve, StepKey, StepLog, StepOutcome, Steps,
};
use idem::{Claim, Error, Guard};

type Store = Arc<dyn LeaseStore>;

/// The bank: deduplicates on the step key it is given, and counts every
/// call it received per key.
#[derive(Default)]
struct Bank {
    calls: Mutex<HashMap<String, usize>>,
    charges: AtomicUsize,
}

impl Bank {
    fn charge(&self, key: &StepKey, cents: u64) -> u64 {
        let mut calls = self.calls.lock().unwrap();
        let n = calls.entry(key.to_string()).or_default();
        *n += 1;
        if *n == 1 {
            self.charges.fetch_add(1, SeqCst);
        }
        cents
    }

    fn calls(&self, key: &StepKey) -> usize {
        self.calls.lock().unwrap().get(key.as_str()).copied().unwrap_or(0)
    }
}

/// reserve -> charge -> ledger, each a step; `fail_at` makes that step
/// fail once it ran (after the bank was called, for `charge`).
async fn transfer(steps: Steps<'_>, bank: &Bank, runs: &[AtomicUsize; 3], fail_at: Option<&str>) -> Result<u64, Error> {
    let fail = |name: &str| fail_at == Some(name);
    let held = steps
        .run("reserve", |_| async {
            runs[0].fetch_add(1, SeqCst);
            Ok::<_, Error>(500u64)
        })
        .await?;
    let charged = steps
        .run("charge", |key| async move {
            runs[1].fetch_add(1, SeqCst);
            let charged = bank.charge(&key, held);
            if fail("charge") {
                return Err(Error::Store { store: "bank", source: "timed out after the charge".into() });
            }
            Ok(charged)
        })
        .await?;
    steps
        .run("ledger", |_| async {
            runs[2].fetch_add(1, SeqCst);
            Ok::<_, Error>(())
        })
        .await?;
    Ok(charged)
}

async fn call(
    store: &dyn LeaseStore,
    id: &str,
    lease: Duration,
    bank: &Bank,
    runs: &[AtomicUsize; 3],
    fail_at: Option<&str>,
) -> Result<u64, Error> {
    match Guard::new("tests.steps.transfer").key(id).lease::<u64>(store, lease).await? {
        Claim::Replay(charged) => Ok(charged),
        Claim::Run(ticket) => ticket.run_steps(|steps| transfer(steps, bank, runs, fail_at)).await,
    }
}

fn counts(runs: &[AtomicUsize; 3]) -> [usize; 3] {
    [runs[0].load(SeqCst), runs[1].load(SeqCst), runs[2].load(SeqCst)]
}

fn charge_key(id: &str) -> StepKey {
    // The key the body got for `charge`: Steps::key of the same call.
    let scope = idem::key::stored_scope("tests.steps.transfer");
    let key = idem::Key::new(id).unwrap();
    steps_key(&scope, key.as_str(), "charge")
}

/// A step key as `Steps::key` makes it, for a store-level check.
fn steps_key(scope: &str, key: &str, name: &str) -> StepKey {
    idem::lease::StepKey::for_step(scope, key, name)
}

/// How much later than its length a lease may end on `store`: nothing, but
/// on etcd, whose leases count whole seconds and end when the leader's
/// check (every 500 ms) finds them expired, 1.5 s.
fn slack(store: &dyn LeaseStore) -> Duration {
    if store.kind() == "etcd" { Duration::from_millis(1500) } else { Duration::ZERO }
}

macro_rules! steps_suite {
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

            /// The body fails after the bank charged: its retry replays
            /// `reserve` and `charge` from their records and runs `ledger`;
            /// the bank was called once.
            #[tokio::test]
            async fn a_failed_body_is_retried_from_its_first_unfinished_step() {
                let store: Store = store!();
                let (id, bank, runs) = (unique("fail"), Bank::default(), Default::default());
                let lease = Duration::from_secs(5);
                let first = call(&*store, &id, lease, &bank, &runs, Some("charge")).await;
                assert!(matches!(first, Err(Error::Store { .. })), "{first:?}");
                assert_eq!(counts(&runs), [1, 1, 0], "reserve recorded; charge ran and failed");
                // The charge failed after the bank took it: not recorded, so
                // it runs again, with the same key (the bank deduplicates).
                assert_eq!(call(&*store, &id, lease, &bank, &runs, None).await.unwrap(), 500);
                assert_eq!(counts(&runs), [1, 2, 1], "reserve replayed, charge re-sent, ledger ran");
                assert_eq!(bank.calls(&charge_key(&id)), 2, "the in-flight step re-sent with its key");
                assert_eq!(bank.charges.load(SeqCst), 1, "charged once");
                // Completed: the answer replays; nothing runs.
                assert_eq!(call(&*store, &id, lease, &bank, &runs, None).await.unwrap(), 500);
                assert_eq!(counts(&runs), [1, 2, 1]);
                let scope = idem::key::stored_scope("tests.steps.transfer");
                assert!(
                    store.steps(&scope, idem::Key::new(&id).unwrap().as_str()).await.unwrap() == StepLog::default(),
                    "forgotten once completed"
                );
            }

            /// The answer lands, and each reply of the store is lost: the
            /// completion without the answer that follows leaves it, the
            /// steps are forgotten, and a retry replays the answer.
            #[tokio::test]
            async fn a_completion_whose_replies_are_lost_replays_its_answer() {
                use idem::testing::{Fault, Faults, Op};
                let inner: Store = store!();
                let faults = Faults::new();
                faults.inject_when(Op::Complete, Fault::DropAfterWrite, |call| call.response.is_some());
                let store = faults.wrap(inner);
                let (id, bank, runs) = (unique("reply-lost"), Bank::default(), Default::default());
                let lease = Duration::from_secs(5);
                assert_eq!(call(&store, &id, lease, &bank, &runs, None).await.unwrap(), 500);
                assert_eq!(call(&store, &id, lease, &bank, &runs, None).await.unwrap(), 500, "replayed");
                assert_eq!(counts(&runs), [1, 1, 1], "no step ran again");
                let scope = idem::key::stored_scope("tests.steps.transfer");
                let key = idem::Key::new(&id).unwrap();
                assert!(store.steps(&scope, key.as_str()).await.unwrap().recorded.is_empty(), "forgotten once completed");
            }

            /// A worker whose future is dropped after `charge` (a crash
            /// mid-body): once its lease passes, the next call takes over,
            /// replays `reserve` and `charge`, and runs `ledger` alone.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_take_over_resumes_where_the_dead_worker_stopped() {
                let store: Store = store!();
                let (id, bank, runs) = (unique("crash"), Bank::default(), Default::default());
                let lease = Duration::from_millis(600);
                let claim = Guard::new("tests.steps.transfer").key(&id).lease::<u64>(&*store, lease).await.unwrap();
                let Claim::Run(ticket) = claim else { panic!("first call") };
                let dying = ticket.run_steps(|steps| async { transfer_until_ledger(steps, &bank, &runs).await });
                // The worker dies inside `ledger`, after `charge` was recorded.
                assert!(tokio::time::timeout(Duration::from_millis(300), dying).await.is_err());
                assert_eq!(counts(&runs), [1, 1, 1]);
                let busy = call(&*store, &id, lease, &bank, &runs, None).await;
                assert!(matches!(busy, Err(Error::InProgress { .. })), "{busy:?}");
                tokio::time::sleep(lease + Duration::from_millis(200) + slack(&*store)).await;
                assert_eq!(call(&*store, &id, lease, &bank, &runs, None).await.unwrap(), 500);
                assert_eq!(counts(&runs), [1, 1, 2], "resumed at ledger, the step in flight");
                assert_eq!(bank.calls(&charge_key(&id)), 1, "the recorded charge was not sent again");
            }

            /// A worker whose lease was taken over can no longer record a
            /// step; the new owner can.
            #[tokio::test]
            async fn a_stale_owner_cannot_record_a_step() {
                let store: Store = store!();
                let (scope, key) = (unique("stale-scope"), unique("stale"));
                let lease = Duration::from_millis(200);
                let req = |owner| LeaseRequest {
                    scope: &scope,
                    key: &key,
                    fingerprint: None,
                    owner,
                    lease,
                    retention: Duration::from_secs(60),
                };
                let Ok(LeaseClaim::Acquired { fence: old, .. }) = store.claim(&req("old")).await else { panic!() };
                tokio::time::sleep(Duration::from_millis(300) + slack(&*store)).await;
                let held = |owner, fence| HeldLease {
                    scope: &scope,
                    key: &key,
                    owner,
                    fingerprint: None,
                    fence,
                    lease,
                    retention: Duration::from_secs(60),
                };
                let step = NewStep { number: 0, name: "charge", result: "1" };
                assert!(!store.record_step(&held("old", old), &step).await.unwrap(), "its lease passed");
                let Ok(LeaseClaim::Acquired { fence: new, reclaimed: true }) = store.claim(&req("new")).await else {
                    panic!()
                };
                assert!(!store.record_step(&held("old", old), &step).await.unwrap(), "taken over: fenced out");
                assert!(store.record_step(&held("new", new), &step).await.unwrap());
                let later = NewStep { number: 2, name: "ledger", result: "null" };
                assert!(!store.record_step(&held("new", new), &later).await.unwrap(), "only the next step");
                let steps = store.steps(&scope, &key).await.unwrap().recorded;
                assert_eq!(steps.len(), 1);
                assert_eq!((steps[0].name.as_str(), steps[0].result.as_str()), ("charge", "1"));
                store.forget_steps(&scope, &key).await.unwrap();
            }

            /// A deploy reordered the steps: the resumed call is refused at
            /// the first step that differs, nothing replayed there.
            #[tokio::test]
            async fn steps_changed_between_deploys_are_refused() {
                let store: Store = store!();
                let (id, bank, runs) = (unique("deploy"), Bank::default(), Default::default());
                let lease = Duration::from_secs(5);
                assert!(call(&*store, &id, lease, &bank, &runs, Some("charge")).await.is_err());
                let claim = Guard::new("tests.steps.transfer").key(&id).lease::<u64>(&*store, lease).await.unwrap();
                let Claim::Run(ticket) = claim else { panic!("a retry runs") };
                let changed = ticket
                    .run_steps(|steps| async move { steps.run("charge", |_| async { Ok::<u64, Error>(1) }).await })
                    .await;
                let Err(Error::StepsChanged { position, recorded, found, .. }) = changed else { panic!("{changed:?}") };
                assert_eq!((position, recorded.as_str(), found.as_str()), (0, "reserve", "charge"));
            }

            /// 100 duplicates at once: one runs the steps, each step once.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_hundred_concurrent_duplicates_run_each_step_once() {
                let store: Store = store!();
                let (id, bank, runs) = (unique("race"), Bank::default(), Default::default());
                let lease = Duration::from_secs(5);
                let report = idem::testing::Duplicates::new()
                    .concurrent(100)
                    .sequential(2)
                    .fire(|_| async {
                        let claim = Guard::new("tests.steps.transfer").key(&id);
                        match claim.lease_or_wait::<u64>(&*store, lease, Duration::from_secs(10)).await? {
                            Claim::Replay(charged) => Ok(charged),
                            Claim::Run(ticket) => ticket.run_steps(|steps| transfer(steps, &bank, &runs, None)).await,
                        }
                    })
                    .await;
                report.assert_same_answers();
                assert_eq!(counts(&runs), [1, 1, 1]);
                assert_eq!(bank.charges.load(SeqCst), 1);
            }

            /// The worker stopped after the gateway charged, before the
            /// charge was recorded: the take-over asks the gateway, records
            /// its answer and goes on; charged once.
            #[tokio::test]
            async fn a_checked_step_the_gateway_did_is_recorded_from_the_check() {
                let store: Store = store!();
                let (id, gateway) = (unique("checked-done"), Gateway::default());
                pay_and_stop(&*store, &id, &gateway, Charge::Checked, Stop::AfterTheCharge).await;
                assert_eq!(pay_attempt(&*store, &id, &gateway, Charge::Checked).await.unwrap(), 500);
                assert_eq!((gateway.charges(&pay_key(&id)), gateway.checks.load(SeqCst)), (1, 1));
                assert_eq!(pay_attempt(&*store, &id, &gateway, Charge::Checked).await.unwrap(), 500, "replayed");
                assert_eq!((gateway.charges(&pay_key(&id)), gateway.checks.load(SeqCst)), (1, 1));
            }

            /// The worker stopped in the charge before it reached the
            /// gateway: the check says not done, and the take-over charges,
            /// once. An attempt with no crash behind it asks nothing.
            #[tokio::test]
            async fn a_checked_step_the_gateway_did_not_do_is_run_once() {
                let store: Store = store!();
                let (id, gateway) = (unique("checked-not-done"), Gateway::default());
                pay_and_stop(&*store, &id, &gateway, Charge::Checked, Stop::BeforeTheCharge).await;
                assert_eq!(pay_attempt(&*store, &id, &gateway, Charge::Checked).await.unwrap(), 500);
                assert_eq!((gateway.charges(&pay_key(&id)), gateway.checks.load(SeqCst)), (1, 1));
                let (other, fresh) = (unique("checked-plain"), Gateway::default());
                assert_eq!(pay_attempt(&*store, &other, &fresh, Charge::Checked).await.unwrap(), 500);
                assert_eq!((fresh.charges(&pay_key(&other)), fresh.checks.load(SeqCst)), (1, 0));
            }

            /// An at-most-once charge in flight at a crash: every attempt
            /// stops in doubt, naming the step's key, and charges nothing;
            /// nothing is resolved while a worker holds the call; resolved
            /// "done" with the gateway's result, the call completes with it.
            #[tokio::test]
            async fn an_at_most_once_step_in_flight_is_in_doubt_until_resolved_done() {
                let store: Store = store!();
                let (id, gateway) = (unique("once-done"), Gateway::default());
                let scope = idem::key::stored_scope(PAY);
                let key = idem::Key::new(&id).unwrap();
                let claim = Guard::new(PAY).key(&id).lease::<u64>(&*store, Duration::from_secs(30)).await.unwrap();
                let Claim::Run(live) = claim else { panic!("a fresh key") };
                let held = store.resolve_step(&scope, key.as_str(), "charge", StepOutcome::NotDone).await.unwrap();
                assert!(matches!(held, Resolve::Held { .. }), "{held:?}");
                live.run(async { Err::<u64, Error>(Error::TokenRejected) }).await.unwrap_err();

                pay_and_stop(&*store, &id, &gateway, Charge::AtMostOnce, Stop::AfterTheCharge).await;
                for _ in 0..2 {
                    let doubt = pay_attempt(&*store, &id, &gateway, Charge::AtMostOnce).await;
                    let Err(Error::InDoubt { step, step_key, .. }) = doubt else { panic!("{doubt:?}") };
                    assert_eq!((step.as_str(), step_key.as_str()), ("charge", pay_key(&id).as_str()));
                }
                assert_eq!(gateway.charges(&pay_key(&id)), 1, "charged by the stopped worker alone");
                let log = store.steps(&scope, key.as_str()).await.unwrap();
                assert_eq!(log.started.map(|s| (s.number, s.name)), Some((1, "charge".to_owned())));

                let other = store.resolve_step(&scope, key.as_str(), "quote", StepOutcome::NotDone).await.unwrap();
                assert!(matches!(other, Resolve::NotInFlight(_)), "{other:?}");
                let done = StepOutcome::Done { result: "500" };
                let resolved = store.resolve_step(&scope, key.as_str(), "charge", done).await.unwrap();
                assert!(matches!(&resolved, Resolve::Resolved(log) if log.recorded.len() == 1), "{resolved:?}");
                let again = store.resolve_step(&scope, key.as_str(), "charge", done).await.unwrap();
                assert!(matches!(again, Resolve::NotInFlight(_)), "resolved once: {again:?}");
                assert_eq!(pay_attempt(&*store, &id, &gateway, Charge::AtMostOnce).await.unwrap(), 500);
                assert_eq!(gateway.charges(&pay_key(&id)), 1);
            }

            /// An at-most-once charge in flight before it reached the
            /// gateway: in doubt; resolved "not done", the next attempt
            /// charges, once.
            #[tokio::test]
            async fn an_at_most_once_step_resolved_not_done_runs_once() {
                let store: Store = store!();
                let (id, gateway) = (unique("once-not-done"), Gateway::default());
                pay_and_stop(&*store, &id, &gateway, Charge::AtMostOnce, Stop::BeforeTheCharge).await;
                let doubt = pay_attempt(&*store, &id, &gateway, Charge::AtMostOnce).await;
                assert!(matches!(doubt, Err(Error::InDoubt { .. })), "{doubt:?}");
                let (scope, key) = (idem::key::stored_scope(PAY), idem::Key::new(&id).unwrap());
                let resolved = store.resolve_step(&scope, key.as_str(), "charge", StepOutcome::NotDone).await.unwrap();
                assert!(matches!(resolved, Resolve::Resolved(_)), "{resolved:?}");
                assert_eq!(pay_attempt(&*store, &id, &gateway, Charge::AtMostOnce).await.unwrap(), 500);
                assert_eq!(gateway.charges(&pay_key(&id)), 1);
            }

            /// An at-most-once step whose work returned `Err` said it did
            /// not act: its mark goes, and the retry runs it without doubt.
            #[tokio::test]
            async fn an_at_most_once_step_that_failed_runs_again() {
                let store: Store = store!();
                let (id, tries) = (unique("once-failed"), &AtomicUsize::new(0));
                let attempt = || async {
                    match Guard::new(PAY).key(&id).lease::<u64>(&*store, PAY_LEASE).await? {
                        Claim::Replay(charged) => Ok(charged),
                        Claim::Run(ticket) => {
                            ticket
                                .run_steps(|steps| async move {
                                    steps
                                        .run_at_most_once("charge", |_| async {
                                            match tries.fetch_add(1, SeqCst) {
                                                0 => Err(Error::Store { store: "gateway", source: "refused".into() }),
                                                _ => Ok(500u64),
                                            }
                                        })
                                        .await
                                })
                                .await
                        }
                    }
                };
                assert!(matches!(attempt().await, Err(Error::Store { .. })));
                assert_eq!(attempt().await.unwrap(), 500);
                assert_eq!(tries.load(SeqCst), 2);
            }

            /// A name used twice in one body is refused before it runs.
            #[tokio::test]
            async fn a_step_name_used_twice_is_refused() {
                let store: Store = store!();
                let claim =
                    Guard::new("tests.steps.twice").key(&unique("twice")).lease::<u8>(&*store, Duration::from_secs(5));
                let Claim::Run(ticket) = claim.await.unwrap() else { panic!() };
                let ran = &AtomicUsize::new(0);
                let twice = ticket
                    .run_steps(|steps| async move {
                        steps.run("notify", |_| async { Ok::<u8, Error>(1) }).await?;
                        steps.run("notify", |_| async { Ok::<u8, Error>(ran.fetch_add(1, SeqCst) as u8) }).await
                    })
                    .await;
                let Err(Error::Step { step, reason, .. }) = twice else { panic!("{twice:?}") };
                assert_eq!(step, "notify");
                assert!(reason.contains("twice"), "{reason}");
                assert_eq!(ran.load(SeqCst), 0);
            }
        }
    };
}

/// The scope of the calls to the gateway.
const PAY: &str = "tests.steps.pay";

/// A payment gateway that does not deduplicate: every request with a key
/// charges again (it counts charges per key), but it can be asked whether
/// a key was charged.
#[derive(Default)]
struct Gateway {
    charges: Mutex<HashMap<String, usize>>,
    checks: AtomicUsize,
}

impl Gateway {
    fn charge(&self, key: &StepKey) -> u64 {
        *self.charges.lock().unwrap().entry(key.to_string()).or_default() += 1;
        500
    }

    fn find(&self, key: &StepKey) -> Option<u64> {
        self.checks.fetch_add(1, SeqCst);
        (self.charges(key) > 0).then_some(500)
    }

    fn charges(&self, key: &StepKey) -> usize {
        self.charges.lock().unwrap().get(key.as_str()).copied().unwrap_or(0)
    }
}

/// How the charge step declares itself.
#[derive(Clone, Copy, Debug)]
enum Charge {
    /// `run_checked`, asking the gateway.
    Checked,
    /// `run_at_most_once`.
    AtMostOnce,
}

/// Where the worker of an attempt stops for good (its body dropped), if
/// it does: in `charge`, before or after the gateway charged.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stop {
    Never,
    BeforeTheCharge,
    AfterTheCharge,
}

/// quote -> charge (the gateway) -> receipt, answering the charge.
async fn pay(steps: &Steps<'_>, gateway: &Gateway, charge: Charge, stop: Stop, stopped: &Notify) -> Result<u64, Error> {
    let stand = |at: Stop| async move {
        if stop == at {
            stopped.notify_one();
            std::future::pending::<()>().await;
        }
    };
    let cents = steps.run("quote", |_| async { Ok::<_, Error>(500u64) }).await?;
    let send = |key: StepKey| async move {
        stand(Stop::BeforeTheCharge).await;
        assert_eq!(gateway.charge(&key), cents);
        stand(Stop::AfterTheCharge).await;
        Ok::<_, Error>(cents)
    };
    let charged = match charge {
        Charge::Checked => steps.run_checked("charge", |key| async move { Ok(gateway.find(&key)) }, send).await?,
        Charge::AtMostOnce => steps.run_at_most_once("charge", send).await?,
    };
    steps.run("receipt", |_| async { Ok::<_, Error>(()) }).await?;
    Ok(charged)
}

/// One attempt of the payment `id`.
async fn pay_attempt(store: &dyn LeaseStore, id: &str, gateway: &Gateway, charge: Charge) -> Result<u64, Error> {
    match Guard::new(PAY).key(id).lease::<u64>(store, PAY_LEASE).await? {
        Claim::Replay(charged) => Ok(charged),
        Claim::Run(ticket) => {
            ticket
                .run_steps(|steps| async move { pay(&steps, gateway, charge, Stop::Never, &Notify::new()).await })
                .await
        }
    }
}

/// An attempt of the payment `id` whose worker stops at `stop` (its body
/// dropped there, its record left as a crash leaves it), then the wait
/// for its lease to pass.
async fn pay_and_stop(store: &dyn LeaseStore, id: &str, gateway: &Gateway, charge: Charge, stop: Stop) {
    let claim = Guard::new(PAY).key(id).lease::<u64>(store, PAY_LEASE).await.unwrap();
    let Claim::Run(ticket) = claim else { panic!("a fresh key") };
    let stopped = &Notify::new();
    let body = ticket.run_steps(|steps| async move { pay(&steps, gateway, charge, stop, stopped).await });
    tokio::select! {
        done = body => panic!("the worker was to stop at {stop:?}: {done:?}"),
        () = stopped.notified() => {}
    }
    tokio::time::sleep(PAY_LEASE + Duration::from_millis(200) + slack(store)).await;
}

const PAY_LEASE: Duration = Duration::from_millis(600);

/// The key the gateway got for the charge of payment `id`.
fn pay_key(id: &str) -> StepKey {
    steps_key(&idem::key::stored_scope(PAY), idem::Key::new(id).unwrap().as_str(), "charge")
}

/// `transfer` whose `ledger` step never ends (its worker dies in it).
async fn transfer_until_ledger(steps: Steps<'_>, bank: &Bank, runs: &[AtomicUsize; 3]) -> Result<u64, Error> {
    let held = steps
        .run("reserve", |_| async {
            runs[0].fetch_add(1, SeqCst);
            Ok::<_, Error>(500u64)
        })
        .await?;
    let charged = steps
        .run("charge", |key| async move {
            runs[1].fetch_add(1, SeqCst);
            Ok::<_, Error>(bank.charge(&key, held))
        })
        .await?;
    steps
        .run("ledger", |_| async {
            runs[2].fetch_add(1, SeqCst);
            std::future::pending::<()>().await;
            Ok::<_, Error>(())
        })
        .await?;
    Ok(charged)
}

steps_suite! {
    mod memory;
    store = Some(Arc::new(idem::store::MemoryStore::new()) as Store);
}

steps_suite! {
    mod sqlite;
    store = common::sqlite().await.map(|p| Arc::new(idem::store::SqlStore::new(p)) as Store);
}

steps_suite! {
    mod postgres;
    store = common::postgres().await.map(|p| Arc::new(idem::store::SqlStore::new(p)) as Store);
}

steps_suite! {
    mod mysql;
    store = common::mysql().await.map(|p| Arc::new(idem::store::SqlStore::new(p)) as Store);
}

steps_suite! {
    mod redis;
    store = common::redis().await.map(|c| Arc::new(idem::store::RedisStore::new(c, format!("{}:", unique("idem-steps")))) as Store);
}

steps_suite! {
    mod etcd;
    store = common::etcd_cluster::store().await.map(|s| Arc::new(s) as Store);
}

steps_suite! {
    mod redis_cluster;
    store = common::redis_cluster().await.map(|c| Arc::new(idem::store::RedisStore::new(c, format!("{}:", unique("idem-steps")))) as Store);
}

/// Through the attribute: `steps = "steps"` names the body's step log.
#[idem::idempotent(key = "id", strategy = "lease", steps = "steps", store = "store", scope = "tests.steps.macro")]
async fn booked(store: &dyn LeaseStore, id: &str, bank: &Bank, fail: bool) -> Result<u64, common::AppError> {
    let cents = steps.run("quote", |_| async { Ok::<_, Error>(700u64) }).await?;
    let charged = steps.run("charge", |key| async move { Ok::<_, Error>(bank.charge(&key, cents)) }).await?;
    if fail {
        return Err(common::AppError::Rule("the ledger is closed".into()));
    }
    Ok(charged)
}

#[tokio::test]
async fn the_attribute_runs_a_body_in_recorded_steps() {
    let (store, bank, id) = (idem::store::MemoryStore::new(), Bank::default(), unique("macro"));
    assert!(booked(&store, &id, &bank, true).await.is_err());
    assert_eq!(booked(&store, &id, &bank, false).await.unwrap(), 700);
    assert_eq!(booked(&store, &id, &bank, false).await.unwrap(), 700);
    let scope = idem::key::stored_scope("tests.steps.macro");
    let charge = steps_key(&scope, idem::Key::new(&id).unwrap().as_str(), "charge");
    assert_eq!(bank.calls(&charge), 1, "the recorded charge replayed on the retry");
}

/// The store takes no completion for the whole lease: the first call still
/// gets its answer, the record stays as a crash leaves it, and so do its
/// steps, so the take-over replays them instead of charging again.
#[tokio::test]
async fn a_completion_the_store_never_took_keeps_the_steps_for_the_take_over() {
    use idem::testing::{Fault, Faults, Op};
    let faults = Faults::new();
    let store = faults.wrap(idem::store::MemoryStore::new());
    let (id, bank, runs) = (unique("never-completed"), Bank::default(), Default::default());
    let lease = Duration::from_millis(400);
    faults.inject(Op::Complete, Fault::Fail);
    assert_eq!(call(&store, &id, lease, &bank, &runs, None).await.unwrap(), 500);
    faults.clear();
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    assert_eq!(call(&store, &id, lease, &bank, &runs, None).await.unwrap(), 500);
    assert_eq!(counts(&runs), [1, 1, 1], "every step replayed by the take-over");
    assert_eq!(bank.charges.load(SeqCst), 1);
}

/// A step that failed recorded nothing: the body may try it again, at the
/// same place (a retry loop), and the next step follows it.
#[tokio::test]
async fn a_failed_step_can_be_run_again_by_the_body() {
    let store = idem::store::MemoryStore::new();
    let claim = Guard::new("tests.steps.retry_loop").key(&unique("loop")).lease::<u32>(&store, Duration::from_secs(5));
    let Claim::Run(ticket) = claim.await.unwrap() else { panic!("first call") };
    let tries = &AtomicUsize::new(0);
    let done = ticket
        .run_steps(|steps| async move {
            let mut charged = None;
            for _ in 0..3 {
                let attempt = steps
                    .run("charge", |_| async {
                        match tries.fetch_add(1, SeqCst) {
                            0 | 1 => Err(Error::Store { store: "bank", source: "busy".into() }),
                            _ => Ok(9u32),
                        }
                    })
                    .await;
                if let Ok(value) = attempt {
                    charged = Some(value);
                    break;
                }
            }
            steps.run("notify", |_| async { Ok::<_, Error>(()) }).await?;
            Ok::<u32, Error>(charged.expect("charged on the third try"))
        })
        .await;
    assert_eq!(done.unwrap(), 9);
    assert_eq!(tries.load(SeqCst), 3);
}
