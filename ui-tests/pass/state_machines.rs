//! Signatures the state strategies must keep working with.

use idem::idempotent;
use sqlx::{Database, MySql, Postgres, Sqlite, Transaction};

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Codes from explicit discriminants; a composite key.
#[derive(idem::StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state(table = "shop.orders", key_column = "tenant_id, order_no", status_column = "status")]
pub enum OrderStatus {
    #[state(to(Paid, Canceled))]
    WaitPay = 1,
    #[state(to(Shipped, Canceled))]
    Paid = 2,
    #[state(to(Finished))]
    Shipped = 3,
    Finished = 4,
    Canceled = -1,
}

/// Stored by name: `OPEN`, `IN_REVIEW`, and an explicit one.
#[derive(idem::StateMachine)]
#[state(table = "tickets", key_column = "id", status_column = "state", stored_as = "name")]
pub enum TicketState {
    #[state(to(InReview, Closed))]
    Open,
    #[state(to(Closed))]
    InReview,
    #[state(name = "done")]
    Closed,
}

const _: () = assert!(OrderStatus::can_transition(OrderStatus::WaitPay, OrderStatus::Paid));

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    pub coupon_id: i64,
}

impl idem::SilentRepeat for Receipt {
    fn silent_repeat() -> Self {
        Receipt { coupon_id: 0 }
    }
}

#[idempotent(key = "tenant_id, order_no", strategy = "state",
             transition = "OrderStatus::WaitPay | OrderStatus::Paid -> OrderStatus::Canceled")]
async fn cancel(tx: &mut Transaction<'_, Postgres>, tenant_id: i64, order_no: &str) -> Result<(), AppError> {
    let _ = (tx, tenant_id, order_no);
    Ok(())
}

#[idempotent(key = (tenant_id, order_no), strategy = "dedup+state", fingerprint = "amount",
             retention = "30d", transition = "crate::OrderStatus::WaitPay -> crate::OrderStatus::Paid")]
async fn pay<'c, DB: Database + idem::sql::SqlBackend>(
    tx: &mut Transaction<'c, DB>,
    tenant_id: u32,
    order_no: String,
    amount: i64,
) -> Result<Receipt, AppError>
where
    DB::Connection: Send,
{
    let _ = (tx, tenant_id, order_no, amount);
    Ok(Receipt { coupon_id: 1 })
}

pub struct Tickets;

impl Tickets {
    #[idempotent(key = "id", strategy = "state", scope = "tickets.review",
                 transition = "TicketState::Open -> TicketState::InReview")]
    async fn review(&self, tx: &mut Transaction<'_, Sqlite>, id: i64) -> Result<Option<String>, AppError> {
        let _ = (tx, id);
        Ok(Some("reviewer assigned".into()))
    }
}

#[idempotent(key = "id", strategy = "state", transition = "TicketState::Open | TicketState::InReview -> TicketState::Closed")]
async fn close(tx: &mut Transaction<'_, MySql>, id: u64) -> Result<(), AppError> {
    let _ = (tx, id);
    Ok(())
}

fn main() {
    // Never called: proves the futures are Send, so they can be spawned.
    let _ = |pg: sqlx::PgPool, lite: sqlx::SqlitePool, my: sqlx::MySqlPool| {
        tokio::spawn(async move {
            let mut tx = pg.begin().await?;
            cancel(&mut tx, 1, "A-1").await?;
            pay(&mut tx, 1, "A-1".to_owned(), 500).await?;
            let mut tx = lite.begin().await?;
            Tickets.review(&mut tx, 7).await?;
            let mut tx = my.begin().await?;
            close(&mut tx, 7).await?;
            Ok::<_, AppError>(())
        })
    };
}
