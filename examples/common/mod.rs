//! What the examples share: connecting to the store named by `--database-url`
//! (SQLite in a temporary file when none is given) and the demo shop's
//! business statements for each database; [`shards`], the route of
//! `sharded_orders`. Also included (`#[path]`) by the load generator
//! (`bench/`) and the message consumer (`examples/mq/`), which are packages
//! of their own for their dependencies' sake.
#![allow(dead_code)]

use std::future::Future;
use std::path::PathBuf;

use sqlx::{MySql, MySqlPool, PgPool, Postgres, Sqlite, SqlitePool};

pub mod shards;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The application error of the demo services.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Idem(#[from] idem::Error),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    #[error("{0}")]
    Unexpected(String),
    /// A message that no attempt can handle (a body that does not decode):
    /// a consumer dead-letters it at once instead of retrying it.
    #[error("{0}")]
    Malformed(String),
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

    /// A lease store on this database, its record table migrated.
    pub async fn lease_store(&self) -> Result<std::sync::Arc<dyn idem::lease::LeaseStore>, BoxError> {
        Ok(match self {
            Store::Sqlite(pool, _) => {
                idem::migrate(pool).await?;
                std::sync::Arc::new(idem::store::SqlStore::new(pool.clone()))
            }
            Store::Postgres(pool) => {
                idem::migrate(pool).await?;
                std::sync::Arc::new(idem::store::SqlStore::new(pool.clone()))
            }
            Store::MySql(pool) => {
                idem::migrate(pool).await?;
                std::sync::Arc::new(idem::store::SqlStore::new(pool.clone()))
            }
        })
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

/// SQL written with `?` placeholders, numbered `$1, $2, ...` for PostgreSQL
/// (`backend`: [`Store::name`] or `idem::sql::SqlBackend::BACKEND`).
pub fn sql(backend: &str, text: &'static str) -> sqlx::AssertSqlSafe<String> {
    let mut parts = text.split('?').enumerate();
    let first = parts.next().map_or("", |(_, part)| part).to_owned();
    sqlx::AssertSqlSafe(parts.fold(first, |out, (n, part)| match backend {
        "postgres" => format!("{out}${n}{part}"),
        _ => format!("{out}?{part}"),
    }))
}

/// `on_pool!(store, pool => body)`: `body` once per database, with `pool`
/// bound to the [`Store`]'s typed pool (each arm is compiled on its own).
#[allow(unused_macros)]
macro_rules! on_pool {
    ($store:expr, $pool:ident => $body:expr) => {
        match $store {
            $crate::common::Store::Sqlite($pool, _) => $body,
            $crate::common::Store::Postgres($pool) => $body,
            $crate::common::Store::MySql($pool) => $body,
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_pool;

/// The seed's order lifecycle, stored as integer codes (the discriminants)
/// in `shop_orders.status`.
#[derive(idem::StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state(table = "shop_orders", key_column = "trade_no", status_column = "status")]
pub enum OrderStatus {
    #[state(to(Paid, Canceled))]
    WaitPay = 1,
    #[state(to(Shipped, Canceled))]
    Paid = 2,
    #[state(to(Finished))]
    Shipped = 3,
    Finished = 4,
    Canceled = 9,
}

impl OrderStatus {
    /// The stored code.
    pub fn code(self) -> i64 {
        self as i64
    }

    /// The seed's name (`WAIT_PAY`, ...) of a stored code, `?` for none.
    pub fn label(code: i64) -> &'static str {
        // In declaration order, like the derive's table.
        const LABELS: [&str; 5] = ["WAIT_PAY", "PAID", "SHIPPED", "FINISHED", "CANCELED"];
        let states = <OrderStatus as idem::StateMachine>::STATES;
        states.variant_of(&idem::state::StoredState::Int(code)).map_or("?", |i| LABELS[i])
    }
}

/// The demo shop's business statements, per database: orders with a status,
/// a coupon table and 1,000 users with a coupon counter.
pub trait Shop: idem::sql::SqlBackend {
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
    /// Orders `{prefix}{n}` for n in `from..to`, all WAIT_PAY, in one statement.
    fn create_orders(
        pool: &sqlx::Pool<Self>,
        prefix: &str,
        from: u64,
        to: u64,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// The order's status code.
    fn order_status(pool: &sqlx::Pool<Self>, trade_no: &str) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;
}

const USERS: i64 = 1000;

impl Shop for Sqlite {
    async fn setup(pool: &SqlitePool) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS shop_coupons (id INTEGER PRIMARY KEY AUTOINCREMENT, trade_no TEXT NOT NULL, user_id INTEGER NOT NULL);
             CREATE INDEX IF NOT EXISTS shop_coupons_trade_no ON shop_coupons (trade_no);
             CREATE TABLE IF NOT EXISTS shop_users (id INTEGER PRIMARY KEY, coupons INTEGER NOT NULL DEFAULT 0);
             CREATE TABLE IF NOT EXISTS shop_orders (trade_no TEXT PRIMARY KEY, status INTEGER NOT NULL);
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
    async fn create_orders(pool: &SqlitePool, prefix: &str, from: u64, to: u64) -> Result<(), sqlx::Error> {
        sqlx::query(
            "WITH RECURSIVE n(i) AS (SELECT ?2 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?3) \
             INSERT INTO shop_orders (trade_no, status) SELECT ?1 || i, 1 FROM n",
        )
        .bind(prefix)
        .bind(from as i64)
        .bind(to as i64)
        .execute(pool)
        .await?;
        Ok(())
    }
    async fn order_status(pool: &SqlitePool, trade_no: &str) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT status FROM shop_orders WHERE trade_no = ?").bind(trade_no).fetch_one(pool).await
    }
}

// PostgreSQL's `CREATE TABLE IF NOT EXISTS` is not safe against itself:
// two sessions creating the same table at once can fail with a unique
// violation of `pg_type` (tests of one binary run in parallel). Each setup
// text takes this transaction-level advisory lock first (the statements of
// one text run as one transaction), so the setups take turns.
// The lock's key, 8349005, is the examples' own.

impl Shop for Postgres {
    async fn setup(pool: &PgPool) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(
            "SELECT pg_advisory_xact_lock(8349005); -- the examples' setup lock (above)
             CREATE TABLE IF NOT EXISTS shop_coupons (id BIGSERIAL PRIMARY KEY, trade_no VARCHAR(64) NOT NULL, user_id BIGINT NOT NULL);
             CREATE INDEX IF NOT EXISTS shop_coupons_trade_no ON shop_coupons (trade_no);
             CREATE TABLE IF NOT EXISTS shop_users (id BIGINT PRIMARY KEY, coupons BIGINT NOT NULL DEFAULT 0);
             CREATE TABLE IF NOT EXISTS shop_orders (trade_no VARCHAR(64) PRIMARY KEY, status SMALLINT NOT NULL);
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
    async fn create_orders(pool: &PgPool, prefix: &str, from: u64, to: u64) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO shop_orders (trade_no, status) SELECT $1 || i, 1 FROM generate_series($2::int8, $3::int8 - 1) i",
        )
        .bind(prefix)
        .bind(from as i64)
        .bind(to as i64)
        .execute(pool)
        .await?;
        Ok(())
    }
    async fn order_status(pool: &PgPool, trade_no: &str) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT status::int8 FROM shop_orders WHERE trade_no = $1")
            .bind(trade_no)
            .fetch_one(pool)
            .await
    }
}

impl Shop for MySql {
    async fn setup(pool: &MySqlPool) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS shop_coupons (id BIGINT AUTO_INCREMENT PRIMARY KEY, trade_no VARCHAR(64) NOT NULL, \
               user_id BIGINT NOT NULL, INDEX shop_coupons_trade_no (trade_no)) ENGINE = InnoDB;
             CREATE TABLE IF NOT EXISTS shop_users (id BIGINT PRIMARY KEY, coupons BIGINT NOT NULL DEFAULT 0) ENGINE = InnoDB;
             CREATE TABLE IF NOT EXISTS shop_orders (trade_no VARCHAR(64) PRIMARY KEY, status SMALLINT NOT NULL) ENGINE = InnoDB;",
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
    async fn create_orders(pool: &MySqlPool, prefix: &str, from: u64, to: u64) -> Result<(), sqlx::Error> {
        // Batches of 1,000 rows: MariaDB stops a recursive CTE after
        // max_recursive_iterations (1,000 by default).
        let mut start = from;
        while start < to {
            let end = (start + 1000).min(to);
            sqlx::query(
                "INSERT INTO shop_orders (trade_no, status) \
                 WITH RECURSIVE n(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?) \
                 SELECT CONCAT(?, i), 1 FROM n",
            )
            .bind(start as i64)
            .bind(end as i64)
            .bind(prefix)
            .execute(pool)
            .await?;
            start = end;
        }
        Ok(())
    }
    async fn order_status(pool: &MySqlPool, trade_no: &str) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT CAST(status AS SIGNED) FROM shop_orders WHERE trade_no = ?")
            .bind(trade_no)
            .fetch_one(pool)
            .await
    }
}

/// The ledger of the message-consumer demo (`mq_consumer`): `mq_ledger`
/// holds one entry per business key, its unique index the last line of
/// defence; `mq_applied` logs every committed run of the handler's body and
/// has no unique index, so a duplicate effect would show there.
pub trait Ledger: idem::sql::SqlBackend {
    /// Create the two tables if missing.
    fn setup_ledger(pool: &sqlx::Pool<Self>) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Book one entry of run `run` and log the application; the entry's id.
    fn book(
        conn: &mut Self::Connection,
        run: &str,
        key: &str,
        account: i64,
        amount_cents: i64,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;
    /// Of run `run`: (entries, applications, distinct keys applied).
    fn ledger_report(
        pool: &sqlx::Pool<Self>,
        run: &str,
    ) -> impl Future<Output = Result<(i64, i64, i64), sqlx::Error>> + Send;
}

const LEDGER_REPORT: &str = "SELECT (SELECT COUNT(*) FROM mq_ledger WHERE run = ?), \
     (SELECT COUNT(*) FROM mq_applied WHERE run = ?), (SELECT COUNT(DISTINCT business_key) FROM mq_applied WHERE run = ?)";

impl Ledger for Sqlite {
    async fn setup_ledger(pool: &SqlitePool) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS mq_ledger (id INTEGER PRIMARY KEY AUTOINCREMENT, run TEXT NOT NULL, \
               business_key TEXT NOT NULL UNIQUE, account INTEGER NOT NULL, amount_cents INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS mq_applied (id INTEGER PRIMARY KEY AUTOINCREMENT, run TEXT NOT NULL, business_key TEXT NOT NULL);
             CREATE INDEX IF NOT EXISTS mq_applied_run ON mq_applied (run);",
        )
        .execute(pool)
        .await?;
        Ok(())
    }
    async fn book(
        conn: &mut sqlx::SqliteConnection,
        run: &str,
        key: &str,
        account: i64,
        cents: i64,
    ) -> Result<i64, sqlx::Error> {
        let id = sqlx::query("INSERT INTO mq_ledger (run, business_key, account, amount_cents) VALUES (?, ?, ?, ?)")
            .bind(run)
            .bind(key)
            .bind(account)
            .bind(cents)
            .execute(&mut *conn)
            .await?
            .last_insert_rowid();
        sqlx::query("INSERT INTO mq_applied (run, business_key) VALUES (?, ?)")
            .bind(run)
            .bind(key)
            .execute(conn)
            .await?;
        Ok(id)
    }
    async fn ledger_report(pool: &SqlitePool, run: &str) -> Result<(i64, i64, i64), sqlx::Error> {
        sqlx::query_as(LEDGER_REPORT).bind(run).bind(run).bind(run).fetch_one(pool).await
    }
}

impl Ledger for Postgres {
    async fn setup_ledger(pool: &PgPool) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(
            "SELECT pg_advisory_xact_lock(8349005); -- the examples' setup lock (above)
             CREATE TABLE IF NOT EXISTS mq_ledger (id BIGSERIAL PRIMARY KEY, run VARCHAR(64) NOT NULL, \
               business_key VARCHAR(191) NOT NULL UNIQUE, account BIGINT NOT NULL, amount_cents BIGINT NOT NULL);
             CREATE INDEX IF NOT EXISTS mq_ledger_run ON mq_ledger (run);
             CREATE TABLE IF NOT EXISTS mq_applied (id BIGSERIAL PRIMARY KEY, run VARCHAR(64) NOT NULL, business_key VARCHAR(191) NOT NULL);
             CREATE INDEX IF NOT EXISTS mq_applied_run ON mq_applied (run);",
        )
        .execute(pool)
        .await?;
        Ok(())
    }
    async fn book(
        conn: &mut sqlx::PgConnection,
        run: &str,
        key: &str,
        account: i64,
        cents: i64,
    ) -> Result<i64, sqlx::Error> {
        let id = sqlx::query_scalar(
            "INSERT INTO mq_ledger (run, business_key, account, amount_cents) VALUES ($1, $2, $3, $4) RETURNING id",
        )
        .bind(run)
        .bind(key)
        .bind(account)
        .bind(cents)
        .fetch_one(&mut *conn)
        .await?;
        sqlx::query("INSERT INTO mq_applied (run, business_key) VALUES ($1, $2)")
            .bind(run)
            .bind(key)
            .execute(conn)
            .await?;
        Ok(id)
    }
    async fn ledger_report(pool: &PgPool, run: &str) -> Result<(i64, i64, i64), sqlx::Error> {
        sqlx::query_as(sql("postgres", LEDGER_REPORT)).bind(run).bind(run).bind(run).fetch_one(pool).await
    }
}

