use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[idempotent(strategy = "unique", constraint = "uk_pay_no", replay = "existing_payment")]
async fn record_payment(pay_no: &str) -> Result<i64, AppError> {
    let _ = pay_no;
    Ok(1)
}

async fn existing_payment(pay_no: &str) -> Result<i64, AppError> {
    let _ = pay_no;
    Ok(1)
}

fn main() {}
