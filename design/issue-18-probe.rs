//! Feasibility probe for idem issue 18 (zero extra round trips).
//!
//! A TCP proxy in front of PostgreSQL (15432 -> 5432) and MariaDB (13306 ->
//! 3306) counts round trips: one per burst of client bytes that follows
//! server bytes. Every section prints what it counted.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Database, MySql, Postgres, Row, SqlSafeStr};
use sqlx_core::transaction::TransactionManager;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type PgTm = <Postgres as Database>::TransactionManager;
type MyTm = <MySql as Database>::TransactionManager;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

// ---------------------------------------------------------------- proxy

async fn proxy(listen: u16, upstream: u16, rts: Arc<AtomicU64>) {
    let l = TcpListener::bind(("127.0.0.1", listen)).await.expect("bind");
    loop {
        let (client, _) = l.accept().await.unwrap();
        let server = TcpStream::connect(("127.0.0.1", upstream)).await.unwrap();
        client.set_nodelay(true).unwrap();
        server.set_nodelay(true).unwrap();
        let rts = rts.clone();
        // 0 = nothing yet, 1 = client spoke last, 2 = server spoke last
        let last = Arc::new(AtomicU8::new(0));
        let (mut cr, mut cw) = client.into_split();
        let (mut sr, mut sw) = server.into_split();
        let l1 = last.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = match cr.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if l1.swap(1, SeqCst) != 1 {
                    rts.fetch_add(1, SeqCst);
                }
                if sw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            let _ = sw.shutdown().await;
        });
        tokio::spawn(async move {
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = match sr.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                last.store(2, SeqCst);
                if cw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            let _ = cw.shutdown().await;
        });
    }
}

async fn counted<F: Future>(rts: &AtomicU64, label: &str, f: F) -> F::Output {
    let before = rts.load(SeqCst);
    let out = f.await;
    println!("    [{label}] round trips: {}", rts.load(SeqCst) - before);
    out
}

// ---------------------------------------------------------------- text encoding

fn hex(s: &str) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(s.len() * 2);
    for b in s.bytes() {
        out.push(D[(b >> 4) as usize] as char);
        out.push(D[(b & 15) as usize] as char);
    }
    out
}

/// PostgreSQL: a text value decoded on the server; only [0-9a-f] comes from the value.
fn pg_text(s: &str) -> String {
    format!("convert_from(decode('{}','hex'),'UTF8')", hex(s))
}
/// The same, compared with an indexed key column: without the COLLATE the
/// planner cannot use the primary key for `col = convert_from(...)` (seq scan).
fn pg_key(s: &str) -> String {
    format!("convert_from(decode('{}','hex'),'UTF8') COLLATE \"default\"", hex(s))
}
/// MySQL: VARBINARY scope/key columns take the bytes as they are.
fn my_bin(s: &str) -> String {
    format!("UNHEX('{}')", hex(s))
}
/// MySQL: a utf8mb4 text value (the MEDIUMTEXT response).
fn my_text(s: &str) -> String {
    format!("CONVERT(UNHEX('{}') USING utf8mb4)", hex(s))
}

fn pg_claim(scope: &str, key: &str) -> String {
    format!(
        "INSERT INTO zrt_records (scope, idem_key, status, fingerprint, created_at, updated_at, expires_at) \
         VALUES ({}, {}, 'PROCESSING', NULL, now(), now(), clock_timestamp() + 3600000000 * interval '1 microsecond')",
        pg_text(scope),
        pg_text(key)
    )
}
fn pg_complete(scope: &str, key: &str, response: &str) -> String {
    format!(
        "UPDATE zrt_records SET status = 'DONE', response = {} WHERE scope = {} AND idem_key = {}",
        pg_text(response),
        pg_key(scope),
        pg_key(key)
    )
}
fn pg_read(scope: &str, key: &str) -> String {
    format!(
        "SELECT status, fingerprint, response, (expires_at <= now())::int::int8 AS expired FROM zrt_records \
         WHERE scope = {} AND idem_key = {}",
        pg_key(scope),
        pg_key(key)
    )
}
fn my_claim(scope: &str, key: &str) -> String {
    format!(
        "INSERT INTO zrt_records (scope, idem_key, status, fingerprint, created_at, updated_at, expires_at) \
         VALUES ({}, {}, 'PROCESSING', NULL, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), \
         UTC_TIMESTAMP(6) + INTERVAL 3600000000 MICROSECOND)",
        my_bin(scope),
        my_bin(key)
    )
}
fn my_complete(scope: &str, key: &str, response: &str) -> String {
    format!(
        "UPDATE zrt_records SET status = 'DONE', response = {}, updated_at = UTC_TIMESTAMP(6) \
         WHERE scope = {} AND idem_key = {}",
        my_text(response),
        my_bin(scope),
        my_bin(key)
    )
}
fn my_read(scope: &str, key: &str) -> String {
    format!(
        "SELECT status, fingerprint, response, CAST(expires_at <= UTC_TIMESTAMP(6) AS SIGNED) FROM zrt_records \
         WHERE scope = {} AND idem_key = {}",
        my_bin(scope),
        my_bin(key)
    )
}

fn sql(s: String) -> sqlx::SqlStr {
    AssertSqlSafe(s).into_sql_str()
}

fn code(e: &sqlx::Error) -> String {
    match e.as_database_error() {
        Some(d) => format!("{} ({})", d.code().unwrap_or_default(), d.message()),
        None => e.to_string(),
    }
}

const HOSTILE_SCOPE: &str = "tests.it's \\ $$ $q$ E'\\'' ; COMMIT; DROP TABLE zrt_coupons; --";
const HOSTILE_KEY: &str = "k'\\\"$$\\0--;/*\u{202e}\u{1F642}*/'';";

