use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// An alias of the application's own: the macro cannot see through it (an
// alias named `Tx` or `Transaction` is taken for one).
type Txn<'c> = sqlx::Transaction<'c, sqlx::Postgres>;

#[idempotent(key = "trade_no", scope = "payments.pay")]
async fn pay(tx: &mut Txn<'_>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}

fn main() {}
