use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

#[idempotent(strategy = "unique", replay = "existing_payment")]
async fn no_constraint(tx: &mut sqlx::PgTransaction<'_>, pay_no: &str) -> Result<i64, AppError> {
    let _ = (tx, pay_no);
    Ok(1)
}

#[idempotent(strategy = "unique", constraint = "uk_pay_no")]
async fn no_replay(tx: &mut sqlx::PgTransaction<'_>, pay_no: &str) -> Result<i64, AppError> {
    let _ = (tx, pay_no);
    Ok(1)
}

async fn existing_payment(tx: &mut sqlx::PgTransaction<'_>, pay_no: &str) -> Result<i64, AppError> {
    let _ = (tx, pay_no);
    Ok(1)
}

fn main() {}
