use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

pub struct Bank {
    pub leases: idem::store::MemoryStore,
}

impl Bank {
    #[idempotent(key = "transfer_id", strategy = "lease", lease = "30s", scope = "bank.transfer", store = "self.leases")]
    pub async fn transfer(&self, transfer_id: &str, cents: i64) -> Result<u64, AppError> {
        let _ = (transfer_id, cents);
        Ok(1)
    }
}

fn main() {}
