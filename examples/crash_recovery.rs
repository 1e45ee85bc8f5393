//! A worker is killed (SIGKILL) in the middle of a transfer guarded by
//! `strategy = "lease"`: its record says PROCESSING and nobody will ever
//! complete it. The next worker with the same key is told `InProgress` while
//! the dead worker's lease runs out, then reclaims the record (a higher
//! fencing token) and completes the transfer. The ledger gets one entry.
//!
//! ```text
//! cargo run --example crash_recovery                      # SQLite in a temp file
//! cargo run --example crash_recovery -- --database-url postgres://postgres@127.0.0.1/test
//! cargo run --example crash_recovery -- --database-url mysql://root@127.0.0.1/test
//! cargo run --example crash_recovery -- --redis-url redis://127.0.0.1/
//! ```

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use common::{AppError, BoxError, Store};
use idem::idempotent;
use serde::{Deserialize, Serialize};

#[derive(Parser)]
#[command(about = "A worker killed mid-work: the next one reclaims the lease, the effect happens once")]
struct Args {
    /// postgres://..., mysql://... or sqlite:PATH; default: SQLite in a temporary file.
    #[arg(long)]
    database_url: Option<String>,
    /// Keep the lease records (and the ledger counter) in Redis instead.
    #[arg(long)]
    redis_url: Option<String>,
    /// Internal: run as the worker that gets killed, on this transfer id.
    #[arg(long, hide = true)]
    worker: Option<String>,
}

/// Where the transfer's effect lands: a ledger table, or a Redis counter.
enum Ledger {
    Sql(Store),
    Redis(redis::aio::ConnectionManager, String),
}

impl Ledger {
    async fn setup(&self) -> Result<(), BoxError> {
        const DDL: &str =
            "CREATE TABLE IF NOT EXISTS crash_ledger (transfer_id VARCHAR(64) PRIMARY KEY, fence BIGINT NOT NULL)";
        match self {
            Ledger::Sql(Store::Sqlite(pool, _)) => {
                sqlx::query(DDL).execute(pool).await?;
            }
            Ledger::Sql(Store::Postgres(pool)) => {
                sqlx::query(DDL).execute(pool).await?;
            }
            Ledger::Sql(Store::MySql(pool)) => {
                sqlx::query(DDL).execute(pool).await?;
            }
            Ledger::Redis(..) => {}
        }
        Ok(())
    }

