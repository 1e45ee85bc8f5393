//! `strategy = "state"` and `"dedup+state"` against real SQLite, PostgreSQL
//! and MySQL/MariaDB. One suite, stamped out per backend and per transaction
//! type (`*::sqlx_tx::*` with a `sqlx::Transaction`, `*::idem_tx::*` with an
//! `idem::Tx`).

use idem_test_support as common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use common::{AppError, TestTx, unique};
use idem::{Error, Outcome, SilentRepeat, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::Transaction;

/// The seed's order lifecycle: WAIT_PAY 1, PAID 2, SHIPPED 3, FINISHED 4, CANCELED 9.
#[derive(idem::StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state(table = "idem_test_state_orders", key_column = "order_no", status_column = "status")]
enum OrderStatus {
    #[state(code = 1, to(Paid, Canceled))]
    WaitPay,
    #[state(code = 2, to(Shipped, Canceled))]
    Paid,
    #[state(code = 3, to(Finished))]
    Shipped,
    #[state(code = 4)]
    Finished,
    #[state(code = 9)]
    Canceled,
}

/// Stored by name, keyed by an integer.
#[derive(idem::StateMachine)]
#[state(table = "idem_test_tickets", key_column = "id", status_column = "state", stored_as = "name")]
enum TicketState {
    #[state(to(Closed))]
    Open,
    Closed,
}

/// A status column whose CHECK constraint refuses state `Two`: the
/// transition fails with a database error.
#[derive(idem::StateMachine)]
#[state(table = "idem_test_checked", key_column = "order_no", status_column = "status")]
enum CheckedStatus {
    #[state(code = 1, to(Two))]
    One,
    #[state(code = 2)]
    Two,
}

/// What the pay callback answers; a repeat whose first answer is not stored
/// (no dedup record) acknowledges without a coupon.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct PayAck {
    coupon: Option<String>,
}

impl SilentRepeat for PayAck {
    fn silent_repeat() -> Self {
        PayAck { coupon: None }
    }
}

fn unique_id() -> i64 {
    use std::hash::{BuildHasher, RandomState};
    (RandomState::new().hash_one(unique("id")) >> 2) as i64
}

#[test]
fn can_transition_follows_the_declaration() {
    use OrderStatus::*;
    // Usable in const context.
    const { assert!(OrderStatus::can_transition(WaitPay, Paid)) };
    assert!(OrderStatus::can_transition(Paid, Canceled));
    assert!(!OrderStatus::can_transition(Finished, Paid));
    assert!(!OrderStatus::can_transition(Paid, WaitPay));
    assert!(!OrderStatus::can_transition(Canceled, Canceled));
    let table = <OrderStatus as idem::StateMachine>::STATES;
    assert_eq!(table.codes[4], idem::state::StateCode::Int(9));
    let tickets = <TicketState as idem::StateMachine>::STATES;
    assert_eq!(tickets.codes, &[idem::state::StateCode::Text("OPEN"), idem::state::StateCode::Text("CLOSED")]);
}

