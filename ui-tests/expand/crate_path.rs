#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

mod facade {
    pub use ::idem as inner;
}

#[facade::inner::idempotent(crate = "crate::facade::inner", key = "transfer_id", strategy = "lease", scope = "bank.transfer")]
pub async fn transfer(transfer_id: &str) -> Result<u64, AppError> {
    let _ = transfer_id;
    Ok(1)
}

fn main() {}
