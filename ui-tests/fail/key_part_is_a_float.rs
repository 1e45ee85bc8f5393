use idem::idempotent;
use sqlx::{Postgres, Transaction};

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[idempotent(key = amount)]
async fn pay(tx: &mut Transaction<'_, Postgres>, amount: f64) -> Result<(), AppError> {
    let _ = (tx, amount);
    Ok(())
}
fn main() {}
