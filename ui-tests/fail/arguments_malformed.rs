use idem::idempotent;
use sqlx::{Postgres, Transaction};

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// Each function holds one mistake in how an argument is written.

#[idempotent(key = "trade_no", crate = "not a path!")]
async fn crate_not_a_path(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}

#[idempotent(key = "trade_no", crate = 1)]
async fn crate_not_a_string(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}

#[idempotent(key = "trade_no", flavour = "vanilla")]
async fn unknown_name(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}

#[idempotent(key = "trade_no", key = "trade_no")]
async fn given_twice(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}

#[idempotent("trade_no")]
async fn a_literal(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}

#[idempotent(key = "trade_no", strategy = "lock", ttl = "10s", concurrency_only = "yes")]
async fn not_a_bool(trade_no: &str) -> Result<(), AppError> {
    let _ = trade_no;
    Ok(())
}

#[idempotent(key = "trade_no +")]
async fn key_not_rust(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}

#[idempotent(key = "trade_no", scope = "  ")]
async fn empty_scope(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}

#[idempotent(key = "trade_no", retention = "10us")]
async fn under_a_millisecond(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}

#[idempotent(key = "trade_no", source = "cron")]
async fn unknown_source(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}

#[idempotent(key = "trade_no", strategy = "lock + dedup + state")]
async fn unknown_strategy_without_a_close_one(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}

#[idempotent(key = "trade_no.len() + 1")]
async fn key_not_reached_from_a_parameter(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}

fn main() {}
