//! The seed incident: a flash sale. 1,000 buyers press "buy" within 200 ms
//! for the 100 items of one SKU; the shop serves 100 requests at a time.
//! Exactly 100 are sold, the stock never goes below zero, and a buyer who
//! retries (the answer got lost) gets the first answer again instead of
//! buying a second item.
//!
//! Three defences, each for its own job (and a sold-out flag in front, set
//! once the database said so, that answers late buyers without queueing them
//! on the lock):
//! - `buy` takes a lock on the SKU (`strategy = "lock", concurrency_only =
//!   true`, `wait = "60s"`): buyers queue in the lock store instead of piling
//!   up on the stock row's database lock. The lock is taken before the
//!   transaction begins and released after it commits, so it covers the
//!   commit, and no transaction waits on the database while holding it.
//!   Waiters poll the lock store: the order of clicks is not the order of
//!   sales (the first buyer to click may well be told "sold out").
//! - `place_order` is `dedup` on the buyer's order id, in that transaction:
//!   a retry replays "bought" or "sold out".
//! - the conditional decrement `UPDATE shop_stock SET num = num - 1 WHERE
//!   sku = ? AND num > 0` is what guarantees "never oversold". A lock can be
//!   lost (its TTL passes while the holder stalls, the lock store fails
//!   over); the `num > 0` test cannot.
//!
//! Why not `lock+dedup`: it uses one key for its lock and its record. Keyed
//! on the SKU, the first buyer's record would make every later buyer of that
//! SKU a "repeat"; keyed on the order id, each buyer would lock only himself.
//!
//! Part 3 shows the limit of any lock with a TTL: holder A's work outlasts
//! its TTL (a GC pause), holder B takes the lock, and A wakes up believing it
//! still holds it. Every grant carries a fencing token, higher than all
//! earlier ones; the stock row keeps the token of its last write, and writes
//! are conditional on it (`... WHERE sku = ? AND fence < ?`), so A's late
//! write changes nothing. (The attribute renews its lock while the body runs;
//! the low-level `idem::lock::acquire` used there does not.)
//!
//! ```text
//! cargo run --example stock_deduct                       # locks in memory, SQLite in a temp file
//! cargo run --example stock_deduct -- --redis-url redis://127.0.0.1:6379 \
//!     --database-url postgres://postgres@127.0.0.1:5432/test
//! cargo run --example stock_deduct -- --database-url mysql://root@127.0.0.1:3306/test
//! ```
//!
//! It ends with `store=<locks>+<database> buyers=1000 sold=100 oversold=0
//! fenced_writes_rejected=1 errors=0`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use common::{AppError, BoxError, Store, on_pool, sql};
use idem::lock::LockStore;
use idem::{Outcome, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::{MySql, Postgres, Sqlite, Transaction};
use tokio::sync::Semaphore;

#[derive(Parser)]
#[command(about = "1,000 buyers race for 100 items: a lock, a conditional decrement, a fencing token")]
struct Args {
    /// postgres://..., mysql://... or sqlite:PATH; default: SQLite in a temporary file.
    #[arg(long)]
    database_url: Option<String>,
    /// Keep the locks in Redis instead of this process's memory.
    #[arg(long)]
    redis_url: Option<String>,
    /// Buyers in the race.
    #[arg(long, default_value_t = 1000)]
    buyers: usize,
    /// Items in stock.
    #[arg(long, default_value_t = 100)]
    stock: i64,
    /// Requests the shop serves at a time (the others queue in front of it).
    #[arg(long, default_value_t = 100)]
    clients: usize,
    /// The buyers' clicks spread over this many milliseconds (0: all at once).
    #[arg(long, default_value_t = 200)]
    spread_ms: u64,
}

/// What the "buy" button posts; the order id is made by the page, so a
/// retry carries the same one.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct BuyOrder {
    order_id: String,
    sku: String,
}

/// The answer, replayed to a retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Purchase {
    Bought,
    SoldOut,
}

