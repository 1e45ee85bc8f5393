use idem::idempotent;
use sqlx::{Postgres, Transaction};

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

pub struct Receipt {
    pub coupon_id: u64,
}

#[derive(idem::StateMachine, Clone, Copy)]
#[state(table = "orders", key_column = "order_no", status_column = "status")]
pub enum OrderStatus {
    #[state(code = 1, to(Paid))]
    WaitPay,
    #[state(code = 2)]
    Paid,
}

// One error per function, at its return type, saying what to derive: not
// one per serde trait, nor one per use of the answer in the expansion.
#[idempotent(key = "trade_no")]
async fn pay(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<Receipt, AppError> {
    let _ = (tx, trade_no);
    Ok(Receipt { coupon_id: 1 })
}

#[idempotent(key = "transfer_id", strategy = "lease")]
async fn transfer(transfer_id: &str) -> Result<Receipt, AppError> {
    let _ = transfer_id;
    Ok(Receipt { coupon_id: 1 })
}

// `Option<_>` answers a silent repeat, but its `Some` is still stored.
#[idempotent(key = "order_no", strategy = "dedup+state", transition = "OrderStatus::WaitPay -> OrderStatus::Paid")]
async fn pay_order(tx: &mut Transaction<'_, Postgres>, order_no: &str) -> Result<Option<Receipt>, AppError> {
    let _ = (tx, order_no);
    Ok(None)
}
fn main() {}
