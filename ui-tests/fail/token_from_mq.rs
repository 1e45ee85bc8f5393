use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// A redelivered message carries no fresh token.
#[idempotent(key = "msg_id", strategy = "token+dedup", scope = "ledger.consume", source = "mq")]
async fn consume(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>, msg_id: &str, #[idem(token)] token: &str) -> Result<(), AppError> {
    let _ = (tx, msg_id, token);
    Ok(())
}
fn main() {}
