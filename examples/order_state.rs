//! The seed's order lifecycle as a state machine: WAIT_PAY -> PAID ->
//! SHIPPED -> FINISHED (or CANCELED). Every status change is a
//! compare-and-set in the caller's transaction, so a repeat changes nothing
//! and succeeds silently, while an illegal move (paying or canceling a
//! finished order) is refused as an error, never mistaken for a repeat.
//!
//! ```text
//! cargo run --example order_state                        # SQLite, no server
//! cargo run --example order_state -- --database-url postgres://postgres@127.0.0.1/test
//! cargo run --example order_state -- --database-url mysql://root@127.0.0.1/test
//! ```

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use clap::Parser;
use common::{AppError, BoxError, OrderStatus, Shop, Store};
use idem::{Outcome, idempotent};
use sqlx::Transaction;

/// The pay callback: the coupon hangs off the WAIT_PAY -> PAID transition,
/// so it is granted exactly when the order becomes paid.
#[idempotent(
    key = "trade_no",
    strategy = "state",
    scope = "shop.order.pay",
    transition = "OrderStatus::WaitPay -> OrderStatus::Paid"
)]
async fn on_paid<DB: Shop>(tx: &mut Transaction<'_, DB>, trade_no: &str, user_id: i64) -> Result<(), AppError>
where
    DB::Connection: Send,
{
    DB::insert_coupon(tx, trade_no, user_id).await?;
    DB::bump_user(tx, user_id).await?;
    Ok(())
}

#[idempotent(
    key = "trade_no",
    strategy = "state",
    scope = "shop.order.ship",
    transition = "OrderStatus::Paid -> OrderStatus::Shipped"
)]
async fn ship<DB: Shop>(tx: &mut Transaction<'_, DB>, trade_no: &str) -> Result<(), AppError>
where
    DB::Connection: Send,
{
    let _ = (&tx, trade_no); // e.g. write the waybill here
    Ok(())
}

#[idempotent(
    key = "trade_no",
    strategy = "state",
    scope = "shop.order.finish",
    transition = "OrderStatus::Shipped -> OrderStatus::Finished"
)]
async fn finish<DB: Shop>(tx: &mut Transaction<'_, DB>, trade_no: &str) -> Result<(), AppError>
where
    DB::Connection: Send,
{
    let _ = (&tx, trade_no);
    Ok(())
}

#[idempotent(
    key = "trade_no",
    strategy = "state",
    scope = "shop.order.cancel",
    transition = "OrderStatus::WaitPay | OrderStatus::Paid -> OrderStatus::Canceled"
)]
async fn cancel<DB: Shop>(tx: &mut Transaction<'_, DB>, trade_no: &str) -> Result<(), AppError>
where
    DB::Connection: Send,
{
    let _ = (&tx, trade_no); // e.g. start the refund here
    Ok(())
}

#[derive(Parser)]
#[command(about = "An order's status machine: repeats succeed silently, illegal moves are errors")]
struct Args {
    /// postgres://..., mysql://... or sqlite:PATH; default: SQLite in a temporary file.
    #[arg(long)]
    database_url: Option<String>,
    /// Concurrent pay callbacks in the burst.
    #[arg(long, default_value_t = 100)]
    clients: usize,
}

/// What happened to each request, counted.
#[derive(Default)]
struct Tally {
    executed: AtomicUsize,
    repeats_ok: AtomicUsize,
    illegal_rejected: AtomicUsize,
    errors: AtomicUsize,
}

impl Tally {
    /// Count one request's result and describe it.
    fn count(&self, result: &Result<(), AppError>, outcome: Option<Outcome>) -> String {
        match (result, outcome) {
            (Ok(()), Some(Outcome::Executed)) => {
                self.executed.fetch_add(1, Ordering::Relaxed);
                "moved; the body ran".to_owned()
            }
            (Ok(()), _) => {
                self.repeats_ok.fetch_add(1, Ordering::Relaxed);
                "a repeat: already there, nothing changed, success".to_owned()
            }
            (Err(AppError::Idem(idem::Error::IllegalTransition { current, .. })), _) => {
                self.illegal_rejected.fetch_add(1, Ordering::Relaxed);
                format!("REFUSED: illegal from {current}")
            }
            (Err(e), _) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                format!("error: {e}")
            }
        }
    }
}

