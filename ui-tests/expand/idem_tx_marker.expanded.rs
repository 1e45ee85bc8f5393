use idem::idempotent;
use sqlx::{Sqlite, Transaction};
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
/// The application's own unit of work, handing idem its transaction.
pub struct UnitOfWork<'c>(pub Transaction<'c, Sqlite>);
impl idem::sql::TxContext for UnitOfWork<'_> {
    type Db = Sqlite;
    fn connection(&mut self) -> &mut sqlx::SqliteConnection {
        &mut self.0
    }
}
pub async fn ship<T: Send>(
    uow: &mut UnitOfWork<'_>,
    order_id: u64,
    label: T,
) -> Result<bool, AppError> {
    let __idem_ticket = match ::idem::Guard::new("orders.ship")
        .key_source("order_id")
        .key(&(order_id))
        .dedup(&mut ::idem::__private::connection(&mut *uow))
        .await
    {
        ::core::result::Result::Ok(::idem::Claim::Run(__idem_run)) => __idem_run,
        __idem_other => return ::idem::__private::settle(__idem_other),
    };
    let __idem_result: Result<bool, AppError> = async {
        #[allow(unused_variables)]
        let uow = &mut *uow;
        let _ = (uow, label);
        Ok(true)
    }
        .await;
    __idem_ticket
        .finish(&mut ::idem::__private::connection(&mut *uow), __idem_result)
        .await
}
fn main() {}
