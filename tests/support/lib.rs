//! Shared set-up of the workspace's integration tests: real databases,
//! unique keys. A dev-dependency of the root package, `idem-cli`,
//! the door examples in `examples/http`, `examples/grpc` and `examples/mq`, which name it `common`
//! (`use idem_test_support as common;`).
//!
//! PostgreSQL, MySQL/MariaDB, Redis, RabbitMQ and NATS come from
//! `IDEM_PG_URL`, `IDEM_MYSQL_URL`, `IDEM_REDIS_URL`, `IDEM_AMQP_URL` and
//! `IDEM_NATS_URL` (defaulting to the local servers).
//! A server that does not answer within [`SKIP_AFTER`] skips the tests that
//! need it, each saying so in a `SKIPPED:` line (see [`skip`]); with
//! `IDEM_REQUIRE_SERVICES=1` (CI) it fails them instead, after
//! [`REQUIRED_WAIT`].
//!
//! [`redis_server`]: Redis servers a test starts for itself, to kill or
//! restart them; [`etcd_cluster`]: etcd clusters likewise, and one shared
//! by the suites of a test binary. [`proxy`]: a TCP proxy to a shared
//! server, cut and restored by a test (a broker out of reach, the server
//! left running).

// The runtime under the facade's name, as the tests write it (the facade
// re-exports its types): `idem::Tx` is `idem_runtime::Tx`.
extern crate idem_runtime as idem;

use std::fmt::Display;
use std::future::Future;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::{MySqlPool, PgPool, SqlitePool};

pub mod etcd_cluster;
pub mod proxy;
pub mod redis_server;

pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
pub const DEFAULT_MYSQL_URL: &str = "mysql://root@127.0.0.1:3306/test";

/// How long a test waits for a server before it skips: a local server
/// answers in milliseconds, and a run without one should not take minutes.
pub const SKIP_AFTER: Duration = Duration::from_secs(2);
/// How long it waits when the server is required: a loaded CI machine may
/// be slow to accept a connection, and waiting costs nothing there.
pub const REQUIRED_WAIT: Duration = Duration::from_secs(30);

/// A value no other test or earlier run has used, so tests share tables
/// without seeing each other's rows.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{prefix}-{}-{nanos}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

pub fn required() -> bool {
    std::env::var("IDEM_REQUIRE_SERVICES").is_ok_and(|v| v == "1")
}

