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

fn main() {
    let _ = transfer;
}
