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
#[state(table = "orders", key_column = "trade_no", status_column = "status")]
pub enum OrderStatus {
    #[state(code = 1, to(Paid))]
    WaitPay,
    #[state(code = 2)]
    Paid,
}

#[idempotent(key = "trade_no", strategy = "dedup+state", scope = "payments.on_pay",
             transition = "OrderStatus::WaitPay -> OrderStatus::Paid")]
pub async fn on_pay_callback(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<Option<i64>, AppError> {
    let _ = (tx, trade_no);
    Ok(Some(1))
}

fn main() {}
