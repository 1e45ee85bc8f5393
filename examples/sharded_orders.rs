//! A sharded orders table, and its dedup records sharded with it. (The
//! incident: orders were split over several databases, the dedup table
//! stayed in one, so a record never committed with its order, and a crash
//! between the two commits lost or duplicated payments.)
//!
//! Two PostgreSQL databases, `idem_shard_0` and `idem_shard_1`, are the
//! shards; an order lives on the shard given by a stable hash of its id.
//! Each shard has its own `orders` and its own `idem_records`. The gateway's
//! "paid" callback runs in a transaction **on the order's shard**, so its
//! dedup record commits there with the payment: route the transaction, and
//! the record follows. A refund sent to the bank (outside work, strategy
//! `lease`) keeps its lease record through `idem::store::Routed` with the
//! same route, so it too lives on the order's shard.
//!
//! Each order gets 100 concurrent copies of its callback, then 100
//! concurrent refund requests; every copy gets the first answer, and no
//! record is on the wrong shard.
//!
//! ```text
//! cargo run --example sharded_orders          # the local server, postgres@127.0.0.1:5432
//! cargo run --example sharded_orders -- --database-url postgres://app@db.internal/shop
//! ```
//!
//! `--database-url` names the server and a database to connect to first;
//! the shards are the databases `idem_shard_0` and `idem_shard_1` on that
//! server (same user and options), created if missing (the user needs
//! `CREATEDB` for that, once). PostgreSQL only.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use common::shards::{SHARDS, ensure_database, shard_of};
use common::{AppError, BoxError};
use idem::store::{Routed, SqlStore};
use idem::{Outcome, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool, Postgres, Transaction};

const PAID_SCOPE: &str = "shop.sharded.on_paid";
const REFUND_SCOPE: &str = "shop.sharded.refund";

/// What the gateway posts when an order is paid.
#[derive(Clone, Debug, Serialize)]
struct PaidCallback {
    order_id: String,
    amount_cents: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Receipt {
    payment_id: i64,
}

/// The guarded handler: runs in `tx`, a transaction on the order's shard,
/// where its dedup record is written next to the payment.
#[idempotent(key = "cb.order_id", strategy = "dedup", fingerprint = "cb", scope = "shop.sharded.on_paid")]
async fn on_paid(tx: &mut Transaction<'_, Postgres>, cb: &PaidCallback) -> Result<Receipt, AppError> {
    let updated = sqlx::query("UPDATE orders SET status = 'PAID', payments = payments + 1 WHERE order_id = $1")
        .bind(&cb.order_id)
        .execute(&mut **tx)
        .await?
        .rows_affected();
    if updated != 1 {
        return Err(AppError::Unexpected(format!("order {} is not on this shard", cb.order_id)));
    }
    let payment_id =
        sqlx::query_scalar("INSERT INTO order_payments (order_id, amount_cents) VALUES ($1, $2) RETURNING id")
            .bind(&cb.order_id)
            .bind(cb.amount_cents)
            .fetch_one(&mut **tx)
            .await?;
    Ok(Receipt { payment_id })
}

/// The shop: a pool per shard, and the lease records routed like the orders.
struct Shop {
    shards: Vec<PgPool>,
    leases: Routed<SqlStore<Postgres>>,
    bank: Bank,
}

impl Shop {
    /// One delivery: a transaction on the order's shard, the handler, commit.
    async fn deliver(&self, cb: &PaidCallback) -> Result<(Receipt, Outcome), AppError> {
        let mut tx = self.shards[shard_of(&cb.order_id)].begin().await?;
        let (receipt, outcome) = idem::observe(on_paid(&mut tx, cb)).await;
        let receipt = receipt?;
        tx.commit().await?;
        Ok((receipt, outcome.expect("the guard ran")))
    }
}

/// The bank's side: counts the transfers it was asked for, per order.
#[derive(Default)]
struct Bank {
    transfers: Mutex<HashMap<String, usize>>,
}

impl Bank {
    async fn transfer(&self, refund: &Refund, fence: i64) -> Result<BankReceipt, AppError> {
        tokio::time::sleep(Duration::from_millis(50)).await; // the network
        let mut transfers = self.transfers.lock().expect("not poisoned");
        *transfers.entry(refund.order_id.clone()).or_default() += 1;
        Ok(BankReceipt { bank_ref: format!("R-{}-{fence}", refund.order_id) })
    }

    fn total(&self) -> usize {
        self.transfers.lock().expect("not poisoned").values().sum()
    }
}

#[derive(Clone, Debug, Serialize)]
struct Refund {
    order_id: String,
    amount_cents: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct BankReceipt {
    bank_ref: String,
}

/// A refund at the bank: no transaction to share, so a lease record,
/// claimed on the order's shard through `shop.leases`.
#[idempotent(
    key = "refund.order_id",
    strategy = "lease",
    lease = "10s",
    fingerprint = "refund",
    scope = "shop.sharded.refund",
    store = "shop.leases"
)]
async fn send_refund(shop: &Shop, refund: &Refund) -> Result<BankReceipt, AppError> {
    let fence = idem::lease::current().expect("the body runs under its lease").fence;
    shop.bank.transfer(refund, fence).await
}

