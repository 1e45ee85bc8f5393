use idem::idempotent;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

#[idempotent(strategy = "unique", constraint = "uk_pay_no", replay = "existing_payment", fingerprint = "pay_no",
             wait = "2s", lease = "30s", precheck = "redis", claim = "after", outbox = "outbox")]
async fn record_payment(tx: &mut sqlx::PgTransaction<'_>, pay_no: &str) -> Result<i64, AppError> {
    let _ = (tx, pay_no);
    Ok(1)
}

#[idempotent(key = "pay_no", constraint = "uk_pay_no", replay = "existing_payment", savepoint = false)]
async fn dedup_with_unique_arguments(tx: &mut sqlx::PgTransaction<'_>, pay_no: &str) -> Result<i64, AppError> {
    let _ = (tx, pay_no);
    Ok(1)
}

#[idempotent(strategy = "unique", constraint = "uk_pay_no", replay = "existing_pair")]
async fn destructured(tx: &mut sqlx::PgTransaction<'_>, (pay_no, amount): (&str, i64)) -> Result<i64, AppError> {
    let _ = (tx, pay_no);
    Ok(amount)
}

async fn existing_payment(tx: &mut sqlx::PgTransaction<'_>, pay_no: &str) -> Result<i64, AppError> {
    let _ = (tx, pay_no);
    Ok(1)
}

fn main() {}