/// `mod $m` holds the suite once per transaction type of `tx`: `$m::sqlx_tx`
/// takes `sqlx::Transaction`s, `$m::idem_tx` `idem::Tx`s (`common::TestTx`).
macro_rules! state_suite {
    (mod $m:ident; tx = $($tx:ident)|+; $($rest:tt)*) => {
        mod $m {
            use super::*;
            state_suite!(@each [$($tx)+] $($rest)*);
        }
    };
    (@each [$tx:ident $($more:ident)*] $($rest:tt)*) => {
        state_suite!(@one mod $tx; $($rest)*);
        state_suite!(@each [$($more)*] $($rest)*);
    };
    (@each [] $($rest:tt)*) => {};
    (
        @one mod $tx:ident;
        db = $DB:ty;
        pool = $pool:path;
        ddl = $ddl:literal;
        insert_order = $insert_order:literal;
        set_status = $set_status:literal;
        get_status = $get_status:literal;
        insert_coupon = $insert_coupon:literal;
        count_coupons = $count:literal;
        insert_ticket = $insert_ticket:literal;
        get_ticket = $get_ticket:literal;
        count_records = $count_records:literal;
        insert_checked = $insert_checked:literal;
    ) => {
        mod $tx {
            use super::*;

            type Db = $DB;
            type Tx<'c> = common::$tx::Tx<'c, Db>;

            async fn begin(pool: &sqlx::Pool<Db>) -> Tx<'static> {
                <Tx<'static> as TestTx<Db>>::begin(pool).await
            }

            /// The tables are created by one test at a time: concurrent CREATE
            /// TABLE IF NOT EXISTS can collide on PostgreSQL's catalog. (Each
            /// SQLite test has a database file of its own, so every test runs it.)
            static DDL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

            macro_rules! pool {
                () => {
                    match $pool().await {
                        Some(pool) => {
                            let _one_at_a_time = DDL.lock().await;
                            sqlx::raw_sql($ddl).execute(&pool).await.unwrap();
                            pool
                        }
                        None => return,
                    }
                };
            }

            async fn new_order(pool: &sqlx::Pool<Db>, status: i32) -> String {
                let order_no = unique("order");
                sqlx::query($insert_order).bind(&order_no).bind(status).execute(pool).await.unwrap();
                order_no
            }

            async fn status(pool: &sqlx::Pool<Db>, order_no: &str) -> i32 {
                sqlx::query_scalar($get_status).bind(order_no).fetch_one(pool).await.unwrap()
            }

            async fn set_status(pool: &sqlx::Pool<Db>, order_no: &str, status: i32) {
                sqlx::query($set_status).bind(status).bind(order_no).execute(pool).await.unwrap();
            }

            async fn coupons(pool: &sqlx::Pool<Db>, order_no: &str) -> i64 {
                sqlx::query_scalar($count).bind(order_no).fetch_one(pool).await.unwrap()
            }

            async fn records(pool: &sqlx::Pool<Db>, scope: &str, order_no: &str) -> i64 {
                sqlx::query_scalar($count_records).bind(scope).bind(order_no).fetch_one(pool).await.unwrap()
            }

            /// The pay callback as a state change: the coupon hangs off the transition.
            #[idempotent(
                key = "order_no",
                strategy = "state",
                scope = "tests.state.pay",
                transition = "OrderStatus::WaitPay -> OrderStatus::Paid"
            )]
            async fn pay(
                tx: &mut Tx<'_>,
                order_no: &str,
                fail: bool,
                runs: &AtomicUsize,
            ) -> Result<(), AppError> {
                runs.fetch_add(1, SeqCst);
                sqlx::query($insert_coupon).bind(order_no).execute(&mut **tx).await?;
                if fail {
                    return Err(AppError::Rule("coupon service refused".into()));
                }
                Ok(())
            }

            #[idempotent(
                key = "order_no",
                strategy = "state",
                scope = "tests.state.cancel",
                transition = "OrderStatus::WaitPay | OrderStatus::Paid -> OrderStatus::Canceled"
            )]
            async fn cancel(
                tx: &mut Tx<'_>,
                order_no: &str,
                fail: bool,
                runs: &AtomicUsize,
            ) -> Result<Option<String>, AppError> {
                let _ = &tx;
                runs.fetch_add(1, SeqCst);
                if fail {
                    return Err(AppError::Rule("refund failed".into()));
                }
                Ok(Some(format!("canceled {order_no}")))
            }

            /// The payment-callback scheme: dedup record and transition together.
            #[idempotent(
                key = "order_no",
                strategy = "dedup+state",
                scope = "tests.dedup_state.pay",
                fingerprint = "amount",
                transition = "OrderStatus::WaitPay -> OrderStatus::Paid"
            )]
            async fn pay_both(
                tx: &mut Tx<'_>,
                order_no: &str,
                amount: i64,
                runs: &AtomicUsize,
            ) -> Result<PayAck, AppError> {
                let n = runs.fetch_add(1, SeqCst);
                sqlx::query($insert_coupon).bind(order_no).execute(&mut **tx).await?;
                Ok(PayAck { coupon: Some(format!("coupon-{amount}-{n}")) })
            }

            #[idempotent(
                key = "order_no",
                strategy = "dedup+state",
                scope = "tests.dedup_state.cancel",
                transition = "OrderStatus::WaitPay | OrderStatus::Paid -> OrderStatus::Canceled"
            )]
            async fn cancel_both(
                tx: &mut Tx<'_>,
                order_no: &str,
                fail: bool,
            ) -> Result<Option<String>, AppError> {
                let _ = &tx;
                if fail {
                    return Err(AppError::Rule("refund failed".into()));
                }
                Ok(Some(format!("canceled {order_no}")))
            }

            #[idempotent(
                key = "id",
                strategy = "state",
                scope = "tests.state.close",
                transition = "TicketState::Open -> TicketState::Closed"
            )]
            async fn close_ticket(tx: &mut Tx<'_>, id: i64) -> Result<(), AppError> {
                let _ = &tx;
                Ok(())
            }

            async fn call_pay(
                pool: &sqlx::Pool<Db>,
                order_no: &str,
                fail: bool,
                runs: &AtomicUsize,
            ) -> (Result<(), AppError>, Option<Outcome>) {
                let mut tx = begin(pool).await;
                let (result, outcome) = idem::observe(pay(&mut tx, order_no, fail, runs)).await;
                // Commit even after an error: the guard must leave nothing behind.
                tx.commit().await.unwrap();
                (result, outcome)
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn state_100_concurrent_callbacks_one_transition_one_coupon() {
                let pool = pool!();
                let order_no = new_order(&pool, 1).await;
                let runs = Arc::new(AtomicUsize::new(0));
                let mut tasks = Vec::new();
                for _ in 0..100 {
                    let (pool, order_no, runs) = (pool.clone(), order_no.clone(), runs.clone());
                    tasks.push(tokio::spawn(async move { call_pay(&pool, &order_no, false, &runs).await }));
                }
                let mut replays = 0;
                for t in tasks {
                    let (result, outcome) = t.await.unwrap();
                    result.unwrap();
                    if outcome == Some(Outcome::Replayed) {
                        replays += 1;
                    }
                }
                assert_eq!(runs.load(SeqCst), 1);
                assert_eq!(replays, 99);
                assert_eq!(coupons(&pool, &order_no).await, 1);
                assert_eq!(status(&pool, &order_no).await, 2);
            }

            #[tokio::test]
            async fn state_illegal_transition_is_an_error_and_changes_nothing() {
                let pool = pool!();
                let order_no = new_order(&pool, 4).await; // FINISHED
                let runs = AtomicUsize::new(0);
                let (result, outcome) = call_pay(&pool, &order_no, false, &runs).await;
                match result {
                    Err(AppError::Idem(Error::IllegalTransition { from, to, current, scope, .. })) => {
                        assert_eq!(from, "OrderStatus::WaitPay");
                        assert_eq!(to, "OrderStatus::Paid");
                        assert_eq!(current, "OrderStatus::Finished");
                        assert_eq!(scope, "tests.state.pay");
                    }
                    other => panic!("expected IllegalTransition, got {other:?}"),
                }
                assert_eq!(outcome, Some(Outcome::Rejected));
                assert_eq!(runs.load(SeqCst), 0);
                assert_eq!(status(&pool, &order_no).await, 4);
                assert_eq!(coupons(&pool, &order_no).await, 0);
            }

            #[tokio::test]
            async fn state_unknown_stored_code_is_illegal_and_named() {
                let pool = pool!();
                let order_no = new_order(&pool, 7).await;
                let (result, _) = call_pay(&pool, &order_no, false, &AtomicUsize::new(0)).await;
                match result {
                    Err(AppError::Idem(Error::IllegalTransition { current, .. })) => {
                        assert!(current.contains("7") && current.contains("OrderStatus"), "{current}")
                    }
                    other => panic!("expected IllegalTransition, got {other:?}"),
                }
            }

            #[tokio::test]
            async fn state_missing_entity_is_not_found() {
                let pool = pool!();
                let (result, _) = call_pay(&pool, &unique("no-such-order"), false, &AtomicUsize::new(0)).await;
                assert!(matches!(result, Err(AppError::Idem(Error::NotFound { .. }))), "{result:?}");
            }

            #[tokio::test]
            async fn state_body_error_undoes_the_transition_even_if_the_caller_commits() {
                let pool = pool!();
                let order_no = new_order(&pool, 1).await;
                let runs = AtomicUsize::new(0);
                let (result, _) = call_pay(&pool, &order_no, true, &runs).await;
                assert!(matches!(result, Err(AppError::Rule(_))), "{result:?}");
                assert_eq!(status(&pool, &order_no).await, 1, "the failed call must not leave the order PAID");
                // A retry runs the body again and makes the transition.
                let (result, outcome) = call_pay(&pool, &order_no, false, &runs).await;
                result.unwrap();
                assert_eq!(outcome, Some(Outcome::Executed));
                assert_eq!(runs.load(SeqCst), 2);
                assert_eq!(status(&pool, &order_no).await, 2);
            }

            #[tokio::test]
            async fn state_repeat_after_commit_is_a_silent_success() {
                let pool = pool!();
                let order_no = new_order(&pool, 1).await;
                let runs = AtomicUsize::new(0);
                for _ in 0..6 {
                    call_pay(&pool, &order_no, false, &runs).await.0.unwrap();
                }
                assert_eq!(runs.load(SeqCst), 1);
                assert_eq!(coupons(&pool, &order_no).await, 1);
            }

            #[tokio::test]
            async fn state_several_sources_move_from_the_one_the_entity_is_in() {
                let pool = pool!();
                let runs = AtomicUsize::new(0);
                for start in [1, 2] {
                    let order_no = new_order(&pool, start).await;
                    // The body fails: the order goes back to exactly where it was.
                    let mut tx = begin(&pool).await;
                    assert!(cancel(&mut tx, &order_no, true, &runs).await.is_err());
                    tx.commit().await.unwrap();
                    assert_eq!(status(&pool, &order_no).await, start);

                    let mut tx = begin(&pool).await;
                    assert_eq!(
                        cancel(&mut tx, &order_no, false, &runs).await.unwrap(),
                        Some(format!("canceled {order_no}"))
                    );
                    tx.commit().await.unwrap();
                    assert_eq!(status(&pool, &order_no).await, 9);
                    // A repeat: no stored answer under `state`, so the silent one.
                    let mut tx = begin(&pool).await;
                    assert_eq!(cancel(&mut tx, &order_no, false, &runs).await.unwrap(), None);
                    tx.commit().await.unwrap();
                }
                let shipped = new_order(&pool, 3).await;
                let mut tx = begin(&pool).await;
                let err = cancel(&mut tx, &shipped, false, &runs).await.unwrap_err();
                match err {
                    AppError::Idem(Error::IllegalTransition { from, current, .. }) => {
                        assert_eq!(from, "OrderStatus::WaitPay | OrderStatus::Paid");
                        assert_eq!(current, "OrderStatus::Shipped");
                    }
                    other => panic!("{other:?}"),
                }
                assert_eq!(runs.load(SeqCst), 4);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn state_several_sources_100_concurrent_cancels_move_once() {
                let pool = pool!();
                let order_no = new_order(&pool, 2).await;
                let runs = Arc::new(AtomicUsize::new(0));
                let mut tasks = Vec::new();
                for _ in 0..100 {
                    let (pool, order_no, runs) = (pool.clone(), order_no.clone(), runs.clone());
                    tasks.push(tokio::spawn(async move {
                        let mut tx = begin(&pool).await;
                        let answer = cancel(&mut tx, &order_no, false, &runs).await.unwrap();
                        tx.commit().await.unwrap();
                        answer
                    }));
                }
                let mut first_answers = 0;
                for t in tasks {
                    if t.await.unwrap().is_some() {
                        first_answers += 1;
                    }
                }
                assert_eq!(runs.load(SeqCst), 1);
                assert_eq!(first_answers, 1, "one call made the move, 99 were silent repeats");
                assert_eq!(status(&pool, &order_no).await, 9);
            }

            #[tokio::test]
            async fn state_text_codes_and_integer_keys() {
                let pool = pool!();
                let id = unique_id();
                sqlx::query($insert_ticket).bind(id).bind("OPEN").execute(&pool).await.unwrap();
                for _ in 0..2 {
                    let mut tx = begin(&pool).await;
                    close_ticket(&mut tx, id).await.unwrap();
                    tx.commit().await.unwrap();
                }
                let state: String = sqlx::query_scalar($get_ticket).bind(id).fetch_one(&pool).await.unwrap();
                assert_eq!(state, "CLOSED");
                let mut tx = begin(&pool).await;
                assert!(matches!(close_ticket(&mut tx, id + 1).await, Err(AppError::Idem(Error::NotFound { .. }))));
            }

            /// A status written in another case (`Open`, by a legacy system):
            /// MySQL's collation matches it to `OPEN` and the move is made;
            /// PostgreSQL and SQLite compare exactly, so it is no state of the
            /// machine: an error naming it, not a retry that can never succeed.
            #[tokio::test]
            async fn state_text_code_in_another_case() {
                let pool = pool!();
                let id = unique_id();
                sqlx::query($insert_ticket).bind(id).bind("Open").execute(&pool).await.unwrap();
                let mut tx = begin(&pool).await;
                let result = close_ticket(&mut tx, id).await;
                tx.commit().await.unwrap();
                let state: String = sqlx::query_scalar($get_ticket).bind(id).fetch_one(&pool).await.unwrap();
                if <Db as idem::sql::SqlBackend>::TEXT_IGNORES_CASE {
                    result.unwrap();
                    assert_eq!(state, "CLOSED");
                } else {
                    match result {
                        Err(AppError::Idem(Error::IllegalTransition { current, .. })) => {
                            assert_eq!(current, "'Open' (no variant of TicketState is stored so)")
                        }
                        other => panic!("{other:?}"),
                    }
                    assert_eq!(state, "Open");
                }
            }

            async fn call_both(
                pool: &sqlx::Pool<Db>,
                order_no: &str,
                amount: i64,
                runs: &AtomicUsize,
            ) -> (Result<PayAck, AppError>, Option<Outcome>) {
                let mut tx = begin(pool).await;
                let out = idem::observe(pay_both(&mut tx, order_no, amount, runs)).await;
                tx.commit().await.unwrap();
                out
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn dedup_state_100_concurrent_callbacks_replay_the_first_answer() {
                let pool = pool!();
                let order_no = new_order(&pool, 1).await;
                let runs = Arc::new(AtomicUsize::new(0));
                let mut tasks = Vec::new();
                for _ in 0..100 {
                    let (pool, order_no, runs) = (pool.clone(), order_no.clone(), runs.clone());
                    tasks.push(tokio::spawn(async move { call_both(&pool, &order_no, 500, &runs).await }));
                }
                let mut answers = Vec::new();
                for t in tasks {
                    let (result, _) = t.await.unwrap();
                    answers.push(result.unwrap());
                }
                assert_eq!(runs.load(SeqCst), 1);
                assert!(answers.iter().all(|a| *a == PayAck { coupon: Some("coupon-500-0".into()) }), "{answers:?}");
                assert_eq!(coupons(&pool, &order_no).await, 1);
                assert_eq!(status(&pool, &order_no).await, 2);
                assert_eq!(records(&pool, "tests.dedup_state.pay", &order_no).await, 1);
            }

            #[tokio::test]
            async fn dedup_state_record_present_state_moved_on_replays() {
                let pool = pool!();
                let order_no = new_order(&pool, 1).await;
                let runs = AtomicUsize::new(0);
                let first = call_both(&pool, &order_no, 500, &runs).await.0.unwrap();
                set_status(&pool, &order_no, 3).await; // shipped since
                let (again, outcome) = call_both(&pool, &order_no, 500, &runs).await;
                assert_eq!(again.unwrap(), first);
                assert_eq!(outcome, Some(Outcome::Replayed));
                assert_eq!(runs.load(SeqCst), 1);
                // The record is checked first: a different payload is a mismatch.
                let (other, _) = call_both(&pool, &order_no, 999, &runs).await;
                assert!(matches!(other, Err(AppError::Idem(Error::KeyMismatch { .. }))), "{other:?}");
            }

            #[tokio::test]
            async fn dedup_state_state_moved_without_record_is_a_silent_repeat() {
                let pool = pool!();
                let order_no = new_order(&pool, 2).await; // paid through another path
                let runs = AtomicUsize::new(0);
                let (result, outcome) = call_both(&pool, &order_no, 500, &runs).await;
                assert_eq!(result.unwrap(), PayAck { coupon: None });
                assert_eq!(outcome, Some(Outcome::Replayed));
                assert_eq!(runs.load(SeqCst), 0);
                assert_eq!(coupons(&pool, &order_no).await, 0);
                assert_eq!(
                    records(&pool, "tests.dedup_state.pay", &order_no).await,
                    0,
                    "no record without a first answer"
                );
            }

            #[tokio::test]
            async fn dedup_state_illegal_or_missing_leaves_no_record() {
                let pool = pool!();
                let finished = new_order(&pool, 4).await;
                let runs = AtomicUsize::new(0);
                let (result, _) = call_both(&pool, &finished, 500, &runs).await;
                assert!(matches!(result, Err(AppError::Idem(Error::IllegalTransition { .. }))), "{result:?}");
                assert_eq!(records(&pool, "tests.dedup_state.pay", &finished).await, 0);
                let missing = unique("no-such-order");
                let (result, _) = call_both(&pool, &missing, 500, &runs).await;
                assert!(matches!(result, Err(AppError::Idem(Error::NotFound { .. }))), "{result:?}");
                assert_eq!(records(&pool, "tests.dedup_state.pay", &missing).await, 0);
                assert_eq!(runs.load(SeqCst), 0);
            }

            #[idempotent(
                key = "order_no",
                strategy = "dedup+state",
                scope = "tests.dedup_state.checked",
                transition = "CheckedStatus::One -> CheckedStatus::Two"
            )]
            async fn move_checked(tx: &mut Tx<'_>, order_no: &str) -> Result<(), AppError> {
                let _ = &tx;
                Ok(())
            }

            #[tokio::test]
            async fn dedup_state_failing_transition_is_an_error_and_leaves_no_record() {
                let pool = pool!();
                let order_no = unique("checked");
                sqlx::query($insert_checked).bind(&order_no).execute(&pool).await.unwrap();
                let mut tx = begin(&pool).await;
                let result = move_checked(&mut tx, &order_no).await;
                assert!(matches!(result, Err(AppError::Idem(Error::Database(_)))), "{result:?}");
                // Committing anyway (PostgreSQL turns it into a rollback) leaves nothing behind.
                let _ = tx.commit().await;
                assert_eq!(records(&pool, "tests.dedup_state.checked", &order_no).await, 0);
            }

            #[tokio::test]
            async fn dedup_state_body_error_leaves_neither_record_nor_transition() {
                let pool = pool!();
                let order_no = new_order(&pool, 2).await;
                let mut tx = begin(&pool).await;
                assert!(cancel_both(&mut tx, &order_no, true).await.is_err());
                tx.commit().await.unwrap();
                assert_eq!(status(&pool, &order_no).await, 2);
                assert_eq!(records(&pool, "tests.dedup_state.cancel", &order_no).await, 0);
                for _ in 0..2 {
                    let mut tx = begin(&pool).await;
                    assert_eq!(
                        cancel_both(&mut tx, &order_no, false).await.unwrap(),
                        Some(format!("canceled {order_no}"))
                    );
                    tx.commit().await.unwrap();
                }
                assert_eq!(status(&pool, &order_no).await, 9);
                assert_eq!(records(&pool, "tests.dedup_state.cancel", &order_no).await, 1);
            }
        }
    };
}

