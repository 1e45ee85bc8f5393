use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// A lease record is committed on its own: the transaction marked here would
// not hold it, and the call would look safer than it is.
#[idempotent(key = "transfer_id", strategy = "lease")]
async fn transfer(
    #[idem(tx)] tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    transfer_id: &str,
) -> Result<(), AppError> {
    let _ = (tx, transfer_id);
    Ok(())
}

// `lock` alone writes nothing anywhere.
#[idempotent(key = "sku", strategy = "lock", ttl = "10s", concurrency_only = true)]
async fn restock(#[idem(tx)] tx: &mut sqlx::Transaction<'_, sqlx::Postgres>, sku: i64) -> Result<(), AppError> {
    let _ = (tx, sku);
    Ok(())
}

fn main() {}
