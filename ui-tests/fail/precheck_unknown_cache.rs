use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "msg_id", precheck = "memcached")]
async fn consume(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>, msg_id: &str) -> Result<(), AppError> {
    let _ = (tx, msg_id);
    Ok(())
}
fn main() {}
