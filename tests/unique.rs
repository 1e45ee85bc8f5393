//! `strategy = "unique"` and `"unique+state"` against real SQLite,
//! PostgreSQL and MySQL/MariaDB: the payment table's own unique key
//! (`uk_idem_test_pay_no`) is the guard. One suite, stamped out per
//! backend; each test uses payment numbers of its own.

use idem_test_support as common;

use common::{AppError, unique};
use idem::{Outcome, idempotent, observe};

/// A gateway's payment callback.
struct Payment {
    pay_no: String,
    ext_no: Option<String>,
    amount: i64,
}

fn payment(amount: i64) -> Payment {
    Payment { pay_no: unique("pay"), ext_no: None, amount }
}

/// A status the `unique+state` guard moves (the order paid by the payment).
#[derive(idem::StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state(table = "idem_test_unique_orders", key_column = "order_no", status_column = "status")]
enum OrderStatus {
    #[state(code = 1, to(Paid))]
    WaitPay,
    #[state(code = 2)]
    Paid,
}

macro_rules! unique_suite {
    (
        mod $m:ident;
        db = $DB:ty;
        pool = $pool:path;
        ddl = $ddl:literal;
        insert_coupon = $insert_coupon:literal;
        insert_payment = $insert_payment:literal;
        existing = $existing:literal;
        count = $count:literal;
        count_coupons = $count_coupons:literal;
        insert_order = $insert_order:literal;
    ) => {
        mod $m {
            use super::*;

            type Db = $DB;

            /// One test at a time creates the tables: concurrent CREATE
            /// TABLE IF NOT EXISTS can collide on PostgreSQL's catalog.
            static DDL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

            pub(super) async fn pool() -> Option<sqlx::Pool<Db>> {
                let pool = $pool().await?;
                let _one_at_a_time = DDL.lock().await;
                sqlx::raw_sql($ddl).execute(&pool).await.unwrap();
                Some(pool)
            }

            /// The coupon first, then the payment row (the claim): a
            /// duplicate's coupon is undone with the savepoint.
            #[idempotent(strategy = "unique", constraint = "uk_idem_test_pay_no", replay = "existing")]
            pub(super) async fn pay(tx: &mut sqlx::Transaction<'_, Db>, p: &Payment) -> Result<i64, AppError> {
                sqlx::query($insert_coupon).bind(&p.pay_no).execute(&mut **tx).await?;
                sqlx::query($insert_payment).bind(&p.pay_no).bind(&p.ext_no).bind(p.amount).execute(&mut **tx).await?;
                existing(tx, p).await
            }

            /// The existing row, read so that it sees a winner committed
            /// after this transaction's snapshot (MySQL: a locking read).
            async fn existing(tx: &mut sqlx::Transaction<'_, Db>, p: &Payment) -> Result<i64, AppError> {
                Ok(sqlx::query_scalar($existing).bind(&p.pay_no).fetch_one(&mut **tx).await?)
            }

            /// The payment row as the body's first write: no savepoint.
            #[idempotent(
                strategy = "unique",
                constraint = "uk_idem_test_pay_no",
                replay = "existing",
                savepoint = false
            )]
            async fn pay_first(tx: &mut sqlx::Transaction<'_, Db>, p: &Payment) -> Result<i64, AppError> {
                sqlx::query($insert_payment).bind(&p.pay_no).bind(&p.ext_no).bind(p.amount).execute(&mut **tx).await?;
                sqlx::query($insert_coupon).bind(&p.pay_no).execute(&mut **tx).await?;
                existing(tx, p).await
            }

            /// The body fails after its insert.
            #[idempotent(strategy = "unique", constraint = "uk_idem_test_pay_no", replay = "existing")]
            async fn pay_then_fail(tx: &mut sqlx::Transaction<'_, Db>, p: &Payment) -> Result<i64, AppError> {
                sqlx::query($insert_payment).bind(&p.pay_no).bind(&p.ext_no).bind(p.amount).execute(&mut **tx).await?;
                Err(AppError::Rule("the gateway's signature is wrong".into()))
            }

            #[idempotent(
                strategy = "unique+state",
                key = "order_no",
                constraint = "uk_idem_test_pay_no",
                replay = "existing_for_order",
                transition = "OrderStatus::WaitPay -> OrderStatus::Paid"
            )]
            async fn pay_order(
                tx: &mut sqlx::Transaction<'_, Db>,
                order_no: &str,
                p: &Payment,
            ) -> Result<i64, AppError> {
                pay_body(tx, p).await
            }

            async fn pay_body(tx: &mut sqlx::Transaction<'_, Db>, p: &Payment) -> Result<i64, AppError> {
                sqlx::query($insert_coupon).bind(&p.pay_no).execute(&mut **tx).await?;
                sqlx::query($insert_payment).bind(&p.pay_no).bind(&p.ext_no).bind(p.amount).execute(&mut **tx).await?;
                existing(tx, p).await
            }

            async fn existing_for_order(
                tx: &mut sqlx::Transaction<'_, Db>,
                _order_no: &str,
                p: &Payment,
            ) -> Result<i64, AppError> {
                existing(tx, p).await
            }

            async fn counts(pool: &sqlx::Pool<Db>, pay_no: &str) -> (i64, i64) {
                let rows: i64 = sqlx::query_scalar($count).bind(pay_no).fetch_one(pool).await.unwrap();
                let coupons: i64 = sqlx::query_scalar($count_coupons).bind(pay_no).fetch_one(pool).await.unwrap();
                (rows, coupons)
            }

            async fn call(pool: &sqlx::Pool<Db>, p: &Payment, first: bool) -> (Result<i64, AppError>, Option<Outcome>) {
                let mut tx = pool.begin().await.unwrap();
                let (answer, outcome) =
                    observe(async { if first { pay_first(&mut tx, p).await } else { pay(&mut tx, p).await } }).await;
                if answer.is_ok() {
                    tx.commit().await.unwrap();
                }
                (answer, outcome)
            }

            #[tokio::test]
            async fn a_repeat_replays_the_row_and_grants_no_second_coupon() {
                let Some(pool) = pool().await else { return };
                let p = payment(100);
                let (first, outcome) = call(&pool, &p, false).await;
                let id = first.unwrap();
                assert_eq!(outcome, Some(Outcome::Executed));
                for _ in 0..5 {
                    let (again, outcome) = call(&pool, &p, false).await;
                    assert_eq!(again.unwrap(), id, "the repeat answers with the existing row");
                    assert_eq!(outcome, Some(Outcome::Replayed));
                }
                assert_eq!(counts(&pool, &p.pay_no).await, (1, 1), "one payment row, one coupon");
            }

            #[tokio::test]
            async fn without_a_savepoint_the_first_write_is_the_claim() {
                let Some(pool) = pool().await else { return };
                let p = payment(100);
                let id = call(&pool, &p, true).await.0.unwrap();
                let (again, outcome) = call(&pool, &p, true).await;
                if <Db as idem::sql::SqlBackend>::BACKEND == "postgres" {
                    // A plain insert's duplicate aborts PostgreSQL's
                    // transaction: said so (`postgres_helper` shows the way).
                    match again {
                        Err(AppError::Idem(idem::Error::UniqueAborted { constraint, .. })) => {
                            assert_eq!(constraint, "uk_idem_test_pay_no")
                        }
                        other => panic!("expected UniqueAborted, got {other:?}"),
                    }
                } else {
                    assert_eq!((again.unwrap(), outcome), (id, Some(Outcome::Replayed)));
                }
                assert_eq!(counts(&pool, &p.pay_no).await, (1, 1));
            }

            #[tokio::test]
            async fn fifty_concurrent_duplicates_insert_once_and_replay_the_winner() {
                let Some(pool) = pool().await else { return };
                let p = std::sync::Arc::new(payment(100));
                let calls = (0..50).map(|_| {
                    let (pool, p) = (pool.clone(), p.clone());
                    tokio::spawn(async move { call(&pool, &p, false).await })
                });
                let mut answers = Vec::new();
                let mut executed = 0;
                for call in calls.collect::<Vec<_>>() {
                    let (answer, outcome) = call.await.unwrap();
                    answers.push(answer.unwrap());
                    executed += usize::from(outcome == Some(Outcome::Executed));
                }
                assert_eq!(executed, 1, "one call inserted, every other replayed");
                assert!(answers.iter().all(|a| *a == answers[0]), "every call answers the winner's row: {answers:?}");
                assert_eq!(counts(&pool, &p.pay_no).await, (1, 1));
            }

            #[tokio::test]
            async fn another_unique_key_of_the_table_is_the_body_error() {
                let Some(pool) = pool().await else { return };
                let ext = unique("ext");
                let a = Payment { ext_no: Some(ext.clone()), ..payment(100) };
                call(&pool, &a, false).await.0.unwrap();
                // Another payment number, the same external number: not a repeat.
                let b = Payment { ext_no: Some(ext), ..payment(100) };
                let (answer, _) = call(&pool, &b, false).await;
                match answer {
                    Err(AppError::Db(sqlx::Error::Database(e))) => assert!(e.is_unique_violation(), "{e}"),
                    other => panic!("expected the body's unique violation on the other key, got {other:?}"),
                }
                assert_eq!(counts(&pool, &b.pay_no).await, (0, 0));
            }

            #[tokio::test]
            async fn a_check_violation_is_the_body_error() {
                let Some(pool) = pool().await else { return };
                let p = payment(-5);
                let (answer, outcome) = call(&pool, &p, false).await;
                match answer {
                    Err(AppError::Db(sqlx::Error::Database(e))) => assert!(!e.is_unique_violation(), "{e}"),
                    other => panic!("expected the body's CHECK violation, got {other:?}"),
                }
                assert_eq!(outcome, Some(Outcome::Executed), "the body ran; nothing was replayed");
            }

            #[tokio::test]
            async fn a_body_that_fails_leaves_nothing() {
                let Some(pool) = pool().await else { return };
                let p = payment(100);
                let mut tx = pool.begin().await.unwrap();
                let failed = pay_then_fail(&mut tx, &p).await;
                assert!(matches!(failed, Err(AppError::Rule(_))), "{failed:?}");
                tx.rollback().await.unwrap();
                assert_eq!(counts(&pool, &p.pay_no).await, (0, 0));
                // A retry runs the body again and inserts.
                let id = call(&pool, &p, false).await.0.unwrap();
                assert_eq!(call(&pool, &p, false).await.0.unwrap(), id);
            }

            #[tokio::test]
            async fn unique_state_moves_the_order_once_and_replays_the_row() {
                let Some(pool) = pool().await else { return };
                let order_no = unique("order");
                sqlx::query($insert_order).bind(&order_no).execute(&pool).await.unwrap();
                let p = payment(100);
                let mut answers = Vec::new();
                let mut outcomes = Vec::new();
                for _ in 0..3 {
                    let mut tx = pool.begin().await.unwrap();
                    let (answer, outcome) = observe(pay_order(&mut tx, &order_no, &p)).await;
                    tx.commit().await.unwrap();
                    answers.push(answer.unwrap());
                    outcomes.push(outcome);
                }
                assert_eq!(outcomes, [Some(Outcome::Executed), Some(Outcome::Replayed), Some(Outcome::Replayed)]);
                assert!(answers.iter().all(|a| *a == answers[0]));
                assert_eq!(counts(&pool, &p.pay_no).await, (1, 1));
                // Another order paid with the same payment number: the move
                // is undone with the duplicate's writes, the row replayed.
                let other = unique("order");
                sqlx::query($insert_order).bind(&other).execute(&pool).await.unwrap();
                let mut tx = pool.begin().await.unwrap();
                let (answer, outcome) = observe(pay_order(&mut tx, &other, &p)).await;
                tx.commit().await.unwrap();
                assert_eq!((answer.unwrap(), outcome), (answers[0], Some(Outcome::Replayed)));
                assert_eq!(counts(&pool, &p.pay_no).await, (1, 1));
            }

            #[tokio::test]
            async fn the_guard_api_says_duplicate_and_takes_the_replay() {
                use idem::unique::Completed;
                use idem::{Claim, Guard};
                let Some(pool) = pool().await else { return };
                let p = payment(100);
                let mut results = Vec::new();
                for _ in 0..2 {
                    let mut tx = pool.begin().await.unwrap();
                    let Claim::Run(ticket) =
                        Guard::new("unique.guard_api").unique(&mut tx, "uk_idem_test_pay_no").await.unwrap()
                    else {
                        panic!("`unique` always runs the body")
                    };
                    let body = pay_body(&mut tx, &p).await;
                    let answer = match ticket.complete(&mut tx, body).await.unwrap() {
                        Completed::Answer(answer) => ("ran", answer.unwrap()),
                        Completed::Duplicate(replaying) => {
                            ("replayed", replaying.answer(existing(&mut tx, &p).await).unwrap())
                        }
                    };
                    tx.commit().await.unwrap();
                    results.push(answer);
                }
                assert_eq!(results[0].0, "ran");
                assert_eq!(results[1], ("replayed", results[0].1));
            }
        }
    };
}

