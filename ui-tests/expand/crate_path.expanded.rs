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
mod facade {
    pub use ::idem as inner;
}
pub async fn transfer(transfer_id: &str) -> Result<u64, AppError> {
    let __idem_store = crate::facade::inner::__private::installed_lease();
    let __idem_ticket = match crate::facade::inner::Guard::new("bank.transfer")
        .key_source("transfer_id")
        .key(&(transfer_id))
        .lease(__idem_store, crate::facade::inner::lease::DEFAULT_LEASE)
        .await
    {
        ::core::result::Result::Ok(crate::facade::inner::Claim::Run(__idem_run)) => {
            __idem_run
        }
        __idem_other => return crate::facade::inner::__private::settle(__idem_other),
    };
    let __idem_body = async {
        let _ = transfer_id;
        Ok(1)
    };
    let __idem_result: Result<u64, AppError> = __idem_ticket.run(__idem_body).await;
    __idem_result
}
fn main() {}
