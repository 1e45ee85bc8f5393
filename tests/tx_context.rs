//! An application's own unit of work as the guard's transaction (`#[idem(tx)]`).

use idem_test_support as common;

use common::{AppError, unique};
use idem::idempotent;
use sqlx::{Sqlite, SqliteConnection, Transaction};

/// A unit of work that owns its transaction.
struct UnitOfWork<'c> {
    tx: Transaction<'c, Sqlite>,
}

impl idem::sql::TxContext for UnitOfWork<'_> {
    type Db = Sqlite;
    fn connection(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }
}

/// A broken implementation that hands out a connection outside any transaction.
struct NotATransaction(sqlx::pool::PoolConnection<Sqlite>);

impl idem::sql::TxContext for NotATransaction {
    type Db = Sqlite;
    fn connection(&mut self) -> &mut SqliteConnection {
        &mut self.0
    }
}

#[idempotent(key = "order_id", scope = "tests.uow")]
async fn ship<W: idem::sql::TxContext<Db = Sqlite>>(
    #[idem(tx)] work: &mut W,
    order_id: &str,
) -> Result<String, AppError> {
    let _ = work;
    Ok(format!("shipped {order_id}"))
}

#[tokio::test]
async fn a_unit_of_work_carries_the_record() {
    let pool = common::sqlite().await.unwrap();
    let order = unique("uow");
    for _ in 0..2 {
        let mut work = UnitOfWork { tx: pool.begin().await.unwrap() };
        let (result, outcome) = idem::observe(ship(&mut work, &order)).await;
        work.tx.commit().await.unwrap();
        assert_eq!(result.unwrap(), format!("shipped {order}"));
        assert!(outcome.is_some());
    }
    let record = idem::sql::find_record(&pool, "tests.uow", &idem::Key::new(&order).unwrap()).await.unwrap();
    assert!(record.is_some());
}

#[tokio::test]
async fn a_connection_outside_a_transaction_is_refused() {
    let pool = common::sqlite().await.unwrap();
    let order = unique("no-tx");
    let mut work = NotATransaction(pool.acquire().await.unwrap());
    let err = ship(&mut work, &order).await.unwrap_err();
    assert!(matches!(err, AppError::Idem(idem::Error::NoTransaction { .. })), "{err:?}");
    let record = idem::sql::find_record(&pool, "tests.uow", &idem::Key::new(&order).unwrap()).await.unwrap();
    assert_eq!(record, None, "nothing may be written outside a transaction");
}

/// Over 128 bytes: stored as its hash.
const LONG_SCOPE: &str = "payments.gateway.callbacks.alipay.trade_status_sync.v2.merchant_notifications.with_a_scope_name_far_longer_than_the_indexed_column_allows";

#[idempotent(
    key = "order_id",
    scope = "payments.gateway.callbacks.alipay.trade_status_sync.v2.merchant_notifications.with_a_scope_name_far_longer_than_the_indexed_column_allows"
)]
async fn long_scoped(tx: &mut Transaction<'_, Sqlite>, order_id: &str) -> Result<(), AppError> {
    let _ = (tx, order_id);
    Ok(())
}

#[tokio::test]
async fn a_long_scope_is_stored_hashed_and_still_found() {
    let pool = common::sqlite().await.unwrap();
    let order = unique("long-scope");
    let mut tx = pool.begin().await.unwrap();
    long_scoped(&mut tx, &order).await.unwrap();
    tx.commit().await.unwrap();
    let record = idem::sql::find_record(&pool, LONG_SCOPE, &idem::Key::new(&order).unwrap()).await.unwrap();
    let record = record.expect("find_record takes the scope as written in the attribute");
    assert!(record.scope.starts_with("\\sha256:"), "{}", record.scope);
}
