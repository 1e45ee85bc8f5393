use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "sku", strategy = "lock+dedup")]
async fn deduct(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>, sku: i64) -> Result<(), AppError> {
    let _ = (tx, sku);
    Ok(())
}
fn main() {}
