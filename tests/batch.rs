//! `idem::batch::dedup` against real SQLite, PostgreSQL and MySQL/MariaDB:
//! each message of a batch under its own guard, in a transaction of its
//! own. The handler books a coupon per message (the coupons table has no
//! unique index, so a duplicate effect would be counted) and then does what
//! the message's fate says.

use idem_test_support as common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::{AppError, unique};
use idem::batch::{self, Failure, Handled};
use idem::precheck::PrecheckStore;
use idem::{Error, Guard};

/// What the handler does after booking the message's coupon.
enum Fate {
    Succeed,
    /// Return an error: a poison message.
    Fail,
    Panic,
    /// Panic as the handler is called, before its future exists.
    PanicOnCall,
    /// Fail while the flag is down: a message that fails once and is fixed.
    FailUntil(AtomicBool),
}

struct Msg {
    key: Option<String>,
    amount: i64,
    fate: Fate,
}

fn msg(key: &str, amount: i64) -> Msg {
    Msg { key: Some(key.to_owned()), amount, fate: Fate::Succeed }
}

fn poison(key: &str, fate: Fate) -> Msg {
    Msg { key: Some(key.to_owned()), amount: 0, fate }
}

/// The shape of a batch's outcome, to compare whole batches at once.
fn shape(handled: &[Handled<i64, AppError>]) -> Vec<String> {
    let one = |h: &Handled<i64, AppError>| match h {
        Handled::Succeeded(v) => format!("succeeded {v}"),
        Handled::Repeat(Some(v)) => format!("repeat {v}"),
        Handled::Repeat(None) => "repeat, answer not kept".to_owned(),
        Handled::Failed(Failure::Handler(e)) => format!("failed: {e}"),
        Handled::Failed(Failure::Idem(e)) => format!("refused: {}", guard_kind(e)),
        Handled::Failed(Failure::Panicked(p)) => format!("panicked: {p}"),
    };
    handled.iter().map(one).collect()
}

fn guard_kind(e: &Error) -> &'static str {
    match e {
        Error::InvalidKey { .. } => "invalid key",
        Error::KeyMismatch { .. } => "key mismatch",
        _ => "other",
    }
}

