use idem::idempotent;
use sqlx::{Postgres, Transaction};

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// Each argument belongs to another strategy than the one given.

#[idempotent(key = "trade_no", transition = "OrderStatus::WaitPay -> OrderStatus::Paid", ttl = "10s",
             store = "pool", wait = "1s", on_store_error = "allow", concurrency_only = true)]
async fn dedup(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}

#[idempotent(key = "transfer_id", strategy = "lease", ttl = "30s")]
async fn lease(transfer_id: &str) -> Result<(), AppError> {
    let _ = transfer_id;
    Ok(())
}

#[idempotent(strategy = "token", scope = "orders.create", retention = "1d", claim = "after")]
async fn token(#[idem(token)] token: &str) -> Result<(), AppError> {
    let _ = token;
    Ok(())
}

#[idempotent(key = "sku", strategy = "lock+dedup", ttl = "10s", claim = "after")]
async fn lock_dedup(tx: &mut Transaction<'_, Postgres>, sku: i64) -> Result<(), AppError> {
    let _ = (tx, sku);
    Ok(())
}

fn main() {}