state_suite! {
    mod sqlite;
    tx = sqlx_tx | idem_tx;
    db = sqlx::Sqlite;
    pool = common::sqlite;
    ddl = "CREATE TABLE IF NOT EXISTS idem_test_state_orders (order_no TEXT PRIMARY KEY, status INTEGER NOT NULL);
           CREATE TABLE IF NOT EXISTS idem_test_tickets (id INTEGER PRIMARY KEY, state TEXT NOT NULL);
           CREATE TABLE IF NOT EXISTS idem_test_checked (order_no TEXT PRIMARY KEY, status INTEGER NOT NULL CHECK (status <> 2));";
    insert_order = "INSERT INTO idem_test_state_orders (order_no, status) VALUES (?, ?)";
    set_status = "UPDATE idem_test_state_orders SET status = ? WHERE order_no = ?";
    get_status = "SELECT status FROM idem_test_state_orders WHERE order_no = ?";
    insert_coupon = "INSERT INTO idem_test_coupons (trade_no) VALUES (?)";
    count_coupons = "SELECT COUNT(*) FROM idem_test_coupons WHERE trade_no = ?";
    insert_ticket = "INSERT INTO idem_test_tickets (id, state) VALUES (?, ?)";
    get_ticket = "SELECT state FROM idem_test_tickets WHERE id = ?";
    count_records = "SELECT COUNT(*) FROM idem_records WHERE scope = ? AND idem_key = ?";
    insert_checked = "INSERT INTO idem_test_checked (order_no, status) VALUES (?, 1)";
}

