use idem::idempotent;


#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "trade_no")]
async fn pay(#[idem(tx)] pool: &mut sqlx::PgPool, trade_no: &str) -> Result<(), AppError> {
    let _ = (pool, trade_no);
    Ok(())
}
fn main() {}
