use idem::idempotent;

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

#[idempotent(key = "order_no", strategy = "state", transition = "OrderStatus::WaitPay -> OrderStatus::Paid")]
async fn pay(order_no: &str) -> Result<(), AppError> {
    let _ = order_no;
    Ok(())
}
fn main() {}
