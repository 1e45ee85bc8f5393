use idem::idempotent;
use sqlx::{Postgres, Transaction};

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// Each function marks its parameters wrongly.

#[idempotent(key = "trade_no")]
async fn unknown_mark(#[idem(transaction)] tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}

#[idempotent(key = "trade_no")]
async fn no_mark(#[idem] tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}

#[idempotent(key = "trade_no")]
async fn a_pattern(#[idem(tx)] (tx, _): (&mut Transaction<'_, Postgres>, u8), trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}

#[idempotent(key = "trade_no")]
async fn two_marks(
    #[idem(tx)] tx: &mut Transaction<'_, Postgres>,
    #[idem(tx)] other: &mut Transaction<'_, Postgres>,
    trade_no: &str,
) -> Result<(), AppError> {
    let _ = (tx, other, trade_no);
    Ok(())
}

#[idempotent(key = "trade_no")]
async fn two_transactions(
    tx: &mut Transaction<'_, Postgres>,
    other: &mut Transaction<'_, Postgres>,
    trade_no: &str,
) -> Result<(), AppError> {
    let _ = (tx, other, trade_no);
    Ok(())
}

#[idempotent(strategy = "token", scope = "orders.create")]
async fn two_tokens(#[idem(token)] token: &str, #[idem(token)] again: &str) -> Result<(), AppError> {
    let _ = (token, again);
    Ok(())
}

#[idempotent(strategy = "token", scope = "orders.create")]
async fn tx_with_token(#[idem(token)] token: &str, #[idem(tx)] tx: &mut Transaction<'_, Postgres>) -> Result<(), AppError> {
    let _ = (token, tx);
    Ok(())
}

fn main() {}
