use idem::idempotent;
use sqlx::{Postgres, Transaction};

// `sqlx::Error` converts from any database error, not from `idem::Error`:
// the guard's own failures would have nowhere to go.
#[idempotent(key = "trade_no", scope = "payments.pay")]
async fn pay(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), sqlx::Error> {
    let _ = (tx, trade_no);
    Ok(())
}

#[idempotent(key = "trade_no", scope = "payments.refund")]
async fn refund(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> sqlx::Result<u64> {
    let _ = (tx, trade_no);
    Ok(1)
}

#[idempotent(key = "trade_no", scope = "payments.void")]
async fn void(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<bool, sqlx::error::Error> {
    let _ = (tx, trade_no);
    Ok(true)
}

fn main() {}
