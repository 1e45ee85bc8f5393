use idem::idempotent;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// The replay function answers another type.
#[idempotent(strategy = "unique", constraint = "uk_pay_no", replay = "payment_number")]
async fn record_payment(tx: &mut sqlx::PgTransaction<'_>, pay_no: &str) -> Result<i64, AppError> {
    let _ = (tx, pay_no);
    Ok(1)
}

async fn payment_number(tx: &mut sqlx::PgTransaction<'_>, pay_no: &str) -> Result<String, AppError> {
    let _ = tx;
    Ok(pay_no.to_owned())
}

/// The replay function takes other parameters.
#[idempotent(strategy = "unique", constraint = "uk_pay_no", replay = "existing_by_id")]
async fn record_payment_again(tx: &mut sqlx::PgTransaction<'_>, pay_no: &str) -> Result<i64, AppError> {
    let _ = (tx, pay_no);
    Ok(1)
}

async fn existing_by_id(tx: &mut sqlx::PgTransaction<'_>, id: i64) -> Result<i64, AppError> {
    let _ = tx;
    Ok(id)
}

fn main() {}
