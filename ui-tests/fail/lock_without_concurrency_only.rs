use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// A lock alone stops concurrency, not repetition.
#[idempotent(key = "sku", strategy = "lock", ttl = "10s")]
async fn deduct(sku: i64) -> Result<(), AppError> {
    let _ = sku;
    Ok(())
}
fn main() {}
