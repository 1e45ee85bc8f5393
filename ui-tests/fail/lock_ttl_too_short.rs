use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// Renewed every third of its TTL: 50ms leaves no time for a round trip.
#[idempotent(key = "sku", strategy = "lock+dedup", ttl = "50ms")]
async fn deduct(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>, sku: i64) -> Result<(), AppError> {
    let _ = (tx, sku);
    Ok(())
}

fn main() {}
