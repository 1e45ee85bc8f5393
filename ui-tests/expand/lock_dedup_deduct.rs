use idem::idempotent;
use sqlx::{Postgres, Transaction};

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "order_no", strategy = "lock+dedup", ttl = "10s", wait = "2s", scope = "stock.deduct")]
pub async fn deduct(tx: &mut Transaction<'_, Postgres>, order_no: &str) -> Result<bool, AppError> {
    let fence = idem::lock::current().map(|l| l.fence);
    let _ = (tx, order_no, fence);
    Ok(true)
}

fn main() {}
