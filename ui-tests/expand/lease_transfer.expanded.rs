use idem::idempotent;
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
pub struct Bank {
    pub leases: idem::store::MemoryStore,
}
impl Bank {
    pub async fn transfer(
        &self,
        transfer_id: &str,
        cents: i64,
    ) -> Result<u64, AppError> {
        let __idem_store = &(self.leases);
        let __idem_store = ::idem::__private::lease_store(__idem_store);
        let __idem_ticket = match ::idem::Guard::new("bank.transfer")
            .key_source("transfer_id")
            .key(&(transfer_id))
            .lease(__idem_store, ::idem::__private::Duration::from_millis(30000u64))
            .await
        {
            ::core::result::Result::Ok(::idem::Claim::Run(__idem_run)) => __idem_run,
            __idem_other => return ::idem::__private::settle(__idem_other),
        };
        let __idem_body = async {
            let _ = (transfer_id, cents);
            Ok(1)
        };
        let __idem_result: Result<u64, AppError> = __idem_ticket.run(__idem_body).await;
        __idem_result
    }
}
fn main() {}