unique_suite! {
    mod sqlite;
    db = sqlx::Sqlite;
    pool = common::sqlite;
    ddl = "CREATE TABLE IF NOT EXISTS idem_test_unique_pay (id INTEGER PRIMARY KEY AUTOINCREMENT, \
           pay_no TEXT NOT NULL, ext_no TEXT, amount INTEGER NOT NULL CHECK (amount > 0));
           CREATE UNIQUE INDEX IF NOT EXISTS uk_idem_test_pay_no ON idem_test_unique_pay (pay_no);
           CREATE UNIQUE INDEX IF NOT EXISTS uk_idem_test_ext_no ON idem_test_unique_pay (ext_no);
           CREATE TABLE IF NOT EXISTS idem_test_unique_coupons (id INTEGER PRIMARY KEY AUTOINCREMENT, pay_no TEXT NOT NULL);
           CREATE TABLE IF NOT EXISTS idem_test_unique_orders (order_no TEXT PRIMARY KEY, status INTEGER NOT NULL);";
    insert_coupon = "INSERT INTO idem_test_unique_coupons (pay_no) VALUES (?)";
    insert_payment = "INSERT INTO idem_test_unique_pay (pay_no, ext_no, amount) VALUES (?, ?, ?)";
    existing = "SELECT id FROM idem_test_unique_pay WHERE pay_no = ?";
    count = "SELECT COUNT(*) FROM idem_test_unique_pay WHERE pay_no = ?";
    count_coupons = "SELECT COUNT(*) FROM idem_test_unique_coupons WHERE pay_no = ?";
    insert_order = "INSERT INTO idem_test_unique_orders (order_no, status) VALUES (?, 1)";
}