fn hostile_answer() -> String {
    // JSON as serde_json would write it (a NUL inside a string is `\u0000`), plus raw specials.
    "{\"a\":\"'); COMMIT; DROP TABLE zrt_records; --\",\"b\":\"\\\\ $$ $x$ \\u0000 \\\" ''\",\"c\":\"\u{1F642}\"}"
        .to_owned()
}

// ---------------------------------------------------------------- PostgreSQL

async fn pg_connect(port: u16, app: &str) -> Result<PgConnection, sqlx::Error> {
    let opts = PgConnectOptions::new()
        .host("127.0.0.1")
        .port(port)
        .username("postgres")
        .database("test")
        .application_name(app)
        .options([("log_statement", "all")]);
    PgConnection::connect_with(&opts).await
}

async fn pg_in_tx(conn: &mut PgConnection) -> String {
    // One statement alone: SAVEPOINT fails outside a transaction block (25P01)
    // and in an aborted one (25P02); inside a live one, release it at once.
    match sqlx::raw_sql("SAVEPOINT zrt_probe_check").execute(&mut *conn).await {
        Ok(_) => {
            sqlx::raw_sql("RELEASE SAVEPOINT zrt_probe_check").execute(&mut *conn).await.unwrap();
            "yes (open block)".into()
        }
        Err(e) => format!("no: {}", code(&e)),
    }
}

