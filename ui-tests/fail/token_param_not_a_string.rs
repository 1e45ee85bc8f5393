use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// A token is a string.
#[idempotent(strategy = "token", scope = "orders.create")]
async fn create_order(#[idem(token)] token: u64) -> Result<(), AppError> {
    let _ = token;
    Ok(())
}
fn main() {}