/// A client that, told `InProgress`, tries again shortly.
async fn refund_until_answered(shop: &Shop, refund: &Refund) -> Result<(BankReceipt, Outcome), AppError> {
    loop {
        match idem::observe(send_refund(shop, refund)).await {
            (Ok(receipt), outcome) => return Ok((receipt, outcome.expect("the guard ran"))),
            (Err(AppError::Idem(idem::Error::InProgress { retry_after, .. })), _) => {
                let wait = retry_after.unwrap_or_default().clamp(Duration::from_millis(5), Duration::from_millis(25));
                tokio::time::sleep(wait).await;
            }
            (Err(e), _) => return Err(e),
        }
    }
}

/// A pool per shard, each database created if missing, migrated
/// (`idem_records`) and given the shop's tables.
async fn connect_shards(url: &str) -> Result<Vec<PgPool>, BoxError> {
    let base: PgConnectOptions = url.parse()?;
    let mut admin = PgConnection::connect_with(&base).await?;
    for name in SHARDS {
        ensure_database(&mut admin, name).await?;
    }
    admin.close().await?;
    let mut pools = Vec::new();
    for name in SHARDS {
        let pool = PgPoolOptions::new().max_connections(10).connect_with(base.clone().database(name)).await?;
        idem::migrate(&pool).await?;
        let mut tx = pool.begin().await?;
        // One creator at a time: two sessions creating a table at once can
        // fail on PostgreSQL's catalog.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('idem_example_sharded_orders'))").execute(&mut *tx).await?;
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS orders (order_id VARCHAR(64) PRIMARY KEY, amount_cents BIGINT NOT NULL, \
               status VARCHAR(16) NOT NULL, payments INT NOT NULL DEFAULT 0);
             CREATE TABLE IF NOT EXISTS order_payments (id BIGSERIAL PRIMARY KEY, order_id VARCHAR(64) NOT NULL, \
               amount_cents BIGINT NOT NULL);
             CREATE INDEX IF NOT EXISTS order_payments_order_id ON order_payments (order_id);",
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        pools.push(pool);
    }
    Ok(pools)
}

#[derive(Parser)]
#[command(about = "Orders on two PostgreSQL shards, their dedup and lease records on the order's shard")]
struct Args {
    /// The server (and a database on it to connect to first); the shards are
    /// the databases idem_shard_0 and idem_shard_1 there.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    database_url: String,
    /// Orders, spread evenly over the shards.
    #[arg(long, default_value_t = 8)]
    orders: usize,
    /// Concurrent copies of each order's callback, and of its refund.
    #[arg(long, default_value_t = 100)]
    duplicates: usize,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    if !args.database_url.starts_with("postgres://") && !args.database_url.starts_with("postgresql://") {
        return Err(
            format!("--database-url {:?}: this example needs PostgreSQL (postgres://)", args.database_url).into()
        );
    }
    let shards = connect_shards(&args.database_url).await?;
    // The lease records: the same route as the transactions. `Routed` hands
    // the route the key as stored, which for these ids is the id itself.
    let leases = Routed::new(shards.iter().cloned().map(SqlStore::new).collect(), |_scope, key| shard_of(key));
    let shop = Arc::new(Shop { shards, leases, bank: Bank::default() });
    println!("shards: {} (an order's shard: FNV-1a of its id, mod {})", SHARDS.join(", "), SHARDS.len());

    // Order ids O<run>-1, O<run>-2, ..., kept while their shard still needs
    // orders, so the demo has as many on each shard.
    let run = common::run_id();
    let mut wanted: Vec<usize> =
        (0..SHARDS.len()).map(|s| (args.orders + SHARDS.len() - 1 - s) / SHARDS.len()).collect();
    let mut orders = Vec::new();
    for n in 1.. {
        if orders.len() == args.orders {
            break;
        }
        let id = format!("O{run}-{n}");
        let shard = shard_of(&id);
        if wanted[shard] > 0 {
            wanted[shard] -= 1;
            sqlx::query("INSERT INTO orders (order_id, amount_cents, status) VALUES ($1, 1999, 'WAIT_PAY')")
                .bind(&id)
                .execute(&shop.shards[shard])
                .await?;
            orders.push(id);
        }
    }
    for (s, name) in SHARDS.iter().enumerate() {
        let here: Vec<&str> = orders.iter().filter(|id| shard_of(id) == s).map(String::as_str).collect();
        println!("1. {name} holds orders {}", here.join(", "));
    }

