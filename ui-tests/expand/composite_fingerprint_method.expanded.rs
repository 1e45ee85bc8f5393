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
        let __idem_ticket = match ::idem::Guard::new("wallet.transfer")
            .key_source("user_id, request_id")
            .retention(::idem::__private::Duration::from_millis(86400000u64))
            .key(&(user_id))
            .key(&(request_id))
            .fingerprint(&(amount_cents))
            .dedup(&mut ::idem::__private::connection(&mut *tx))
            .await
        {
            ::core::result::Result::Ok(::idem::Claim::Run(__idem_run)) => __idem_run,
            __idem_other => return ::idem::__private::settle(__idem_other),
        };
        let __idem_result: Result<(), AppError> = async {
            #[allow(unused_variables)]
            let tx = &mut *tx;
            let _ = (tx, amount_cents);
            Ok(())
        }
            .await;
        __idem_ticket
            .finish(&mut ::idem::__private::connection(&mut *tx), __idem_result)
            .await
    }
}
fn main() {}
