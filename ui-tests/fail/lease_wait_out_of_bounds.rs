use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// A lease duplicate's wait must be at least a millisecond and at most 100 years.

#[idempotent(key = "callback_id", strategy = "lease", wait = "0s")]
async fn zero(callback_id: &str) -> Result<(), AppError> {
    let _ = callback_id;
    Ok(())
}

#[idempotent(key = "callback_id", strategy = "lease", wait = "101y")]
async fn too_long(callback_id: &str) -> Result<(), AppError> {
    let _ = callback_id;
    Ok(())
}

fn main() {}