state_suite! {
    mod postgres;
    tx = sqlx_tx | idem_tx;
    db = sqlx::Postgres;
    pool = common::postgres;
    ddl = "CREATE TABLE IF NOT EXISTS idem_test_state_orders (order_no VARCHAR(191) PRIMARY KEY, status SMALLINT NOT NULL);
           CREATE TABLE IF NOT EXISTS idem_test_tickets (id BIGINT PRIMARY KEY, state VARCHAR(16) NOT NULL);
           CREATE TABLE IF NOT EXISTS idem_test_checked (order_no VARCHAR(191) PRIMARY KEY, status INT NOT NULL CHECK (status <> 2));";
    insert_order = "INSERT INTO idem_test_state_orders (order_no, status) VALUES ($1, $2)";
    set_status = "UPDATE idem_test_state_orders SET status = $1 WHERE order_no = $2";
    get_status = "SELECT status::int4 FROM idem_test_state_orders WHERE order_no = $1";
    insert_coupon = "INSERT INTO idem_test_coupons (trade_no) VALUES ($1)";
    count_coupons = "SELECT COUNT(*) FROM idem_test_coupons WHERE trade_no = $1";
    insert_ticket = "INSERT INTO idem_test_tickets (id, state) VALUES ($1, $2)";
    get_ticket = "SELECT state FROM idem_test_tickets WHERE id = $1";
    count_records = "SELECT COUNT(*) FROM idem_records WHERE scope = $1 AND idem_key = $2";
    insert_checked = "INSERT INTO idem_test_checked (order_no, status) VALUES ($1, 1)";
}

