use idem::idempotent;
use sqlx::{Postgres, Transaction};

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "trade_no", retention = "100000000000d")]
async fn pay(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}
fn main() {}
