//! `outbox = "name"` binds the call's outbox handle in the body of every
//! strategy that writes in the caller's transaction, on any database and
//! on an `idem::Tx`.

use idem::idempotent;
use sqlx::{MySql, Postgres, Sqlite, Transaction};

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

#[derive(idem::StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state(table = "orders", key_column = "order_no", status_column = "status")]
pub enum OrderStatus {
    #[state(to(Paid))]
    WaitPay = 1,
    Paid = 2,
}

#[derive(serde::Serialize)]
pub struct Grant<'a> {
    pub trade_no: &'a str,
}

#[idempotent(key = "trade_no", outbox = "outbox")]
async fn pay(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<u64, AppError> {
    outbox.publish_json(tx, "coupons.grant", &Grant { trade_no }).await?;
    Ok(1)
}

#[idempotent(key = "order_no", strategy = "dedup+state", transition = "OrderStatus::WaitPay -> OrderStatus::Paid",
             outbox = "events")]
async fn paid(tx: &mut Transaction<'_, MySql>, order_no: &str) -> Result<(), AppError> {
    events.publish(&mut *tx, "orders.paid", order_no).await?;
    Ok(())
}

#[idempotent(key = "order_no", strategy = "state", transition = "OrderStatus::WaitPay -> OrderStatus::Paid",
             outbox = "outbox")]
async fn settle(tx: &mut idem::Tx<Sqlite>, order_no: &str) -> Result<(), AppError> {
    let id = outbox.publish(tx, "orders.settled", order_no.as_bytes()).await?;
    let _ = id.as_str();
    Ok(())
}

fn main() {
    // Never called: proves the futures are Send, so they can be spawned.
    let _ = |pg: sqlx::PgPool, my: sqlx::MySqlPool, lite: sqlx::SqlitePool| {
        tokio::spawn(async move {
            let mut tx = pg.begin().await?;
            pay(&mut tx, "T-1").await?;
            let mut tx = my.begin().await?;
            paid(&mut tx, "A-1").await?;
            let mut tx = idem::begin(&lite).await?;
            settle(&mut tx, "A-1").await?;
            Ok::<_, AppError>(())
        })
    };
}