state_suite! {
    mod mysql;
    tx = sqlx_tx | idem_tx;
    db = sqlx::MySql;
    pool = common::mysql;
    ddl = "CREATE TABLE IF NOT EXISTS idem_test_state_orders (order_no VARCHAR(191) PRIMARY KEY, status SMALLINT NOT NULL) ENGINE = InnoDB;
           CREATE TABLE IF NOT EXISTS idem_test_tickets (id BIGINT PRIMARY KEY, state VARCHAR(16) NOT NULL) ENGINE = InnoDB;
           CREATE TABLE IF NOT EXISTS idem_test_checked (order_no VARCHAR(191) PRIMARY KEY, status INT NOT NULL CHECK (status <> 2)) ENGINE = InnoDB;";
    insert_order = "INSERT INTO idem_test_state_orders (order_no, status) VALUES (?, ?)";
    set_status = "UPDATE idem_test_state_orders SET status = ? WHERE order_no = ?";
    get_status = "SELECT CAST(status AS SIGNED) FROM idem_test_state_orders WHERE order_no = ?";
    insert_coupon = "INSERT INTO idem_test_coupons (trade_no) VALUES (?)";
    count_coupons = "SELECT COUNT(*) FROM idem_test_coupons WHERE trade_no = ?";
    insert_ticket = "INSERT INTO idem_test_tickets (id, state) VALUES (?, ?)";
    get_ticket = "SELECT state FROM idem_test_tickets WHERE id = ?";
    count_records = "SELECT COUNT(*) FROM idem_records WHERE scope = ? AND idem_key = ?";
    insert_checked = "INSERT INTO idem_test_checked (order_no, status) VALUES (?, 1)";
}

