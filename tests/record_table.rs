//! Records in a table the application names (`StoresBuilder::record_table`,
//! installed): guards, lease records, migrations, `migrator()` and purging
//! all use it, and `idem_records` is never touched. The table is fixed per
//! process, so this binary runs with `idem_custom_records` only.

use idem_test_support as common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::{AppError, unique};
use idem::{Key, idempotent};
use sqlx::Transaction;

const TABLE: &str = "idem_custom_records";

/// This binary's stores: none of their own, the record table named. Every
/// test installs them before its first SQL step.
fn named() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let table = idem::sql::RecordTable::new(TABLE).unwrap();
        idem::Stores::builder().record_table(table).install().expect("installed before any SQL step");
    });
}

#[idempotent(key = "id", scope = "tests.table.dedup")]
async fn grant<DB: idem::sql::SqlBackend>(
    tx: &mut Transaction<'_, DB>,
    id: &str,
    runs: &AtomicUsize,
) -> Result<u32, AppError> {
    let _ = tx;
    Ok(runs.fetch_add(1, SeqCst) as u32 + 1)
}

macro_rules! backend {
    ($name:ident, $pool:expr, $count:literal) => {
        #[tokio::test]
        async fn $name() {
            named();
            let Some(pool) = $pool else { return };
            let (id, runs) = (unique("t"), AtomicUsize::new(0));
            for _ in 0..3 {
                let mut tx = pool.begin().await.unwrap();
                assert_eq!(grant(&mut tx, &id, &runs).await.unwrap(), 1);
                tx.commit().await.unwrap();
            }
            assert_eq!(runs.load(SeqCst), 1);
            let scoped = |table: &str| format!("SELECT COUNT(*) FROM {table} WHERE idem_key = {}", $count);
            let in_custom: i64 =
                sqlx::query_scalar(sqlx::AssertSqlSafe(scoped(TABLE))).bind(&id).fetch_one(&pool).await.unwrap();
            assert_eq!(in_custom, 1, "the record is in {TABLE}");
            // `idem_records` may exist (other test binaries): it holds no trace of this key.
            if let Ok(in_default) = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(scoped("idem_records")))
                .bind(&id)
                .fetch_one(&pool)
                .await
            {
                assert_eq!(in_default, 0);
            }
            let found = idem::sql::find_record(&pool, "tests.table.dedup", &Key::new(&id).unwrap()).await.unwrap();
            assert!(found.is_some());
            // Lease records go to the same table.
            let store = idem::store::SqlStore::new(pool.clone());
            let key = unique("lease");
            for _ in 0..2 {
                match idem::Guard::new("tests.table.lease").key(&key).lease::<u8>(&store, Duration::from_secs(5)).await
                {
                    Ok(idem::Claim::Run(ticket)) => {
                        ticket.run(async { Ok::<u8, idem::Error>(4) }).await.unwrap();
                    }
                    Ok(idem::Claim::Replay(v)) => assert_eq!(v, 4),
                    Err(e) => panic!("{e}"),
                }
            }
            let leases: i64 =
                sqlx::query_scalar(sqlx::AssertSqlSafe(scoped(TABLE))).bind(&key).fetch_one(&pool).await.unwrap();
            assert_eq!(leases, 1);
            // A purge of this scope runs on the table (nothing expired yet).
            let options = idem::sql::PurgeOptions { scope: Some("tests.table.dedup".into()), ..Default::default() };
            assert_eq!(idem::sql::purge_expired(&pool, options).await.unwrap().deleted, 0);
        }
    };
}

backend!(sqlite, common::sqlite().await, "?1");
backend!(postgres, common::postgres().await, "$1");
backend!(mysql, common::mysql().await, "?");

#[test]
fn the_table_is_the_installed_stores_and_stays() {
    named();
    assert_eq!(idem::Stores::installed().unwrap().record_table().qualified(), TABLE);
    let other = idem::sql::RecordTable::new("other_records").unwrap();
    let e = idem::Stores::builder().record_table(other).install().unwrap_err();
    assert!(matches!(e, idem::Error::StoresAlreadyInstalled), "{e}");
    let e = idem::sql::RecordTable::new("records; DROP TABLE x").unwrap_err();
    assert!(e.to_string().contains("ASCII letters"), "{e}");
}

