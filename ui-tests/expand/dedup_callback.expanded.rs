use idem::idempotent;
use sqlx::{Postgres, Transaction};
pub struct AppError;
#[automatically_derived]
impl ::core::fmt::Debug for AppError {
    #[inline]
    fn fmt(&self, f: &mut ::core::fmt::Formatter) -> ::core::fmt::Result {
        ::core::fmt::Formatter::write_str(f, "AppError")
    }
}
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
    tx: &mut Transaction<'_, Postgres>,
    trade_no: &str,
) -> Result<i64, AppError> {
    static __IDEM_SPEC: ::idem::__private::GuardSpec = ::idem::__private::GuardSpec {
        scope: "payments.on_pay",
        key_source: "trade_no",
        retention: ::idem::DEFAULT_RETENTION,
        claim_after: false,
    };
    let __idem_ticket = match ::idem::__private::Guard::new(&__IDEM_SPEC)
        .key(&(trade_no))
        .dedup(::idem::__private::connection(&mut *tx))
        .await
    {
        ::core::result::Result::Ok(::idem::__private::Claim::Run(__idem_run)) => {
            __idem_run
        }
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
    let __idem_completed = __idem_ticket
        .complete(::idem::__private::connection(&mut *tx), __idem_result)
        .await;
    ::idem::__private::finish(__idem_completed)
}
fn main() {}
