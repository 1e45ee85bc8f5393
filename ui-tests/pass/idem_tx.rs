//! `idem::Tx` (and its aliases) is recognised as the transaction without
//! `#[idem(tx)]`, for every strategy that writes in the caller's transaction.
use idem::{PgTx, StateMachine, Tx, idempotent};
use sqlx::{MySql, Postgres, Sqlite};

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}
impl From<sqlx::Error> for AppError {
    fn from(_: sqlx::Error) -> Self {
        AppError
    }
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state(table = "orders", key_column = "order_no", status_column = "status")]
pub enum OrderStatus {
    #[state(to(Paid))]
    WaitPay = 1,
    Paid = 2,
}

#[idempotent(key = "trade_no")]
async fn grant(tx: &mut Tx<Postgres>, trade_no: &str) -> Result<i64, AppError> {
    let id = sqlx::query_scalar("INSERT INTO coupons (trade_no) VALUES ($1) RETURNING id")
        .bind(trade_no)
        .fetch_one(&mut **tx)
        .await?;
    Ok(id)
}

#[idempotent(key = "trade_no", claim = "after")]
async fn grant_after(tx: &mut idem::MySqlTx, trade_no: &str) -> Result<u64, AppError> {
    sqlx::query("INSERT INTO coupons (trade_no) VALUES (?)").bind(trade_no).execute(&mut **tx).await?;
    Ok(1)
}

#[idempotent(key = "order_no", strategy = "dedup+state", transition = "OrderStatus::WaitPay -> OrderStatus::Paid")]
async fn pay(tx: &mut PgTx, order_no: &str) -> Result<(), AppError> {
    sqlx::query("UPDATE wallets SET paid = paid + 1 WHERE order_no = $1").bind(order_no).execute(&mut **tx).await?;
    Ok(())
}

#[idempotent(key = "order_no", strategy = "state", transition = "OrderStatus::WaitPay -> OrderStatus::Paid")]
async fn mark(tx: &mut idem::SqliteTx, order_no: &str) -> Result<(), AppError> {
    let _ = (tx, order_no);
    Ok(())
}

async fn caller(pg: sqlx::PgPool, my: sqlx::Pool<MySql>, lite: sqlx::Pool<Sqlite>) -> Result<(), AppError> {
    let mut tx = idem::begin(&pg).await?;
    grant(&mut tx, "T1").await?;
    pay(&mut tx, "O1").await?;
    tx.commit().await?;
    let mut tx = idem::begin(&my).await?;
    grant_after(&mut tx, "T1").await?;
    tx.commit().await?;
    let mut tx = idem::sql::begin_with(&lite, "BEGIN IMMEDIATE").await?;
    mark(&mut tx, "O1").await?;
    tx.rollback().await?;
    Ok(())
}

fn main() {
    let _ = caller;
}

/// A parameter type named `Tx` without arguments (a channel's sender) is
/// not taken for a transaction next to the real one.
type Tx2 = std::sync::mpsc::Sender<String>;
mod sender {
    pub type Tx = super::Tx2;
}

#[idempotent(key = "id")]
async fn notify(db: &mut sqlx::Transaction<'_, Postgres>, out: &sender::Tx, id: &str) -> Result<(), AppError> {
    let _ = (db, out, id);
    Ok(())
}