/// Report the calling test as skipped: one line `SKIPPED: <test>: <reason>`.
///
/// Written straight to the process's stderr, not with `eprintln!`: the test
/// harness captures `print!`/`eprint!` output and shows it for failed tests
/// only, so a skipped test's reason would be lost and the test would read as
/// passed. `.ci/run` counts these lines (one test however many lines it
/// writes) and reports those tests as skipped, not passed. The harness runs
/// each test on a thread named after it, hence the name.
pub fn skip(reason: &str) {
    let thread = std::thread::current();
    let line = format!("SKIPPED: {}: {reason}\n", thread.name().unwrap_or("(unnamed test thread)"));
    // One write of the whole line, so parallel tests' lines do not interleave.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// The calling test cannot run here: a failure with
/// `IDEM_REQUIRE_SERVICES=1`, a skip otherwise.
pub fn cannot_run(reason: impl Display) {
    if required() {
        panic!("{reason}, and IDEM_REQUIRE_SERVICES=1");
    }
    skip(&format!("{reason}; set IDEM_REQUIRE_SERVICES=1 to make this a failure"));
}

fn unavailable(service: &str, url: &str, err: &dyn Display) {
    cannot_run(format!("{service} at {url} is unreachable ({err})"));
}

/// `connect`'s value, or `None` (the test skips) when it fails or takes
/// longer than [`SKIP_AFTER`] ([`REQUIRED_WAIT`] when services are
/// required, and then it panics). The deadline covers a server that is
/// down (refused at once) and an address that never answers (a firewall
/// dropping packets, a host that is gone), where a client's own connect can
/// wait for minutes.
pub async fn reach<T, E: Display>(service: &str, url: &str, connect: impl Future<Output = Result<T, E>>) -> Option<T> {
    let wait = if required() { REQUIRED_WAIT } else { SKIP_AFTER };
    match tokio::time::timeout(wait, connect).await {
        Ok(Ok(connected)) => Some(connected),
        Ok(Err(e)) => {
            unavailable(service, url, &e);
            None
        }
        Err(_) => {
            unavailable(service, url, &format_args!("no answer within {wait:?}"));
            None
        }
    }
}

/// A pool of 20 connections to `url`, or `None` (skip).
async fn sql_pool<DB: sqlx::Database>(service: &str, url: &str) -> Option<sqlx::Pool<DB>> {
    use sqlx::Connection;
    // One plain connection first, within the deadline: the pool's own
    // connect retries a refused connection until its acquire timeout (30 s,
    // which the 100-task tests need), and waits as long as the operating
    // system does for an address that never answers. Closed at once; once
    // the server has answered, the pool connects on its usual terms.
    reach(service, url, async { DB::Connection::connect(url).await?.close().await }).await?;
    match sqlx::pool::PoolOptions::<DB>::new().max_connections(20).connect(url).await {
        Ok(pool) => Some(pool),
        Err(e) => {
            unavailable(service, url, &e);
            None
        }
    }
}

pub async fn postgres() -> Option<PgPool> {
    let url = std::env::var("IDEM_PG_URL").unwrap_or_else(|_| DEFAULT_PG_URL.to_owned());
    let pool = sql_pool::<sqlx::Postgres>("PostgreSQL", &url).await?;
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
    let pool = sql_pool::<sqlx::MySql>("MySQL/MariaDB", &url).await?;
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

/// A PostgreSQL table's storage options (`pg_class.reloptions`, e.g.
/// `fillfactor=90`), the table named as SQL names it (`search_path` applies).
pub async fn pg_table_options(pool: &PgPool, table: &str) -> Vec<String> {
    sqlx::query_scalar::<_, Option<Vec<String>>>("SELECT reloptions FROM pg_class WHERE oid = $1::text::regclass")
        .bind(table)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("the options of {table}: {e}"))
        .unwrap_or_default()
}

/// A fresh SQLite file (an in-memory database would be one database per
/// pooled connection).
pub async fn sqlite() -> Option<SqlitePool> {
    let dir = std::env::temp_dir().join("idem-tests");
    std::fs::create_dir_all(&dir).unwrap();
    Some(sqlite_at(&dir.join(format!("{}.db", unique("t")))).await)
}

/// The SQLite file at `path`, created and migrated if new: for a test whose
/// worker processes share one database.
pub async fn sqlite_at(path: &std::path::Path) -> SqlitePool {
    let opts = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
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
    pool
}

/// The transaction types the SQL suites are stamped with, one module each
/// (the module names the tests carry: `postgres::idem_tx::...`). Each
/// holds `Tx<'c, DB>`: the lifetime is `idem::Tx`'s to ignore.
pub mod sqlx_tx {
    pub type Tx<'c, DB> = sqlx::Transaction<'c, DB>;
}
pub mod idem_tx {
    pub type Tx<'c, DB> = idem::Tx<DB>;
}

/// What the SQL suites do with either transaction type outside guarded
/// bodies: begin one, and reach its connection.
// Its futures need not be `Send` (the tests await them in place), which is
// what the lint asks a public trait to decide.
#[allow(async_fn_in_trait)]
pub trait TestTx<DB: idem::sql::SqlBackend>: Sized {
    /// `pool.begin()` / `idem::begin(&pool)`.
    async fn begin(pool: &sqlx::Pool<DB>) -> Self;
    /// The connection, for statements outside guarded bodies: `&mut **tx`,
    /// or `tx.open()` on an `idem::Tx` (it begins the transaction if nothing
    /// has begun yet).
    async fn conn(&mut self) -> &mut DB::Connection;
}

impl<DB: idem::sql::SqlBackend> TestTx<DB> for sqlx::Transaction<'_, DB> {
    async fn begin(pool: &sqlx::Pool<DB>) -> Self {
        pool.begin().await.unwrap()
    }
    async fn conn(&mut self) -> &mut DB::Connection {
        &mut **self
    }
}

impl<DB: idem::sql::SqlBackend> TestTx<DB> for idem::Tx<DB> {
    async fn begin(pool: &sqlx::Pool<DB>) -> Self {
        idem::begin(pool).await.unwrap()
    }
    async fn conn(&mut self) -> &mut DB::Connection {
        self.open().await.unwrap()
    }
}

pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379/";

/// A connection manager on `IDEM_REDIS_URL` (default: the local server).
pub async fn redis() -> Option<redis::aio::ConnectionManager> {
    let url = std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| DEFAULT_REDIS_URL.to_owned());
    let connected = async {
        let client = redis::Client::open(url.as_str())?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(1);
        redis::aio::ConnectionManager::new_with_config(client, config).await
    };
    reach("Redis", &url, connected).await
}

