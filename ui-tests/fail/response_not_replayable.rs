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

#[idempotent(key = "trade_no")]
async fn pay(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<Receipt, AppError> {
    let _ = (tx, trade_no);
    Ok(Receipt { coupon_id: 1 })
}
fn main() {}
