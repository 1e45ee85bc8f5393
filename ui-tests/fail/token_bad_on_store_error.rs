use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[idempotent(strategy = "token", scope = "orders.create", on_store_error = "ignore")]
async fn create_order(#[idem(token)] token: &str) -> Result<(), AppError> {
    let _ = token;
    Ok(())
}
fn main() {}
