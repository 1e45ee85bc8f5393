//! `precheck = "redis"` in front of `dedup`, `dedup+state`, `token+dedup` and `lease`.

use idem::idempotent;
use sqlx::{Postgres, Transaction};

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
}

pub struct Consumer {
    pub markers: idem::store::RedisStore,
}

impl Consumer {
    /// Markers in a named store, with their TTL.
    #[idempotent(key = "key", scope = "ledger.apply", precheck = "redis", ttl = "2d", store = "self.markers")]
    async fn apply(&self, tx: &mut Transaction<'_, Postgres>, key: &str) -> Result<u64, AppError> {
        let _ = (tx, key);
        Ok(1)
    }
}

/// A configuration of stores as a value: each guard below names it, and
/// each takes the store of its role from it.
static STORES: std::sync::LazyLock<idem::Stores> =
    std::sync::LazyLock::new(|| idem::Stores::builder().all(idem::store::MemoryStore::new()).build());

/// The installed precheck store and the default TTL; `claim = "after"` too.
#[idempotent(key = "key", scope = "ledger.apply_after", precheck = "redis", claim = "after")]
async fn apply_after(tx: &mut Transaction<'_, Postgres>, key: &str) -> Result<(), AppError> {
    let _ = (tx, key);
    Ok(())
}

/// A lease record with a precheck: `store` is the lease store.
#[idempotent(key = "id", strategy = "lease", scope = "bank.transfer", precheck = "redis", ttl = "1h",
             store = "*STORES")]
async fn transfer(id: &str) -> Result<(), AppError> {
    let _ = id;
    Ok(())
}

#[derive(idem::StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state(table = "orders", key_column = "id", status_column = "status")]
pub enum OrderStatus {
    #[state(to(Paid))]
    WaitPay = 1,
    Paid = 2,
}

/// The record of `dedup+state` behind the markers; `store` is the precheck store.
#[idempotent(key = "id", strategy = "dedup+state", scope = "orders.paid", precheck = "redis", ttl = "1d",
             store = "*STORES", transition = "OrderStatus::WaitPay -> OrderStatus::Paid")]
async fn on_paid(tx: &mut Transaction<'_, Postgres>, id: i64) -> Result<(), AppError> {
    let _ = (tx, id);
    Ok(())
}

/// `token+dedup`: `store` is the token store; markers go to the installed precheck store.
#[idempotent(key = "request_id", strategy = "token+dedup", scope = "orders.submit", precheck = "redis",
             store = "*STORES")]
async fn submit(tx: &mut Transaction<'_, Postgres>, request_id: &str, #[idem(token)] token: &str) -> Result<(), AppError> {
    let _ = (tx, request_id, token);
    Ok(())
}

fn main() {
    let _ = |pg: sqlx::PgPool, c: Consumer| {
        tokio::spawn(async move {
            let mut tx = pg.begin().await.map_err(|_| idem::Error::TokenRejected)?;
            c.apply(&mut tx, "k").await?;
            apply_after(&mut tx, "k").await?;
            transfer("t").await?;
            on_paid(&mut tx, 1).await?;
            submit(&mut tx, "r", "t").await?;
            Ok::<_, AppError>(())
        })
    };
}
