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
pub async fn create_order(token: &str, user_id: i64) -> Result<i64, AppError> {
    let __idem_store = ::idem::__private::installed_token();
    let __idem_ticket = match ::idem::Guard::new("orders.create")
        .key_source("<token>")
        .token(__idem_store, ::idem::__private::token_param(&(token)))
        .await
    {
        ::core::result::Result::Ok(::idem::Claim::Run(__idem_run)) => __idem_run,
        __idem_other => return ::idem::__private::settle(__idem_other),
    };
    let __idem_body = async {
        let _ = (token, user_id);
        Ok(1)
    };
    let __idem_result: Result<i64, AppError> = __idem_ticket.run(__idem_body).await;
    __idem_result
}
fn main() {}
