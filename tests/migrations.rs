//! idem's versioned migrations (`idem::sql::migrator`) on each database, for
//! the default record table: a database migrated by a release before 0003
//! (0001 and 0002 recorded) takes 0003 and records it, and on PostgreSQL
//! the record table is then at `fillfactor = 90`, as `idem::migrate` leaves
//! it. Each test works in a schema or database of its own. (A table named
//! otherwise: `record_table.rs`, `record_table_schema.rs`.)

use idem_test_support as common;

use common::{pg_table_options, unique};

/// The migrator of a release before 0003: idem's first two migrations, with
/// the same history table.
fn before_0003<DB: idem::sql::SqlBackend>() -> sqlx::migrate::Migrator {
    let old = idem::sql::migrator::<DB>().iter().take(2).cloned().collect();
    let mut migrator = sqlx::migrate::Migrator::with_migrations(old);
    migrator.dangerous_set_table_name("_idem_migrations");
    migrator
}

/// A name for a schema or database of the test's own.
fn fresh(prefix: &str) -> String {
    unique(prefix).replace('-', "_")
}

/// The versions the migrator's history holds.
const VERSIONS: &str = "SELECT version FROM _idem_migrations ORDER BY version";

#[tokio::test]
async fn postgres_record_table_is_at_fillfactor_90_after_an_upgrade() {
    let Some(pool) = common::postgres().await else { return };
    // As idem::migrate leaves the shared test database.
    assert!(pg_table_options(&pool, "idem_records").await.contains(&"fillfactor=90".to_owned()));

    let schema = fresh("idem_migrations");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}"))).execute(&pool).await.unwrap();
    let opts = pool.connect_options().as_ref().clone().options([("search_path", schema.as_str())]);
    let own = sqlx::postgres::PgPoolOptions::new().max_connections(2).connect_with(opts).await.unwrap();
    before_0003::<sqlx::Postgres>().run(&own).await.unwrap();
    assert_eq!(sqlx::query_scalar::<_, i64>(VERSIONS).fetch_all(&own).await.unwrap(), [1, 2]);
    assert_eq!(pg_table_options(&own, "idem_records").await, Vec::<String>::new(), "before 0003");
    idem::sql::migrator::<sqlx::Postgres>().run(&own).await.unwrap();
    assert_eq!(sqlx::query_scalar::<_, i64>(VERSIONS).fetch_all(&own).await.unwrap(), [1, 2, 3, 4]);
    assert_eq!(pg_table_options(&own, "idem_records").await, ["fillfactor=90"]);
    // idem::migrate sets it on a table made before 0003 too.
    sqlx::raw_sql("ALTER TABLE idem_records RESET (fillfactor)").execute(&own).await.unwrap();
    idem::migrate(&own).await.unwrap();
    assert_eq!(pg_table_options(&own, "idem_records").await, ["fillfactor=90"]);
    own.close().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE"))).execute(&pool).await.unwrap();
}

#[tokio::test]
async fn mysql_takes_0003_as_a_no_op() {
    let Some(pool) = common::mysql().await else { return };
    let database = fresh("idem_migrations");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}"))).execute(&pool).await.unwrap();
    let opts = pool.connect_options().as_ref().clone().database(&database);
    let own = sqlx::mysql::MySqlPoolOptions::new().max_connections(2).connect_with(opts).await.unwrap();
    before_0003::<sqlx::MySql>().run(&own).await.unwrap();
    idem::sql::migrator::<sqlx::MySql>().run(&own).await.unwrap();
    assert_eq!(sqlx::query_scalar::<_, i64>(VERSIONS).fetch_all(&own).await.unwrap(), [1, 2, 3, 4]);
    idem::migrate(&own).await.unwrap();
    own.close().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE {database}"))).execute(&pool).await.unwrap();
}

#[tokio::test]
async fn sqlite_takes_0003_as_a_no_op() {
    let path = std::env::temp_dir().join(format!("{}.db", unique("migrations")));
    let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(&path).create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(opts).await.unwrap();
    before_0003::<sqlx::Sqlite>().run(&pool).await.unwrap();
    idem::sql::migrator::<sqlx::Sqlite>().run(&pool).await.unwrap();
    assert_eq!(sqlx::query_scalar::<_, i64>(VERSIONS).fetch_all(&pool).await.unwrap(), [1, 2, 3, 4]);
    idem::migrate(&pool).await.unwrap();
    pool.close().await;
    let _ = std::fs::remove_file(&path);
}
