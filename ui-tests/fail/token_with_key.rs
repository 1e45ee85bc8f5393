use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// `token` keys on the token itself.
#[idempotent(strategy = "token", scope = "orders.create", key = "user_id")]
async fn create_order(#[idem(token)] token: &str, user_id: i64) -> Result<(), AppError> {
    let _ = (token, user_id);
    Ok(())
}
fn main() {}
