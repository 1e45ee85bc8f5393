use idem::idempotent;
use sqlx::{Postgres, Transaction};

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// The lease record is committed on its own: a caller that rolls `tx` back
// would leave a record saying done for writes that never happened.
#[idempotent(key = "trade_no", strategy = "lease")]
async fn pay(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}
fn main() {}
