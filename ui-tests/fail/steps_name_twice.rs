use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// A resumed call finds each recorded result by name and place: a name run
// twice is refused where it is written.
#[idempotent(key = "transfer_id", strategy = "lease", steps = "steps", store = "leases")]
async fn transfer(leases: &idem::store::MemoryStore, transfer_id: &str) -> Result<(), AppError> {
    steps.run("charge", |_| async { Ok::<u8, AppError>(1) }).await?;
    if transfer_id.is_empty() {
        steps.run("charge", |_| async { Ok::<u8, AppError>(2) }).await?;
    }
    Ok(())
}

fn main() {}