unique_suite! {
    mod postgres;
    db = sqlx::Postgres;
    pool = common::postgres;
    ddl = "CREATE TABLE IF NOT EXISTS idem_test_unique_pay (id BIGSERIAL PRIMARY KEY, pay_no VARCHAR(191) NOT NULL, \
           ext_no VARCHAR(191), amount BIGINT NOT NULL, CONSTRAINT uk_idem_test_pay_no UNIQUE (pay_no), \
           CONSTRAINT uk_idem_test_ext_no UNIQUE (ext_no), CONSTRAINT ck_idem_test_amount CHECK (amount > 0));
           CREATE TABLE IF NOT EXISTS idem_test_unique_coupons (id BIGSERIAL PRIMARY KEY, pay_no VARCHAR(191) NOT NULL);
           CREATE INDEX IF NOT EXISTS idem_test_unique_coupons_pay_no ON idem_test_unique_coupons (pay_no);
           CREATE TABLE IF NOT EXISTS idem_test_unique_orders (order_no VARCHAR(191) PRIMARY KEY, status INT NOT NULL);";
    insert_coupon = "INSERT INTO idem_test_unique_coupons (pay_no) VALUES ($1)";
    insert_payment = "INSERT INTO idem_test_unique_pay (pay_no, ext_no, amount) VALUES ($1, $2, $3)";
    existing = "SELECT id FROM idem_test_unique_pay WHERE pay_no = $1";
    count = "SELECT COUNT(*) FROM idem_test_unique_pay WHERE pay_no = $1";
    count_coupons = "SELECT COUNT(*) FROM idem_test_unique_coupons WHERE pay_no = $1";
    insert_order = "INSERT INTO idem_test_unique_orders (order_no, status) VALUES ($1, 1)";
}

