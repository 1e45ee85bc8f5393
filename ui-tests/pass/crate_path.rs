//! `crate = "..."`: the expansion names the idem crate by the path given, for
//! a crate that re-exports idem (its users need not depend on idem).

use sqlx::{Postgres, Transaction};

/// A facade crate's re-export, as its users see it.
mod facade {
    pub use ::idem as inner;
}

/// At the crate root, under another name.
use ::idem as my_idem;

#[derive(Debug)]
pub struct AppError;
impl From<facade::inner::Error> for AppError {
    fn from(_: facade::inner::Error) -> Self {
        AppError
    }
}

#[facade::inner::idempotent(crate = "crate::facade::inner", key = "trade_no", scope = "facade.pay")]
async fn pay(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<u64, AppError> {
    let _ = (tx, trade_no);
    Ok(1)
}

#[my_idem::idempotent(crate = "my_idem", key = "transfer_id", strategy = "lease", scope = "facade.transfer")]
async fn transfer(transfer_id: &str) -> Result<(), AppError> {
    let _ = transfer_id;
    Ok(())
}

mod nested {
    use super::AppError;

    /// A bare path works too; from a module below the root, through `crate::`.
    #[crate::my_idem::idempotent(crate = crate::my_idem, key = "sku", strategy = "lock", ttl = "10s",
                                 concurrency_only = true)]
    pub async fn restock(sku: i64) -> Result<(), AppError> {
        let _ = sku;
        Ok(())
    }
}

fn main() {
    let _ = (pay, transfer, nested::restock);
}
