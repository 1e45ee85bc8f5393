//! Signatures `#[idempotent]` must keep exactly: generics, lifetimes, where
//! clauses, methods, bare and composite keys, and `Send` futures.

use idem::idempotent;
use serde::{Deserialize, Serialize};
use sqlx::{MySql, Postgres, Sqlite, Transaction};

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

#[derive(Serialize, Deserialize)]
pub struct PayCallback {
    pub trade_no: String,
    pub user_id: u64,
    pub request_id: uuid_like::RequestId,
}

mod uuid_like {
    pub type RequestId = String;
}

#[derive(Serialize, Deserialize)]
pub struct Receipt {
    pub coupon_id: u64,
}

/// Bare expression key and a fingerprint.
#[idempotent(key = event.trade_no, fingerprint = event, scope = "payments.on_pay", retention = "24h")]
pub async fn on_pay(tx: &mut Transaction<'_, Postgres>, event: &PayCallback) -> Result<Receipt, AppError> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    Ok(Receipt { coupon_id: 1 })
}

/// sqlx's own names for a transaction.
#[idempotent(key = "trade_no", scope = "aliases.pg")]
async fn pg_alias(tx: &mut sqlx::PgTransaction<'_>, trade_no: &str) -> Result<(), AppError> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    let _ = trade_no;
    Ok(())
}

#[idempotent(key = "trade_no", scope = "aliases.mysql")]
async fn mysql_alias(tx: &mut sqlx::MySqlTransaction<'_>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}

#[idempotent(key = "trade_no", scope = "aliases.sqlite", claim = "after")]
async fn sqlite_alias(tx: &mut sqlx::SqliteTransaction<'_>, trade_no: &str) -> Result<(), AppError> {
    let _ = (tx, trade_no);
    Ok(())
}

/// `anyhow::Error` as the error type: it converts from `idem::Error` too.
#[idempotent(key = "trade_no", scope = "errors.anyhow")]
async fn anyhow_error(tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> anyhow::Result<u32> {
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    let _ = trade_no;
    Ok(1)
}

/// Composite key; MySQL; named lifetimes.
#[idempotent(key = "event.user_id, event.request_id", source = "rpc")]
async fn named_lifetimes<'a, 'c>(tx: &'a mut Transaction<'c, MySql>, event: &'a PayCallback) -> Result<String, AppError> {
    let _ = (tx, event);
    Ok("done".to_owned())
}

/// Generic over the payload, with a where clause; tuple key.
#[idempotent(key = (id, tenant))]
async fn generic<T>(tx: &mut Transaction<'_, Sqlite>, id: i64, tenant: &str, payload: T) -> Result<Vec<T>, AppError>
where
    T: Serialize + serde::de::DeserializeOwned + Send,
{
    let _ = tx;
    Ok(vec![payload])
}

/// Generic over the database.
#[idempotent(key = "key")]
async fn any_backend<DB: idem::sql::SqlBackend>(tx: &mut Transaction<'_, DB>, key: u64) -> Result<(), AppError>
where
    DB::Connection: Send,
{
    let _ = (tx, key);
    Ok(())
}

/// `?`, early `return` and owned parameters in the body.
#[idempotent(key = "order_id")]
async fn early_return(tx: &mut Transaction<'_, Postgres>, order_id: String, skip: bool) -> Result<Option<String>, AppError> {
    if skip {
        return Ok(None);
    }
    sqlx::query("SELECT 1").execute(&mut **tx).await?;
    Ok(Some(order_id))
}

/// Raw identifiers as the transaction and as a key.
#[idempotent(key = "r#type")]
async fn raw_identifiers(r#tx: &mut Transaction<'_, Sqlite>, r#type: &str) -> Result<(), AppError> {
    let _ = (r#tx, r#type);
    Ok(())
}

pub struct PaymentService {
    pub prefix: String,
}

impl PaymentService {
    /// A `&self` method keyed on a field of `self` and a parameter.
    #[idempotent(key = "self.prefix, trade_no", scope = "payments.service")]
    pub async fn handle(&self, tx: &mut Transaction<'_, Postgres>, trade_no: &str) -> Result<u32, AppError> {
        let _ = tx;
        Ok(self.prefix.len() as u32)
    }
}

/// A unit of work of the application's own, marked `#[idem(tx)]`.
pub struct UnitOfWork<'c> {
    pub tx: Transaction<'c, Postgres>,
}

impl idem::sql::TxContext for UnitOfWork<'_> {
    type Db = Postgres;
    fn connection(&mut self) -> &mut sqlx::PgConnection {
        &mut self.tx
    }
}

#[idempotent(key = "trade_no")]
async fn with_unit_of_work(#[idem(tx)] uow: &mut UnitOfWork<'_>, trade_no: &str) -> Result<(), AppError> {
    let _ = (uow, trade_no);
    Ok(())
}

fn main() {
    // Never called: proves the futures are Send, so they can be spawned.
    let _ = |pool: sqlx::PgPool, event: PayCallback, service: PaymentService| {
        tokio::spawn(async move {
            let mut tx = pool.begin().await?;
            on_pay(&mut tx, &event).await?;
            service.handle(&mut tx, &event.trade_no).await?;
            early_return(&mut tx, event.trade_no.clone(), false).await?;
            any_backend(&mut tx, 7).await?;
            let mut uow = UnitOfWork { tx };
            with_unit_of_work(&mut uow, "T1").await?;
            uow.tx.commit().await?;
            Ok::<_, AppError>(())
        })
    };
    let _ = |pool: sqlx::MySqlPool, event: PayCallback| {
        tokio::spawn(async move {
            let mut tx = pool.begin().await?;
            named_lifetimes(&mut tx, &event).await?;
            Ok::<_, AppError>(())
        })
    };
    let _ = |pool: sqlx::SqlitePool| {
        tokio::spawn(async move {
            let mut tx = pool.begin().await?;
            generic(&mut tx, 1, "acme", 2.5_f64).await?;
            raw_identifiers(&mut tx, "express").await?;
            Ok::<_, AppError>(())
        })
    };
}