    let errors = Arc::new(AtomicUsize::new(0));
    let dup = args.duplicates.max(1);
    println!("2. the gateway sends each order's \"paid\" callback {dup} times at once; each runs on the order's shard");
    let mut tasks = Vec::new();
    for id in &orders {
        for _ in 0..dup {
            let (shop, errors) = (shop.clone(), errors.clone());
            let cb = PaidCallback { order_id: id.clone(), amount_cents: 1999 };
            tasks.push(tokio::spawn(async move {
                match shop.deliver(&cb).await {
                    Ok(answer) => Some((cb.order_id, answer)),
                    Err(e) => {
                        eprintln!("   !! callback for {}: {e}", cb.order_id);
                        errors.fetch_add(1, Ordering::Relaxed);
                        None
                    }
                }
            }));
        }
    }
    let (mut executed, mut replayed, mut answers) = (0, 0, HashMap::<String, HashSet<i64>>::new());
    for t in tasks {
        if let Some((id, (receipt, outcome))) = t.await? {
            match outcome {
                Outcome::Executed => executed += 1,
                Outcome::Replayed => replayed += 1,
                _ => {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            answers.entry(id).or_default().insert(receipt.payment_id);
        }
    }
    let callbacks = orders.len() * dup;
    println!("   {callbacks} callbacks: {executed} ran the handler, {replayed} replayed its answer");

    println!(
        "3. the shop refunds each order, {dup} concurrent requests per order, at the bank (lease, through Routed)"
    );
    let mut tasks = Vec::new();
    for id in &orders {
        for _ in 0..dup {
            let (shop, errors) = (shop.clone(), errors.clone());
            let refund = Refund { order_id: id.clone(), amount_cents: 1999 };
            tasks.push(tokio::spawn(async move {
                match refund_until_answered(&shop, &refund).await {
                    Ok(answer) => Some((refund.order_id, answer)),
                    Err(e) => {
                        eprintln!("   !! refund of {}: {e}", refund.order_id);
                        errors.fetch_add(1, Ordering::Relaxed);
                        None
                    }
                }
            }));
        }
    }
    let (mut refunds_executed, mut refund_answers) = (0, HashMap::<String, HashSet<String>>::new());
    for t in tasks {
        if let Some((id, (receipt, outcome))) = t.await? {
            refunds_executed += usize::from(outcome == Outcome::Executed);
            refund_answers.entry(id).or_default().insert(receipt.bank_ref);
        }
    }
    let bank_transfers = shop.bank.total();
    println!("   {} requests: {refunds_executed} reached the bank, which made {bank_transfers} transfers", callbacks);

    // Every order: one answer for all its copies, its records and its
    // payment on its shard, nothing of it on the other.
    let (mut records_at_home, mut records_on_wrong_shard) = (0, 0);
    for id in &orders {
        if answers.get(id).map(HashSet::len) != Some(1) || refund_answers.get(id).map(HashSet::len) != Some(1) {
            eprintln!("   !! {id}: not one answer for all copies");
            errors.fetch_add(1, Ordering::Relaxed);
        }
        let key = idem::Key::new(id.as_str())?;
        let home = shard_of(id);
        for (s, pool) in shop.shards.iter().enumerate() {
            let mut found = 0;
            for scope in [PAID_SCOPE, REFUND_SCOPE] {
                let record = idem::sql::find_record(pool, scope, &key).await?;
                found += usize::from(record.is_some());
                if s == home && record.is_none_or(|r| r.status != idem::admin::RecordStatus::Done) {
                    eprintln!("   !! {id}: no completed {scope} record on its shard");
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            let payments: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM order_payments WHERE order_id = $1")
                .bind(id)
                .fetch_one(pool)
                .await?;
            if s == home {
                records_at_home += found;
            } else {
                records_on_wrong_shard += found;
            }
            if payments != i64::from(s == home) {
                eprintln!("   !! {id}: {payments} payments on {}", SHARDS[s]);
                errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    println!(
        "4. dedup and lease records: {records_at_home} on their order's shard (of {}), {records_on_wrong_shard} on the other",
        2 * orders.len()
    );

    let errors = errors.load(Ordering::Relaxed);
    println!(
        "shards={} orders={} callbacks={callbacks} executed={executed} replayed={replayed} refunds={callbacks} \
         refunds_executed={refunds_executed} bank_transfers={bank_transfers} records_on_wrong_shard={records_on_wrong_shard} \
         errors={errors}",
        SHARDS.len(),
        orders.len()
    );
    let ok = executed == orders.len()
        && replayed == callbacks - orders.len()
        && refunds_executed == orders.len()
        && bank_transfers == orders.len()
        && records_on_wrong_shard == 0
        && errors == 0;
    for pool in &shop.shards {
        pool.close().await;
    }
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
