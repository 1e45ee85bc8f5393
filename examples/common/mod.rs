//! What the examples share: connecting to the store named by `--database-url`
//! (SQLite in a temporary file when none is given) and the demo shop's
//! business statements for each database.
#![allow(dead_code)]

use std::future::Future;
use std::path::PathBuf;

use sqlx::{MySql, MySqlPool, PgPool, Postgres, Sqlite, SqlitePool};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The application error of the demo services.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// A connected store.
pub enum Store {
    Sqlite(SqlitePool, PathBuf),
    Postgres(PgPool),
    MySql(MySqlPool),
}

impl Store {
    /// `None`: the embedded default, SQLite in a fresh temporary file.
    pub async fn connect(url: Option<&str>, max_connections: u32) -> Result<Store, BoxError> {
        let url = url.unwrap_or("");
        let store = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let pool = sqlx::postgres::PgPoolOptions::new().max_connections(max_connections).connect(url).await?;
            Store::Postgres(pool)
        } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
            let url = url.replacen("mariadb://", "mysql://", 1);
            let pool = sqlx::mysql::MySqlPoolOptions::new().max_connections(max_connections).connect(&url).await?;
            Store::MySql(pool)
        } else if url.is_empty() || url.starts_with("sqlite:") {
            let path = match url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:")) {
                Some(p) if !p.is_empty() => PathBuf::from(p),
                _ => std::env::temp_dir().join(format!("idem-example-{}.db", std::process::id())),
            };
            let opts = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true)
                .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                .synchronous(sqlx::sqlite::SqliteSynchronous::Normal)
                .busy_timeout(std::time::Duration::from_secs(30));
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(max_connections.min(8))
                .connect_with(opts)
                .await?;
            Store::Sqlite(pool, path)
        } else {
            return Err(format!("unsupported --database-url {url:?}: use postgres://, mysql:// or sqlite:").into());
        };
        Ok(store)
    }

    pub fn name(&self) -> &'static str {
        match self {
            Store::Sqlite(..) => "sqlite",
            Store::Postgres(_) => "postgres",
            Store::MySql(_) => "mysql",
        }
    }

    /// Remove the temporary SQLite file of the embedded default.
    pub async fn close(self) {
        if let Store::Sqlite(pool, path) = self {
            pool.close().await;
            if path.starts_with(std::env::temp_dir()) {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                }
            }
        }
    }
}

/// A unique run id, so repeated runs against one server never see each
/// other's trades.
pub fn run_id() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{:x}", nanos)
}

/// The demo shop's business statements, per database: a coupon table and
/// 1,000 users with a coupon counter.
pub trait Shop: idem::SqlBackend {
    /// Create the tables if missing and make sure users 1..=1000 exist.
    fn setup(pool: &sqlx::Pool<Self>) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Insert a coupon for the trade; returns its id.
    fn insert_coupon(
        conn: &mut Self::Connection,
        trade_no: &str,
        user_id: i64,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;
    /// Count a granted coupon on the user.
    fn bump_user(conn: &mut Self::Connection, user_id: i64) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Coupons granted for one trade.
    fn coupons_for(pool: &sqlx::Pool<Self>, trade_no: &str) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;
}

const USERS: i64 = 1000;

impl Shop for Sqlite {
    async fn setup(pool: &SqlitePool) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS shop_coupons (id INTEGER PRIMARY KEY AUTOINCREMENT, trade_no TEXT NOT NULL, user_id INTEGER NOT NULL);
             CREATE INDEX IF NOT EXISTS shop_coupons_trade_no ON shop_coupons (trade_no);
             CREATE TABLE IF NOT EXISTS shop_users (id INTEGER PRIMARY KEY, coupons INTEGER NOT NULL DEFAULT 0);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000)
             INSERT OR IGNORE INTO shop_users (id) SELECT i FROM n;",
        )
        .execute(pool)
        .await?;
        Ok(())
    }
    async fn insert_coupon(
        conn: &mut sqlx::SqliteConnection,
        trade_no: &str,
        user_id: i64,
    ) -> Result<i64, sqlx::Error> {
        let done = sqlx::query("INSERT INTO shop_coupons (trade_no, user_id) VALUES (?, ?)")
            .bind(trade_no)
            .bind(user_id)
            .execute(conn)
            .await?;
        Ok(done.last_insert_rowid())
    }
    async fn bump_user(conn: &mut sqlx::SqliteConnection, user_id: i64) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE shop_users SET coupons = coupons + 1 WHERE id = ?")
            .bind(user_id % USERS + 1)
            .execute(conn)
            .await?;
        Ok(())
    }
    async fn coupons_for(pool: &SqlitePool, trade_no: &str) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT COUNT(*) FROM shop_coupons WHERE trade_no = ?").bind(trade_no).fetch_one(pool).await
    }
}

