//! A record table installed after this process used `idem_records` is
//! refused: its guards would write to two tables, and a repeat seen by one
//! would run again on the other. Its own binary: it uses the default
//! table first.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use idem_test_support as common;

use common::{AppError, unique};
use idem::idempotent;

#[idempotent(key = "id", scope = "tests.table.late")]
async fn grant(tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>, id: &str, runs: &AtomicUsize) -> Result<u32, AppError> {
    let _ = tx;
    Ok(runs.fetch_add(1, SeqCst) as u32 + 1)
}

#[tokio::test]
async fn a_table_named_after_idem_records_was_used_is_refused() {
    let pool = common::sqlite().await.expect("SQLite needs no server");
    let (id, runs) = (unique("late"), AtomicUsize::new(0));
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(grant(&mut tx, &id, &runs).await.unwrap(), 1);
    tx.commit().await.unwrap();

    let late = idem::sql::RecordTable::new("idem_late_records").unwrap();
    let e = idem::Stores::builder().record_table(late).install().unwrap_err();
    assert!(matches!(e, idem::Error::InvalidTable { .. }), "{e}");
    assert!(e.to_string().contains("already keeps its records in `idem_records`"), "{e}");

    // Stores on the table in use still install, and the record is still found.
    idem::Stores::builder().all(idem::store::MemoryStore::new()).install().unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(grant(&mut tx, &id, &runs).await.unwrap(), 1, "the repeat replays");
    tx.commit().await.unwrap();
    assert_eq!(runs.load(SeqCst), 1);
}
