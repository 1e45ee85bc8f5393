use idem::idempotent;
use sqlx::{Postgres, Transaction};

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "trade_no", steps = "steps")]
async fn pay(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}

#[idempotent(key = "id", strategy = "lease", steps = "the steps", scope = "bad.name")]
async fn work(id: &str) -> Result<(), AppError> {
    let _ = id;
    Ok(())
}

fn main() {}