unique_suite! {
    mod mysql;
    db = sqlx::MySql;
    pool = common::mysql;
    ddl = "CREATE TABLE IF NOT EXISTS idem_test_unique_pay (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
           pay_no VARCHAR(191) NOT NULL, ext_no VARCHAR(191), amount BIGINT NOT NULL, \
           UNIQUE KEY uk_idem_test_pay_no (pay_no), UNIQUE KEY uk_idem_test_ext_no (ext_no), \
           CONSTRAINT ck_idem_test_amount CHECK (amount > 0)) ENGINE = InnoDB;
           CREATE TABLE IF NOT EXISTS idem_test_unique_coupons (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
           pay_no VARCHAR(191) NOT NULL, INDEX (pay_no)) ENGINE = InnoDB;
           CREATE TABLE IF NOT EXISTS idem_test_unique_orders (order_no VARCHAR(191) PRIMARY KEY, status INT NOT NULL) ENGINE = InnoDB;";
    insert_coupon = "INSERT INTO idem_test_unique_coupons (pay_no) VALUES (?)";
    insert_payment = "INSERT INTO idem_test_unique_pay (pay_no, ext_no, amount) VALUES (?, ?, ?)";
    // REPEATABLE READ: a plain read would see the snapshot, not the winner.
    existing = "SELECT id FROM idem_test_unique_pay WHERE pay_no = ? LOCK IN SHARE MODE";
    count = "SELECT COUNT(*) FROM idem_test_unique_pay WHERE pay_no = ?";
    count_coupons = "SELECT COUNT(*) FROM idem_test_unique_coupons WHERE pay_no = ?";
    insert_order = "INSERT INTO idem_test_unique_orders (order_no, status) VALUES (?, 1)";
}

