use idem::idempotent;
use sqlx::{MySql, Transaction};
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
pub struct Wallet;
impl Wallet {
    pub async fn transfer<'a>(
        &self,
        tx: &mut Transaction<'a, MySql>,
        user_id: u64,
        request_id: &str,
        amount_cents: i64,
    ) -> Result<(), AppError> {
        static __IDEM_SPEC: ::idem::__private::GuardSpec = ::idem::__private::GuardSpec {
            scope: "wallet.transfer",
            key_source: "user_id, request_id",
            retention: ::idem::__private::Duration::from_millis(86400000u64),
            claim_after: false,
        };
        let __idem_ticket = match ::idem::__private::Guard::new(&__IDEM_SPEC)
            .key(&(user_id))
            .key(&(request_id))
            .fingerprint(&(amount_cents))
            .dedup(::idem::__private::connection(&mut *tx))
            .await
        {
            ::core::result::Result::Ok(::idem::__private::Claim::Run(__idem_run)) => {
                __idem_run
            }
            __idem_other => return ::idem::__private::settle(__idem_other),
        };
        let __idem_result: Result<(), AppError> = async {
            #[allow(unused_variables)]
            let tx = &mut *tx;
            let _ = (tx, amount_cents);
            Ok(())
        }
            .await;
        let __idem_completed = __idem_ticket
            .complete(::idem::__private::connection(&mut *tx), __idem_result)
            .await;
        ::idem::__private::finish(__idem_completed)
    }
}
fn main() {}
