use idem::idempotent;
use sqlx::{Postgres, Transaction};

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[derive(idem::StateMachine, Clone, Copy)]
#[state(table = "orders", key_column = "order_no", status_column = "status")]
pub enum OrderStatus {
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

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    pub coupon_id: i64,
}

// `state` stores no answer: what does a repeat return?
#[idempotent(key = "order_no", strategy = "state", transition = "OrderStatus::WaitPay -> OrderStatus::Paid")]
async fn pay(tx: &mut Transaction<'_, Postgres>, order_no: &str) -> Result<Receipt, AppError> {
    let _ = (tx, order_no);
    Ok(Receipt { coupon_id: 1 })
}
// `dedup+state` replays the stored answer, but a repeat that finds the order
// paid with no record left (past its retention) has none to replay.
#[idempotent(
    key = "order_no",
    strategy = "dedup+state",
    scope = "orders.pay_again",
    transition = "OrderStatus::WaitPay -> OrderStatus::Paid"
)]
async fn pay_again(tx: &mut Transaction<'_, Postgres>, order_no: &str) -> Result<Receipt, AppError> {
    let _ = (tx, order_no);
    Ok(Receipt { coupon_id: 1 })
}
fn main() {}
