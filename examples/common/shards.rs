//! The two PostgreSQL shards of `examples/sharded_orders.rs` (also used by
//! `tests/shards.rs`): their databases and the route of an order to one.

use std::time::Duration;

use sqlx::PgConnection;

/// The shard databases, on the server the URL names.
pub const SHARDS: [&str; 2] = ["idem_shard_0", "idem_shard_1"];

/// The route: a stable hash (64-bit FNV-1a) of the order id, the same in
/// every process and every release. Changing it (or the number of shards)
/// moves orders, and their records must move with them.
pub fn shard_of(order_id: &str) -> usize {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in order_id.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % SHARDS.len() as u64) as usize
}

/// Create database `name` unless it exists; another process (or test)
/// creating it at the same moment is fine.
pub async fn ensure_database(conn: &mut PgConnection, name: &str) -> Result<(), sqlx::Error> {
    let mut attempts = 0;
    loop {
        let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(name)
            .fetch_one(&mut *conn)
            .await?;
        if exists {
            return Ok(());
        }
        // `name` is one of the constants above: nothing user-supplied reaches this SQL.
        match sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\""))).execute(&mut *conn).await {
            Ok(_) => return Ok(()),
            // 42P04 duplicate_database, or 23505 on pg_database's unique
            // index when the other creation had not committed yet.
            Err(sqlx::Error::Database(e)) if matches!(e.code().as_deref(), Some("42P04" | "23505")) => return Ok(()),
            // 55006: the template database is in use by another session
            // for a moment; try again.
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55006") && attempts < 50 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    }
}
