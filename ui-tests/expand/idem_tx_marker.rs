use idem::idempotent;
use sqlx::{Sqlite, Transaction};

#[derive(Debug)]
pub struct AppError;
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

#[idempotent(key = order_id, scope = "orders.ship")]
pub async fn ship<T: Send>(#[idem(tx)] uow: &mut UnitOfWork<'_>, order_id: u64, label: T) -> Result<bool, AppError> {
    let _ = (uow, label);
    Ok(true)
}

fn main() {}
