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
    static __IDEM_SPEC: ::idem::__private::GuardSpec = ::idem::__private::GuardSpec {
        scope: "stock.deduct",
        key_source: "order_no",
        retention: ::idem::DEFAULT_RETENTION,
        claim_after: false,
    };
    let __idem_store = ::idem::__private::installed_lock();
    let __idem_guard = ::idem::__private::Guard::new(&__IDEM_SPEC).key(&(order_no));
    let __idem_lock = match __idem_guard
        .lock(
            __idem_store,
            ::idem::__private::Duration::from_millis(10000u64),
            ::idem::__private::Duration::from_millis(2000u64),
        )
        .await
    {
        ::core::result::Result::Ok(::idem::__private::Claim::Run(__idem_run)) => {
            __idem_run
        }
        __idem_other => return ::idem::__private::settle(__idem_other),
    };
    let __idem_body = async {
        let __idem_ticket = match __idem_guard
            .dedup(::idem::__private::connection(&mut *tx))
            .await
        {
            ::core::result::Result::Ok(::idem::__private::Claim::Run(__idem_run)) => {
                __idem_run
            }
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
        let __idem_completed = __idem_ticket
            .complete(::idem::__private::connection(&mut *tx), __idem_result)
            .await;
        ::idem::__private::finish(__idem_completed)
    };
    let __idem_result: Result<bool, AppError> = __idem_lock.run(__idem_body).await;
    __idem_result
}
fn main() {}
