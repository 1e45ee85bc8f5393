use idem::idempotent;
use sqlx::{Postgres, Transaction};

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

pub struct Handler;

impl Handler {
    #[idempotent(key = "trade_no")]
    pub async fn handle(&self, tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), AppError> {
        let _ = (tx, trade_no);
        Ok(())
    }
}
fn main() {}
