use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// Tokens are issued for a scope; the guard must name it.
#[idempotent(strategy = "token")]
async fn create_order(#[idem(token)] token: &str) -> Result<(), AppError> {
    let _ = token;
    Ok(())
}
fn main() {}
