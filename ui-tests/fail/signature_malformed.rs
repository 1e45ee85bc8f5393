use idem::idempotent;
use sqlx::{Postgres, Transaction};

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// What `#[idempotent]` goes on: an `async fn` returning `Result`.

#[idempotent(key = "trade_no")]
struct NotAFunction;

#[idempotent(key = "trade_no")]
async fn returns_nothing(tx: &mut Transaction<'_, Postgres>, trade_no: &str) {
    let _ = (tx, trade_no);
}

fn main() {}