/// The requests the shop receives.
#[derive(Clone, Copy)]
enum Request {
    Pay,
    Ship,
    Finish,
    Cancel,
}

/// One request in its own transaction.
async fn request<DB: Shop>(
    pool: &sqlx::Pool<DB>,
    req: Request,
    trade_no: &str,
) -> (Result<(), AppError>, Option<Outcome>)
where
    DB::Connection: Send,
{
    let mut tx = match pool.begin().await {
        Ok(tx) => tx,
        Err(e) => return (Err(e.into()), None),
    };
    let (result, outcome) = idem::observe(async {
        match req {
            Request::Pay => on_paid(&mut tx, trade_no, 42).await,
            Request::Ship => ship(&mut tx, trade_no).await,
            Request::Finish => finish(&mut tx, trade_no).await,
            Request::Cancel => cancel(&mut tx, trade_no).await,
        }
    })
    .await;
    let result = match result {
        Ok(()) => tx.commit().await.map_err(AppError::from),
        Err(e) => Err(e), // tx dropped: rolled back
    };
    (result, outcome)
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

async fn run<DB: Shop>(store: &str, pool: &sqlx::Pool<DB>, args: &Args) -> Result<bool, BoxError>
where
    DB::Connection: Send,
{
    DB::setup(pool).await?;
    let prefix = format!("S{}-", common::run_id());
    DB::create_orders(pool, &prefix, 1, 2).await?;
    let trade_no = format!("{prefix}1");
    let status = OrderStatus::label;
    println!("store={store}: order {trade_no} is {}", status(DB::order_status(pool, &trade_no).await?));
    let tally = Arc::new(Tally::default());

    println!("1. the pay callback arrives from {} concurrent clients at once:", args.clients);
    let mut tasks = Vec::new();
    for _ in 0..args.clients {
        let (pool, trade_no, tally) = (pool.clone(), trade_no.clone(), tally.clone());
        tasks.push(tokio::spawn(async move {
            let (result, outcome) = request(&pool, Request::Pay, &trade_no).await;
            tally.count(&result, outcome)
        }));
    }
    let mut burst: std::collections::BTreeMap<String, usize> = Default::default();
    for t in tasks {
        *burst.entry(t.await?).or_default() += 1;
    }
    for (what, n) in burst {
        println!("   {n} x {what}");
    }

    println!("2. then the gateway retries it 6 more times:");
    for attempt in 1..=6 {
        let (result, outcome) = request(pool, Request::Pay, &trade_no).await;
        println!("   pay #{attempt}: {}", tally.count(&result, outcome));
    }

    println!("   the order is {}", status(DB::order_status(pool, &trade_no).await?));

    println!("3. the warehouse ships it (and its retry repeats the request), then it is delivered:");
    for (step, req) in [("ship", Request::Ship), ("ship (retry)", Request::Ship), ("finish", Request::Finish)] {
        let (result, outcome) = request(pool, req, &trade_no).await;
        println!("   {step}: {}", tally.count(&result, outcome));
    }

    println!("4. late and wrong requests:");
    let (result, outcome) = request(pool, Request::Pay, &trade_no).await;
    println!("   a pay callback for the finished order: {}", tally.count(&result, outcome));
    let (result, outcome) = request(pool, Request::Cancel, &trade_no).await;
    println!("   a cancel of the finished order: {}", tally.count(&result, outcome));

    let coupons = DB::coupons_for(pool, &trade_no).await?;
    let final_status = status(DB::order_status(pool, &trade_no).await?);
    let executed = tally.executed.load(Ordering::Relaxed);
    let repeats_ok = tally.repeats_ok.load(Ordering::Relaxed);
    let illegal = tally.illegal_rejected.load(Ordering::Relaxed);
    let errors = tally.errors.load(Ordering::Relaxed);
    println!(
        "store={store} transitions={executed} repeats_ok={repeats_ok} illegal_rejected={illegal} \
         coupons_granted={coupons} final_status={final_status} errors={errors}"
    );
    Ok(coupons == 1 && final_status == "FINISHED" && illegal == 2 && executed == 3 && errors == 0)
}
