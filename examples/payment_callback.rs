//! The seed incident: a payment gateway fires the same "paid" callback six
//! times, then 100 concurrent clients send 1,000 more copies of it, then a
//! second trade arrives. Every copy gets the first answer; exactly one coupon
//! is granted per trade number.
//!
//! With `--strategy dedup+state` the handler also moves the order WAIT_PAY ->
//! PAID in the same transaction (the seeds' two lines of defence: either the
//! dedup record or the status check alone keeps the coupon single).
//!
//! With `--strategy unique` it runs the seed's first scheme: the payment
//! table's own unique key (`payment_record`, `uk_pay_no`) is the guard. The
//! handler inserts the payment row (with the coupon it granted); a repeat's
//! insert fails on `uk_pay_no`, its coupon is rolled back with it, and the
//! existing row answers. Nothing of idem's is written.
//!
//! ```text
//! cargo run --example payment_callback                        # SQLite, no server
//! cargo run --example payment_callback -- --strategy dedup+state
//! cargo run --example payment_callback -- --strategy unique --database-url postgres://postgres@127.0.0.1/test
//! cargo run --example payment_callback -- --database-url postgres://postgres@127.0.0.1/test
//! cargo run --example payment_callback -- --database-url mysql://root@127.0.0.1/test
//! ```

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use clap::{Parser, ValueEnum};
use common::{AppError, BoxError, OrderStatus, Shop, Store};
use idem::{Outcome, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::Transaction;

/// What the gateway posts when a payment succeeds.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct PayCallback {
    trade_no: String,
    user_id: i64,
    amount_cents: i64,
}

/// What the handler answers; every repeat gets the first one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Receipt {
    coupon_id: i64,
}

/// The guarded handler. The dedup record is written in `tx`, next to the
/// coupon: both commit, or neither does.
#[idempotent(key = "event.trade_no", fingerprint = "event", scope = "shop.on_pay_callback")]
async fn on_pay_callback<DB: Shop>(tx: &mut Transaction<'_, DB>, event: &PayCallback) -> Result<Receipt, AppError>
where
    DB::Connection: Send,
{
    let coupon_id = DB::insert_coupon(tx, &event.trade_no, event.user_id).await?;
    Ok(Receipt { coupon_id })
}

/// The same handler with both lines of defence: the dedup record and the
/// order's WAIT_PAY -> PAID compare-and-set, in one transaction. A repeat
/// whose record is gone (past retention) but whose order is already PAID is
/// still a repeat; it has no stored receipt to replay, hence `Option`.
#[idempotent(
    key = "event.trade_no",
    strategy = "dedup+state",
    fingerprint = "event",
    scope = "shop.on_pay_callback_state",
    transition = "OrderStatus::WaitPay -> OrderStatus::Paid"
)]
async fn on_pay_callback_state<DB: Shop>(
    tx: &mut Transaction<'_, DB>,
    event: &PayCallback,
) -> Result<Option<Receipt>, AppError>
where
    DB::Connection: Send,
{
    let coupon_id = DB::insert_coupon(tx, &event.trade_no, event.user_id).await?;
    Ok(Some(Receipt { coupon_id }))
}

/// The seed's first scheme: the payment row is the claim (its unique key
/// `uk_pay_no` stops the second insert), and a repeat's answer is read
/// from that row. The coupon is granted first: a repeat's coupon is rolled
/// back to the guard's savepoint with its failed insert.
#[idempotent(
    strategy = "unique",
    constraint = "uk_pay_no",
    replay = "existing_payment",
    scope = "shop.on_pay_callback_unique"
)]
async fn on_pay_callback_unique<DB: PaymentTable>(
    tx: &mut Transaction<'_, DB>,
    event: &PayCallback,
) -> Result<Receipt, AppError>
where
    DB::Connection: Send,
{
    let coupon_id = DB::insert_coupon(tx, &event.trade_no, event.user_id).await?;
    DB::insert_payment(tx, event, coupon_id).await?;
    Ok(Receipt { coupon_id })
}

/// A repeat's answer: the existing payment row's coupon.
async fn existing_payment<DB: PaymentTable>(
    tx: &mut Transaction<'_, DB>,
    event: &PayCallback,
) -> Result<Receipt, AppError>
where
    DB::Connection: Send,
{
    Ok(Receipt { coupon_id: DB::payment_coupon(tx, &event.trade_no).await? })
}

/// The seed's payment table, per database: its migration, the insert that
/// claims, and the read that answers a repeat.
trait PaymentTable: Shop {
    /// `payment_record` with its unique key `uk_pay_no`.
    const MIGRATION: &'static str;
    const INSERT: &'static str;
    /// Under MySQL's REPEATABLE READ a plain read sees the transaction's
    /// snapshot, which may predate the winner: a locking read sees it.
    const EXISTING: &'static str;