/// The sale, per database: the conditional decrement, and the sale row if it took an item.
trait Stock: idem::sql::SqlBackend {
    fn deduct(
        conn: &mut Self::Connection,
        sku: &str,
        order_id: &str,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
}

macro_rules! impl_stock {
    ($($db:ty),*) => {$(
        impl Stock for $db {
            async fn deduct(conn: &mut Self::Connection, sku: &str, order_id: &str) -> Result<bool, sqlx::Error> {
                let decrement = sql(<Self as idem::sql::SqlBackend>::BACKEND, "UPDATE shop_stock SET num = num - 1 WHERE sku = ? AND num > 0");
                let took = sqlx::query(decrement).bind(sku).execute(&mut *conn).await?.rows_affected() == 1;
                if took {
                    let sale = sql(<Self as idem::sql::SqlBackend>::BACKEND, "INSERT INTO shop_stock_sales (order_id, sku) VALUES (?, ?)");
                    sqlx::query(sale).bind(order_id).bind(sku).execute(&mut *conn).await?;
                }
                Ok(took)
            }
        }
    )*};
}
impl_stock!(Sqlite, MySql, Postgres);

/// One buyer's order, in the caller's transaction: the dedup record on the
/// order id, then the conditional decrement.
#[idempotent(key = "order.order_id", fingerprint = "order", scope = "shop.stock.place_order")]
async fn place_order<DB: Stock>(tx: &mut Transaction<'_, DB>, order: &BuyOrder) -> Result<Purchase, AppError>
where
    DB::Connection: Send,
{
    let took = DB::deduct(tx, &order.sku, &order.order_id).await?;
    Ok(if took { Purchase::Bought } else { Purchase::SoldOut })
}

/// The purchase under the SKU's lock: begin, place the order, commit. A
/// buyer who waited `wait` in vain gets `LockBusy` (retry later).
#[idempotent(
    key = "order.sku",
    strategy = "lock",
    concurrency_only = true,
    ttl = "5s",
    wait = "60s",
    scope = "shop.stock.sku",
    store = "locks"
)]
async fn buy(db: &Store, locks: &Arc<dyn LockStore>, order: &BuyOrder) -> Result<(Purchase, Outcome), AppError> {
    on_pool!(db, pool => {
        let mut tx = pool.begin().await?;
        let (purchase, outcome) = idem::observe(place_order(&mut tx, order)).await;
        let purchase = purchase?;
        tx.commit().await?;
        Ok((purchase, outcome.unwrap_or(Outcome::Executed)))
    })
}

/// The "buy" endpoint. Once a decrement found the stock empty, a flag
/// answers "sold out" at once (no outcome: no guard ran) instead of queueing
/// the rest of the crowd on the lock; the database stays the judge.
async fn handle(
    db: &Store,
    locks: &Arc<dyn LockStore>,
    sold_out: &AtomicBool,
    order: &BuyOrder,
) -> Result<(Purchase, Option<Outcome>), AppError> {
    if sold_out.load(Ordering::Relaxed) {
        return Ok((Purchase::SoldOut, None));
    }
    let (purchase, outcome) = buy(db, locks, order).await?;
    if purchase == Purchase::SoldOut {
        sold_out.store(true, Ordering::Relaxed);
    }
    Ok((purchase, Some(outcome)))
}

async fn stock_of(db: &Store, sku: &str) -> Result<i64, BoxError> {
    let select = sql(db.name(), "SELECT num FROM shop_stock WHERE sku = ?");
    Ok(on_pool!(db, pool => sqlx::query_scalar(select).bind(sku).fetch_one(pool).await?))
}

