use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// The record of lock+dedup is read once the lock is held: a marker read in
// front of it would come before the lock.
#[idempotent(key = "sku", strategy = "lock+dedup", ttl = "10s", precheck = "redis")]
async fn deduct(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>, sku: i64) -> Result<(), AppError> {
    let _ = (tx, sku);
    Ok(())
}
fn main() {}
