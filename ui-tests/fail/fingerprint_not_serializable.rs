use idem::idempotent;
use sqlx::{Postgres, Transaction};

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

pub struct PayCallback {
    pub trade_no: String,
}

#[idempotent(key = "event.trade_no", fingerprint = "event")]
async fn pay(tx: &mut Transaction<'_, Postgres>, event: &PayCallback) -> Result<(), AppError> {
    let _ = (tx, event);
    Ok(())
}
fn main() {}
