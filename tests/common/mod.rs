//! Shared set-up of the integration tests: real databases, unique keys.
//!
//! PostgreSQL and MySQL/MariaDB come from `IDEM_PG_URL` and `IDEM_MYSQL_URL`
//! (defaulting to the local servers). An unreachable server skips its tests
//! with a printed reason, unless `IDEM_REQUIRE_SERVICES=1`, where it fails.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::{MySqlPool, PgPool, SqlitePool};

pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
pub const DEFAULT_MYSQL_URL: &str = "mysql://root@127.0.0.1:3306/test";

/// A value no other test or earlier run has used, so tests share tables
/// without seeing each other's rows.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{prefix}-{}-{nanos}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

fn required() -> bool {
    std::env::var("IDEM_REQUIRE_SERVICES").is_ok_and(|v| v == "1")
}

fn unavailable(service: &str, url: &str, err: &dyn std::fmt::Display) {
    if required() {
        panic!("{service} at {url} is required (IDEM_REQUIRE_SERVICES=1) but unreachable: {err}");
    }
    eprintln!("SKIPPED: {service} at {url} is unreachable ({err}); set IDEM_REQUIRE_SERVICES=1 to make this a failure");
}

pub async fn postgres() -> Option<PgPool> {
    let url = std::env::var("IDEM_PG_URL").unwrap_or_else(|_| DEFAULT_PG_URL.to_owned());
    let pool = match sqlx::postgres::PgPoolOptions::new().max_connections(20).connect(&url).await {
        Ok(p) => p,
        Err(e) => {
            unavailable("PostgreSQL", &url, &e);
            return None;
        }
    };
    idem::migrate(&pool).await.expect("migrate postgres");
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS idem_test_coupons (id BIGSERIAL PRIMARY KEY, trade_no VARCHAR(191) NOT NULL);
         CREATE INDEX IF NOT EXISTS idem_test_coupons_trade_no ON idem_test_coupons (trade_no);
         CREATE TABLE IF NOT EXISTS idem_test_orders (trade_no VARCHAR(191) PRIMARY KEY);",
    )
    .execute(&pool)
    .await
    .ok();
    Some(pool)
}

pub async fn mysql() -> Option<MySqlPool> {
    let url = std::env::var("IDEM_MYSQL_URL").unwrap_or_else(|_| DEFAULT_MYSQL_URL.to_owned());
    let pool = match sqlx::mysql::MySqlPoolOptions::new().max_connections(20).connect(&url).await {
        Ok(p) => p,
        Err(e) => {
            unavailable("MySQL/MariaDB", &url, &e);
            return None;
        }
    };
    idem::migrate(&pool).await.expect("migrate mysql");
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS idem_test_coupons (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
         trade_no VARCHAR(191) NOT NULL, INDEX (trade_no)) ENGINE = InnoDB;
         CREATE TABLE IF NOT EXISTS idem_test_orders (trade_no VARBINARY(191) PRIMARY KEY) ENGINE = InnoDB",
    )
    .execute(&pool)
    .await
    .ok();
    Some(pool)
}

/// A fresh SQLite file (an in-memory database would be one database per
/// pooled connection).
pub async fn sqlite() -> Option<SqlitePool> {
    let dir = std::env::temp_dir().join("idem-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{}.db", unique("t")));
    let opts = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(std::time::Duration::from_secs(30));
    let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(8).connect_with(opts).await.unwrap();
    idem::migrate(&pool).await.expect("migrate sqlite");
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS idem_test_coupons (id INTEGER PRIMARY KEY AUTOINCREMENT, trade_no TEXT NOT NULL);
         CREATE INDEX IF NOT EXISTS idem_test_coupons_trade_no ON idem_test_coupons (trade_no);
         CREATE TABLE IF NOT EXISTS idem_test_orders (trade_no TEXT PRIMARY KEY);",
    )
    .execute(&pool)
    .await
    .unwrap();
    Some(pool)
}

pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379/";

/// A connection manager on `IDEM_REDIS_URL` (default: the local server).
pub async fn redis() -> Option<redis::aio::ConnectionManager> {
    let url = std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| DEFAULT_REDIS_URL.to_owned());
    let connected = async {
        let client = redis::Client::open(url.as_str())?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(std::time::Duration::from_secs(2)))
            .set_number_of_retries(1);
        redis::aio::ConnectionManager::new_with_config(client, config).await
    };
    match connected.await {
        Ok(conn) => Some(conn),
        Err(e) => {
            unavailable("Redis", &url, &e);
            None
        }
    }
}

/// A real Redis client pointed at a port where no server listens: a store
/// that is down. `None` when Redis tests are skipped altogether.
pub async fn unreachable_redis() -> Option<idem::RedisStore> {
    redis().await?;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(std::time::Duration::from_millis(300)))
        .set_number_of_retries(0);
    let conn = redis::aio::ConnectionManager::new_lazy_with_config(client, config).unwrap();
    Some(idem::RedisStore::new(conn, "idem-test:"))
}

/// A real Redis client on a server that accepts connections and never
/// answers (stuck, or behind a network black hole), with the client's
/// default timeouts. `None` when Redis tests are skipped altogether.
pub async fn silent_redis() -> Option<idem::RedisStore> {
    redis().await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket); // read nothing, answer nothing, close nothing
        }
    });
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let conn = redis::aio::ConnectionManager::new_lazy_with_config(client, Default::default()).unwrap();
    Some(idem::RedisStore::new(conn, "idem-test:"))
}

pub const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// A connection to RabbitMQ at `IDEM_AMQP_URL` (default: the local broker).
pub async fn amqp() -> Option<lapin::Connection> {
    let url = std::env::var("IDEM_AMQP_URL").unwrap_or_else(|_| DEFAULT_AMQP_URL.to_owned());
    let connect = lapin::Connection::connect(&url, lapin::ConnectionProperties::default());
    match tokio::time::timeout(std::time::Duration::from_secs(5), connect).await {
        Ok(Ok(conn)) => Some(conn),
        Ok(Err(e)) => {
            unavailable("RabbitMQ", &url, &e);
            None
        }
        Err(_) => {
            unavailable("RabbitMQ", &url, &"no answer within 5s");
            None
        }
    }
}

/// The application error of the test services.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    #[error("business rule: {0}")]
    Rule(String),
}
