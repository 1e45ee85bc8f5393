//! A lease body in recorded steps: `steps = "steps"` names its step log.

use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

pub struct Bank;
impl Bank {
    pub async fn charge(&self, idempotency_key: &str, cents: i64) -> Result<String, AppError> {
        Ok(format!("{idempotency_key}:{cents}"))
    }
}

#[idempotent(key = "transfer_id", strategy = "lease", lease = "30s", steps = "steps", store = "leases")]
async fn transfer(
    leases: &idem::store::MemoryStore,
    bank: &Bank,
    transfer_id: &str,
    cents: i64,
) -> Result<String, AppError> {
    let held = steps.run("reserve", |_| async { Ok::<i64, AppError>(cents) }).await?;
    let charge = steps.run("charge", |key| async move { bank.charge(key.as_str(), held).await }).await?;
    steps.run("notify", |_| async { Ok::<(), AppError>(()) }).await?;
    Ok(charge)
}

/// With `wait`: a duplicate waits for the call that holds the key, then
/// replays its answer.
#[idempotent(key = "transfer_id", strategy = "lease", wait = "5s", steps = "steps", store = "leases")]
async fn transfer_waiting(leases: &idem::store::MemoryStore, bank: &Bank, transfer_id: &str) -> Result<String, AppError> {
    steps.run("charge", |key| async move { bank.charge(key.as_str(), 5).await }).await
}

fn main() {
    let _ = transfer;
}

/// A step whose work is writes to the lease records' database runs in a
/// transaction of its own, recorded in it (`run_tx`).
#[idempotent(key = "transfer_id", strategy = "lease", steps = "steps", store = "leases")]
async fn post_ledger(
    leases: &idem::store::SqlStore<sqlx::Postgres>,
    pool: &sqlx::PgPool,
    transfer_id: &str,
    cents: i64,
) -> Result<i64, idem::Error> {
    let entry = steps
        .run_tx("ledger", pool, |tx, _key| {
            Box::pin(async move {
                let (id,): (i64,) = sqlx::query_as("INSERT INTO ledger (cents) VALUES ($1) RETURNING id")
                    .bind(cents)
                    .fetch_one(&mut **tx)
                    .await?;
                Ok::<_, idem::Error>(id)
            })
        })
        .await?;
    Ok(entry)
}

fn _also() {
    let _ = post_ledger;
}
