use idem::idempotent;
use sqlx::{Postgres, Transaction};

#[derive(Debug)]
pub enum AppError {
    Db(sqlx::Error),
}

#[idempotent(key = "trade_no")]
async fn pay(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}

fn main() {}
