//! Transfers in recorded steps (reserve -> charge -> ledger -> notify)
//! under `strategy = "lease"`, with workers killed at random points: a
//! worker's future is dropped mid-body, its lease runs out, and the next
//! worker takes the record over and resumes at the first step without a
//! result. The bank deduplicates on each step's key, as a payment API does
//! on an idempotency key: a charge that was in flight when its worker died
//! is re-sent with the same key and taken once. On a SQL store the ledger
//! entry is a row of the same database, written in the step's own
//! transaction with its record (`run_tx`): a worker killed in it leaves no
//! row, and the ledger needs no unique key to hold one row a transfer.
//!
//! ```text
//! cargo run --example transfer_steps                      # SQLite in a temp file
//! cargo run --example transfer_steps -- --database-url postgres://postgres@127.0.0.1/test
//! cargo run --example transfer_steps -- --redis-url redis://127.0.0.1/
//! ```

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use common::{BoxError, Store};
use idem::lease::{LeaseStore, StepKey, Steps};
use idem::{Claim, Error, Guard};

#[derive(Parser)]
#[command(about = "Transfers in recorded steps, workers killed at random points: each charge taken once")]
struct Args {
    /// postgres://..., mysql://... or sqlite:PATH; default: SQLite in a temporary file.
    #[arg(long)]
    database_url: Option<String>,
    /// Keep the lease records and their steps in Redis instead.
    #[arg(long)]
    redis_url: Option<String>,
    /// How many transfers.
    #[arg(long, default_value_t = 40)]
    transfers: usize,
}

/// The bank: takes a charge once per key, however often it is sent.
#[derive(Default)]
struct Bank {
    taken: Mutex<HashMap<String, u64>>,
    sent: AtomicUsize,
}

impl Bank {
    async fn charge(&self, key: &StepKey, cents: u64) -> u64 {
        self.sent.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(3)).await;
        *self.taken.lock().unwrap().entry(key.to_string()).or_insert(cents)
    }
}

/// What the run saw.
#[derive(Default)]
struct Counts {
    attempts: AtomicUsize,
    takeovers: AtomicUsize,
    resumed: AtomicUsize,
    /// The ledger: an entry per transfer, keyed by the step's key as a
    /// ledger with a unique column is (a step in flight at a crash runs
    /// again; its entry is not written twice).
    ledger: Mutex<HashMap<String, String>>,
}

/// A small generator of random points (no dependency for a demo).
struct Dice(AtomicU64);

impl Dice {
    fn below(&self, n: u64) -> u64 {
        let mut x = self.0.load(SeqCst);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0.store(x, SeqCst);
        x % n
    }
}

/// The ledger's table on a SQL store: no unique key, the atomic phase
/// alone keeps it to one row a transfer.
const LEDGER: &str = "CREATE TABLE IF NOT EXISTS idem_example_ledger (transfer_id VARCHAR(191) NOT NULL)";

/// The transfer's body, four recorded steps.
async fn transfer(steps: Steps<'_>, id: &str, db: Option<&Store>, bank: &Bank, counts: &Counts) -> Result<u64, Error> {
    if idem::lease::current().is_some_and(|l| l.reclaimed) {
        counts.takeovers.fetch_add(1, SeqCst);
        if steps.recorded() > 0 {
            counts.resumed.fetch_add(1, SeqCst);
        }
    }
    let cents = steps.run("reserve", |_| async { Ok::<_, Error>(1_000u64) }).await?;
    let charged = steps.run("charge", |key| async move { Ok::<_, Error>(bank.charge(&key, cents).await) }).await?;
    match db {
        // A row in the lease records' database, committed with the step's record.
        Some(db) => common::on_pool!(db, pool => steps.run_tx("ledger", pool, |tx, _| Box::pin(async move {
            let insert = common::sql(db.name(), "INSERT INTO idem_example_ledger (transfer_id) VALUES (?)");
            sqlx::query(insert).bind(id).execute(&mut **tx).await?;
            Ok::<_, Error>(())
        })).await?),
        None => {
            steps
                .run("ledger", |key| async move {
                    counts.ledger.lock().unwrap().entry(key.to_string()).or_insert_with(|| id.to_owned());
                    Ok::<_, Error>(())
                })
                .await?
        }
    }
    steps.run("notify", |_| async { Ok::<_, Error>(()) }).await?;
    Ok(charged)
}

