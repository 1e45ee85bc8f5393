use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "sku", strategy = "lock", concurrency_only = true, ttl = "101y", wait = "40000d")]
async fn deduct(sku: i64) -> Result<(), AppError> {
    let _ = sku;
    Ok(())
}
fn main() {}
