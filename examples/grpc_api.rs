//! A payment method behind the gRPC idempotency layer: a client whose RPC
//! framework retries on timeout, sending the same call 100 times at once
//! with one `idempotency-key`. The handler runs once; the other calls are
//! told `ABORTED` (retry after the pushback) while it runs, then get its
//! response again, exactly; the same key with another amount is refused
//! (`FAILED_PRECONDITION`); the streaming method passes through.
//!
//! ```text
//! cargo run -p idem-grpc-demo --example grpc_api                      # SQLite, no server
//! cargo run -p idem-grpc-demo --example grpc_api -- --database-url postgres://postgres@127.0.0.1/test
//! cargo run -p idem-grpc-demo --example grpc_api -- --redis-url redis://127.0.0.1:6379/
//! ```
//!
//! (Built by a package of its own, `examples/grpc/`, so that tonic is compiled
//! for this example only; the service and its client are written by hand
//! over tonic's generic ones, so no `.proto` compiler is needed.)

mod common;

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use common::{BoxError, Store};
use idem::grpc::{IdempotencyLayer, RETRY_PUSHBACK};
use idem::lease::LeaseStore;
use idem_grpc_demo::{PAY, PayRequest, Payment, PaymentsClient, Shop, WATCH, keyed, replayed, serve};
use tonic::Code;

#[derive(Parser)]
struct Args {
    /// Keep the records in this database (postgres://, mysql://, sqlite:);
    /// default: SQLite in a temporary file.
    #[arg(long)]
    database_url: Option<String>,
    /// Keep the records in Redis instead.
    #[arg(long)]
    redis_url: Option<String>,
    /// How many copies of the call to send at once.
    #[arg(long, default_value_t = 100)]
    requests: usize,
}

/// The lease store the layer keeps its records in, its name, and the SQL
/// store to close at the end (SQLite's temporary file is removed).
async fn records(args: &Args) -> Result<(Arc<dyn LeaseStore>, &'static str, Option<Store>), BoxError> {
    if let Some(url) = &args.redis_url {
        let conn = redis::aio::ConnectionManager::new(redis::Client::open(url.as_str())?).await?;
        let prefix = format!("idem-example-grpc-{}:", common::run_id());
        return Ok((Arc::new(idem::store::RedisStore::new(conn, prefix)), "redis", None));
    }
    let store = Store::connect(args.database_url.as_deref(), 20).await?;
    let lease = store.lease_store().await?;
    Ok((lease, store.name(), Some(store)))
}

/// What one client saw, after retrying `ABORTED` as told.
enum Seen {
    Executed(Payment),
    Replayed(Payment),
    Failed(String),
}

/// One client: call, and while told `ABORTED`, wait the pushback (capped,
/// for the demo) and call again. Counts the refusals it met.
async fn client_run(mut client: PaymentsClient, key: String, message: PayRequest) -> (Seen, usize) {
    let mut aborted = 0;
    loop {
        match client.pay(keyed(&key, "acme-shop", message.clone())).await {
            Ok(response) if replayed(response.metadata()) => return (Seen::Replayed(response.into_inner()), aborted),
            Ok(response) => return (Seen::Executed(response.into_inner()), aborted),
            Err(status) if status.code() == Code::Aborted => {
                aborted += 1;
                let pushback = status.metadata().get(RETRY_PUSHBACK).and_then(|v| v.to_str().ok()?.parse().ok());
                tokio::time::sleep(Duration::from_millis(pushback.unwrap_or(50u64).min(100))).await;
            }
            Err(status) => return (Seen::Failed(format!("{status:?}")), aborted),
        }
    }
}

/// What the clients of step 1 saw, together.
#[derive(Default)]
struct Tally {
    executed: Vec<Payment>,
    replays: Vec<Payment>,
    aborted: usize,
    errors: usize,
}

/// `n` clients sending the same call at once, each until it has an answer.
async fn copies(client: &PaymentsClient, key: &str, n: usize) -> Result<Tally, BoxError> {
    // The handler takes 200 ms: the copies arrive while it runs.
    let message = PayRequest { amount_cents: 4_200, delay_ms: 200, ..Default::default() };
    let tasks: Vec<_> =
        (0..n).map(|_| tokio::spawn(client_run(client.clone(), key.to_owned(), message.clone()))).collect();
    let mut tally = Tally::default();
    for task in tasks {
        let (seen, met) = task.await?;
        tally.aborted += met;
        match seen {
            Seen::Executed(payment) => tally.executed.push(payment),
            Seen::Replayed(payment) => tally.replays.push(payment),
            Seen::Failed(why) => {
                eprintln!("   a client failed: {why}");
                tally.errors += 1;
            }
        }
    }
    // Every replay is the first call's response.
    tally.errors += tally.replays.iter().filter(|p| tally.executed.first() != Some(*p)).count();
    Ok(tally)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let (store, name, sql) = records(&args).await?;
    let layer = IdempotencyLayer::new(store)
        .scope("example.payments.grpc")
        .required(true)
        .pass_through([WATCH])
        .tenant(|request| request.headers.get("x-client").and_then(|v| v.to_str().ok()).map(str::to_owned));
    let shop = Shop::default();
    let addr = serve(shop.clone(), layer).await;
    let client = PaymentsClient::connect(addr).await?;
    let key = format!("pay-{}", common::run_id());
    println!("{PAY} on {addr}, idempotency-key {key:?}, records in {name}");

    println!("1. {} copies of one payment call, at once:", args.requests);
    let Tally { executed, replays, aborted, mut errors } = copies(&client, &key, args.requests).await?;
    println!(
        "   the handler ran {} time(s); {} clients got its response replayed; ABORTED was answered {aborted} times to \
         clients that came while it ran",
        shop.runs(),
        replays.len()
    );

    println!("2. the same key with another amount:");
    let other = PayRequest { amount_cents: 9_900, ..Default::default() };
    let mismatch = client.clone().pay(keyed(&key, "acme-shop", other)).await;
    let mismatches = usize::from(matches!(&mismatch, Err(status) if status.code() == Code::FailedPrecondition));
    println!("   {:?}", mismatch.map(|r| r.into_inner()).map_err(|s| (s.code(), s.message().to_owned())));

    println!("3. the streaming method, passed through with the same key:");
    let streamed = client.clone().watch(keyed(&key, "acme-shop", PayRequest::default())).await?;
    println!("   {} messages streamed", streamed.len());

    errors +=
        (1 - mismatches) + usize::from(streamed.len() != 3) + usize::from(executed.len() != 1 || shop.runs() != 1);
    if let Some(sql) = sql {
        sql.close().await;
    }
    println!(
        "requests={} executed={} replayed={} aborted={aborted} mismatches={mismatches} errors={errors}",
        args.requests,
        shop.runs(),
        replays.len()
    );
    if errors > 0 {
        std::process::exit(1);
    }
    Ok(())
}
