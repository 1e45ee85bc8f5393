use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "sku", strategy = "lock", concurrency_only = true, ttl = "10s", store = "pool")]
async fn rebuild(pool: &sqlx::PgPool, sku: i64) -> Result<(), AppError> {
    let _ = (pool, sku);
    Ok(())
}
fn main() {}
