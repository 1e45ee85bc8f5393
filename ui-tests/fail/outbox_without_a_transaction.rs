use idem::idempotent;
use sqlx::{Postgres, Transaction};

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// A lease body holds no transaction for the message to commit with.
#[idempotent(key = "id", strategy = "lease", outbox = "outbox")]
async fn transfer(id: &str) -> Result<(), AppError> {
    let _ = id;
    Ok(())
}

#[idempotent(key = "id", strategy = "lock", concurrency_only = true, ttl = "10s", outbox = "outbox")]
async fn exclusive(id: &str) -> Result<(), AppError> {
    let _ = id;
    Ok(())
}

#[idempotent(key = "trade_no", outbox = "the outbox")]
async fn pay(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}

fn main() {}