/// SQLite's message names columns, not the index: `table(a, b)` names them.
mod sqlite_columns {
    use super::*;

    #[idempotent(strategy = "unique", constraint = "idem_test_unique_pay(pay_no)", replay = "existing")]
    async fn pay(tx: &mut sqlx::SqliteTransaction<'_>, p: &Payment) -> Result<i64, AppError> {
        sqlx::query("INSERT INTO idem_test_unique_pay (pay_no, ext_no, amount) VALUES (?, ?, ?)")
            .bind(&p.pay_no)
            .bind(&p.ext_no)
            .bind(p.amount)
            .execute(&mut **tx)
            .await?;
        existing(tx, p).await
    }

    async fn existing(tx: &mut sqlx::SqliteTransaction<'_>, p: &Payment) -> Result<i64, AppError> {
        Ok(sqlx::query_scalar("SELECT id FROM idem_test_unique_pay WHERE pay_no = ?")
            .bind(&p.pay_no)
            .fetch_one(&mut **tx)
            .await?)
    }

    #[tokio::test]
    async fn columns_written_as_table_and_columns_are_the_key() {
        let Some(pool) = common::sqlite().await else { return };
        sqlx::raw_sql(
            "CREATE TABLE idem_test_unique_pay (id INTEGER PRIMARY KEY, pay_no TEXT NOT NULL UNIQUE, \
             ext_no TEXT UNIQUE, amount INTEGER NOT NULL)",
        )
        .execute(&pool)
        .await
        .unwrap();
        let p = payment(1);
        let mut answers = Vec::new();
        for _ in 0..2 {
            let mut tx = pool.begin().await.unwrap();
            answers.push(observe(pay(&mut tx, &p)).await);
            tx.commit().await.unwrap();
        }
        let id = *answers[0].0.as_ref().unwrap();
        assert_eq!(answers[1].0.as_ref().unwrap(), &id);
        assert_eq!(answers.iter().map(|a| a.1).collect::<Vec<_>>(), [Some(Outcome::Executed), Some(Outcome::Replayed)]);
    }
}

