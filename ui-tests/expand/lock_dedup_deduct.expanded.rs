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
pub async fn deduct(
    tx: &mut Transaction<'_, Postgres>,
    order_no: &str,
) -> Result<bool, AppError> {
    let __idem_store = ::idem::__private::installed_lock();
    let __idem_guard = ::idem::Guard::new("stock.deduct")
        .key_source("order_no")
        .key(&(order_no));
    let __idem_lock = match __idem_guard
        .lock(
            __idem_store,
            ::idem::__private::Duration::from_millis(10000u64),
            ::idem::__private::Duration::from_millis(2000u64),
        )
        .await
    {
        ::core::result::Result::Ok(__idem_lock) => __idem_lock,
        ::core::result::Result::Err(__idem_e) => {
            return ::core::result::Result::Err(::core::convert::From::from(__idem_e));
        }
    };
    let __idem_body = async {
        let __idem_ticket = match __idem_guard
            .dedup(&mut ::idem::__private::connection(&mut *tx))
            .await
        {
            ::core::result::Result::Ok(::idem::Claim::Run(__idem_run)) => __idem_run,
            __idem_other => return ::idem::__private::settle(__idem_other),
        };
        let __idem_result: Result<bool, AppError> = async {
            #[allow(unused_variables)]
            let tx = &mut *tx;
            let fence = idem::lock::current().map(|l| l.fence);
            let _ = (tx, order_no, fence);
            Ok(true)
        }
            .await;
        __idem_ticket
            .finish(&mut ::idem::__private::connection(&mut *tx), __idem_result)
            .await
    };
    let __idem_result: Result<bool, AppError> = __idem_lock.run(__idem_body).await;
    __idem_result
}
fn main() {}
