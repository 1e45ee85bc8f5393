use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}
impl From<sqlx::Error> for AppError {
    fn from(_: sqlx::Error) -> Self {
        AppError
    }
}

// A step in a transaction of its own shares the body's names: `run` and
// `run_tx` under one name are two steps of the same name.
#[idempotent(key = "transfer_id", strategy = "lease", steps = "steps", store = "leases")]
async fn transfer(
    leases: &idem::store::SqlStore<sqlx::Sqlite>,
    pool: &sqlx::SqlitePool,
    transfer_id: &str,
) -> Result<(), AppError> {
    steps.run("ledger", |_| async { Ok::<u8, AppError>(1) }).await?;
    steps
        .run_tx("ledger", pool, |tx, _| {
            Box::pin(async move {
                sqlx::query("INSERT INTO ledger (id) VALUES (1)").execute(&mut **tx).await?;
                Ok::<u8, AppError>(2)
            })
        })
        .await?;
    let _ = transfer_id;
    Ok(())
}

fn main() {}