/// PostgreSQL without a savepoint: the claim helper.
mod postgres_helper {
    use super::*;

    #[idempotent(strategy = "unique", constraint = "uk_idem_test_pay_no", replay = "existing", savepoint = false)]
    async fn pay(tx: &mut sqlx::PgTransaction<'_>, p: &Payment) -> Result<i64, AppError> {
        let insert = sqlx::query(
            "INSERT INTO idem_test_unique_pay (pay_no, ext_no, amount) VALUES ($1, $2, $3) \
             ON CONFLICT ON CONSTRAINT uk_idem_test_pay_no DO NOTHING",
        );
        idem::unique::insert(&mut **tx, "uk_idem_test_pay_no", insert.bind(&p.pay_no).bind(&p.ext_no).bind(p.amount))
            .await?;
        sqlx::query("INSERT INTO idem_test_unique_coupons (pay_no) VALUES ($1)")
            .bind(&p.pay_no)
            .execute(&mut **tx)
            .await?;
        existing(tx, p).await
    }

    async fn existing(tx: &mut sqlx::PgTransaction<'_>, p: &Payment) -> Result<i64, AppError> {
        Ok(sqlx::query_scalar("SELECT id FROM idem_test_unique_pay WHERE pay_no = $1")
            .bind(&p.pay_no)
            .fetch_one(&mut **tx)
            .await?)
    }

    async fn pool() -> Option<sqlx::PgPool> {
        // The tables are the suite's.
        super::postgres::pool().await
    }

    #[tokio::test]
    async fn the_claim_helper_needs_no_savepoint() {
        let Some(pool) = pool().await else { return };
        let p = payment(100);
        let mut answers = Vec::new();
        for _ in 0..3 {
            let mut tx = pool.begin().await.unwrap();
            let (answer, outcome) = observe(pay(&mut tx, &p)).await;
            tx.commit().await.unwrap();
            answers.push((answer.unwrap(), outcome));
        }
        let id = answers[0].0;
        assert_eq!(
            answers,
            [(id, Some(Outcome::Executed)), (id, Some(Outcome::Replayed)), (id, Some(Outcome::Replayed))]
        );
        let coupons: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_test_unique_coupons WHERE pay_no = $1")
            .bind(&p.pay_no)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(coupons, 1);
    }
}

/// MariaDB's REPEATABLE READ: the loser's snapshot predates the winner's
/// row; the replay's locking read sees it anyway.
mod mysql_repeatable_read {
    use super::*;

    #[tokio::test]
    async fn the_replay_sees_a_winner_committed_after_the_losers_snapshot() {
        let Some(pool) = super::mysql::pool().await else { return };
        let p = payment(100);
        let mut loser = pool.begin().await.unwrap();
        // The loser's snapshot: taken by its first read, before the winner.
        let before: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_test_unique_pay WHERE pay_no = ?")
            .bind(&p.pay_no)
            .fetch_one(&mut *loser)
            .await
            .unwrap();
        assert_eq!(before, 0);
        let mut winner = pool.begin().await.unwrap();
        let id = super::mysql::pay(&mut winner, &p).await.unwrap();
        winner.commit().await.unwrap();
        let (answer, outcome) = observe(super::mysql::pay(&mut loser, &p)).await;
        assert_eq!((answer.unwrap(), outcome), (id, Some(Outcome::Replayed)));
        // A plain read in the loser still sees its snapshot: without the
        // locking read the replay would have found no row.
        let plain: Option<i64> = sqlx::query_scalar("SELECT id FROM idem_test_unique_pay WHERE pay_no = ?")
            .bind(&p.pay_no)
            .fetch_optional(&mut *loser)
            .await
            .unwrap();
        assert_eq!(plain, None, "REPEATABLE READ: the plain read sees the snapshot");
        loser.commit().await.unwrap();
    }
}
