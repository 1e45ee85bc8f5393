use idem::idempotent;
use sqlx::{Postgres, Transaction};

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// `Some(())` and `Some(None)` are written as JSON `null`, like `None`.
#[idempotent(key = "trade_no", scope = "shop.mark")]
async fn mark(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<Option<()>, AppError> {
    let _ = (tx, trade_no);
    Ok(Some(()))
}

#[idempotent(key = "trade_no", scope = "shop.lookup")]
async fn lookup(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<Option<Option<u32>>, AppError> {
    let _ = (tx, trade_no);
    Ok(Some(None))
}

fn main() {}