async fn pg_probe(rts: Arc<AtomicU64>) -> Result<(), BoxError> {
    println!("=== PostgreSQL ===");
    let mut admin = pg_connect(5432, "zrt-admin").await?;
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS zrt_records, zrt_coupons, zrt_users, zrt_deferred; \
         CREATE TABLE zrt_records (LIKE idem_records INCLUDING ALL); \
         CREATE TABLE zrt_coupons (id bigserial PRIMARY KEY, trade_no text NOT NULL UNIQUE); \
         CREATE TABLE zrt_users (id int8 PRIMARY KEY, n int8 NOT NULL DEFAULT 0); \
         INSERT INTO zrt_users (id) SELECT g FROM generate_series(0, 999) g; \
         CREATE TABLE zrt_deferred (k text, CONSTRAINT zrt_deferred_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)",
    )
    .execute(&mut admin)
    .await?;

    let mut conn = pg_connect(15432, "zrt-probe").await?;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut conn).await?;
    println!("  probe backend pid {pid} (log lines '[{pid}]')");
    let insert = "INSERT INTO zrt_coupons (trade_no) VALUES ($1)";
    // warm the statement cache: a cached prepared statement is one round trip
    sqlx::query(insert).bind("warm").execute(&mut conn).await?;
    sqlx::query("INSERT INTO zrt_records (scope, idem_key, status, created_at, updated_at, expires_at) VALUES ($1, $2, 'PROCESSING', now(), now(), clock_timestamp() + $3::interval) ON CONFLICT (scope, idem_key) DO NOTHING")
        .bind("warm").bind("warm").bind(Duration::from_secs(3600)).execute(&mut conn).await?;
    sqlx::query("UPDATE zrt_records SET status = 'DONE', response = $3 WHERE scope = $1 AND idem_key = $2")
        .bind("warm").bind("warm").bind("1").execute(&mut conn).await?;

    println!("-- P1 plain sqlx transaction: begin, body insert, commit");
    let t = counted(&rts, "P1 total", async {
        let mut tx = conn.begin().await?;
        sqlx::query(insert).bind("p1").execute(&mut *tx).await?;
        tx.commit().await
    })
    .await;
    t?;

    println!("-- P2 today's guard (claim ON CONFLICT DO NOTHING, body, UPDATE response, commit)");
    counted(&rts, "P2 total", async {
        let mut tx = conn.begin().await?;
        sqlx::query("INSERT INTO zrt_records (scope, idem_key, status, created_at, updated_at, expires_at) VALUES ($1, $2, 'PROCESSING', now(), now(), clock_timestamp() + $3::interval) ON CONFLICT (scope, idem_key) DO NOTHING")
            .bind("s").bind("p2").bind(Duration::from_secs(3600)).execute(&mut *tx).await?;
        sqlx::query(insert).bind("p2").execute(&mut *tx).await?;
        sqlx::query("UPDATE zrt_records SET status = 'DONE', response = $3 WHERE scope = $1 AND idem_key = $2")
            .bind("s").bind("p2").bind("42").execute(&mut *tx).await?;
        tx.commit().await
    })
    .await?;

    println!("-- P3 zero-RT first call: TransactionManager::begin(Some(\"BEGIN; <claim>\")), body, raw \"<complete>; COMMIT; BEGIN\" + start_rollback");
    let before = rts.load(SeqCst);
    counted(&rts, "P3 BEGIN+claim", PgTm::begin(&mut conn, Some(sql(format!("BEGIN; {}", pg_claim("s", "k3")))))).await?;
    println!("    depth after begin: {}", PgTm::get_transaction_depth(&conn));
    counted(&rts, "P3 body", sqlx::query(insert).bind("p3").execute(&mut conn)).await?;
    let done = counted(
        &rts,
        "P3 complete+COMMIT",
        sqlx::raw_sql(sql(format!("{}; COMMIT; BEGIN", pg_complete("s", "k3", "42")))).execute(&mut conn),
    )
    .await?;
    PgTm::start_rollback(&mut conn);
    println!(
        "    rows_affected of the text: {}, depth after start_rollback: {}, P3 total round trips: {}",
        done.rows_affected(),
        PgTm::get_transaction_depth(&conn),
        rts.load(SeqCst) - before
    );
    counted(&rts, "P3 ping after (what a pool's release does; carries the queued ROLLBACK)", conn.ping()).await?;
    let row = sqlx::query("SELECT status, response FROM zrt_records WHERE scope = 's' AND idem_key = 'k3'")
        .fetch_one(&mut admin)
        .await?;
    println!("    committed record: status={} response={}", row.get::<String, _>(0), row.get::<String, _>(1));
    println!("    in a transaction now? {}", pg_in_tx(&mut conn).await);

    println!("-- P4 replay: the same key again (the claim's unique violation aborts the rest of the text)");
    let before = rts.load(SeqCst);
    let r = counted(
        &rts,
        "P4 BEGIN+claim (dup) + marker",
        PgTm::begin(
            &mut conn,
            Some(sql(format!(
                "BEGIN; {}; INSERT INTO zrt_coupons (trade_no) VALUES ('p4-marker-after-dup')",
                pg_claim("s", "k3")
            ))),
        ),
    )
    .await;
    println!("    begin result: {:?}", r.as_ref().map_err(code));
    println!("    depth after failed begin: {}", PgTm::get_transaction_depth(&conn));
    let row = counted(
        &rts,
        "P4 ROLLBACK + read",
        sqlx::raw_sql(sql(format!("ROLLBACK; {}", pg_read("s", "k3")))).fetch_optional(&mut conn),
    )
    .await?;
    let row = row.expect("record");
    println!(
        "    read: status={} response={:?} expired={}; P4 total round trips: {}",
        row.get::<String, _>(0),
        row.get::<Option<String>, _>(2),
        row.get::<i64, _>(3),
        rts.load(SeqCst) - before
    );
    let marker: i64 = sqlx::query_scalar("SELECT count(*) FROM zrt_coupons WHERE trade_no = 'p4-marker-after-dup'")
        .fetch_one(&mut admin)
        .await?;
    println!("    statements after the failed claim that ran: {marker}; in a transaction now? {}", pg_in_tx(&mut conn).await);

    println!("-- P4b hazard: the same failed begin WITHOUT our ROLLBACK (sqlx depth 0, server block aborted)");
    let r = PgTm::begin(&mut conn, Some(sql(format!("BEGIN; {}", pg_claim("s", "k3"))))).await;
    println!("    begin result: {:?}, depth {}", r.as_ref().map_err(code), PgTm::get_transaction_depth(&conn));
    let r = sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(&mut conn).await;
    println!("    next ordinary query: {:?}", r.as_ref().map_err(code));
    sqlx::raw_sql("ROLLBACK").execute(&mut conn).await?;

    println!("-- P4c hazard: a raw BEGIN confuses sqlx's depth (then Connection::begin sends BEGIN, not SAVEPOINT)");
    sqlx::raw_sql("BEGIN").execute(&mut conn).await?;
    println!("    depth after raw BEGIN: {}", PgTm::get_transaction_depth(&conn));
    {
        let mut nested = conn.begin().await?; // "BEGIN" again: WARNING there is already a transaction in progress
        sqlx::query(insert).bind("p4c-inner").execute(&mut *nested).await?;
        nested.commit().await?; // commits the OUTER transaction
    }
    println!("    in a transaction after the 'nested' commit? {}", pg_in_tx(&mut conn).await);

    println!("-- P5 savepoints inside a zero-RT transaction");
    PgTm::begin(&mut conn, Some(sql(format!("BEGIN; {}", pg_claim("s", "k5"))))).await?;
    {
        let mut sp = conn.begin().await?;
        println!("    depth inside nested: {}", PgTm::get_transaction_depth(&sp));
        sqlx::query(insert).bind("p5-rolled-back").execute(&mut *sp).await?;
        sp.rollback().await?;
    }
    sqlx::query(insert).bind("p5-kept").execute(&mut conn).await?;
    sqlx::raw_sql(sql(format!("{}; COMMIT; BEGIN", pg_complete("s", "k5", "5")))).execute(&mut conn).await?;
    PgTm::start_rollback(&mut conn);
    let n: (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE trade_no = 'p5-rolled-back'), count(*) FILTER (WHERE trade_no = 'p5-kept') FROM zrt_coupons",
    )
    .fetch_one(&mut admin)
    .await?;
    println!("    rolled-back savepoint rows: {}, kept rows: {}, depth {}", n.0, n.1, PgTm::get_transaction_depth(&conn));

    println!("-- P6 concurrent repeat: B's BEGIN+claim waits on A's row lock");
    for a_commits in [true, false] {
        let key = format!("k6-{a_commits}");
        let mut a = pg_connect(5432, "zrt-a").await?;
        PgTm::begin(&mut a, Some(sql(format!("BEGIN; {}", pg_claim("s", &key))))).await?;
        let k2 = key.clone();
        let b = tokio::spawn(async move {
            let mut b = pg_connect(5432, "zrt-b").await.unwrap();
            let t = Instant::now();
            let r = PgTm::begin(&mut b, Some(sql(format!("BEGIN; {}", pg_claim("s", &k2))))).await;
            let waited = t.elapsed();
            let outcome = match r {
                Ok(()) => "claimed (A rolled back)".to_owned(),
                Err(e) => {
                    let row = sqlx::raw_sql(sql(format!("ROLLBACK; {}", pg_read("s", &k2))))
                        .fetch_optional(&mut b)
                        .await
                        .unwrap();
                    format!("{} -> replay read {:?}", code(&e), row.map(|r| (r.get::<String, _>(0), r.get::<Option<String>, _>(2))))
                }
            };
            (waited, outcome)
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        if a_commits {
            sqlx::raw_sql(sql(format!("{}; COMMIT; BEGIN", pg_complete("s", &key, "\"first\"")))).execute(&mut a).await?;
            PgTm::start_rollback(&mut a);
        } else {
            PgTm::rollback(&mut a).await?;
        }
        let (waited, outcome) = b.await?;
        println!("    A {}: B waited {:?}: {outcome}", if a_commits { "commits" } else { "rolls back" }, waited);
    }

    println!("-- P7 hostile scope, key and answer; NUL; 40 MiB");
    let answer = hostile_answer();
    PgTm::begin(&mut conn, Some(sql(format!("BEGIN; {}", pg_claim(HOSTILE_SCOPE, HOSTILE_KEY))))).await?;
    sqlx::raw_sql(sql(format!("{}; COMMIT; BEGIN", pg_complete(HOSTILE_SCOPE, HOSTILE_KEY, &answer)))).execute(&mut conn).await?;
    PgTm::start_rollback(&mut conn);
    let same: bool = sqlx::query_scalar("SELECT response = $3 FROM zrt_records WHERE scope = $1 AND idem_key = $2")
        .bind(HOSTILE_SCOPE)
        .bind(HOSTILE_KEY)
        .bind(&answer)
        .fetch_one(&mut admin)
        .await?;
    let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE tablename IN ('zrt_records', 'zrt_coupons')")
        .fetch_one(&mut admin)
        .await?;
    println!("    hostile values stored byte-exact (bound compare): {same}; tables still there: {tables}/2");
    let r = sqlx::raw_sql(sql(format!("SELECT {}", pg_text("a\0b")))).execute(&mut conn).await;
    println!("    raw NUL through convert_from: {:?}", r.map_err(|e| code(&e)));
    let big = format!("{}{}", "x'\\$$".repeat((40 << 20) / 5), answer);
    let t = Instant::now();
    PgTm::begin(&mut conn, Some(sql(format!("BEGIN; {}", pg_claim("s", "k7-big"))))).await?;
    let text = format!("{}; COMMIT; BEGIN", pg_complete("s", "k7-big", &big));
    let text_len = text.len();
    let r = counted(&rts, "P7 40 MiB complete+COMMIT", sqlx::raw_sql(sql(text)).execute(&mut conn)).await;
    PgTm::start_rollback(&mut conn);
    println!("    40 MiB answer ({} bytes, text {} bytes): {:?} in {:?}", big.len(), text_len, r.map(|d| d.rows_affected()).map_err(|e| code(&e)), t.elapsed());
    let same: bool = sqlx::query_scalar("SELECT response = $1 FROM zrt_records WHERE scope = 's' AND idem_key = 'k7-big'")
        .bind(&big)
        .fetch_one(&mut admin)
        .await?;
    println!("    stored byte-exact: {same}");

    println!("-- P8 a failing flush: (a) the UPDATE fails (CHECK), (b) COMMIT fails (deferred unique)");
    PgTm::begin(&mut conn, Some(sql(format!("BEGIN; {}", pg_claim("s", "k8a"))))).await?;
    let r = sqlx::raw_sql(sql(format!(
        "UPDATE zrt_records SET status = 'BOGUS' WHERE scope = 's' AND idem_key = 'k8a'; COMMIT; BEGIN"
    )))
    .execute(&mut conn)
    .await;
    println!("    (a) text: {:?}; server in a tx block: {}", r.map_err(|e| code(&e)), pg_in_tx(&mut conn).await);
    PgTm::start_rollback(&mut conn);
    conn.ping().await?;
    PgTm::begin(&mut conn, Some(sql(format!("BEGIN; {}", pg_claim("s", "k8b"))))).await?;
    sqlx::raw_sql("INSERT INTO zrt_deferred VALUES ('same'), ('same')").execute(&mut conn).await?;
    let r = sqlx::raw_sql(sql(format!("{}; COMMIT; BEGIN", pg_complete("s", "k8b", "8")))).execute(&mut conn).await;
    println!("    (b) text: {:?}; server in a tx block: {}", r.map_err(|e| code(&e)), pg_in_tx(&mut conn).await);
    PgTm::start_rollback(&mut conn); // queued ROLLBACK outside a block: a WARNING in the server log
    conn.ping().await?;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM zrt_records WHERE idem_key IN ('k8a', 'k8b')")
        .fetch_one(&mut admin)
        .await?;
    println!("    records of k8a/k8b committed: {left}");

    println!("-- P9 cancellation: (a) during BEGIN+claim, (b) during complete+COMMIT");
    let r = tokio::time::timeout(
        Duration::from_millis(100),
        PgTm::begin(&mut conn, Some(sql(format!("BEGIN; {}; SELECT pg_sleep(0.5)", pg_claim("s", "k9a"))))),
    )
    .await;
    println!("    (a) cancelled: {}; depth {}", r.is_err(), PgTm::get_transaction_depth(&conn));
    conn.ping().await?; // what the pool's release does
    println!("    (a) after the release ping, server still in a tx block: {} (a pool would hand this on)", pg_in_tx(&mut conn).await);
    sqlx::raw_sql("ROLLBACK").execute(&mut conn).await?;
    PgTm::begin(&mut conn, Some(sql(format!("BEGIN; {}", pg_claim("s", "k9b"))))).await?;
    let r = tokio::time::timeout(
        Duration::from_millis(100),
        sqlx::raw_sql(sql(format!("{}; SELECT pg_sleep(0.5); COMMIT; BEGIN", pg_complete("s", "k9b", "9")))).execute(&mut conn),
    )
    .await;
    println!("    (b) cancelled: {}; depth {} (start_rollback still works)", r.is_err(), PgTm::get_transaction_depth(&conn));
    PgTm::start_rollback(&mut conn);
    conn.ping().await?;
    let st: Option<String> = sqlx::query_scalar("SELECT status FROM zrt_records WHERE scope = 's' AND idem_key = 'k9b'")
        .fetch_optional(&mut admin)
        .await?;
    println!("    (b) record after the cancelled commit: {st:?} (the server ran the whole text)");
    conn.close().await?;
    Ok(())
}

// ---------------------------------------------------------------- MySQL / MariaDB

async fn my_connect(port: u16) -> Result<MySqlConnection, sqlx::Error> {
    let opts = MySqlConnectOptions::new().host("127.0.0.1").port(port).username("root").database("test");
    MySqlConnection::connect_with(&opts).await
}

async fn my_in_tx(conn: &mut MySqlConnection) -> i64 {
    sqlx::query_scalar("SELECT CAST(@@in_transaction AS SIGNED)").fetch_one(&mut *conn).await.unwrap_or(-1)
}

async fn my_probe(rts: Arc<AtomicU64>) -> Result<(), BoxError> {
    println!("=== MariaDB ===");
    let mut admin = my_connect(3306).await?;
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS zrt_records, zrt_coupons, zrt_users; \
         CREATE TABLE zrt_records LIKE idem_records; \
         CREATE TABLE zrt_coupons (id BIGINT AUTO_INCREMENT PRIMARY KEY, trade_no VARCHAR(191) NOT NULL UNIQUE); \
         CREATE TABLE zrt_users (id BIGINT PRIMARY KEY, n BIGINT NOT NULL DEFAULT 0); \
         INSERT INTO zrt_users (id) SELECT seq FROM seq_0_to_999",
    )
    .execute(&mut admin)
    .await?;
    let mut conn = my_connect(13306).await?;
    let max_packet: i64 = sqlx::query_scalar("SELECT CAST(@@max_allowed_packet AS SIGNED)").fetch_one(&mut conn).await?;
    println!("  max_allowed_packet = {max_packet}");
    let insert = "INSERT INTO zrt_coupons (trade_no) VALUES (?)";
    sqlx::query(insert).bind("warm").execute(&mut conn).await?;

    println!("-- M1 plain sqlx transaction: begin, body insert, commit");
    counted(&rts, "M1 total", async {
        let mut tx = conn.begin().await?;
        sqlx::query(insert).bind("m1").execute(&mut *tx).await?;
        tx.commit().await
    })
    .await?;

    println!("-- M3 zero-RT first call");
    let before = rts.load(SeqCst);
    counted(&rts, "M3 BEGIN+claim", MyTm::begin(&mut conn, Some(sql(format!("BEGIN; {}", my_claim("s", "k3")))))).await?;
    println!("    depth after begin: {}", MyTm::get_transaction_depth(&conn));
    counted(&rts, "M3 body", sqlx::query(insert).bind("m3").execute(&mut conn)).await?;
    let done = counted(
        &rts,
        "M3 complete+COMMIT",
        sqlx::raw_sql(sql(format!("{}; COMMIT; BEGIN", my_complete("s", "k3", "42")))).execute(&mut conn),
    )
    .await?;
    MyTm::start_rollback(&mut conn);
    println!(
        "    rows_affected of the text: {}, depth {}, M3 total round trips: {}",
        done.rows_affected(),
        MyTm::get_transaction_depth(&conn),
        rts.load(SeqCst) - before
    );
    counted(&rts, "M3 ping after (a pool's release; drains the queued ROLLBACK first)", conn.ping()).await?;
    counted(&rts, "M3 a plain ping for comparison", conn.ping()).await?;
    let row = sqlx::query("SELECT status, response FROM zrt_records WHERE scope = 's' AND idem_key = 'k3'")
        .fetch_one(&mut admin)
        .await?;
    println!("    committed record: status={} response={}", row.get::<String, _>(0), row.get::<String, _>(1));

    println!("-- M4 replay: the same key again");
    let before = rts.load(SeqCst);
    let r = counted(
        &rts,
        "M4 BEGIN+claim (dup) + marker",
        MyTm::begin(
            &mut conn,
            Some(sql(format!(
                "BEGIN; {}; INSERT INTO zrt_coupons (trade_no) VALUES ('m4-marker-after-dup')",
                my_claim("s", "k3")
            ))),
        ),
    )
    .await;
    println!("    begin result: {:?}; depth {}", r.as_ref().map_err(code), MyTm::get_transaction_depth(&conn));
    let row = counted(
        &rts,
        "M4 ROLLBACK + read",
        sqlx::raw_sql(sql(format!("ROLLBACK; {}", my_read("s", "k3")))).fetch_optional(&mut conn),
    )
    .await?
    .expect("record");
    println!(
        "    read: status={} response={:?} expired={}; M4 total round trips: {}",
        row.get::<String, _>(0),
        row.get::<Option<String>, _>(2),
        row.get::<i64, _>(3),
        rts.load(SeqCst) - before
    );
    let marker: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM zrt_coupons WHERE trade_no = 'm4-marker-after-dup'")
        .fetch_one(&mut admin)
        .await?;
    println!("    statements after the failed claim that ran: {marker}; @@in_transaction now: {}", my_in_tx(&mut conn).await);
    let r = MyTm::begin(&mut conn, Some(sql(format!("BEGIN; {}", my_claim("s", "k3"))))).await;
    println!(
        "    M4b the failed begin without ROLLBACK: {:?}, depth {}, @@in_transaction {} (the transaction stays OPEN)",
        r.map_err(|e| code(&e)),
        MyTm::get_transaction_depth(&conn),
        my_in_tx(&mut conn).await
    );
    sqlx::raw_sql("ROLLBACK").execute(&mut conn).await?;

    println!("-- M5 savepoint inside");
    MyTm::begin(&mut conn, Some(sql(format!("BEGIN; {}", my_claim("s", "k5"))))).await?;
    {
        let mut sp = conn.begin().await?;
        sqlx::query(insert).bind("m5-rolled-back").execute(&mut *sp).await?;
        sp.rollback().await?;
    }
    sqlx::query(insert).bind("m5-kept").execute(&mut conn).await?;
    sqlx::raw_sql(sql(format!("{}; COMMIT; BEGIN", my_complete("s", "k5", "5")))).execute(&mut conn).await?;
    MyTm::start_rollback(&mut conn);
    let n: (i64, i64) = sqlx::query_as(
        "SELECT CAST(SUM(trade_no = 'm5-rolled-back') AS SIGNED), CAST(SUM(trade_no = 'm5-kept') AS SIGNED) FROM zrt_coupons",
    )
    .fetch_one(&mut admin)
    .await?;
    println!("    rolled-back savepoint rows: {}, kept rows: {}", n.0, n.1);

    println!("-- M6 concurrent repeat");
    for a_commits in [true, false] {
        let key = format!("k6-{a_commits}");
        let mut a = my_connect(3306).await?;
        MyTm::begin(&mut a, Some(sql(format!("BEGIN; {}", my_claim("s", &key))))).await?;
        let k2 = key.clone();
        let b = tokio::spawn(async move {
            let mut b = my_connect(3306).await.unwrap();
            let t = Instant::now();
            let r = MyTm::begin(&mut b, Some(sql(format!("BEGIN; {}", my_claim("s", &k2))))).await;
            let waited = t.elapsed();
            let outcome = match r {
                Ok(()) => "claimed (A rolled back)".to_owned(),
                Err(e) => {
                    let row = sqlx::raw_sql(sql(format!("ROLLBACK; {}", my_read("s", &k2))))
                        .fetch_optional(&mut b)
                        .await
                        .unwrap();
                    format!("{} -> replay read {:?}", code(&e), row.map(|r| (r.get::<String, _>(0), r.get::<Option<String>, _>(2))))
                }
            };
            (waited, outcome)
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        if a_commits {
            sqlx::raw_sql(sql(format!("{}; COMMIT; BEGIN", my_complete("s", &key, "\"first\"")))).execute(&mut a).await?;
            MyTm::start_rollback(&mut a);
        } else {
            MyTm::rollback(&mut a).await?;
        }
        let (waited, outcome) = b.await?;
        println!("    A {}: B waited {:?}: {outcome}", if a_commits { "commits" } else { "rolls back" }, waited);
    }

    println!("-- M7 hostile values; sizes against max_allowed_packet");
    let answer = hostile_answer();
    MyTm::begin(&mut conn, Some(sql(format!("BEGIN; {}", my_claim(HOSTILE_SCOPE, HOSTILE_KEY))))).await?;
    sqlx::raw_sql(sql(format!("{}; COMMIT; BEGIN", my_complete(HOSTILE_SCOPE, HOSTILE_KEY, &answer)))).execute(&mut conn).await?;
    MyTm::start_rollback(&mut conn);
    let same: i64 = sqlx::query_scalar("SELECT CAST(response = ? AS SIGNED) FROM zrt_records WHERE scope = ? AND idem_key = ?")
        .bind(&answer)
        .bind(HOSTILE_SCOPE)
        .bind(HOSTILE_KEY)
        .fetch_one(&mut admin)
        .await?;
    let bin_same: i64 = sqlx::query_scalar("SELECT CAST(CAST(response AS BINARY) = CAST(? AS BINARY) AS SIGNED) FROM zrt_records WHERE scope = ? AND idem_key = ?")
        .bind(&answer)
        .bind(HOSTILE_SCOPE)
        .bind(HOSTILE_KEY)
        .fetch_one(&mut admin)
        .await?;
    println!("    hostile values stored (bound compare, binary compare): {same}, {bin_same}");
    for mib in [7usize, 9] {
        let big = "y".repeat(mib << 20);
        let key = format!("k7-{mib}");
        MyTm::begin(&mut conn, Some(sql(format!("BEGIN; {}", my_claim("s", &key))))).await?;
        let text = format!("{}; COMMIT; BEGIN", my_complete("s", &key, &big));
        let len = text.len();
        let r = sqlx::raw_sql(sql(text)).execute(&mut conn).await;
        let ok = r.is_ok();
        println!("    {mib} MiB answer, text {len} bytes: {:?}", r.map(|d| d.rows_affected()).map_err(|e| code(&e)));
        if ok {
            MyTm::start_rollback(&mut conn);
        } else {
            let alive = conn.ping().await;
            println!("    connection after the refused packet: {:?}", alive.map_err(|e| code(&e)));
            conn = my_connect(13306).await?;
        }
    }

    println!("-- M8 a failing flush: the UPDATE fails (CHECK constraint)");
    MyTm::begin(&mut conn, Some(sql(format!("BEGIN; {}", my_claim("s", "k8a"))))).await?;
    let r = sqlx::raw_sql("UPDATE zrt_records SET status = 'BOGUS' WHERE scope = 's' AND idem_key = 's'; COMMIT; BEGIN")
        .execute(&mut conn)
        .await;
    println!("    (no row matched: {:?})", r.map(|d| d.rows_affected()).map_err(|e| code(&e)));
    let r = sqlx::raw_sql(sql(format!(
        "UPDATE zrt_records SET status = 'BOGUS' WHERE scope = UNHEX('{}') AND idem_key = UNHEX('{}'); COMMIT; BEGIN",
        hex("s"),
        hex("k8a")
    )))
    .execute(&mut conn)
    .await;
    println!("    text: {:?}; @@in_transaction {}", r.map_err(|e| code(&e)), my_in_tx(&mut conn).await);
    MyTm::start_rollback(&mut conn);
    conn.ping().await?;
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM zrt_records WHERE idem_key = 'k8a'").fetch_one(&mut admin).await?;
    println!("    (note: the first UPDATE above matched no row and COMMITTED k8a's claim: rows {left})");
    Ok(())
}

// ---------------------------------------------------------------- mini load test

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Unguarded,
    Guard,
    ZeroRt,
}

static SEQ: AtomicU64 = AtomicU64::new(0);

async fn pg_call(pool: &sqlx::PgPool, mode: Mode, run: &str) -> Result<(), sqlx::Error> {
    let n = SEQ.fetch_add(1, SeqCst);
    let trade = format!("{run}-{n}");
    let user = (n * 104_729 % 1000) as i64;
    let mut conn = pool.acquire().await?;
    match mode {
        Mode::Unguarded | Mode::Guard => {
            let mut tx = conn.begin().await?;
            if mode == Mode::Guard {
                sqlx::query("INSERT INTO zrt_records (scope, idem_key, status, created_at, updated_at, expires_at) VALUES ('bench', $1, 'PROCESSING', now(), now(), clock_timestamp() + $2::interval) ON CONFLICT (scope, idem_key) DO NOTHING")
                    .bind(&trade).bind(Duration::from_secs(3600)).execute(&mut *tx).await?;
            }
            sqlx::query("INSERT INTO zrt_coupons (trade_no) VALUES ($1)").bind(&trade).execute(&mut *tx).await?;
            sqlx::query("UPDATE zrt_users SET n = n + 1 WHERE id = $1").bind(user).execute(&mut *tx).await?;
            if mode == Mode::Guard {
                sqlx::query("UPDATE zrt_records SET status = 'DONE', response = $2 WHERE scope = 'bench' AND idem_key = $1")
                    .bind(&trade).bind(n.to_string()).execute(&mut *tx).await?;
            }
            tx.commit().await?;
        }
        Mode::ZeroRt => {
            PgTm::begin(&mut conn, Some(sql(format!("BEGIN; {}", pg_claim("bench", &trade))))).await?;
            sqlx::query("INSERT INTO zrt_coupons (trade_no) VALUES ($1)").bind(&trade).execute(&mut *conn).await?;
            sqlx::query("UPDATE zrt_users SET n = n + 1 WHERE id = $1").bind(user).execute(&mut *conn).await?;
            sqlx::raw_sql(sql(format!("{}; COMMIT; BEGIN", pg_complete("bench", &trade, &n.to_string()))))
                .execute(&mut *conn)
                .await?;
            PgTm::start_rollback(&mut conn);
        }
    }
    Ok(())
}

async fn my_call(pool: &sqlx::MySqlPool, mode: Mode, run: &str) -> Result<(), sqlx::Error> {
    let n = SEQ.fetch_add(1, SeqCst);
    let trade = format!("{run}-{n}");
    let user = (n * 104_729 % 1000) as i64;
    let mut conn = pool.acquire().await?;
    match mode {
        Mode::Unguarded | Mode::Guard => {
            let mut tx = conn.begin().await?;
            if mode == Mode::Guard {
                sqlx::query("INSERT INTO zrt_records (scope, idem_key, status, created_at, updated_at, expires_at) VALUES ('bench', ?, 'PROCESSING', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)")
                    .bind(&trade).bind(3_600_000_000i64).execute(&mut *tx).await?;
            }
            sqlx::query("INSERT INTO zrt_coupons (trade_no) VALUES (?)").bind(&trade).execute(&mut *tx).await?;
            sqlx::query("UPDATE zrt_users SET n = n + 1 WHERE id = ?").bind(user).execute(&mut *tx).await?;
            if mode == Mode::Guard {
                sqlx::query("UPDATE zrt_records SET status = 'DONE', response = ?, updated_at = UTC_TIMESTAMP(6) WHERE scope = 'bench' AND idem_key = ?")
                    .bind(n.to_string()).bind(&trade).execute(&mut *tx).await?;
            }
            tx.commit().await?;
        }
        Mode::ZeroRt => {
            MyTm::begin(&mut conn, Some(sql(format!("BEGIN; {}", my_claim("bench", &trade))))).await?;
            sqlx::query("INSERT INTO zrt_coupons (trade_no) VALUES (?)").bind(&trade).execute(&mut *conn).await?;
            sqlx::query("UPDATE zrt_users SET n = n + 1 WHERE id = ?").bind(user).execute(&mut *conn).await?;
            sqlx::raw_sql(sql(format!("{}; COMMIT; BEGIN", my_complete("bench", &trade, &n.to_string()))))
                .execute(&mut *conn)
                .await?;
            MyTm::start_rollback(&mut conn);
        }
    }
    Ok(())
}

async fn load<F, Fut>(name: &str, clients: usize, slice: Duration, rounds: usize, call: F)
where
    F: Fn(Mode) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<(), sqlx::Error>> + Send,
{
    let modes = [Mode::Unguarded, Mode::Guard, Mode::ZeroRt];
    let mut tps: Vec<Vec<f64>> = vec![Vec::new(); 3];
    for round in 0..rounds {
        for i in 0..3 {
            let m = (i + round) % 3;
            let stop = Arc::new(AtomicBool::new(false));
            let calls = Arc::new(AtomicU64::new(0));
            let t = Instant::now();
            let mut tasks = Vec::new();
            for _ in 0..clients {
                let (stop, calls, call) = (stop.clone(), calls.clone(), call.clone());
                let mode = modes[m];
                tasks.push(tokio::spawn(async move {
                    while !stop.load(SeqCst) {
                        match call(mode).await {
                            Ok(()) => {
                                calls.fetch_add(1, SeqCst);
                            }
                            Err(e) => eprintln!("{mode:?}: {e}"),
                        }
                    }
                }));
            }
            tokio::time::sleep(slice).await;
            stop.store(true, SeqCst);
            for task in tasks {
                task.await.unwrap();
            }
            tps[m].push(calls.load(SeqCst) as f64 / t.elapsed().as_secs_f64());
        }
    }
    let median = |a: &[f64], b: &[f64]| {
        let mut r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
        r.sort_by(f64::total_cmp);
        r[r.len() / 2]
    };
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "load {name} clients={clients} rounds={rounds} slice={:?}: unguarded_tps={:.0} guard_tps={:.0} zero_rt_tps={:.0} ratio_guard={:.3} ratio_zero_rt={:.3} zero_rt_vs_guard={:.3}",
        slice,
        mean(&tps[0]),
        mean(&tps[1]),
        mean(&tps[2]),
        median(&tps[1], &tps[0]),
        median(&tps[2], &tps[0]),
        median(&tps[2], &tps[1]),
    );
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let what = std::env::args().nth(1).unwrap_or_else(|| "probe".into());
    let pg_rts = Arc::new(AtomicU64::new(0));
    let my_rts = Arc::new(AtomicU64::new(0));
    tokio::spawn(proxy(15432, 5432, pg_rts.clone()));
    tokio::spawn(proxy(13306, 3306, my_rts.clone()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    match what.as_str() {
        "probe" => {
            pg_probe(pg_rts.clone()).await?;
            my_probe(my_rts.clone()).await?;
        }
        "mysql" => my_probe(my_rts.clone()).await?,
        "rts" => {
            println!("=== pool round trips (postgres counter, then mysql counter) ===");
            pool_round_trips_split(pg_rts.clone(), my_rts.clone()).await?;
        }
        "load" => {
            let clients: usize = std::env::args().nth(2).map_or(16, |s| s.parse().unwrap());
            let secs: f64 = std::env::args().nth(3).map_or(3.0, |s| s.parse().unwrap());
            let rounds: usize = std::env::args().nth(4).map_or(3, |s| s.parse().unwrap());
            let run = format!("L{}", std::process::id());
            let pg = PgPoolOptions::new()
                .max_connections(clients as u32 + 2)
                .connect_with(PgConnectOptions::new().host("127.0.0.1").username("postgres").database("test"))
                .await?;
            let r = run.clone();
            load("postgres", clients, Duration::from_secs_f64(secs), rounds, move |m| {
                let (pg, r) = (pg.clone(), r.clone());
                async move { pg_call(&pg, m, &r).await }
            })
            .await;
            let my = MySqlPoolOptions::new()
                .max_connections(clients as u32 + 2)
                .connect_with(MySqlConnectOptions::new().host("127.0.0.1").username("root").database("test"))
                .await?;
            let r = run.clone();
            load("mariadb", clients, Duration::from_secs_f64(secs), rounds, move |m| {
                let (my, r) = (my.clone(), r.clone());
                async move { my_call(&my, m, &r).await }
            })
            .await;
        }
        "cleanup" => {
            let mut pg = pg_connect(5432, "zrt-admin").await?;
            sqlx::raw_sql("DROP TABLE IF EXISTS zrt_records, zrt_coupons, zrt_users, zrt_deferred").execute(&mut pg).await?;
            let mut my = my_connect(3306).await?;
            sqlx::raw_sql("DROP TABLE IF EXISTS zrt_records, zrt_coupons, zrt_users").execute(&mut my).await?;
            println!("dropped the zrt_ tables");
        }
        other => return Err(format!("unknown mode {other}").into()),
    }
    Ok(())
}

async fn pool_round_trips_split(pg_rts: Arc<AtomicU64>, my_rts: Arc<AtomicU64>) -> Result<(), BoxError> {
    // Same function, each backend reading its own counter.
    let pg = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(PgConnectOptions::new().host("127.0.0.1").port(15432).username("postgres").database("test"))
        .await?;
    for mode in [Mode::Unguarded, Mode::Guard, Mode::ZeroRt] {
        pg_call(&pg, mode, "rt-warm").await?;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let before = pg_rts.load(SeqCst);
        for _ in 0..20 {
            pg_call(&pg, mode, "rt").await?;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!("  postgres {mode:?}: {:.2} round trips per transaction (acquire + release pings included)", (pg_rts.load(SeqCst) - before) as f64 / 20.0);
    }
    let my = MySqlPoolOptions::new()
        .max_connections(1)
        .connect_with(MySqlConnectOptions::new().host("127.0.0.1").port(13306).username("root").database("test"))
        .await?;
    for mode in [Mode::Unguarded, Mode::Guard, Mode::ZeroRt] {
        my_call(&my, mode, "rt-warm").await?;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let before = my_rts.load(SeqCst);
        for _ in 0..20 {
            my_call(&my, mode, "rt").await?;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!("  mysql {mode:?}: {:.2} round trips per transaction (acquire + release pings included)", (my_rts.load(SeqCst) - before) as f64 / 20.0);
    }
    Ok(())
}
