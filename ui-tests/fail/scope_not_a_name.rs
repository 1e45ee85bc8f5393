use idem::idempotent;
use sqlx::{Postgres, Transaction};

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// A line break pasted into the scope: nobody could read it back or type it.
#[idempotent(key = "trade_no", scope = "payments.\non_pay")]
async fn pay(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}
fn main() {}
