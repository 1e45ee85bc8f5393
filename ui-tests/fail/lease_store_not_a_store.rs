use idem::idempotent;

#[derive(Debug)]
pub struct AppError;
impl From<idem::Error> for AppError {
    fn from(_: idem::Error) -> Self {
        AppError
    }
}

// `store` must name a lease store, not a connection pool.
#[idempotent(key = "transfer_id", strategy = "lease", store = "pool")]
async fn transfer(pool: &sqlx::PgPool, transfer_id: &str) -> Result<(), AppError> {
    let _ = (pool, transfer_id);
    Ok(())
}

fn main() {}