impl Ledger for MySql {
    async fn setup_ledger(pool: &MySqlPool) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS mq_ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, run VARCHAR(64) NOT NULL, \
               business_key VARCHAR(191) NOT NULL, account BIGINT NOT NULL, amount_cents BIGINT NOT NULL, \
               UNIQUE INDEX mq_ledger_key (business_key), INDEX mq_ledger_run (run)) ENGINE = InnoDB;
             CREATE TABLE IF NOT EXISTS mq_applied (id BIGINT AUTO_INCREMENT PRIMARY KEY, run VARCHAR(64) NOT NULL, \
               business_key VARCHAR(191) NOT NULL, INDEX mq_applied_run (run)) ENGINE = InnoDB;",
        )
        .execute(pool)
        .await?;
        Ok(())
    }
    async fn book(
        conn: &mut sqlx::MySqlConnection,
        run: &str,
        key: &str,
        account: i64,
        cents: i64,
    ) -> Result<i64, sqlx::Error> {
        let id = sqlx::query("INSERT INTO mq_ledger (run, business_key, account, amount_cents) VALUES (?, ?, ?, ?)")
            .bind(run)
            .bind(key)
            .bind(account)
            .bind(cents)
            .execute(&mut *conn)
            .await?
            .last_insert_id();
        sqlx::query("INSERT INTO mq_applied (run, business_key) VALUES (?, ?)")
            .bind(run)
            .bind(key)
            .execute(conn)
            .await?;
        Ok(id as i64)
    }
    async fn ledger_report(pool: &MySqlPool, run: &str) -> Result<(i64, i64, i64), sqlx::Error> {
        sqlx::query_as(LEDGER_REPORT).bind(run).bind(run).bind(run).fetch_one(pool).await
    }
}
