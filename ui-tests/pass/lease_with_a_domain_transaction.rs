//! `strategy = "lease"` refuses sqlx's transactions, not a domain type that
//! happens to be called `Transaction` (a payment's, a bank's).
use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

pub mod bank {
    #[derive(serde::Serialize)]
    pub struct Transaction {
        pub id: String,
        pub cents: i64,
    }
}

#[idempotent(key = "t.id", strategy = "lease", scope = "bank.send")]
async fn send(t: &bank::Transaction) -> Result<i64, AppError> {
    Ok(t.cents)
}

fn main() {
    let _ = send;
}
