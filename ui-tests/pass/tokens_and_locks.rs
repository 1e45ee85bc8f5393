//! Signatures the token and lock strategies must keep working with.

use idem::idempotent;
use sqlx::{Postgres, Sqlite, Transaction};

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

#[derive(idem::StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state(table = "orders", key_column = "id", status_column = "status")]
pub enum OrderStatus {
    #[state(to(Paid))]
    WaitPay = 1,
    Paid = 2,
}

/// A store the application keeps (a `RedisStore` in production).
static STORE: std::sync::LazyLock<idem::store::MemoryStore> = std::sync::LazyLock::new(idem::store::MemoryStore::new);

pub struct Submit {
    pub user_id: i64,
    pub token: Option<String>,
}

/// A token from a form field, the installed store.
#[idempotent(strategy = "token", scope = "orders.create", source = "frontend")]
async fn create_order(#[idem(token)] token: &str, user_id: i64) -> Result<i64, AppError> {
    let _ = (token, user_id);
    Ok(1)
}

/// An optional token, a named store, an explicit policy.
#[idempotent(strategy = "token", scope = "orders.create", store = "*STORE", on_store_error = "allow")]
async fn create_order_optional(#[idem(token)] token: Option<String>) -> Result<(), AppError> {
    let _ = token;
    Ok(())
}

/// token+dedup: a record under the request's key, in the transaction.
#[idempotent(key = "req.user_id", strategy = "token+dedup", scope = "orders.submit", fingerprint = "req.user_id")]
async fn submit(
    tx: &mut Transaction<'_, Postgres>,
    req: &Submit,
    #[idem(token)] token: &str,
) -> Result<String, AppError> {
    let _ = (tx, req, token);
    Ok("order-1".into())
}

/// lock+dedup with a bounded wait; the body reads its fencing token.
#[idempotent(key = "sku, buyer", strategy = "lock+dedup", ttl = "10s", wait = "2s")]
async fn buy(tx: &mut Transaction<'_, Sqlite>, sku: i64, buyer: &str) -> Result<bool, AppError> {
    let fence = idem::lock::current().map(|l| l.fence);
    let _ = (tx, sku, buyer, fence);
    Ok(true)
}

#[idempotent(
    key = "id",
    strategy = "lock+state",
    ttl = "5s",
    store = "*STORE",
    transition = "OrderStatus::WaitPay -> OrderStatus::Paid"
)]
async fn pay(tx: &mut Transaction<'_, Postgres>, id: i64) -> Result<(), AppError> {
    let _ = (tx, id);
    Ok(())
}

/// Mutual exclusion only, on a method.
pub struct Reports;
impl Reports {
    #[idempotent(key = "day", strategy = "lock", concurrency_only = true, ttl = "1m", scope = "reports.build")]
    async fn build(&self, day: &str) -> Result<usize, AppError> {
        let _ = day;
        Ok(0)
    }
}

fn main() {
    // Never called: proves the futures are Send, so they can be spawned.
    let _ = |pg: sqlx::PgPool, lite: sqlx::SqlitePool| {
        tokio::spawn(async move {
            create_order("t", 1).await?;
            create_order_optional(None).await?;
            let mut tx = pg.begin().await?;
            submit(&mut tx, &Submit { user_id: 1, token: None }, "t").await?;
            pay(&mut tx, 1).await?;
            let mut tx = lite.begin().await?;
            buy(&mut tx, 1, "ann").await?;
            Reports.build("2026-11-30").await?;
            Ok::<_, AppError>(())
        })
    };
}