pub const DEFAULT_REDIS_CLUSTER_URLS: &str = "redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002";

/// The seed nodes of the Redis Cluster: `IDEM_REDIS_CLUSTER_URLS`, comma
/// separated (default: the local cluster of `.ci/redis-cluster`).
pub fn redis_cluster_urls() -> Vec<String> {
    let urls = std::env::var("IDEM_REDIS_CLUSTER_URLS").unwrap_or_else(|_| DEFAULT_REDIS_CLUSTER_URLS.to_owned());
    urls.split(',').map(str::trim).filter(|u| !u.is_empty()).map(str::to_owned).collect()
}

/// A cluster client on `urls`, its waits bounded: 2 s to connect to a
/// node, and each request (with its retries and redirections) 5 s at most.
pub fn redis_cluster_client(urls: &[String]) -> redis::RedisResult<redis::cluster::ClusterClient> {
    redis::cluster::ClusterClient::builder(urls.iter().map(String::as_str))
        .connection_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(5))
        .build()
}

/// A connection to the Redis Cluster at `IDEM_REDIS_CLUSTER_URLS`, or
/// `None` (skip; a failure with `IDEM_REQUIRE_SERVICES=1`). A cluster that
/// answers but is not serving every slot counts as unreachable.
pub async fn redis_cluster() -> Option<redis::cluster_async::ClusterConnection> {
    let urls = redis_cluster_urls();
    let connected = async {
        let mut conn = redis_cluster_client(&urls)?.get_async_connection().await?;
        let info: String = redis::cmd("CLUSTER").arg("INFO").query_async(&mut conn).await?;
        if !info.contains("cluster_state:ok") {
            return Err(redis::RedisError::from((redis::ErrorKind::Client, "cluster_state is not ok")));
        }
        Ok::<_, redis::RedisError>(conn)
    };
    reach("Redis Cluster", &urls.join(","), connected).await
}

/// A real Redis client pointed at a port where no server listens: a store
/// that is down. `None` when Redis tests are skipped altogether.
pub async fn unreachable_redis() -> Option<idem::store::RedisStore> {
    redis().await?;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(300)))
        .set_number_of_retries(0);
    let conn = redis::aio::ConnectionManager::new_lazy_with_config(client, config).unwrap();
    Some(idem::store::RedisStore::new(conn, "idem-test:"))
}

/// A real Redis client on a server that accepts connections and never
/// answers (stuck, or behind a network black hole), with the client's
/// default timeouts. `None` when Redis tests are skipped altogether.
pub async fn silent_redis() -> Option<idem::store::RedisStore> {
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
    Some(idem::store::RedisStore::new(conn, "idem-test:"))
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

/// Delete every key matching `pattern` with `SCAN` (never `KEYS`, which
/// blocks a shared server on a big keyspace) and `UNLINK`, page by page;
/// the number deleted. Standalone Redis only (a cluster's `SCAN` covers one
/// node).
pub async fn scan_unlink<C: redis::aio::ConnectionLike + Send + Sync>(conn: &mut C, pattern: &str) -> usize {
    use redis::AsyncCommands as _;
    let mut keys = Vec::new();
    let mut scan = conn.scan_match::<_, String>(pattern).await.unwrap();
    while let Some(key) = scan.next_item().await {
        keys.push(key.unwrap());
    }
    drop(scan);
    let mut deleted = 0;
    for page in keys.chunks(1000) {
        deleted += conn.unlink::<_, usize>(page).await.unwrap();
    }
    deleted
}

pub const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";

/// `IDEM_AMQP_URL` (default: the local RabbitMQ) once its server accepts a
/// connection, or `None` (skip; a failure with `IDEM_REQUIRE_SERVICES=1`).
pub async fn amqp() -> Option<String> {
    let url = std::env::var("IDEM_AMQP_URL").unwrap_or_else(|_| DEFAULT_AMQP_URL.to_owned());
    reach("RabbitMQ", &url, tokio::net::TcpStream::connect(proxy::host_port(&url))).await?;
    Some(url)
}

/// `IDEM_NATS_URL` (default: the local NATS server, JetStream on) once its
/// server accepts a connection, or `None` (skip; a failure with
/// `IDEM_REQUIRE_SERVICES=1`).
pub async fn nats() -> Option<String> {
    let url = std::env::var("IDEM_NATS_URL").unwrap_or_else(|_| DEFAULT_NATS_URL.to_owned());
    reach("NATS", &url, tokio::net::TcpStream::connect(proxy::host_port(&url))).await?;
    Some(url)
}
