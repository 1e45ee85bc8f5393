use idem::idempotent;

pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}
impl From<sqlx::Error> for AppError {
    fn from(_: sqlx::Error) -> Self {
        AppError
    }
}

// An idem::Tx expands exactly as a sqlx::Transaction does: the claim riding
// on BEGIN and the answer on COMMIT are the runtime's doing.
#[idempotent(key = "trade_no", scope = "payments.on_pay")]
pub async fn on_pay_callback(tx: &mut idem::PgTx, trade_no: &str) -> Result<i64, AppError> {
    let coupon_id = sqlx::query_scalar("INSERT INTO coupons (trade_no) VALUES ($1) RETURNING id")
        .bind(trade_no)
        .fetch_one(&mut **tx)
        .await?;
    Ok(coupon_id)
}

fn main() {}