#[tokio::test]
async fn postgres_named_table_is_at_fillfactor_90() {
    named();
    let Some(pool) = common::postgres().await else { return };
    assert!(common::pg_table_options(&pool, TABLE).await.contains(&"fillfactor=90".to_owned()));
}

#[tokio::test]
async fn migrator_creates_the_named_table_and_keeps_its_own_history() {
    named();
    let path = std::env::temp_dir().join(format!("{}.db", unique("migrator")));
    let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(&path).create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(opts).await.unwrap();
    let migrator = idem::sql::migrator::<sqlx::Sqlite>();
    migrator.run(&pool).await.unwrap();
    migrator.run(&pool).await.unwrap(); // applied: nothing to do
    let tables: Vec<String> = sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        tables,
        [
            "idem_custom_records",
            "idem_custom_records_archive",
            "idem_custom_records_migrations",
            "idem_custom_records_outbox",
            "sqlite_sequence"
        ]
    );
    let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM idem_custom_records_migrations ORDER BY version")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(versions, [1, 2, 3, 4]);
    let _ = std::fs::remove_file(&path);
    // A database set up by idem::migrate before takes the migrator's
    // migrations (all IF NOT EXISTS) without a complaint.
    let path = std::env::temp_dir().join(format!("{}.db", unique("migrated")));
    let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(&path).create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(opts).await.unwrap();
    idem::migrate(&pool).await.unwrap();
    migrator.run(&pool).await.unwrap();
    let _ = std::fs::remove_file(&path);
}

/// An order whose status `dedup+state` moves (its table made by the test).
#[derive(idem::StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state(table = "idem_table_test_orders", key_column = "order_no", status_column = "status")]
enum Order {
    #[state(code = 1, to(Paid))]
    WaitPay,
    #[state(code = 2)]
    Paid,
}

#[idempotent(
    key = "order_no",
    strategy = "dedup+state",
    transition = "Order::WaitPay -> Order::Paid",
    scope = "tests.table.state"
)]
async fn pay(tx: &mut Transaction<'_, sqlx::Postgres>, order_no: &str, runs: &AtomicUsize) -> Result<(), AppError> {
    let _ = tx;
    runs.fetch_add(1, SeqCst);
    Ok(())
}

#[tokio::test]
async fn dedup_and_state_on_postgres() {
    // PostgreSQL claims and moves in one statement: its claim is rewritten too.
    named();
    let Some(pool) = common::postgres().await else { return };
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS idem_table_test_orders (order_no TEXT PRIMARY KEY, status SMALLINT NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let (order, runs) = (unique("o"), AtomicUsize::new(0));
    sqlx::query("INSERT INTO idem_table_test_orders VALUES ($1, 1)").bind(&order).execute(&pool).await.unwrap();
    for _ in 0..3 {
        let mut tx = pool.begin().await.unwrap();
        pay(&mut tx, &order, &runs).await.unwrap();
        tx.commit().await.unwrap();
    }
    assert_eq!(runs.load(SeqCst), 1);
    let in_custom: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_custom_records WHERE idem_key = $1")
        .bind(&order)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(in_custom, 1);
    // Counted on the named table: this scope's records are there only.
    let options = idem::sql::PurgeOptions {
        scope: Some("tests.table.state".into()),
        older_than: Some(Duration::from_millis(1)),
        ..Default::default()
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(idem::admin::purge_preview(&pool, &options).await.unwrap().deleted >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_run_once_on_the_named_table() {
    named();
    let Some(pool) = common::postgres().await else { return };
    let (id, runs) = (unique("c"), std::sync::Arc::new(AtomicUsize::new(0)));
    let calls = (0..32).map(|_| {
        let (pool, id, runs) = (pool.clone(), id.clone(), runs.clone());
        tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            let answer = grant(&mut tx, &id, &runs).await.unwrap();
            tx.commit().await.unwrap();
            answer
        })
    });
    for call in calls.collect::<Vec<_>>() {
        assert_eq!(call.await.unwrap(), 1, "every duplicate gets the first answer");
    }
    assert_eq!(runs.load(SeqCst), 1);
}