/// `UPDATE ... SET num = ?, fence = ? WHERE sku = ? AND fence < ?`: rows changed.
async fn fenced_write(db: &Store, sku: &str, num: i64, fence: i64) -> Result<u64, BoxError> {
    let update = sql(db.name(), "UPDATE shop_stock SET num = ?, fence = ? WHERE sku = ? AND fence < ?");
    Ok(on_pool!(db, pool => sqlx::query(update).bind(num).bind(fence).bind(sku).bind(fence)
        .execute(pool).await?.rows_affected()))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let db = Arc::new(Store::connect(args.database_url.as_deref(), 10).await?);
    let locks: Arc<dyn LockStore> = match &args.redis_url {
        Some(url) => {
            let conn = redis::aio::ConnectionManager::new(redis::Client::open(url.as_str())?).await?;
            Arc::new(idem::store::RedisStore::new(conn, "idem-example:"))
        }
        None => Arc::new(idem::store::MemoryStore::new()),
    };
    const DDL: &str = "CREATE TABLE IF NOT EXISTS shop_stock (sku VARCHAR(64) PRIMARY KEY, num BIGINT NOT NULL, \
        fence BIGINT NOT NULL DEFAULT 0)";
    const SALES: &str =
        "CREATE TABLE IF NOT EXISTS shop_stock_sales (order_id VARCHAR(64) PRIMARY KEY, sku VARCHAR(64) NOT NULL)";
    let run = common::run_id();
    let (sku, sku_b) = (format!("SKU-{run}"), format!("SKU-{run}-B"));
    let insert = || sql(db.name(), "INSERT INTO shop_stock (sku, num, fence) VALUES (?, ?, 0)");
    on_pool!(&*db, pool => {
        idem::migrate(pool).await?;
        sqlx::query(DDL).execute(pool).await?;
        sqlx::query(SALES).execute(pool).await?;
        sqlx::query(insert()).bind(&sku).bind(args.stock).execute(pool).await?;
        sqlx::query(insert()).bind(&sku_b).bind(10_i64).execute(pool).await?;
    });
    let store = format!("{}+{}", locks.kind(), db.name());
    let mut errors = 0;
    let (stock, buyers, spread) = (args.stock, args.buyers, args.spread_ms);
    println!("store={store}: {sku} has {stock} in stock; {buyers} buyers press \"buy\" within {spread}ms");

    println!(
        "1. the race: {} requests at a time, a lock on the SKU, the conditional decrement behind it",
        args.clients
    );
    let started = Instant::now();
    let (slots, sold_out) = (Arc::new(Semaphore::new(args.clients.max(1))), Arc::new(AtomicBool::new(false)));
    let orders: Vec<BuyOrder> =
        (1..=args.buyers).map(|n| BuyOrder { order_id: format!("O{run}-{n}"), sku: sku.clone() }).collect();
    let tasks: Vec<_> = orders
        .iter()
        .enumerate()
        .map(|(i, order)| {
            let (db, locks, order, slots, sold_out) =
                (db.clone(), locks.clone(), order.clone(), slots.clone(), sold_out.clone());
            let click = Duration::from_millis(args.spread_ms) * i as u32 / args.buyers.max(1) as u32;
            tokio::spawn(async move {
                tokio::time::sleep(click).await;
                let _slot = slots.acquire().await.expect("never closed");
                handle(&db, &locks, &sold_out, &order).await
            })
        })
        .collect();
    let mut answers = Vec::new();
    let (mut bought, mut refused, mut flagged, mut failed) = (0, 0, 0, 0);
    for task in tasks {
        let answer = task.await?;
        match &answer {
            Ok((Purchase::Bought, Some(Outcome::Executed))) => bought += 1,
            Ok((Purchase::SoldOut, Some(Outcome::Executed))) => refused += 1,
            Ok((Purchase::SoldOut, None)) => flagged += 1,
            Ok(other) => println!("   !! unexpected {other:?}"),
            Err(e) => println!("   !! {e}"),
        }
        failed += usize::from(!matches!(answer, Ok((_, Some(Outcome::Executed))) | Ok((Purchase::SoldOut, None))));
        answers.push(answer.ok().and_then(|(p, outcome)| outcome.map(|_| p)));
    }
    println!(
        "   {bought} bought; {} were told \"sold out\" ({refused} by the decrement, {flagged} by the sold-out flag); \
         {failed} failed; {:.1}s; {} left in stock",
        refused + flagged,
        started.elapsed().as_secs_f64(),
        stock_of(&db, &sku).await?
    );
    errors += failed;

    println!("2. two buyers retry (their answers got lost):");
    let first_sold_out = answers.iter().position(|a| *a == Some(Purchase::SoldOut));
    for i in [answers.iter().position(|a| *a == Some(Purchase::Bought)), first_sold_out].into_iter().flatten() {
        match buy(&db, &locks, &orders[i]).await {
            Ok((purchase, outcome)) => {
                println!("   order {}: {purchase:?} ({})", orders[i].order_id, outcome.as_str());
                errors += usize::from(outcome != Outcome::Replayed || Some(purchase) != answers[i]);
            }
            Err(e) => {
                println!("   order {}: !! {e}", orders[i].order_id);
                errors += 1;
            }
        }
    }
    let count = sql(db.name(), "SELECT COUNT(*) FROM shop_stock_sales WHERE sku = ?");
    let sold: i64 = on_pool!(&*db, pool => sqlx::query_scalar(count).bind(&sku).fetch_one(pool).await?);
    let left = stock_of(&db, &sku).await?;
    let oversold = (sold - args.stock).max(0) + (-left).max(0);
    errors += usize::from(sold != args.stock.min(args.buyers as i64) || sold + left != args.stock);

    println!("3. a lock whose TTL (200ms) is shorter than its holder's work, on {sku_b}:");
    let a = idem::lock::acquire(&locks, "shop.stock", &sku_b, Duration::from_millis(200), Duration::ZERO).await?;
    let seen = stock_of(&db, &sku_b).await?;
    println!("   A takes the lock (fence {}), reads {seen} in stock, sells 1: will write {}", a.fence(), seen - 1);
    println!("   A pauses 400ms (a GC pause); its lock expires");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let b = idem::lock::acquire(&locks, "shop.stock", &sku_b, Duration::from_secs(5), Duration::ZERO).await?;
    let seen_b = stock_of(&db, &sku_b).await?;
    let written = fenced_write(&db, &sku_b, seen_b - 3, b.fence()).await?;
    println!("   B takes the lock (fence {}), sells 3: writes {} with its fence: {written} row", b.fence(), seen_b - 3);
    let released_b = b.release().await?;
    let late = fenced_write(&db, &sku_b, seen - 1, a.fence()).await?;
    let fenced_writes_rejected = usize::from(late == 0);
    println!(
        "   A wakes and writes {} with fence {}: {late} rows{}",
        seen - 1,
        a.fence(),
        if late == 0 { ", refused by the fence (it would have put 2 of B's 3 sold items back on sale)" } else { " !!" }
    );
    let released_a = a.release().await?;
    let final_b = stock_of(&db, &sku_b).await?;
    println!("   A's release: {released_a} (the lock was no longer A's); {final_b} left in stock");
    errors += usize::from(written != 1 || !released_b || released_a || final_b != seen - 3 || late != 0);

    println!(
        "store={store} buyers={} sold={sold} oversold={oversold} fenced_writes_rejected={fenced_writes_rejected} \
         errors={errors}",
        args.buyers
    );
    if let Ok(db) = Arc::try_unwrap(db) {
        db.close().await;
    }
    if errors > 0 {
        std::process::exit(1);
    }
    Ok(())
}
