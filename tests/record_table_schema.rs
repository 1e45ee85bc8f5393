//! A schema-qualified record table (`schema.name`) on PostgreSQL and
//! MySQL/MariaDB (where the schema is a database), and refused on SQLite
//! with a message that says why. One name per process: its own binary.

use idem_test_support as common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use common::{AppError, unique};
use idem::idempotent;
use sqlx::Transaction;

/// On MySQL the schema is the database `test` the tests use.
const TABLE: &str = "test.idem_schema_records";

/// The stores of this binary, naming the table: installed by every test
/// before its first SQL step.
fn named() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let table = idem::sql::RecordTable::new(TABLE).unwrap();
        idem::Stores::builder().record_table(table).install().unwrap();
    });
}

#[idempotent(key = "id", scope = "tests.table.schema")]
async fn grant<DB: idem::sql::SqlBackend>(
    tx: &mut Transaction<'_, DB>,
    id: &str,
    runs: &AtomicUsize,
) -> Result<u32, AppError> {
    let _ = tx;
    Ok(runs.fetch_add(1, SeqCst) as u32 + 1)
}

macro_rules! runs_once {
    ($pool:expr, $count:literal) => {{
        let pool = $pool;
        let (id, runs) = (unique("s"), AtomicUsize::new(0));
        for _ in 0..3 {
            let mut tx = pool.begin().await.unwrap();
            assert_eq!(grant(&mut tx, &id, &runs).await.unwrap(), 1);
            tx.commit().await.unwrap();
        }
        assert_eq!(runs.load(SeqCst), 1);
        let sql = format!("SELECT COUNT(*) FROM {TABLE} WHERE idem_key = {}", $count);
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(&id).fetch_one(&pool).await.unwrap();
        assert_eq!(n, 1);
    }};
}

#[tokio::test]
async fn postgres() {
    named();
    let url = std::env::var("IDEM_PG_URL").unwrap_or_else(|_| common::DEFAULT_PG_URL.to_owned());
    if let Ok(pool) = sqlx::PgPool::connect(&url).await {
        // The schema must exist before idem's migration (it creates tables, not schemas).
        let _ = sqlx::raw_sql("CREATE SCHEMA IF NOT EXISTS test").execute(&pool).await;
    }
    let Some(pool) = common::postgres().await else { return };
    assert!(common::pg_table_options(&pool, TABLE).await.contains(&"fillfactor=90".to_owned()));
    runs_once!(pool, "$1");
}

#[tokio::test]
async fn mysql() {
    named();
    let Some(pool) = common::mysql().await else { return };
    runs_once!(pool, "?");
}

#[tokio::test]
async fn sqlite_refuses_a_schema_and_says_so() {
    named();
    let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
    let e = idem::migrate(&pool).await.unwrap_err();
    assert!(e.to_string().contains("on SQLite name the table alone"), "{e}");
}