    /// Run [`MIGRATION`](Self::MIGRATION).
    fn migrate_payments(pool: &sqlx::Pool<Self>) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    fn insert_payment(
        conn: &mut Self::Connection,
        event: &PayCallback,
        coupon_id: i64,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    fn payment_coupon(
        conn: &mut Self::Connection,
        pay_no: &str,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;
}

macro_rules! payment_table {
    ($db:ty, migration = $migration:literal, insert = $insert:literal, existing = $existing:literal) => {
        impl PaymentTable for $db {
            const MIGRATION: &'static str = $migration;
            const INSERT: &'static str = $insert;
            const EXISTING: &'static str = $existing;

            async fn migrate_payments(pool: &sqlx::Pool<Self>) -> Result<(), sqlx::Error> {
                sqlx::raw_sql(Self::MIGRATION).execute(pool).await.map(drop)
            }

            async fn insert_payment(
                conn: &mut Self::Connection,
                event: &PayCallback,
                coupon_id: i64,
            ) -> Result<(), sqlx::Error> {
                sqlx::query(Self::INSERT)
                    .bind(&event.trade_no)
                    .bind(event.amount_cents)
                    .bind(coupon_id)
                    .execute(conn)
                    .await
                    .map(drop)
            }

            async fn payment_coupon(conn: &mut Self::Connection, pay_no: &str) -> Result<i64, sqlx::Error> {
                sqlx::query_scalar(Self::EXISTING).bind(pay_no).fetch_one(conn).await
            }
        }
    };
}

payment_table!(
    sqlx::Sqlite,
    migration = "CREATE TABLE IF NOT EXISTS payment_record (id INTEGER PRIMARY KEY AUTOINCREMENT, \
                 pay_no TEXT NOT NULL, amount_cents INTEGER NOT NULL, coupon_id INTEGER NOT NULL);
                 CREATE UNIQUE INDEX IF NOT EXISTS uk_pay_no ON payment_record (pay_no);",
    insert = "INSERT INTO payment_record (pay_no, amount_cents, coupon_id) VALUES (?, ?, ?)",
    existing = "SELECT coupon_id FROM payment_record WHERE pay_no = ?"
);
payment_table!(
    sqlx::Postgres,
    migration = "CREATE TABLE IF NOT EXISTS payment_record (id BIGSERIAL PRIMARY KEY, pay_no VARCHAR(64) NOT NULL, \
                 amount_cents BIGINT NOT NULL, coupon_id BIGINT NOT NULL, CONSTRAINT uk_pay_no UNIQUE (pay_no));",
    insert = "INSERT INTO payment_record (pay_no, amount_cents, coupon_id) VALUES ($1, $2, $3)",
    existing = "SELECT coupon_id FROM payment_record WHERE pay_no = $1"
);
payment_table!(
    sqlx::MySql,
    migration = "CREATE TABLE IF NOT EXISTS payment_record (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
                 pay_no VARCHAR(64) NOT NULL, amount_cents BIGINT NOT NULL, coupon_id BIGINT NOT NULL, \
                 UNIQUE KEY uk_pay_no (pay_no)) ENGINE = InnoDB;",
    insert = "INSERT INTO payment_record (pay_no, amount_cents, coupon_id) VALUES (?, ?, ?)",
    existing = "SELECT coupon_id FROM payment_record WHERE pay_no = ? LOCK IN SHARE MODE"
);

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Strategy {
    /// The dedup record alone.
    Dedup,
    /// The dedup record and the order's status check.
    #[value(name = "dedup+state")]
    DedupState,
    /// The payment table's own unique key; nothing of idem's written.
    Unique,
}

/// One delivery: begin, handle, commit.
async fn deliver<DB: PaymentTable>(
    pool: &sqlx::Pool<DB>,
    strategy: Strategy,
    event: &PayCallback,
) -> Result<(Receipt, Outcome), AppError>
where
    DB::Connection: Send,
{
    let mut tx = pool.begin().await?;
    let (receipt, outcome) = match strategy {
        Strategy::Dedup => idem::observe(on_pay_callback(&mut tx, event)).await,
        Strategy::Unique => idem::observe(on_pay_callback_unique(&mut tx, event)).await,
        Strategy::DedupState => {
            let (receipt, outcome) = idem::observe(on_pay_callback_state(&mut tx, event)).await;
            let receipt = receipt
                .and_then(|r| r.ok_or_else(|| AppError::Unexpected("a repeat without its stored receipt".to_owned())));
            (receipt, outcome)
        }
    };
    let receipt = receipt?;
    tx.commit().await?;
    Ok((receipt, outcome.expect("a guard ran")))
}

#[derive(Parser)]
#[command(about = "A gateway's duplicate pay callbacks grant one coupon")]
struct Args {
    /// postgres://..., mysql://... or sqlite:PATH; default: SQLite in a temporary file.
    #[arg(long)]
    database_url: Option<String>,
    /// Concurrent clients in the burst.
    #[arg(long, default_value_t = 100)]
    clients: usize,
    /// Duplicates sent by the burst.
    #[arg(long, default_value_t = 1000)]
    duplicates: usize,
    /// How the handler is guarded.
    #[arg(long, value_enum, default_value = "dedup")]
    strategy: Strategy,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let store = Store::connect(args.database_url.as_deref(), 20).await?;
    let ok = match &store {
        Store::Sqlite(pool, _) => run(store.name(), pool, &args).await?,
        Store::Postgres(pool) => run(store.name(), pool, &args).await?,
        Store::MySql(pool) => run(store.name(), pool, &args).await?,
    };
    store.close().await;
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}

async fn run<DB: PaymentTable>(store: &str, pool: &sqlx::Pool<DB>, args: &Args) -> Result<bool, BoxError>
where
    DB::Connection: Send,
{
    idem::migrate(pool).await?;
    DB::setup(pool).await?;
    DB::migrate_payments(pool).await?;
    let run = common::run_id();
    let event = PayCallback { trade_no: format!("T{run}-1"), user_id: 42, amount_cents: 1999 };
    if args.strategy == Strategy::DedupState {
        // Orders T{run}-1 and T{run}-2, waiting for payment.
        DB::create_orders(pool, &format!("T{run}-"), 1, 3).await?;
    }
    let strategy = args.strategy.to_possible_value().expect("no skipped values");
    let strategy = strategy.get_name();
    println!("store={store} strategy={strategy}: the gateway reports trade {} as paid", event.trade_no);

    let replayed = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let mut callbacks = 0;

    println!("1. it sends the callback 6 times (it did not like our first answers):");
    let mut first: Option<Receipt> = None;
    for attempt in 1..=6 {
        callbacks += 1;
        match deliver(pool, args.strategy, &event).await {
            Ok((receipt, outcome)) => {
                let note = match outcome {
                    Outcome::Executed => "the handler ran and granted the coupon",
                    _ => "replayed the first answer, the handler did not run",
                };
                println!("   callback #{attempt}: coupon {} ({note})", receipt.coupon_id);
                if outcome == Outcome::Replayed {
                    replayed.fetch_add(1, Ordering::Relaxed);
                }
                if first.get_or_insert(receipt.clone()) != &receipt {
                    println!("   !! a different answer than the first");
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => {
                println!("   callback #{attempt}: error {e}");
                errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    println!("2. {} concurrent clients send {} more copies:", args.clients, args.duplicates);
    let replayed_before = replayed.load(Ordering::Relaxed);
    let errors_before = errors.load(Ordering::Relaxed);
    let clients = args.clients.max(1);
    let mut tasks = Vec::new();
    for client in 0..clients {
        let share = args.duplicates / clients + usize::from(client < args.duplicates % clients);
        let (pool, event, replayed, errors) = (pool.clone(), event.clone(), replayed.clone(), errors.clone());
        let strategy = args.strategy;
        let expected = first.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..share {
                match deliver(&pool, strategy, &event).await {
                    Ok((receipt, Outcome::Replayed)) if Some(&receipt) == expected.as_ref() => {
                        replayed.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok((receipt, outcome)) => {
                        eprintln!("   !! unexpected {outcome:?} {receipt:?}");
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        eprintln!("   !! error: {e}");
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    callbacks += args.duplicates;
    println!(
        "   {} replayed the first answer, {} failed",
        replayed.load(Ordering::Relaxed) - replayed_before,
        errors.load(Ordering::Relaxed) - errors_before
    );

    let other = PayCallback { trade_no: format!("T{run}-2"), user_id: 7, amount_cents: 500 };
    println!("3. a second trade, {}, arrives:", other.trade_no);
    callbacks += 1;
    match deliver(pool, args.strategy, &other).await {
        Ok((receipt, outcome)) => println!("   coupon {} ({})", receipt.coupon_id, outcome.as_str()),
        Err(e) => {
            println!("   error {e}");
            errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    if args.strategy == Strategy::DedupState {
        let paid = DB::order_status(pool, &event.trade_no).await? == OrderStatus::Paid.code();
        println!("   order {} is {}", event.trade_no, if paid { "PAID" } else { "NOT PAID" });
        if !paid {
            errors.fetch_add(1, Ordering::Relaxed);
        }
    }
    let granted = DB::coupons_for(pool, &event.trade_no).await?;
    let other_granted = DB::coupons_for(pool, &other.trade_no).await?;
    let replayed = replayed.load(Ordering::Relaxed);
    let errors = errors.load(Ordering::Relaxed);
    println!(
        "store={store} strategy={strategy} callbacks={callbacks} coupons_granted={granted} replayed={replayed} \
         other_trade_coupons={other_granted} errors={errors}"
    );
    Ok(granted == 1 && other_granted == 1 && errors == 0 && replayed == callbacks - 2)
}
