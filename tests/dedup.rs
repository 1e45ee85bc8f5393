//! `strategy = "dedup"` against real SQLite, PostgreSQL and MySQL/MariaDB.
//!
//! One suite, stamped out per backend and per transaction type: every
//! scenario runs on all three, with a `sqlx::Transaction` (`*::sqlx_tx::*`)
//! and with an `idem::Tx` (`*::idem_tx::*`).

use idem_test_support as common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::{AppError, TestTx, unique};
use idem::admin::RecordStatus;
use idem::sql::PurgeOptions;
use idem::{Key, Outcome, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct PayCallback {
    trade_no: String,
    amount_cents: i64,
}

/// Items of a suite that apply to `sqlx::Transaction` only (each says
/// why): kept in the `sqlx_tx` stamp, left out of the `idem_tx` one.
macro_rules! sqlx_only {
    (sqlx_tx, $($item:tt)*) => { $($item)* };
    (idem_tx, $($item:tt)*) => {};
}

/// `mod $m` holds the suite once per transaction type of `tx`: `$m::sqlx_tx`
/// takes `sqlx::Transaction`s, `$m::idem_tx` `idem::Tx`s (`common::TestTx`).
macro_rules! dedup_suite {
    (mod $m:ident; tx = $($tx:ident)|+; $($rest:tt)*) => {
        mod $m {
            use super::*;
            /// The suite's variants share the database and the scope
            /// `tests.short_lived`: its purge test runs one at a time.
            static PURGES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
            dedup_suite!(@each [$($tx)+] $($rest)*);
        }
    };
    (@each [$tx:ident $($more:ident)*] $($rest:tt)*) => {
        dedup_suite!(@one mod $tx; $($rest)*);
        dedup_suite!(@each [$($more)*] $($rest)*);
    };
    (@each [] $($rest:tt)*) => {};
    (
        @one mod $tx:ident;
        db = $DB:ty;
        pool = $pool:path;
        insert_coupon = $insert:literal;
        insert_order = $insert_order:literal;
        count_coupons = $count:literal;
        short_lock_wait = $short_wait:literal;
        unmigrated = $unmigrated:path;
        count_archived = $count_archived:literal;
        insert_record = $insert_record:literal;
    ) => {
        mod $tx {
            use super::*;

            type Db = $DB;
            type Tx<'c> = common::$tx::Tx<'c, Db>;

            async fn begin(pool: &sqlx::Pool<Db>) -> Tx<'static> {
                <Tx<'static> as TestTx<Db>>::begin(pool).await
            }

            macro_rules! pool {
                () => {
                    match $pool().await {
                        Some(pool) => pool,
                        None => return,
                    }
                };
            }

            /// The seed incident's business change: grant a coupon for a trade.
            #[idempotent(key = "trade_no", scope = "tests.grant_coupon")]
            async fn grant_coupon(
                tx: &mut Tx<'_>,
                trade_no: &str,
                runs: &AtomicUsize,
            ) -> Result<u64, AppError> {
                runs.fetch_add(1, SeqCst);
                sqlx::query($insert).bind(trade_no).execute(&mut **tx).await?;
                Ok(42)
            }

            /// The same, written as record + response in one statement after the body.
            #[idempotent(key = "trade_no", scope = "tests.grant_after", claim = "after", retention = "1h")]
            async fn grant_after(
                tx: &mut Tx<'_>,
                trade_no: &str,
                runs: &AtomicUsize,
            ) -> Result<u64, AppError> {
                runs.fetch_add(1, SeqCst);
                sqlx::query($insert).bind(trade_no).execute(&mut **tx).await?;
                Ok(42)
            }

            #[idempotent(key = "event.trade_no", fingerprint = "event", scope = "tests.after_fp", claim = "after")]
            async fn on_callback_after(
                tx: &mut Tx<'_>,
                event: &PayCallback,
                fail: bool,
            ) -> Result<i64, AppError> {
                sqlx::query($insert).bind(&event.trade_no).execute(&mut **tx).await?;
                if fail {
                    return Err(AppError::Rule("refused".into()));
                }
                Ok(event.amount_cents)
            }

            #[idempotent(key = "key", scope = "tests.after_short", claim = "after", retention = "2s")]
            async fn after_short_lived(
                tx: &mut Tx<'_>,
                key: &str,
                runs: &AtomicUsize,
            ) -> Result<u64, AppError> {
                let _ = &tx;
                Ok(runs.fetch_add(1, SeqCst) as u64)
            }

            /// Holds its record a while, then fails when told to.
            #[idempotent(key = "trade_no", scope = "tests.slow_may_fail")]
            async fn slow_may_fail(
                tx: &mut Tx<'_>,
                trade_no: &str,
                fail: bool,
                runs: &AtomicUsize,
            ) -> Result<u64, AppError> {
                runs.fetch_add(1, SeqCst);
                sqlx::query($insert).bind(trade_no).execute(&mut **tx).await?;
                tokio::time::sleep(Duration::from_millis(300)).await;
                if fail {
                    return Err(AppError::Rule("refused".into()));
                }
                Ok(7)
            }

            /// Fails after its business write, when told to.
            #[idempotent(key = "trade_no", scope = "tests.may_fail")]
            async fn may_fail(
                tx: &mut Tx<'_>,
                trade_no: &str,
                fail: bool,
                runs: &AtomicUsize,
            ) -> Result<String, AppError> {
                runs.fetch_add(1, SeqCst);
                sqlx::query($insert).bind(trade_no).execute(&mut **tx).await?;
                if fail {
                    return Err(AppError::Rule("gateway amount does not match the order".into()));
                }
                Ok(format!("receipt for {trade_no}"))
            }

            #[idempotent(key = "event.trade_no", fingerprint = "event", scope = "tests.fingerprinted")]
            async fn on_callback(
                tx: &mut Tx<'_>,
                event: &PayCallback,
                runs: &AtomicUsize,
            ) -> Result<i64, AppError> {
                runs.fetch_add(1, SeqCst);
                sqlx::query($insert).bind(&event.trade_no).execute(&mut **tx).await?;
                Ok(event.amount_cents)
            }

            /// Returns whatever it is given: for exact replay of every value.
            #[idempotent(key = "key", scope = "tests.echo")]
            async fn echo<T>(
                tx: &mut Tx<'_>,
                key: &str,
                value: T,
                runs: &AtomicUsize,
            ) -> Result<T, AppError>
            where
                T: Serialize + serde::de::DeserializeOwned + Send,
            {
                let _ = &tx;
                runs.fetch_add(1, SeqCst);
                Ok(value)
            }

            /// `echo` writing its record after the body (`claim = "after"`).
            #[idempotent(key = "key", scope = "tests.echo_after", claim = "after")]
            async fn echo_after(tx: &mut Tx<'_>, key: &str, value: f64, runs: &AtomicUsize) -> Result<f64, AppError> {
                let _ = &tx;
                runs.fetch_add(1, SeqCst);
                Ok(value)
            }

            #[idempotent(key = "key", scope = "tests.short_lived", retention = "300ms")]
            async fn short_lived(tx: &mut Tx<'_>, key: &str, runs: &AtomicUsize) -> Result<(), AppError> {
                let _ = &tx;
                runs.fetch_add(1, SeqCst);
                Ok(())
            }

            #[idempotent(key = "user_id, request_id", scope = "tests.composite")]
            async fn composite(
                tx: &mut Tx<'_>,
                user_id: i64,
                request_id: Option<&str>,
                runs: &AtomicUsize,
            ) -> Result<(), AppError> {
                let _ = &tx;
                runs.fetch_add(1, SeqCst);
                Ok(())
            }

            async fn coupons(pool: &sqlx::Pool<Db>, trade_no: &str) -> i64 {
                sqlx::query_scalar($count).bind(trade_no).fetch_one(pool).await.unwrap()
            }

            async fn call_once(pool: &sqlx::Pool<Db>, trade_no: &str, runs: &AtomicUsize) -> (u64, Option<Outcome>) {
                let mut tx = begin(pool).await;
                let (result, outcome) = idem::observe(grant_coupon(&mut tx, trade_no, runs)).await;
                tx.commit().await.unwrap();
                (result.unwrap(), outcome)
            }

            #[tokio::test]
            async fn six_gateway_retries_grant_one_coupon() {
                let pool = pool!();
                let trade = unique("six");
                let runs = AtomicUsize::new(0);
                let mut outcomes = Vec::new();
                for _ in 0..6 {
                    outcomes.push(call_once(&pool, &trade, &runs).await);
                }
                assert_eq!(runs.load(SeqCst), 1);
                assert_eq!(coupons(&pool, &trade).await, 1);
                assert_eq!(outcomes[0], (42, Some(Outcome::Executed)));
                assert!(outcomes[1..].iter().all(|o| *o == (42, Some(Outcome::Replayed))));
                let record = idem::sql::find_record(&pool, "tests.grant_coupon", &Key::new(&trade).unwrap())
                    .await
                    .unwrap()
                    .expect("record committed");
                assert_eq!(record.status, RecordStatus::Done);
                assert_eq!(record.response.as_deref(), Some("42"));
                assert!(record.expires_at_ms > record.created_at_ms);
            }

            /// 100 tasks deliver the same trade at once, each in its own
            /// transaction; returns how many ran the body's answer (Executed)
            /// and how many replayed, and the body's run count. tokio::spawn
            /// also proves the guarded futures are Send.
            async fn hundred_duplicates(
                pool: &sqlx::Pool<Db>,
                trade: &str,
                claim_after: bool,
            ) -> (usize, usize, usize) {
                let trade = Arc::new(trade.to_owned());
                let runs = Arc::new(AtomicUsize::new(0));
                let mut tasks = Vec::new();
                for _ in 0..100 {
                    let (pool, trade, runs) = (pool.clone(), trade.clone(), runs.clone());
                    tasks.push(tokio::spawn(async move {
                        let mut tx = begin(&pool).await;
                        let (result, outcome) = if claim_after {
                            idem::observe(grant_after(&mut tx, &trade, &runs)).await
                        } else {
                            idem::observe(grant_coupon(&mut tx, &trade, &runs)).await
                        };
                        let value = result?;
                        tx.commit().await?;
                        Ok::<_, AppError>((value, outcome.unwrap()))
                    }));
                }
                let (mut executed, mut replayed) = (0, 0);
                for t in tasks {
                    let (value, outcome) = t.await.unwrap().expect("every duplicate succeeds");
                    assert_eq!(value, 42);
                    executed += usize::from(outcome == Outcome::Executed);
                    replayed += usize::from(outcome == Outcome::Replayed);
                }
                (executed, replayed, runs.load(SeqCst))
            }

            #[tokio::test]
            async fn a_hundred_concurrent_duplicates_run_the_body_once() {
                let pool = pool!();
                let trade = unique("race");
                let (executed, replayed, runs) = hundred_duplicates(&pool, &trade, false).await;
                assert_eq!(runs, 1, "the body ran more than once");
                assert_eq!((executed, replayed), (1, 99));
                assert_eq!(coupons(&pool, &trade).await, 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn repeats_waiting_on_a_first_call_that_fails_end_in_one_run() {
                // The README's promise: a repeat waiting on a first call that
                // fails runs (one of them) or replays, or, on MySQL/MariaDB,
                // where InnoDB may pick the waiters as deadlock victims, gets a
                // retryable error that, retried, replays.
                let pool = pool!();
                let trade = Arc::new(unique("first-fails"));
                let runs = Arc::new(AtomicUsize::new(0));
                let first = {
                    let (pool, trade, runs) = (pool.clone(), trade.clone(), runs.clone());
                    tokio::spawn(async move {
                        let mut tx = begin(&pool).await;
                        let r = slow_may_fail(&mut tx, &trade, true, &runs).await;
                        tx.rollback().await.unwrap();
                        r
                    })
                };
                tokio::time::sleep(Duration::from_millis(50)).await;
                let mut waiters = Vec::new();
                for _ in 0..10 {
                    let (pool, trade, runs) = (pool.clone(), trade.clone(), runs.clone());
                    waiters.push(tokio::spawn(async move {
                        for attempt in 0.. {
                            let mut tx = begin(&pool).await;
                            let (result, outcome) = idem::observe(slow_may_fail(&mut tx, &trade, false, &runs)).await;
                            match result {
                                Ok(v) => {
                                    tx.commit().await.unwrap();
                                    return (v, outcome.unwrap(), attempt);
                                }
                                Err(e) => {
                                    let retryable = match &e {
                                        AppError::Idem(e) => e.is_retryable(),
                                        AppError::Db(sqlx::Error::Database(db)) => {
                                            matches!(db.code().as_deref(), Some("40001" | "40P01"))
                                        }
                                        _ => false,
                                    };
                                    assert!(retryable && attempt < 5, "attempt {attempt}: {e:?}");
                                    let _ = tx.rollback().await;
                                }
                            }
                        }
                        unreachable!()
                    }));
                }
                assert!(matches!(first.await.unwrap(), Err(AppError::Rule(_))));
                let (mut executed, mut replayed, mut retried) = (0, 0, 0);
                for w in waiters {
                    let (value, outcome, attempt) = w.await.unwrap();
                    retried += usize::from(attempt > 0);
                    assert_eq!(value, 7);
                    executed += usize::from(outcome == Outcome::Executed);
                    replayed += usize::from(outcome == Outcome::Replayed);
                }
                eprintln!("{retried} of 10 repeats were retried after a retryable error");
                assert_eq!((executed, replayed), (1, 9));
                assert_eq!(runs.load(SeqCst), 2, "the failed first call and one repeat");
                assert_eq!(coupons(&pool, &trade).await, 1);
                if stringify!($tx) == "idem_tx" {
                    // Its claim is the first statement of its own BEGIN: a
                    // deadlock victim's claim is sent again by the guard.
                    assert_eq!(retried, 0, "an idem::Tx claim never hands a deadlock to its caller");
                }
            }

            #[tokio::test]
            async fn a_failed_body_leaves_no_record_and_a_retry_runs_again() {
                let pool = pool!();
                let trade = unique("fail");
                let runs = AtomicUsize::new(0);

                let mut tx = begin(&pool).await;
                let err = may_fail(&mut tx, &trade, true, &runs).await.unwrap_err();
                assert!(matches!(err, AppError::Rule(_)), "{err:?}");
                tx.rollback().await.unwrap();
                assert_eq!(idem::sql::find_record(&pool, "tests.may_fail", &Key::new(&trade).unwrap()).await.unwrap(), None);

                let mut tx = begin(&pool).await;
                let ok = may_fail(&mut tx, &trade, false, &runs).await.unwrap();
                tx.commit().await.unwrap();
                assert_eq!(ok, format!("receipt for {trade}"));
                assert_eq!(runs.load(SeqCst), 2);
                assert_eq!(coupons(&pool, &trade).await, 1);
            }

            #[tokio::test]
            async fn committing_after_an_err_still_leaves_no_record() {
                let pool = pool!();
                let trade = unique("commit-after-err");
                let runs = AtomicUsize::new(0);
                let mut tx = begin(&pool).await;
                assert!(may_fail(&mut tx, &trade, true, &runs).await.is_err());
                tx.commit().await.unwrap(); // the caller's mistake, but no record survives it
                assert_eq!(idem::sql::find_record(&pool, "tests.may_fail", &Key::new(&trade).unwrap()).await.unwrap(), None);

                // ... so the next delivery is a first call, not a replay of nothing.
                let mut tx = begin(&pool).await;
                let (result, outcome) = idem::observe(may_fail(&mut tx, &trade, false, &runs)).await;
                tx.commit().await.unwrap();
                assert!(result.is_ok());
                assert_eq!(outcome, Some(Outcome::Executed));
            }

            #[tokio::test]
            async fn a_duplicate_waits_for_a_first_call_that_rolls_back_then_runs() {
                let pool = pool!();
                let trade = unique("rollback");
                let runs = Arc::new(AtomicUsize::new(0));
                let mut first = begin(&pool).await;
                grant_coupon(&mut first, &trade, &runs).await.unwrap();

                let second = {
                    let (pool, trade, runs) = (pool.clone(), trade.clone(), runs.clone());
                    tokio::spawn(async move {
                        let mut tx = begin(&pool).await;
                        let (r, o) = idem::observe(grant_coupon(&mut tx, &trade, &runs)).await;
                        tx.commit().await.unwrap();
                        (r.unwrap(), o)
                    })
                };
                tokio::time::sleep(Duration::from_millis(300)).await;
                assert!(!second.is_finished(), "the duplicate must wait for the first transaction");
                first.rollback().await.unwrap();
                assert_eq!(second.await.unwrap(), (42, Some(Outcome::Executed)));
                assert_eq!(runs.load(SeqCst), 2);
                assert_eq!(coupons(&pool, &trade).await, 1);
            }

            #[tokio::test]
            async fn a_lock_timeout_is_an_error_not_a_duplicate() {
                let pool = pool!();
                let trade = unique("lock-timeout");
                let runs = AtomicUsize::new(0);
                let mut first = begin(&pool).await;
                grant_coupon(&mut first, &trade, &runs).await.unwrap();

                let mut second = begin(&pool).await;
                sqlx::raw_sql($short_wait).execute(second.conn().await).await.unwrap();
                let err = grant_coupon(&mut second, &trade, &runs).await.unwrap_err();
                assert!(matches!(err, AppError::Idem(idem::Error::Database(_))), "{err:?}");
                drop(second);
                first.commit().await.unwrap();
                assert_eq!(runs.load(SeqCst), 1);
                assert_eq!(coupons(&pool, &trade).await, 1);
            }

            /// `claim = "after"`: the record's insert after the body fails
            /// otherwise than on the key (its lock wait on a first call's
            /// uncommitted record timed out; MySQL keeps the transaction
            /// open after that). A caller that commits anyway keeps nothing
            /// of the call: the body's write never commits without its
            /// record for a retry to run the body again.
            #[tokio::test]
            async fn claim_after_a_record_insert_that_fails_keeps_nothing_even_if_committed() {
                let pool = pool!();
                let trade = unique("after-timeout");
                let runs = AtomicUsize::new(0);
                let mut first = begin(&pool).await;
                grant_after(&mut first, &trade, &runs).await.unwrap();

                let mut second = begin(&pool).await;
                sqlx::raw_sql($short_wait).execute(second.conn().await).await.unwrap();
                assert!(grant_after(&mut second, &trade, &runs).await.is_err());
                let _ = second.commit().await;
                drop(first);
                assert_eq!(coupons(&pool, &trade).await, 0, "the failed call's write was kept");
            }

            #[tokio::test]
            async fn a_missing_record_table_is_reported_not_taken_for_a_duplicate() {
                let pool = pool!();
                let mut tx: Tx<'static> = $unmigrated(&pool).await;
                let runs = AtomicUsize::new(0);
                let err = grant_coupon(&mut tx, &unique("unmigrated"), &runs).await.unwrap_err();
                assert!(matches!(err, AppError::Idem(idem::Error::NotMigrated { .. })), "{err:?}");
                assert!(err.to_string().contains("idem::migrate"), "{err}");
                assert_eq!(runs.load(SeqCst), 0);
            }

            #[tokio::test]
            async fn the_same_key_with_another_payload_is_a_key_mismatch() {
                let pool = pool!();
                let runs = AtomicUsize::new(0);
                let event = PayCallback { trade_no: unique("fp"), amount_cents: 1999 };
                let tampered = PayCallback { amount_cents: 1, ..event.clone() };
                for _ in 0..2 {
                    // an identical retry always passes
                    let mut tx = begin(&pool).await;
                    assert_eq!(on_callback(&mut tx, &event, &runs).await.unwrap(), 1999);
                    tx.commit().await.unwrap();
                }
                let mut tx = begin(&pool).await;
                let err = on_callback(&mut tx, &tampered, &runs).await.unwrap_err();
                assert!(matches!(err, AppError::Idem(idem::Error::KeyMismatch { .. })), "{err:?}");
                drop(tx);
                assert_eq!(runs.load(SeqCst), 1);
                assert_eq!(coupons(&pool, &event.trade_no).await, 1);
            }

            /// A record 0.2 wrote holds its fingerprint (64 hex digits of
            /// the payload's JSON, no version): the same payload replays it
            /// after the upgrade, another is a mismatch.
            #[tokio::test]
            async fn a_record_written_by_0_2_compares_in_its_version() {
                let pool = pool!();
                // SHA-256 of `[500,"EUR",null]`: the payload as 0.2 hashed it.
                const V1: &str = "0e77b0216c70a471d71726aa3343e06a0b4554ee1ba530f58c73e63cff494485";
                let (scope, key) = ("tests.written_by_0_2", unique("v1"));
                let record = sqlx::query($insert_record).bind(scope).bind(&key).bind(V1).bind("\"first\"");
                record.execute(&pool).await.unwrap();
                for (currency, replays) in [("EUR", true), ("USD", false)] {
                    let payload = (500, currency, None::<String>);
                    let mut tx = begin(&pool).await;
                    let claim = idem::Guard::new(scope).key(&key).fingerprint(&payload).dedup::<String, _>(&mut tx).await;
                    match claim {
                        Ok(idem::Claim::Replay(first)) if replays => assert_eq!(first, "first"),
                        Err(idem::Error::KeyMismatch { .. }) if !replays => {}
                        other => panic!("{currency}: {other:?}"),
                    }
                }
            }

            async fn replays_exactly<T>(pool: &sqlx::Pool<Db>, first: T, other: T)
            where
                T: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug + Clone + Send,
            {
                let key = unique("falsy");
                let runs = AtomicUsize::new(0);
                for value in [first.clone(), other] {
                    let mut tx = begin(pool).await;
                    let got = echo(&mut tx, &key, value, &runs).await.unwrap();
                    tx.commit().await.unwrap();
                    assert_eq!(got, first);
                }
                assert_eq!(runs.load(SeqCst), 1, "{first:?} was not replayed");
            }

            #[tokio::test]
            async fn falsy_and_unit_values_replay_exactly() {
                let pool = pool!();
                replays_exactly(&pool, (), ()).await;
                replays_exactly(&pool, 0_i64, 7).await;
                replays_exactly(&pool, false, true).await;
                replays_exactly(&pool, String::new(), "x".to_owned()).await;
                replays_exactly(&pool, Vec::<u8>::new(), vec![1]).await;
                replays_exactly(&pool, BTreeMap::<String, i32>::new(), BTreeMap::from([("a".into(), 1)])).await;
                replays_exactly(&pool, None::<u32>, Some(3)).await;
                replays_exactly(&pool, Some(0_u32), None).await;
            }

            /// An order insert with its own unique key: on a repeat under
            /// claim = "after" the body fails on it before the guard's record.
            #[idempotent(key = "trade_no", scope = "tests.create_order", claim = "after")]
            async fn create_order(tx: &mut Tx<'_>, trade_no: &str) -> Result<String, AppError> {
                sqlx::query($insert_order).bind(trade_no).execute(&mut **tx).await?;
                Ok(format!("order {trade_no}"))
            }

            #[tokio::test]
            async fn claim_after_replays_a_repeat_whose_body_hit_its_own_unique_key() {
                let pool = pool!();
                let trade = unique("after-order");
                for expected in [Outcome::Executed, Outcome::Replayed, Outcome::Replayed] {
                    let mut tx = begin(&pool).await;
                    let (result, outcome) = idem::observe(create_order(&mut tx, &trade)).await;
                    assert_eq!(
                        result.expect("a repeat is a success, not a duplicate-key error"),
                        format!("order {trade}")
                    );
                    tx.commit().await.unwrap();
                    assert_eq!(outcome, Some(expected));
                }
            }

            #[tokio::test]
            async fn claim_after_never_replays_a_record_written_earlier_in_the_same_transaction() {
                let pool = pool!();
                let trade = unique("after-same-tx");
                let runs = AtomicUsize::new(0);
                let mut tx = begin(&pool).await;
                assert_eq!(grant_after(&mut tx, &trade, &runs).await.unwrap(), 42);
                // A redelivery handled in the same transaction: the restart takes
                // the first call's work with it, so this must fail loudly.
                let err = grant_after(&mut tx, &trade, &runs).await.unwrap_err();
                assert!(matches!(err, AppError::Idem(idem::Error::InProgress { .. })), "{err:?}");
                drop(tx);
                assert_eq!(coupons(&pool, &trade).await, 0);
            }

            #[tokio::test]
            async fn keys_differing_only_in_trailing_spaces_are_different_keys() {
                let pool = pool!();
                let base = unique("pad");
                let runs = AtomicUsize::new(0);
                for key in [base.clone(), format!("{base} "), format!("{base}  ")] {
                    let mut tx = begin(&pool).await;
                    grant_coupon(&mut tx, &key, &runs).await.unwrap();
                    tx.commit().await.unwrap();
                }
                assert_eq!(runs.load(SeqCst), 3, "a PAD SPACE collation merged distinct keys");
            }

            #[idempotent(key = "key", scope = "tests.slow")]
            async fn slow(tx: &mut Tx<'_>, key: &str, pause: Duration) -> Result<(), AppError> {
                let _ = &tx;
                tokio::time::sleep(pause).await;
                Ok(())
            }

            /// The guarded future is dropped mid-body (a timeout around the
            /// call) and the caller commits anyway: the record says PROCESSING
            /// with no response. Whether the effect happened is unknown, so
            /// repeats get a non-retryable error, never a second run.
            #[tokio::test]
            async fn a_call_cancelled_mid_body_then_committed_is_reported_unfinished() {
                let pool = pool!();
                let key = unique("cancelled");
                let mut tx = begin(&pool).await;
                let cut =
                    tokio::time::timeout(Duration::from_millis(200), slow(&mut tx, &key, Duration::from_secs(30)))
                        .await;
                assert!(cut.is_err(), "the call should have been cut off");
                tx.commit().await.unwrap();

                let mut tx = begin(&pool).await;
                let err = slow(&mut tx, &key, Duration::ZERO).await.unwrap_err();
                match err {
                    AppError::Idem(e @ idem::Error::Unfinished { .. }) => assert!(!e.is_retryable()),
                    other => panic!("{other:?}"),
                }
            }

            async fn insert_marker(tx: &mut Tx<'_>, marker: &str) {
                sqlx::query($insert).bind(marker).execute(tx.conn().await).await.unwrap();
            }

            #[tokio::test]
            async fn claim_after_replays_repeats_and_keeps_one_coupon() {
                let pool = pool!();
                let trade = unique("after-six");
                let runs = AtomicUsize::new(0);
                let mut outcomes = Vec::new();
                for _ in 0..6 {
                    let mut tx = begin(&pool).await;
                    let (r, o) = idem::observe(grant_after(&mut tx, &trade, &runs)).await;
                    tx.commit().await.unwrap();
                    outcomes.push((r.unwrap(), o.unwrap()));
                }
                assert_eq!(outcomes[0], (42, Outcome::Executed));
                assert!(outcomes[1..].iter().all(|o| *o == (42, Outcome::Replayed)), "{outcomes:?}");
                assert_eq!(coupons(&pool, &trade).await, 1);
                let record =
                    idem::sql::find_record(&pool, "tests.grant_after", &Key::new(&trade).unwrap()).await.unwrap().unwrap();
                assert_eq!((record.status, record.response.as_deref()), (RecordStatus::Done, Some("42")));
            }

            #[tokio::test]
            async fn claim_after_under_a_hundred_concurrent_duplicates_commits_one_coupon() {
                let pool = pool!();
                let trade = unique("after-race");
                // claim = "after" may run several bodies; all but one are discarded.
                let (executed, replayed, _) = hundred_duplicates(&pool, &trade, true).await;
                assert_eq!((executed, replayed), (1, 99));
                assert_eq!(coupons(&pool, &trade).await, 1, "a discarded body's coupon was committed");
            }

            #[tokio::test]
            async fn claim_after_restarts_the_transaction_on_a_duplicate() {
                let pool = pool!();
                let trade = unique("after-restart");
                let runs = AtomicUsize::new(0);
                let mut tx = begin(&pool).await;
                grant_after(&mut tx, &trade, &runs).await.unwrap();
                tx.commit().await.unwrap();

                // A repeat in a transaction that wrote something first: the
                // documented price of claim = "after" is that the earlier write
                // goes too; later writes land in the fresh transaction.
                let mut tx = begin(&pool).await;
                insert_marker(&mut tx, &format!("{trade}-before")).await;
                assert_eq!(grant_after(&mut tx, &trade, &runs).await.unwrap(), 42);
                insert_marker(&mut tx, &format!("{trade}-after")).await;
                tx.commit().await.unwrap();
                assert_eq!(coupons(&pool, &trade).await, 1);
                assert_eq!(coupons(&pool, &format!("{trade}-before")).await, 0);
                assert_eq!(coupons(&pool, &format!("{trade}-after")).await, 1);
            }

            // Nested sqlx transactions (savepoints): `sqlx::Connection::begin`
            // on the connection gives a `sqlx::Transaction`, which is what the
            // guarded call then takes; `idem::Tx` has no savepoints of its own.
            sqlx_only! { $tx,
                #[tokio::test]
                async fn claim_after_inside_a_savepoint_rolls_back_only_the_savepoint() {
                    let pool = pool!();
                    let trade = unique("after-nested");
                    let runs = AtomicUsize::new(0);
                    let mut tx = begin(&pool).await;
                    grant_after(&mut tx, &trade, &runs).await.unwrap();
                    tx.commit().await.unwrap();

                    let mut outer = begin(&pool).await;
                    insert_marker(&mut outer, &format!("{trade}-outer")).await;
                    let mut nested = sqlx::Connection::begin(&mut *outer).await.unwrap();
                    assert_eq!(grant_after(&mut nested, &trade, &runs).await.unwrap(), 42);
                    nested.commit().await.unwrap();
                    outer.commit().await.unwrap();
                    assert_eq!(coupons(&pool, &trade).await, 1);
                    let outer_marker = coupons(&pool, &format!("{trade}-outer")).await;
                    assert_eq!(outer_marker, 1, "the outer transaction's work was lost");
                }
            }

            #[tokio::test]
            async fn claim_after_mismatch_and_failure_leave_nothing_behind() {
                let pool = pool!();
                let event = PayCallback { trade_no: unique("after-fp"), amount_cents: 500 };
                let mut tx = begin(&pool).await;
                assert!(on_callback_after(&mut tx, &event, true).await.is_err());
                tx.commit().await.unwrap(); // the caller commits after Err: the body's write is its own
                assert_eq!(
                    idem::sql::find_record(&pool, "tests.after_fp", &Key::new(&event.trade_no).unwrap()).await.unwrap(),
                    None
                );

                let mut tx = begin(&pool).await;
                assert_eq!(on_callback_after(&mut tx, &event, false).await.unwrap(), 500);
                tx.commit().await.unwrap();
                let before = coupons(&pool, &event.trade_no).await;

                let tampered = PayCallback { amount_cents: 1, ..event.clone() };
                let mut tx = begin(&pool).await;
                let err = on_callback_after(&mut tx, &tampered, false).await.unwrap_err();
                assert!(matches!(err, AppError::Idem(idem::Error::KeyMismatch { .. })), "{err:?}");
                tx.commit().await.unwrap(); // even so, the mismatching body's write is gone
                assert_eq!(coupons(&pool, &event.trade_no).await, before);
            }

            #[tokio::test]
            async fn claim_after_takes_over_an_expired_record() {
                let pool = pool!();
                let key = unique("after-expired");
                let runs = AtomicUsize::new(0);
                let mut answers = Vec::new();
                // The retention is long enough that the repeat lands inside it on
                // a loaded machine: a record that expires between a repeat's
                // insert and its read is (rightly) `InProgress`, retry now.
                for pause in [0, 0, 2100] {
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                    let mut tx = begin(&pool).await;
                    answers.push(after_short_lived(&mut tx, &key, &runs).await.unwrap());
                    tx.commit().await.unwrap();
                }
                // claim = "after" runs the body of a repeat too, then discards it:
                // the second answer is the first one replayed, the third is new.
                assert_eq!(answers[1], answers[0], "a repeat within retention replays");
                assert_eq!(answers[2], 2, "a call after retention runs and keeps its answer");
                let record =
                    idem::sql::find_record(&pool, "tests.after_short", &Key::new(&key).unwrap()).await.unwrap().unwrap();
                assert_eq!((record.response.as_deref(), record.fence), (Some("2"), 1));
            }

            /// An answer JSON cannot carry exactly (`f64::NAN` would be stored
            /// as `null`; `Some(())` and `Some(None)` are written like `None`)
            /// cannot be replayed. The first call still gets it and its record
            /// is completed without it: committed, a repeat is told so and the
            /// body never runs again; rolled back, the record goes too.
            #[tokio::test]
            async fn an_answer_that_cannot_replay_is_returned_and_never_run_again() {
                let pool = pool!();
                let runs = AtomicUsize::new(0);
                let key = unique("nan");
                let mut tx = begin(&pool).await;
                assert!(echo(&mut tx, &key, f64::NAN, &runs).await.unwrap().is_nan());
                tx.commit().await.unwrap();
                for _ in 0..2 {
                    let mut tx = begin(&pool).await;
                    let (err, outcome) = idem::observe(echo(&mut tx, &key, f64::NAN, &runs)).await;
                    let err = err.unwrap_err();
                    assert!(matches!(err, AppError::Idem(idem::Error::AnswerNotKept { .. })), "{err:?}");
                    assert_eq!(outcome, Some(Outcome::NotKept));
                }
                assert_eq!(runs.load(SeqCst), 1, "the body ran once");
                let record = idem::sql::find_record(&pool, "tests.echo", &Key::new(&key).unwrap()).await.unwrap().unwrap();
                assert_eq!((record.status, record.response), (RecordStatus::Done, None));

                let unit = unique("some-unit");
                let mut tx = begin(&pool).await;
                assert_eq!(echo(&mut tx, &unit, Some(()), &runs).await.unwrap(), Some(()));
                let nested = unique("some-none");
                assert_eq!(echo(&mut tx, &nested, vec![Some(None::<u8>)], &runs).await.unwrap(), vec![Some(None)]);
                drop(tx); // rolled back: the records go with the body's writes
                for key in [&unit, &nested] {
                    assert_eq!(idem::sql::find_record(&pool, "tests.echo", &Key::new(key).unwrap()).await.unwrap(), None);
                }
                // Their exact neighbours still store and replay.
                let none = unique("none");
                for _ in 0..2 {
                    let mut tx = begin(&pool).await;
                    assert_eq!(echo(&mut tx, &none, None::<()>, &runs).await.unwrap(), None);
                    tx.commit().await.unwrap();
                }
                assert_eq!(runs.load(SeqCst), 4);
            }

            /// `claim = "after"` writes the record once, after the body: an
            /// answer that cannot be kept is written as "not kept" in that
            /// one statement, and a repeat does not run.
            #[tokio::test]
            async fn claim_after_keeps_a_record_without_an_answer_that_cannot_replay() {
                let pool = pool!();
                let (key, runs) = (unique("after-nan"), AtomicUsize::new(0));
                let mut tx = begin(&pool).await;
                assert!(echo_after(&mut tx, &key, f64::NAN, &runs).await.unwrap().is_nan());
                tx.commit().await.unwrap();
                let mut tx = begin(&pool).await;
                let err = echo_after(&mut tx, &key, f64::NAN, &runs).await.unwrap_err();
                assert!(matches!(err, AppError::Idem(idem::Error::AnswerNotKept { .. })), "{err:?}");
                drop(tx);
                // claim = "after" runs the repeat's body too, and rolls it back.
                assert_eq!(runs.load(SeqCst), 2);
                let record =
                    idem::sql::find_record(&pool, "tests.echo_after", &Key::new(&key).unwrap()).await.unwrap().unwrap();
                assert_eq!((record.status, record.response), (RecordStatus::Done, None));
            }

            /// An answer larger than the store holds (MySQL's MEDIUMTEXT and
            /// packet: 16 MiB) never reaches the server: the first call gets
            /// it, its record says "answer not kept", and a repeat does not run.
            #[tokio::test]
            async fn an_answer_larger_than_the_store_holds_is_returned_and_never_run_again() {
                let max = <Db as idem::sql::SqlBackend>::MAX_RESPONSE;
                if max > 64 << 20 {
                    return; // PostgreSQL's and SQLite's 1 GB: too much to send in a test
                }
                let pool = pool!();
                let key = unique("huge");
                let runs = AtomicUsize::new(0);
                let mut tx = begin(&pool).await;
                assert_eq!(echo(&mut tx, &key, "x".repeat(max), &runs).await.unwrap().len(), max);
                tx.commit().await.unwrap();
                let mut tx = begin(&pool).await;
                let err = echo(&mut tx, &key, "x".repeat(max), &runs).await.unwrap_err();
                assert!(matches!(err, AppError::Idem(idem::Error::AnswerNotKept { .. })), "{err:?}");
                assert_eq!(runs.load(SeqCst), 1);
                let record = idem::sql::find_record(&pool, "tests.echo", &Key::new(&key).unwrap()).await.unwrap().unwrap();
                assert_eq!((record.status, record.response), (RecordStatus::Done, None));
            }

            /// A key with a NUL character (from a JSON body's `\u0000`) is
            /// stored escaped: PostgreSQL text cannot hold NUL.
            #[tokio::test]
            async fn a_key_with_a_nul_character_is_stored_and_replays() {
                let pool = pool!();
                let key = format!("{}\0tail", unique("nul"));
                let runs = AtomicUsize::new(0);
                for _ in 0..2 {
                    let mut tx = begin(&pool).await;
                    assert_eq!(echo(&mut tx, &key, 7u8, &runs).await.unwrap(), 7);
                    tx.commit().await.unwrap();
                }
                assert_eq!(runs.load(SeqCst), 1);
                assert!(idem::sql::find_record(&pool, "tests.echo", &Key::new(&key).unwrap()).await.unwrap().is_some());
            }

            #[tokio::test]
            async fn composite_keys_and_missing_parts() {
                let pool = pool!();
                let runs = AtomicUsize::new(0);
                let request = unique("req");
                for user in [1, 1, 2] {
                    let mut tx = begin(&pool).await;
                    composite(&mut tx, user, Some(&request), &runs).await.unwrap();
                    tx.commit().await.unwrap();
                }
                assert_eq!(runs.load(SeqCst), 2, "user 2's request is another request");

                let mut tx = begin(&pool).await;
                let err = composite(&mut tx, 1, None, &runs).await.unwrap_err();
                match err {
                    AppError::Idem(idem::Error::InvalidKey { reason, .. }) => {
                        assert_eq!(reason, "key part `request_id` is None")
                    }
                    other => panic!("{other:?}"),
                }
                assert_eq!(runs.load(SeqCst), 2);
            }

            #[tokio::test]
            async fn an_expired_record_no_longer_replays_and_purge_removes_only_expired_ones() {
                let pool = pool!();
                let _alone = super::PURGES.lock().await;
                // Purges below are scoped to this test's records, so records
                // other tests (or a load generator) left in the shared
                // database are neither purged nor in the way; one of another
                // scope, expired too, must survive them.
                let only = |batch_size, max_batches| PurgeOptions {
                    batch_size,
                    max_batches,
                    archive: true,
                    scope: Some("tests.short_lived".to_owned()),
                    ..Default::default()
                };
                idem::sql::purge_expired(&pool, only(1000, None)).await.unwrap();
                let other = unique("other");
                let mut tx = begin(&pool).await;
                let claim = idem::Guard::new("tests.purge.other").key(&other).retention(Duration::from_millis(500));
                match claim.dedup::<u8, _>(&mut tx).await.unwrap() {
                    idem::Claim::Run(ticket) => {
                        assert_eq!(ticket.finish(&mut tx, Ok::<_, idem::Error>(1)).await.unwrap(), 1)
                    }
                    idem::Claim::Replay(_) => panic!("a fresh key"),
                }
                tx.commit().await.unwrap();
                let runs = AtomicUsize::new(0);
                let expired: Vec<String> = (0..5).map(|_| unique("expired")).collect();
                let kept = unique("kept");
                for key in &expired {
                    let mut tx = begin(&pool).await;
                    short_lived(&mut tx, key, &runs).await.unwrap();
                    tx.commit().await.unwrap();
                }
                call_once(&pool, &kept, &runs).await;
                tokio::time::sleep(Duration::from_millis(1200)).await;

                // Past retention: a new call runs again instead of replaying.
                let mut tx = begin(&pool).await;
                let (_, outcome) = idem::observe(short_lived(&mut tx, &expired[0], &runs)).await;
                tx.commit().await.unwrap();
                assert_eq!(outcome, Some(Outcome::Executed));

                tokio::time::sleep(Duration::from_millis(1200)).await;
                // With `archive`, completed records are copied before they go.
                let one = idem::sql::purge_expired(&pool, only(2, Some(1))).await.unwrap();
                assert_eq!((one.deleted, one.batches), (2, 1), "max_batches bounds one run");
                // Paced by its own batches' time, it still goes to the end.
                let paced = PurgeOptions { pause_factor: 2, ..only(2, None) };
                let rest = idem::sql::purge_expired(&pool, paced).await.unwrap();
                assert!(rest.deleted >= 3 && rest.batches >= 2, "{rest:?}");
                for key in &expired {
                    let found = idem::sql::find_record(&pool, "tests.short_lived", &Key::new(key).unwrap()).await.unwrap();
                    assert_eq!(found, None);
                    let archived: i64 = sqlx::query_scalar($count_archived)
                        .bind("tests.short_lived")
                        .bind(key)
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                    assert_eq!(archived, 1, "the completed record of {key} is in the archive");
                }
                let still = idem::sql::find_record(&pool, "tests.grant_coupon", &Key::new(&kept).unwrap()).await.unwrap();
                assert!(still.is_some(), "a live record was purged");
                let key = Key::new(&other).unwrap();
                let untouched = idem::sql::find_record(&pool, "tests.purge.other", &key).await.unwrap();
                assert!(untouched.is_some(), "an expired record of another scope was purged by a scoped purge");
                let theirs = PurgeOptions { scope: Some("tests.purge.other".to_owned()), ..Default::default() };
                assert!(idem::sql::purge_expired(&pool, theirs).await.unwrap().deleted >= 1);
                assert_eq!(idem::sql::find_record(&pool, "tests.purge.other", &key).await.unwrap(), None);
            }

            sqlx_only! { $tx,
                /// Two instances purging on the same schedule: both finish
                /// (a deadlock's victim runs its batch again), every record
                /// goes once and is archived once.
                #[tokio::test]
                async fn two_purges_at_once_both_finish_and_archive_each_record_once() {
                    let pool = pool!();
                    let scope = unique("tests.purge.twice");
                    let keys: Vec<String> = (0..120).map(|i| format!("k{i}")).collect();
                    for key in &keys {
                        let mut tx = begin(&pool).await;
                        let guard = idem::Guard::new(scope.clone()).key(key).retention(Duration::from_millis(1));
                        match guard.dedup::<u8, _>(&mut tx).await.unwrap() {
                            idem::Claim::Run(ticket) => {
                                ticket.finish(&mut tx, Ok::<_, idem::Error>(1)).await.unwrap();
                            }
                            idem::Claim::Replay(_) => panic!("a fresh key"),
                        }
                        tx.commit().await.unwrap();
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let options =
                        PurgeOptions { batch_size: 7, archive: true, scope: Some(scope.clone()), ..Default::default() };
                    let (a, b) = tokio::join!(
                        idem::sql::purge_expired(&pool, options.clone()),
                        idem::sql::purge_expired(&pool, options)
                    );
                    let (a, b) = (a.unwrap(), b.unwrap());
                    assert_eq!(a.deleted + b.deleted, 120, "{a:?} {b:?}");
                    for key in &keys {
                        let found = idem::sql::find_record(&pool, &scope, &Key::new(key).unwrap()).await.unwrap();
                        assert_eq!(found, None);
                        let archived: i64 =
                            sqlx::query_scalar($count_archived).bind(&scope).bind(key).fetch_one(&pool).await.unwrap();
                        assert_eq!(archived, 1, "{key} archived once");
                    }
                }
            }
        }
    };
}

async fn pg_unmigrated<T: TestTx<sqlx::Postgres>>(pool: &sqlx::PgPool) -> T {
    sqlx::query("CREATE SCHEMA IF NOT EXISTS idem_unmigrated").execute(pool).await.ok();
    let mut tx = T::begin(pool).await;
    sqlx::query("SET LOCAL search_path TO idem_unmigrated").execute(tx.conn().await).await.unwrap();
    tx
}

async fn mysql_unmigrated<T: TestTx<sqlx::MySql>>(pool: &sqlx::MySqlPool) -> T {
    sqlx::query("CREATE DATABASE IF NOT EXISTS idem_unmigrated").execute(pool).await.unwrap();
    let opts: sqlx::mysql::MySqlConnectOptions = pool.connect_options().as_ref().clone().database("idem_unmigrated");
    let other = sqlx::mysql::MySqlPoolOptions::new().max_connections(1).connect_with(opts).await.unwrap();
    T::begin(&other).await
}

async fn sqlite_unmigrated<T: TestTx<sqlx::Sqlite>>(_: &sqlx::SqlitePool) -> T {
    let empty = sqlx::sqlite::SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await.unwrap();
    T::begin(&empty).await
}

dedup_suite! {
    mod sqlite;
    tx = sqlx_tx | idem_tx;
    db = sqlx::Sqlite;
    pool = common::sqlite;
    insert_coupon = "INSERT INTO idem_test_coupons (trade_no) VALUES (?)";
    insert_order = "INSERT INTO idem_test_orders (trade_no) VALUES (?)";
    count_coupons = "SELECT COUNT(*) FROM idem_test_coupons WHERE trade_no = ?";
    short_lock_wait = "PRAGMA busy_timeout = 100";
    unmigrated = sqlite_unmigrated;
    count_archived = "SELECT COUNT(*) FROM idem_records_archive WHERE scope = ? AND idem_key = ? AND status = 'DONE'";
    insert_record = "INSERT INTO idem_records (scope, idem_key, status, fingerprint, response, created_at, updated_at, \
        expires_at) VALUES (?, ?, 'DONE', ?, ?, unixepoch() * 1000, unixepoch() * 1000, unixepoch() * 1000 + 3600000)";
}

dedup_suite! {
    mod postgres;
    tx = sqlx_tx | idem_tx;
    db = sqlx::Postgres;
    pool = common::postgres;
    insert_coupon = "INSERT INTO idem_test_coupons (trade_no) VALUES ($1)";
    insert_order = "INSERT INTO idem_test_orders (trade_no) VALUES ($1)";
    count_coupons = "SELECT COUNT(*) FROM idem_test_coupons WHERE trade_no = $1";
    short_lock_wait = "SET LOCAL lock_timeout = '200ms'";
    unmigrated = pg_unmigrated;
    count_archived = "SELECT COUNT(*) FROM idem_records_archive WHERE scope = $1 AND idem_key = $2 AND status = 'DONE'";
    insert_record = "INSERT INTO idem_records (scope, idem_key, status, fingerprint, response, created_at, updated_at, \
        expires_at) VALUES ($1, $2, 'DONE', $3, $4, now(), now(), now() + interval '1 hour')";
}

dedup_suite! {
    mod mysql;
    tx = sqlx_tx | idem_tx;
    db = sqlx::MySql;
    pool = common::mysql;
    insert_coupon = "INSERT INTO idem_test_coupons (trade_no) VALUES (?)";
    insert_order = "INSERT INTO idem_test_orders (trade_no) VALUES (?)";
    count_coupons = "SELECT COUNT(*) FROM idem_test_coupons WHERE trade_no = ?";
    short_lock_wait = "SET SESSION innodb_lock_wait_timeout = 1";
    unmigrated = mysql_unmigrated;
    count_archived = "SELECT COUNT(*) FROM idem_records_archive WHERE scope = ? AND idem_key = ? AND status = 'DONE'";
    insert_record = "INSERT INTO idem_records (scope, idem_key, status, fingerprint, response, created_at, updated_at, \
        expires_at) VALUES (?, ?, 'DONE', ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)";
}
