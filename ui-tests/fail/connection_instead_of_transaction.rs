use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// A bare connection (or a pool) cannot roll the record back with the change.
#[idempotent(key = "trade_no", scope = "shop.pay")]
async fn pay(conn: &mut sqlx::PgConnection, trade_no: &str) -> Result<(), AppError> {
    let _ = (conn, trade_no);
    Ok(())
}

#[idempotent(key = "trade_no", scope = "shop.refund")]
async fn refund(pool: &sqlx::PgPool, trade_no: &str) -> Result<(), AppError> {
    let _ = (pool, trade_no);
    Ok(())
}

fn main() {}
