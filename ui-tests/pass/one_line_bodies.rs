//! One-line bodies compile without a warning: the expansion must not leave the
//! user's braces where a lint (`unused_braces`) would flag them.
#![deny(warnings)]

use idem::idempotent;
use sqlx::{Postgres, Sqlite, Transaction};

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

/// In a transaction (`dedup`): the body is spliced after the reborrow of `tx`.
#[idempotent(key = "k", scope = "one_line.dedup")]
async fn dedup(tx: &mut Transaction<'_, Sqlite>, k: &str) -> Result<u8, AppError> { Ok(1) }

/// A lock, then the record in the transaction.
#[idempotent(key = "k", strategy = "lock+dedup", ttl = "30s")]
async fn lock_dedup(tx: &mut Transaction<'_, Postgres>, k: i64) -> Result<(), AppError> { Ok(()) }

/// Outside a transaction.
#[idempotent(key = "k", strategy = "lease")]
async fn lease(k: &str) -> Result<bool, AppError> { Ok(true) }

#[idempotent(strategy = "token", scope = "one_line.token")]
async fn token(#[idem(token)] token: &str) -> Result<u8, AppError> { Ok(1) }

#[idempotent(key = "k", strategy = "lock", concurrency_only = true, ttl = "5s")]
async fn lock(k: u64) -> Result<u8, AppError> { Ok(1) }

/// The longest durations accepted: 100 years, however it is written.
#[idempotent(key = "k", retention = "100y")]
async fn longest_retention(tx: &mut Transaction<'_, Sqlite>, k: &str) -> Result<u8, AppError> { Ok(1) }

#[idempotent(key = "k", strategy = "lease", lease = "36500d", retention = "100 years")]
async fn longest_lease(k: &str) -> Result<u8, AppError> { Ok(1) }

fn main() {
    let _ = (dedup, lock_dedup, lease, token, lock, longest_retention, longest_lease);
}