/// Stored by name in a MySQL column that compares exactly (`utf8mb4_bin`).
#[derive(idem::StateMachine)]
#[state(table = "idem_test_tickets_bin", key_column = "id", status_column = "state", stored_as = "name")]
enum BinTicketState {
    #[state(to(Closed))]
    Open,
    Closed,
}

#[idempotent(
    key = "id",
    strategy = "state",
    scope = "tests.state.close_bin",
    transition = "BinTicketState::Open -> BinTicketState::Closed"
)]
async fn close_bin_ticket(tx: &mut Transaction<'_, sqlx::MySql>, id: i64) -> Result<(), AppError> {
    let _ = &tx;
    Ok(())
}

/// MySQL reads `Open` as `OPEN` (its default collations ignore case), but a
/// `_bin` column's compare-and-set never matches it: after its attempts the
/// guard reads the status exactly and names it, rather than answering
/// `InProgress` to a call that can never succeed.
#[tokio::test]
async fn mysql_status_in_another_case_under_a_binary_collation() {
    let Some(pool) = common::mysql().await else { return };
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS idem_test_tickets_bin (id BIGINT PRIMARY KEY, \
         state VARCHAR(16) COLLATE utf8mb4_bin NOT NULL) ENGINE = InnoDB",
    )
    .execute(&pool)
    .await
    .unwrap();
    let id = unique_id();
    sqlx::query("INSERT INTO idem_test_tickets_bin (id, state) VALUES (?, 'Open')")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    match close_bin_ticket(&mut tx, id).await {
        Err(AppError::Idem(Error::IllegalTransition { current, .. })) => {
            assert_eq!(current, "'Open' (no variant of BinTicketState is stored so)")
        }
        other => panic!("{other:?}"),
    }
}

/// Tickets keyed by text where the table's id is `BIGINT`.
#[idempotent(
    key = "id",
    strategy = "state",
    scope = "tests.state.text_key",
    transition = "TicketState::Open -> TicketState::Closed"
)]
async fn close_ticket_by_text(tx: &mut Transaction<'_, sqlx::Postgres>, id: &str) -> Result<(), AppError> {
    let _ = &tx;
    Ok(())
}

/// PostgreSQL compares a text key with a `BIGINT` column not at all
/// (`operator does not exist: bigint = text`, with advice to add casts the
/// user cannot add): the error names the table and column and says to key
/// the guard with the column's type.
#[tokio::test]
async fn postgres_key_of_another_type_than_its_column() {
    let Some(pool) = common::postgres().await else { return };
    sqlx::raw_sql("CREATE TABLE IF NOT EXISTS idem_test_tickets (id BIGINT PRIMARY KEY, state VARCHAR(16) NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    let err = close_ticket_by_text(&mut tx, "42").await.unwrap_err().to_string();
    assert!(err.contains("`idem_test_tickets`") && err.contains("the type of `id`"), "{err}");
    assert!(err.contains("bigint = text"), "the database's words are kept: {err}");
}