    /// The transfer's effect: one ledger entry, tagged with the fencing token.
    async fn apply(&self, transfer_id: &str, fence: i64) -> Result<(), AppError> {
        const INSERT: &str = "INSERT INTO crash_ledger (transfer_id, fence) VALUES (?, ?)";
        match self {
            Ledger::Sql(Store::Sqlite(pool, _)) => {
                sqlx::query(INSERT).bind(transfer_id).bind(fence).execute(pool).await?;
            }
            Ledger::Sql(Store::MySql(pool)) => {
                sqlx::query(INSERT).bind(transfer_id).bind(fence).execute(pool).await?;
            }
            Ledger::Sql(Store::Postgres(pool)) => {
                sqlx::query("INSERT INTO crash_ledger (transfer_id, fence) VALUES ($1, $2)")
                    .bind(transfer_id)
                    .bind(fence)
                    .execute(pool)
                    .await?;
            }
            Ledger::Redis(conn, prefix) => {
                let mut conn = conn.clone();
                let _: i64 = redis::cmd("INCR")
                    .arg(format!("{prefix}effects:{transfer_id}"))
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| AppError::Unexpected(e.to_string()))?;
            }
        }
        Ok(())
    }

    async fn effects(&self, transfer_id: &str) -> Result<i64, BoxError> {
        const COUNT: &str = "SELECT COUNT(*) FROM crash_ledger WHERE transfer_id = ?";
        Ok(match self {
            Ledger::Sql(Store::Sqlite(pool, _)) => sqlx::query_scalar(COUNT).bind(transfer_id).fetch_one(pool).await?,
            Ledger::Sql(Store::MySql(pool)) => sqlx::query_scalar(COUNT).bind(transfer_id).fetch_one(pool).await?,
            Ledger::Sql(Store::Postgres(pool)) => {
                sqlx::query_scalar("SELECT COUNT(*) FROM crash_ledger WHERE transfer_id = $1")
                    .bind(transfer_id)
                    .fetch_one(pool)
                    .await?
            }
            Ledger::Redis(conn, prefix) => {
                let mut conn = conn.clone();
                let n: Option<i64> =
                    redis::cmd("GET").arg(format!("{prefix}effects:{transfer_id}")).query_async(&mut conn).await?;
                n.unwrap_or(0)
            }
        })
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Receipt {
    fence: i64,
    reclaimed: bool,
}

/// The transfer: a slow call to the bank, then the ledger entry. The lease
/// record lives in the store installed at start-up (no `store = ...`).
#[idempotent(key = "transfer_id", strategy = "lease", lease = "2s", scope = "bank.transfer")]
async fn transfer(ledger: &Ledger, transfer_id: &str, bank_call: Duration) -> Result<Receipt, AppError> {
    let lease = idem::lease::current().expect("the body runs under its lease");
    println!(
        "   worker {}: holds {transfer_id} (fence {}{}), calling the bank",
        std::process::id(),
        lease.fence,
        if lease.reclaimed { ", reclaimed" } else { "" }
    );
    std::io::stdout().flush().ok();
    tokio::time::sleep(bank_call).await;
    ledger.apply(transfer_id, lease.fence).await?;
    Ok(Receipt { fence: lease.fence, reclaimed: lease.reclaimed })
}

async fn connect(args: &Args) -> Result<(Ledger, &'static str), BoxError> {
    if let Some(url) = &args.redis_url {
        let conn = redis::aio::ConnectionManager::new(redis::Client::open(url.as_str())?).await?;
        let prefix = "idem-example:".to_owned();
        idem::Stores::builder().lease(idem::store::RedisStore::new(conn.clone(), prefix.clone())).install()?;
        return Ok((Ledger::Redis(conn, prefix), "redis"));
    }
    let store = Store::connect(args.database_url.as_deref(), 4).await?;
    let name = store.name();
    match &store {
        Store::Sqlite(pool, _) => {
            idem::migrate(pool).await?;
            idem::Stores::builder().lease(idem::store::SqlStore::new(pool.clone())).install()?;
        }
        Store::Postgres(pool) => {
            idem::migrate(pool).await?;
            idem::Stores::builder().lease(idem::store::SqlStore::new(pool.clone())).install()?;
        }
        Store::MySql(pool) => {
            idem::migrate(pool).await?;
            idem::Stores::builder().lease(idem::store::SqlStore::new(pool.clone())).install()?;
        }
    }
    Ok((Ledger::Sql(store), name))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut args = Args::parse();
    if let Some(id) = args.worker.clone() {
        // The doomed worker: claims, then "calls the bank" for a minute.
        let (ledger, _) = connect(&args).await?;
        transfer(&ledger, &id, Duration::from_secs(60)).await?;
        return Ok(());
    }
    if args.redis_url.is_none() && args.database_url.is_none() {
        // Both processes must see the same SQLite file.
        let path = std::env::temp_dir().join(format!("idem-crash-{}.db", std::process::id()));
        args.database_url = Some(format!("sqlite:{}", path.display()));
    }
    let (ledger, name) = connect(&args).await?;
    ledger.setup().await?;
    let transfer_id = format!("X{}", common::run_id());
    println!("store={name}: transfer {transfer_id}");

    println!("1. worker A claims the transfer and is killed (SIGKILL) mid-work:");
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("--worker").arg(&transfer_id).stdout(Stdio::piped());
    if let Some(url) = &args.redis_url {
        cmd.arg("--redis-url").arg(url);
    }
    if let Some(url) = &args.database_url {
        cmd.arg("--database-url").arg(url);
    }
    let mut child = cmd.spawn()?;
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    match lines.next() {
        Some(line) => println!("{}", line?),
        None => return Err("the worker exited before claiming".into()),
    }
    child.kill()?; // SIGKILL: no destructor, no release, no completion
    child.wait()?;
    println!("   worker A is dead; its record still says PROCESSING");

    println!("2. worker B retries the same transfer:");
    let started = Instant::now();
    let mut in_progress_seen = 0;
    let receipt = loop {
        match transfer(&ledger, &transfer_id, Duration::from_millis(100)).await {
            Ok(receipt) => break receipt,
            Err(AppError::Idem(idem::Error::InProgress { retry_after, .. })) => {
                in_progress_seen += 1;
                let wait = retry_after.unwrap_or(Duration::from_millis(200)).max(Duration::from_millis(50));
                println!("   InProgress: A's lease runs for {} ms more; retrying then", wait.as_millis());
                tokio::time::sleep(wait).await;
            }
            Err(e) => return Err(e.into()),
        }
        if started.elapsed() > Duration::from_secs(30) {
            return Err("the lease never passed".into());
        }
    };
    println!(
        "   done after {} ms: fence {}, reclaimed {}",
        started.elapsed().as_millis(),
        receipt.fence,
        receipt.reclaimed
    );

    println!("3. a late duplicate replays B's answer:");
    let again = transfer(&ledger, &transfer_id, Duration::from_millis(100)).await?;
    println!("   fence {} (replayed)", again.fence);

    let effects = ledger.effects(&transfer_id).await?;
    let reclaimed = u8::from(receipt.reclaimed);
    println!("store={name} effects={effects} reclaimed={reclaimed} in_progress_seen={in_progress_seen}");
    if let Ledger::Sql(store) = ledger {
        store.close().await;
    }
    if let Some(path) = args.database_url.as_deref().and_then(|u| u.strip_prefix("sqlite:"))
        && path.contains("idem-crash-")
    {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{path}{suffix}"));
        }
    }
    if effects != 1 || !receipt.reclaimed {
        std::process::exit(1);
    }
    Ok(())
}
