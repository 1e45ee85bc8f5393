use idem::idempotent;
use sqlx::{Postgres, Transaction};

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// With the key `a`, this scope would share Redis keys with scope `c` and the
// key `a}:payments`.
#[idempotent(key = "trade_no", scope = "payments}:c")]
async fn pay(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}
fn main() {}
