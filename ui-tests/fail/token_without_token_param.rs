use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// The token must come from a parameter marked `#[idem(token)]`.
#[idempotent(strategy = "token", scope = "orders.create")]
async fn create_order(token: &str, user_id: i64) -> Result<(), AppError> {
    let _ = (token, user_id);
    Ok(())
}
fn main() {}
