//! `unique` and `unique+state`: a plain function, the claim helper without
//! a savepoint, a method, an `idem::Tx`, and the state variant.
use idem::idempotent;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

pub struct Callback {
    pub pay_no: String,
}

#[idempotent(strategy = "unique", constraint = "uk_pay_no", replay = "existing_payment")]
pub async fn record_payment(tx: &mut sqlx::PgTransaction<'_>, cb: &Callback) -> Result<i64, AppError> {
    sqlx::query("INSERT INTO payment_record (pay_no) VALUES ($1)").bind(&cb.pay_no).execute(&mut **tx).await?;
    Ok(1)
}

pub async fn existing_payment(tx: &mut sqlx::PgTransaction<'_>, cb: &Callback) -> Result<i64, AppError> {
    Ok(sqlx::query_scalar("SELECT id FROM payment_record WHERE pay_no = $1").bind(&cb.pay_no).fetch_one(&mut **tx).await?)
}

#[idempotent(strategy = "unique", constraint = "uk_pay_no", replay = "existing_payment", savepoint = false,
             key = "cb.pay_no", scope = "payments.record")]
pub async fn record_payment_with_the_helper(tx: &mut sqlx::PgTransaction<'_>, cb: &Callback) -> Result<i64, AppError> {
    let insert = sqlx::query("INSERT INTO payment_record (pay_no) VALUES ($1) ON CONFLICT ON CONSTRAINT uk_pay_no DO NOTHING");
    idem::unique::insert(&mut **tx, "uk_pay_no", insert.bind(&cb.pay_no)).await?;
    Ok(1)
}

#[idempotent(strategy = "unique", constraint = "uk_pay_no", replay = "existing_payment_mysql")]
pub async fn on_an_idem_tx(tx: &mut idem::Tx<sqlx::MySql>, cb: &Callback) -> Result<i64, AppError> {
    let _ = (tx, cb);
    Ok(1)
}

pub async fn existing_payment_mysql(tx: &mut idem::Tx<sqlx::MySql>, cb: &Callback) -> Result<i64, AppError> {
    let _ = (tx, cb);
    Ok(1)
}

pub struct Payments;

impl Payments {
    #[idempotent(strategy = "unique", constraint = "payment_record(pay_no)", replay = "existing", scope = "payments")]
    pub async fn record(&self, tx: &mut sqlx::SqliteTransaction<'_>, pay_no: &str) -> Result<(), AppError> {
        let _ = (tx, pay_no);
        Ok(())
    }

    async fn existing(&self, tx: &mut sqlx::SqliteTransaction<'_>, pay_no: &str) -> Result<(), AppError> {
        let _ = (tx, pay_no);
        Ok(())
    }
}

#[derive(idem::StateMachine, Clone, Copy)]
#[state(table = "orders", key_column = "order_no", status_column = "status")]
pub enum OrderStatus {
    #[state(code = 1, to(Paid))]
    WaitPay,
    #[state(code = 2)]
    Paid,
}

#[idempotent(strategy = "unique+state", key = "order_no", constraint = "uk_pay_no", replay = "existing_for_order",
             transition = "OrderStatus::WaitPay -> OrderStatus::Paid")]
pub async fn pay_order(tx: &mut sqlx::PgTransaction<'_>, order_no: &str, cb: &Callback) -> Result<i64, AppError> {
    record_payment(tx, cb).await
}

pub async fn existing_for_order(tx: &mut sqlx::PgTransaction<'_>, order_no: &str, cb: &Callback) -> Result<i64, AppError> {
    let _ = order_no;
    existing_payment(tx, cb).await
}

fn main() {}