macro_rules! batch_suite {
    (mod $m:ident; db = $DB:ty; pool = $pool:expr; insert_coupon = $insert:literal; count_coupons = $count:literal;) => {
        mod $m {
            use super::*;

            type Db = $DB;

            /// The batch, with markers in `marks` if given; `runs` counts the handler's runs.
            async fn book(
                pool: &sqlx::Pool<Db>,
                msgs: &[Msg],
                marks: Option<&dyn PrecheckStore>,
                runs: &AtomicUsize,
            ) -> Vec<Handled<i64, AppError>> {
                let guarded = msgs.iter().map(|m| {
                    let guard = Guard::new("tests.batch.book").key(&m.key).fingerprint(&m.amount);
                    let guard = match marks {
                        Some(marks) => guard.precheck(marks, Duration::from_secs(3600)),
                        None => guard,
                    };
                    (guard, m)
                });
                batch::dedup(pool, guarded, |tx, m| {
                    if matches!(m.fate, Fate::PanicOnCall) {
                        panic!("poison before its future");
                    }
                    Box::pin(async move {
                        runs.fetch_add(1, SeqCst);
                        sqlx::query($insert).bind(m.key.as_deref()).execute(&mut **tx).await?;
                        match &m.fate {
                            Fate::Succeed => Ok(m.amount),
                            Fate::Fail => Err(AppError::Rule("poison".into())),
                            Fate::Panic => panic!("poison pill"),
                            Fate::PanicOnCall => unreachable!("it panicked as it was called"),
                            Fate::FailUntil(fixed) if !fixed.load(SeqCst) => Err(AppError::Rule("not yet".into())),
                            Fate::FailUntil(_) => Ok(m.amount),
                        }
                    })
                })
                .await
            }

            async fn effects(pool: &sqlx::Pool<Db>, key: &str) -> i64 {
                sqlx::query_scalar($count).bind(key).fetch_one(pool).await.unwrap()
            }

            #[tokio::test]
            async fn a_poison_message_in_the_middle_fails_alone_and_its_retry_runs_again() {
                let Some(pool) = $pool else { return };
                let (a, bad, c) = (unique("batch-a"), unique("batch-poison"), unique("batch-c"));
                let runs = AtomicUsize::new(0);
                let msgs = [msg(&a, 1), poison(&bad, Fate::FailUntil(AtomicBool::new(false))), msg(&c, 3)];
                let handled = book(&pool, &msgs, None, &runs).await;
                assert_eq!(shape(&handled), ["succeeded 1", "failed: business rule: not yet", "succeeded 3"]);
                assert!(matches!(&handled[1], Handled::Failed(f) if f.is_retryable()));
                assert_eq!((effects(&pool, &a).await, effects(&pool, &bad).await, effects(&pool, &c).await), (1, 0, 1));

                // Redelivered once the poison is fixed: the others replay, it runs.
                let Fate::FailUntil(fixed) = &msgs[1].fate else { unreachable!() };
                fixed.store(true, SeqCst);
                let again = book(&pool, &msgs, None, &runs).await;
                assert_eq!(shape(&again), ["repeat 1", "succeeded 0", "repeat 3"]);
                assert_eq!((effects(&pool, &a).await, effects(&pool, &bad).await, effects(&pool, &c).await), (1, 1, 1));
                assert_eq!(runs.load(SeqCst), 4, "a, poison, c, then the poison again");
            }

            #[tokio::test]
            async fn a_panicking_handler_rolls_back_its_own_message_only() {
                let Some(pool) = $pool else { return };
                let (a, bad, c) = (unique("batch-a"), unique("batch-panic"), unique("batch-c"));
                let runs = AtomicUsize::new(0);
                let msgs = [msg(&a, 1), poison(&bad, Fate::Panic), msg(&c, 3)];
                for expected in [["succeeded 1", "panicked: poison pill", "succeeded 3"], ["repeat 1", "panicked: poison pill", "repeat 3"]] {
                    let handled = book(&pool, &msgs, None, &runs).await;
                    assert_eq!(shape(&handled), expected);
                }
                // The panicking message's coupon went with its transaction.
                assert_eq!((effects(&pool, &a).await, effects(&pool, &bad).await, effects(&pool, &c).await), (1, 0, 1));
                assert_eq!(runs.load(SeqCst), 4, "a, the panic, c, then the panic again");
            }

            #[tokio::test]
            async fn a_handler_panicking_as_it_is_called_fails_its_own_message_only() {
                let Some(pool) = $pool else { return };
                let (a, bad, c) = (unique("batch-a"), unique("batch-call"), unique("batch-c"));
                let runs = AtomicUsize::new(0);
                let msgs = [msg(&a, 1), poison(&bad, Fate::PanicOnCall), msg(&c, 3)];
                let handled = book(&pool, &msgs, None, &runs).await;
                assert_eq!(shape(&handled), ["succeeded 1", "panicked: poison before its future", "succeeded 3"]);
                assert_eq!((effects(&pool, &a).await, effects(&pool, &bad).await, effects(&pool, &c).await), (1, 0, 1));
            }

            #[tokio::test]
            async fn a_whole_batch_redelivered_runs_nothing_twice() {
                let Some(pool) = $pool else { return };
                let keys: Vec<String> = (0..10).map(|_| unique("batch-redelivered")).collect();
                let msgs: Vec<Msg> = keys.iter().zip(0..).map(|(k, i)| msg(k, i)).collect();
                let runs = AtomicUsize::new(0);
                let first = book(&pool, &msgs, None, &runs).await;
                assert!(first.iter().all(|h| matches!(h, Handled::Succeeded(_))), "{:?}", shape(&first));
                let again = book(&pool, &msgs, None, &runs).await;
                let answers: Vec<i64> = again
                    .iter()
                    .map(|h| match h {
                        Handled::Repeat(Some(v)) => *v,
                        other => panic!("{:?}", shape(std::slice::from_ref(other))),
                    })
                    .collect();
                assert_eq!(answers, (0..10).collect::<Vec<_>>(), "each first answer, in order");
                assert_eq!(runs.load(SeqCst), 10);
                for key in &keys {
                    assert_eq!(effects(&pool, key).await, 1, "{key}");
                }
            }

            /// Two consumers handed the same messages in opposite orders: each
            /// message's claim is the only lock its transaction holds, so
            /// they meet at the record and never deadlock.
            #[tokio::test]
            async fn two_consumers_with_overlapping_batches_book_each_key_once() {
                let Some(pool) = $pool else { return };
                let keys: Vec<String> = (0..10).map(|_| unique("batch-overlap")).collect();
                let forward: Vec<Msg> = keys.iter().map(|k| msg(k, 7)).collect();
                let backward: Vec<Msg> = keys.iter().rev().map(|k| msg(k, 7)).collect();
                let runs = AtomicUsize::new(0);
                let (a, b) = tokio::join!(book(&pool, &forward, None, &runs), book(&pool, &backward, None, &runs));
                let ran = a.iter().chain(&b).filter(|h| matches!(h, Handled::Succeeded(7))).count();
                let repeats = a.iter().chain(&b).filter(|h| matches!(h, Handled::Repeat(Some(7)))).count();
                assert_eq!((ran, repeats), (10, 10), "{:?} {:?}", shape(&a), shape(&b));
                assert_eq!(runs.load(SeqCst), 10);
                for key in &keys {
                    assert_eq!(effects(&pool, key).await, 1, "{key}");
                }
            }

            #[tokio::test]
            async fn a_key_twice_in_one_batch_runs_once_unless_its_first_copy_failed() {
                let Some(pool) = $pool else { return };
                let (k, j) = (unique("batch-twice"), unique("batch-twice-failed"));
                let runs = AtomicUsize::new(0);
                let handled = book(&pool, &[msg(&k, 5), poison(&j, Fate::Fail), msg(&k, 5), msg(&j, 0)], None, &runs).await;
                assert_eq!(shape(&handled), ["succeeded 5", "failed: business rule: poison", "repeat 5", "succeeded 0"]);
                assert_eq!((effects(&pool, &k).await, effects(&pool, &j).await), (1, 1));
            }

            #[tokio::test]
            async fn a_missing_key_or_another_payload_fails_for_good() {
                let Some(pool) = $pool else { return };
                let k = unique("batch-mismatch");
                let runs = AtomicUsize::new(0);
                let keyless = Msg { key: None, amount: 1, fate: Fate::Succeed };
                let handled = book(&pool, &[keyless, msg(&k, 1), msg(&k, 2)], None, &runs).await;
                assert_eq!(shape(&handled), ["refused: invalid key", "succeeded 1", "refused: key mismatch"]);
                assert!(handled.iter().all(|h| !matches!(h, Handled::Failed(f) if f.is_retryable())));
                assert_eq!(runs.load(SeqCst), 1);
                assert_eq!(effects(&pool, &k).await, 1);
            }

            /// Markers in Redis in front of the records: a redelivered batch
            /// replays from the precheck's read, and a marker whose message
            /// failed does not stop its retry.
            #[tokio::test]
            async fn with_a_precheck_a_redelivered_batch_replays_and_a_failed_message_runs_again() {
                let Some(pool) = $pool else { return };
                let Some(conn) = common::redis().await else { return };
                let prefix = format!("{}:", unique("idem-test-batch"));
                let marks = idem::store::RedisStore::new(conn.clone(), prefix.clone());
                let (a, bad) = (unique("batch-marked"), unique("batch-marked-poison"));
                let runs = AtomicUsize::new(0);
                let msgs = [msg(&a, 1), poison(&bad, Fate::FailUntil(AtomicBool::new(false)))];
                let first = book(&pool, &msgs, Some(&marks), &runs).await;
                assert_eq!(shape(&first), ["succeeded 1", "failed: business rule: not yet"]);
                let Fate::FailUntil(fixed) = &msgs[1].fate else { unreachable!() };
                fixed.store(true, SeqCst);
                let again = book(&pool, &msgs, Some(&marks), &runs).await;
                assert_eq!(shape(&again), ["repeat 1", "succeeded 0"]);
                assert_eq!((effects(&pool, &a).await, effects(&pool, &bad).await), (1, 1));
                let mut conn = conn;
                assert_eq!(common::scan_unlink(&mut conn, &format!("{prefix}*")).await, 2, "a marker per key");
            }
        }
    };
}

batch_suite! {
    mod sqlite;
    db = sqlx::Sqlite;
    pool = common::sqlite().await;
    insert_coupon = "INSERT INTO idem_test_coupons (trade_no) VALUES (?)";
    count_coupons = "SELECT COUNT(*) FROM idem_test_coupons WHERE trade_no = ?";
}

batch_suite! {
    mod postgres;
    db = sqlx::Postgres;
    pool = common::postgres().await;
    insert_coupon = "INSERT INTO idem_test_coupons (trade_no) VALUES ($1)";
    count_coupons = "SELECT COUNT(*) FROM idem_test_coupons WHERE trade_no = $1";
}

batch_suite! {
    mod mysql;
    db = sqlx::MySql;
    pool = common::mysql().await;
    insert_coupon = "INSERT INTO idem_test_coupons (trade_no) VALUES (?)";
    count_coupons = "SELECT COUNT(*) FROM idem_test_coupons WHERE trade_no = ?";
}
