use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// A cache with no record behind it would be the source of truth.
#[idempotent(key = "sku", strategy = "lock", concurrency_only = true, ttl = "10s", precheck = "redis")]
async fn rebuild(sku: i64) -> Result<(), AppError> {
    let _ = sku;
    Ok(())
}
fn main() {}