impl Shop for Postgres {
    async fn setup(pool: &PgPool) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS shop_coupons (id BIGSERIAL PRIMARY KEY, trade_no VARCHAR(64) NOT NULL, user_id BIGINT NOT NULL);
             CREATE INDEX IF NOT EXISTS shop_coupons_trade_no ON shop_coupons (trade_no);
             CREATE TABLE IF NOT EXISTS shop_users (id BIGINT PRIMARY KEY, coupons BIGINT NOT NULL DEFAULT 0);
             INSERT INTO shop_users (id) SELECT generate_series(1, 1000) ON CONFLICT DO NOTHING;",
        )
        .execute(pool)
        .await?;
        Ok(())
    }
    async fn insert_coupon(conn: &mut sqlx::PgConnection, trade_no: &str, user_id: i64) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("INSERT INTO shop_coupons (trade_no, user_id) VALUES ($1, $2) RETURNING id")
            .bind(trade_no)
            .bind(user_id)
            .fetch_one(conn)
            .await
    }
    async fn bump_user(conn: &mut sqlx::PgConnection, user_id: i64) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE shop_users SET coupons = coupons + 1 WHERE id = $1")
            .bind(user_id % USERS + 1)
            .execute(conn)
            .await?;
        Ok(())
    }
    async fn coupons_for(pool: &PgPool, trade_no: &str) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT COUNT(*) FROM shop_coupons WHERE trade_no = $1").bind(trade_no).fetch_one(pool).await
    }
}

impl Shop for MySql {
    async fn setup(pool: &MySqlPool) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS shop_coupons (id BIGINT AUTO_INCREMENT PRIMARY KEY, trade_no VARCHAR(64) NOT NULL, \
               user_id BIGINT NOT NULL, INDEX shop_coupons_trade_no (trade_no)) ENGINE = InnoDB;
             CREATE TABLE IF NOT EXISTS shop_users (id BIGINT PRIMARY KEY, coupons BIGINT NOT NULL DEFAULT 0) ENGINE = InnoDB;",
        )
        .execute(pool)
        .await?;
        let users: Vec<String> = (1..=USERS).map(|i| format!("({i})")).collect();
        // Built from integers only: nothing user-supplied reaches this SQL.
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("INSERT IGNORE INTO shop_users (id) VALUES {}", users.join(","))))
            .execute(pool)
            .await?;
        Ok(())
    }
    async fn insert_coupon(conn: &mut sqlx::MySqlConnection, trade_no: &str, user_id: i64) -> Result<i64, sqlx::Error> {
        let done = sqlx::query("INSERT INTO shop_coupons (trade_no, user_id) VALUES (?, ?)")
            .bind(trade_no)
            .bind(user_id)
            .execute(conn)
            .await?;
        Ok(done.last_insert_id() as i64)
    }
    async fn bump_user(conn: &mut sqlx::MySqlConnection, user_id: i64) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE shop_users SET coupons = coupons + 1 WHERE id = ?")
            .bind(user_id % USERS + 1)
            .execute(conn)
            .await?;
        Ok(())
    }
    async fn coupons_for(pool: &MySqlPool, trade_no: &str) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT COUNT(*) FROM shop_coupons WHERE trade_no = ?").bind(trade_no).fetch_one(pool).await
    }
}
