use idem::idempotent;
use sqlx::Postgres;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// An idem::Tx is a transaction like any other: the lease record would
// commit apart from it.
#[idempotent(key = "trade_no", strategy = "lease")]
async fn pay(tx: &mut idem::Tx<Postgres>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}

#[idempotent(key = "trade_no", strategy = "lease")]
async fn refund(tx: &mut idem::PgTx, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}
fn main() {}