/// Workers take the transfer in turn until one finishes it; each may be
/// killed (its future dropped) at a random point of its body.
async fn settle(
    store: &dyn LeaseStore,
    db: Option<&Store>,
    id: &str,
    bank: &Bank,
    counts: &Counts,
    dice: &Dice,
) -> Result<u64, Error> {
    let lease = Duration::from_millis(250);
    let mut attempts = 0;
    loop {
        attempts += 1;
        counts.attempts.fetch_add(1, SeqCst);
        let claim = Guard::new("examples.transfer_steps").key(id).lease_or_wait::<u64>(store, lease, lease * 4);
        let done = match claim.await {
            Ok(Claim::Replay(charged)) => return Ok(charged),
            Ok(Claim::Run(ticket)) => {
                let body = ticket.run_steps(|steps| transfer(steps, id, db, bank, counts));
                // Half the workers die somewhere within their first 15 ms:
                // the next worker waits out the lease.
                if dice.below(2) == 0 {
                    match tokio::time::timeout(Duration::from_millis(dice.below(15)), body).await {
                        Ok(done) => done,
                        Err(_) => continue, // killed
                    }
                } else {
                    body.await
                }
            }
            Err(e) => Err(e),
        };
        match done {
            // A worker that lost its lease, or met a busy store, gives the
            // transfer back to the queue, as a job runner does.
            Err(e) if attempts < 100 && (e.is_retryable() || matches!(e, Error::LeaseLost { .. })) => continue,
            done => return done,
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let (store, name, sql): (Arc<dyn LeaseStore>, &str, Option<Store>) = match &args.redis_url {
        Some(url) => {
            let conn = redis::aio::ConnectionManager::new(redis::Client::open(url.as_str())?).await?;
            let prefix = format!("idem-example-steps-{}:", common::run_id());
            (Arc::new(idem::store::RedisStore::new(conn, prefix)), "redis", None)
        }
        None => {
            let db = Store::connect(args.database_url.as_deref(), 16).await?;
            (db.lease_store().await?, db.name(), Some(db))
        }
    };
    if let Some(db) = &sql {
        common::on_pool!(db, pool => sqlx::raw_sql(LEDGER).execute(pool).await.map(drop)?);
    }
    println!("{} transfers, reserve -> charge -> ledger -> notify, records in {name}", args.transfers);
    let (bank, counts) = (Bank::default(), Counts::default());
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(7, |d| d.as_nanos() as u64);
    let dice = Dice(AtomicU64::new(seed | 1));
    let run = common::run_id();
    let ids: Vec<String> = (0..args.transfers).map(|i| format!("X{run}-{i}")).collect();
    let settled = ids.iter().map(|id| settle(&*store, sql.as_ref(), id, &bank, &counts, &dice));
    let mut lost = 0;
    let mut errors = 0;
    for (id, done) in ids.iter().zip(join_all(settled.collect()).await) {
        match done {
            Ok(1_000) => {}
            Ok(other) => {
                eprintln!("   {id}: charged {other}");
                errors += 1;
            }
            Err(e) => {
                eprintln!("   {id}: {e}");
                lost += 1;
            }
        }
    }
    let taken = bank.taken.lock().unwrap().len();
    let booked: Vec<String> = match &sql {
        Some(db) => common::on_pool!(db, pool => {
            let select = common::sql(db.name(), "SELECT transfer_id FROM idem_example_ledger WHERE transfer_id LIKE ?");
            sqlx::query_scalar(select).bind(format!("X{run}-%")).fetch_all(pool).await?
        }),
        None => counts.ledger.lock().unwrap().values().cloned().collect(),
    };
    // Money taken twice for one transfer, a ledger entry missing or twice.
    let duplicate_charges = taken.saturating_sub(args.transfers);
    lost += ids.iter().filter(|id| !booked.contains(*id)).count();
    errors += booked.len().saturating_sub(args.transfers);
    println!(
        "   {} worker attempts; {} take-overs, {} of them resumed past a recorded step; the bank was sent {} \
         charges and took {taken}",
        counts.attempts.load(SeqCst),
        counts.takeovers.load(SeqCst),
        counts.resumed.load(SeqCst),
        bank.sent.load(SeqCst),
    );
    println!(
        "transfers={} takeovers={} resumed={} bank_charges={taken} duplicate_charges={duplicate_charges} lost={lost} \
         errors={errors}",
        args.transfers,
        counts.takeovers.load(SeqCst),
        counts.resumed.load(SeqCst),
    );
    if let Some(db) = sql {
        db.close().await;
    }
    if duplicate_charges > 0 || lost > 0 || errors > 0 {
        std::process::exit(1);
    }
    Ok(())
}

/// Every future of `futures` to its end, polled together.
async fn join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut running: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = running.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, slot) in running.iter_mut().zip(done.iter_mut()) {
            if slot.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => *slot = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending { std::task::Poll::Pending } else { std::task::Poll::Ready(()) }
    })
    .await;
    done.into_iter().map(|v| v.expect("finished")).collect()
}
