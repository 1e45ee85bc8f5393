use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "transfer_id", strategy = "lease", lease = "200 years")]
async fn transfer(transfer_id: &str) -> Result<(), AppError> {
    let _ = transfer_id;
    Ok(())
}

fn main() {}
