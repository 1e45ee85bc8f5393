use idem::idempotent;
use sqlx::{Postgres, Transaction};

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// Transitions written wrongly, one way per function.

#[derive(idem::StateMachine, Clone, Copy)]
#[state(table = "orders", key_column = "order_no", status_column = "status")]
pub enum OrderStatus {
    #[state(code = 1, to(Paid))]
    WaitPay,
    #[state(code = 2)]
    Paid,
}

#[derive(idem::StateMachine, Clone, Copy)]
#[state(table = "refunds", key_column = "order_no", status_column = "status")]
pub enum RefundStatus {
    #[state(code = 1, to(Done))]
    Open,
    #[state(code = 2)]
    Done,
}

#[idempotent(key = "order_no", strategy = "state", transition = "OrderStatus::WaitPay -> OrderStatus::Paid -> OrderStatus::WaitPay")]
async fn two_arrows(tx: &mut Transaction<'_, Postgres>, order_no: &str) -> Result<(), AppError> {
    let _ = (tx, order_no);
    Ok(())
}

#[idempotent(key = "order_no", strategy = "state", transition = "OrderStatus::WaitPay | RefundStatus::Open -> OrderStatus::Paid")]
async fn two_enums(tx: &mut Transaction<'_, Postgres>, order_no: &str) -> Result<(), AppError> {
    let _ = (tx, order_no);
    Ok(())
}

#[idempotent(key = "order_no", strategy = "state", transition = "OrderStatus::Paid | OrderStatus::WaitPay -> OrderStatus::Paid")]
async fn to_itself(tx: &mut Transaction<'_, Postgres>, order_no: &str) -> Result<(), AppError> {
    let _ = (tx, order_no);
    Ok(())
}

#[idempotent(key = "order_no", strategy = "state", transition = "OrderStatus::WaitPay | -> OrderStatus::Paid")]
async fn missing_state(tx: &mut Transaction<'_, Postgres>, order_no: &str) -> Result<(), AppError> {
    let _ = (tx, order_no);
    Ok(())
}

#[idempotent(key = "order_no", strategy = "state", transition = "OrderStatus::WaitPay -> OrderStatus::1")]
async fn not_a_path(tx: &mut Transaction<'_, Postgres>, order_no: &str) -> Result<(), AppError> {
    let _ = (tx, order_no);
    Ok(())
}

fn main() {}
