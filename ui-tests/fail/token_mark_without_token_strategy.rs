use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// `#[idem(token)]` on a guard that consumes no token.
#[idempotent(key = "order_no")]
async fn pay(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>, order_no: &str, #[idem(token)] token: &str) -> Result<(), AppError> {
    let _ = (tx, order_no, token);
    Ok(())
}
fn main() {}
