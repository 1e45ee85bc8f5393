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
pub async fn on_pay_callback(
    tx: &mut idem::PgTx,
    trade_no: &str,
) -> Result<i64, AppError> {
    let __idem_ticket = match ::idem::Guard::new("payments.on_pay")
        .key_source("trade_no")
        .key(&(trade_no))
        .dedup(&mut ::idem::__private::connection(&mut *tx))
        .await
    {
        ::core::result::Result::Ok(::idem::Claim::Run(__idem_run)) => __idem_run,
        __idem_other => return ::idem::__private::settle(__idem_other),
    };
    let __idem_result: Result<i64, AppError> = async {
        #[allow(unused_variables)]
        let tx = &mut *tx;
        let coupon_id = sqlx::query_scalar(
                "INSERT INTO coupons (trade_no) VALUES ($1) RETURNING id",
            )
            .bind(trade_no)
            .fetch_one(&mut **tx)
            .await?;
        Ok(coupon_id)
    }
        .await;
    __idem_ticket
        .finish(&mut ::idem::__private::connection(&mut *tx), __idem_result)
        .await
}
fn main() {}
