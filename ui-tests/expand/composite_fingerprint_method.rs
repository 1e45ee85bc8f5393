use idem::idempotent;
use sqlx::{MySql, Transaction};

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

pub struct Wallet;

impl Wallet {
    #[idempotent(key = "user_id, request_id", scope = "wallet.transfer", fingerprint = "amount_cents", retention = "24h")]
    pub async fn transfer<'a>(
        &self,
        tx: &mut Transaction<'a, MySql>,
        user_id: u64,
        request_id: &str,
        amount_cents: i64,
    ) -> Result<(), AppError> {
        let _ = (tx, amount_cents);
        Ok(())
    }
}

fn main() {}
