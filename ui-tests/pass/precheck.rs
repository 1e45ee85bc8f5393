//! `precheck = "redis"` in front of `dedup` and `lease`.

use idem::idempotent;
use sqlx::{Postgres, Transaction};

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
}

pub struct Consumer {
    pub markers: idem::RedisStore,
}

impl Consumer {
    /// Markers in a named store, with their TTL.
    #[idempotent(key = "key", scope = "ledger.apply", precheck = "redis", ttl = "2d", store = "self.markers")]
    async fn apply(&self, tx: &mut Transaction<'_, Postgres>, key: &str) -> Result<u64, AppError> {
        let _ = (tx, key);
        Ok(1)
    }
}

/// The installed precheck store and the default TTL; `claim = "after"` too.
#[idempotent(key = "key", scope = "ledger.apply_after", precheck = "redis", claim = "after")]
async fn apply_after(tx: &mut Transaction<'_, Postgres>, key: &str) -> Result<(), AppError> {
    let _ = (tx, key);
    Ok(())
}

/// A lease record with a precheck: `store` is the lease store.
#[idempotent(key = "id", strategy = "lease", scope = "bank.transfer", precheck = "redis", ttl = "1h",
             store = "idem::lease::installed()")]
async fn transfer(id: &str) -> Result<(), AppError> {
    let _ = id;
    Ok(())
}

fn main() {
    let _ = |pg: sqlx::PgPool, c: Consumer| {
        tokio::spawn(async move {
            let mut tx = pg.begin().await.map_err(|_| idem::Error::TokenRejected)?;
            c.apply(&mut tx, "k").await?;
            apply_after(&mut tx, "k").await?;
            transfer("t").await?;
            Ok::<_, AppError>(())
        })
    };
}
