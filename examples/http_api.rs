//! A payment endpoint behind the `Idempotency-Key` layer: a client that
//! times out and retries, sent 100 times at once with one key. The handler
//! runs once; the others are told to wait (409) or get the first response
//! again, exactly; the same key with another amount is refused (422). With
//! `--wait`, the layer holds the copies until the first response is there
//! and replays it: no client meets a 409.
//!
//! ```text
//! cargo run -p idem-http-demo --example http_api                      # SQLite, no server
//! cargo run -p idem-http-demo --example http_api -- --wait
//! cargo run -p idem-http-demo --example http_api -- --database-url postgres://postgres@127.0.0.1/test
//! cargo run -p idem-http-demo --example http_api -- --redis-url redis://127.0.0.1:6379/ --wait
//! ```
//!
//! (Built by a package of its own, `examples/http/`, so that axum and the HTTP client
//! are compiled for this example only.)

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use idem::http::IdempotencyLayer;
use idem::lease::LeaseStore;
use idem_http_demo::{Payment, PaymentRequest, Shop, app, serve};
use reqwest::StatusCode;

#[derive(Parser)]
struct Args {
    /// Keep the records in this database (postgres://, mysql://, sqlite:);
    /// default: SQLite in a temporary file.
    #[arg(long)]
    database_url: Option<String>,
    /// Keep the records in Redis instead.
    #[arg(long)]
    redis_url: Option<String>,
    /// How many copies of the request to send at once.
    #[arg(long, default_value_t = 100)]
    requests: usize,
    /// Hold a copy that arrives while the first request runs (up to 5 s)
    /// and replay the first response to it, instead of answering 409.
    #[arg(long)]
    wait: bool,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn store(args: &Args) -> Result<(Arc<dyn LeaseStore>, &'static str), BoxError> {
    if let Some(url) = &args.redis_url {
        let client = redis::Client::open(url.as_str())?;
        let conn = redis::aio::ConnectionManager::new(client.clone()).await?;
        // Notices wake a waiting copy as soon as the first request ends.
        let store = idem::store::RedisStore::new(conn, "idem-example-http:").notifications(&client).await?;
        return Ok((Arc::new(store), "redis"));
    }
    let url = match &args.database_url {
        Some(url) => url.clone(),
        None => {
            let path = std::env::temp_dir().join(format!("idem-http-{}.db", std::process::id()));
            format!("sqlite://{}?mode=rwc", path.display())
        }
    };
    Ok(if url.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(&url).await?;
        idem::migrate(&pool).await?;
        (Arc::new(idem::store::SqlStore::new(pool)), "postgres")
    } else if url.starts_with("mysql") {
        let pool = sqlx::MySqlPool::connect(&url).await?;
        idem::migrate(&pool).await?;
        (Arc::new(idem::store::SqlStore::new(pool)), "mysql")
    } else {
        let pool = sqlx::SqlitePool::connect(&url).await?;
        idem::migrate(&pool).await?;
        (Arc::new(idem::store::SqlStore::new(pool)), "sqlite")
    })
}

/// What one client saw, after retrying a 409 as told.
#[derive(Debug)]
enum Seen {
    Executed(Payment),
    Replayed(Payment),
    Failed(String),
}

async fn send(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    body: &PaymentRequest,
) -> reqwest::Result<reqwest::Response> {
    client
        .post(format!("{base}/payments"))
        .header("x-client", "acme-shop")
        .header("idempotency-key", format!("\"{key}\""))
        .json(body)
        .send()
        .await
}

/// One client: send, and while told 409, wait `Retry-After` (capped, for
/// the demo) and send again. Counts the conflicts it met.
async fn client_run(client: reqwest::Client, base: String, key: String, body: PaymentRequest) -> (Seen, usize) {
    let mut conflicts = 0;
    loop {
        let response = match send(&client, &base, &key, &body).await {
            Ok(r) => r,
            Err(e) => return (Seen::Failed(e.to_string()), conflicts),
        };
        let replayed = response.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
        match response.status() {
            StatusCode::CREATED => {
                let payment = match response.json::<Payment>().await {
                    Ok(p) => p,
                    Err(e) => return (Seen::Failed(e.to_string()), conflicts),
                };
                return (if replayed { Seen::Replayed(payment) } else { Seen::Executed(payment) }, conflicts);
            }
            StatusCode::CONFLICT => {
                conflicts += 1;
                let wait = response
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                    .map_or(Duration::from_millis(50), |s| Duration::from_secs(s).min(Duration::from_millis(100)));
                tokio::time::sleep(wait).await;
            }
            other => {
                return (Seen::Failed(format!("{other}: {}", response.text().await.unwrap_or_default())), conflicts);
            }
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let (store, name) = store(&args).await?;
    let layer = IdempotencyLayer::new(store)
        .scope("example.payments")
        .required(true)
        .tenant(|request| request.headers.get("x-client").and_then(|v| v.to_str().ok()).map(str::to_owned))
        .wait(if args.wait { Duration::from_secs(5) } else { Duration::ZERO });
    let shop = Shop::default();
    let base = format!("http://{}", serve(app(shop.clone(), layer)).await);
    let key = format!(
        "pay-{}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
    );
    let client = reqwest::Client::new();
    let waits = if args.wait { ", copies wait for the first" } else { "" };
    println!("POST {base}/payments, Idempotency-Key \"{key}\", records in {name}{waits}");

    // The handler takes 200 ms: the copies arrive while it runs.
    let body = PaymentRequest { amount_cents: 4_200, delay_ms: Some(200), ..Default::default() };
    println!("1. {} copies of one payment request, at once:", args.requests);
    let tasks: Vec<_> = (0..args.requests)
        .map(|_| tokio::spawn(client_run(client.clone(), base.clone(), key.clone(), body.clone())))
        .collect();
    let (mut executed, mut replayed, mut conflicts, mut errors) = (Vec::new(), 0, 0, 0);
    for task in tasks {
        let (seen, met) = task.await?;
        conflicts += met;
        match seen {
            Seen::Executed(p) => executed.push(p),
            Seen::Replayed(p) => {
                replayed += 1;
                if executed.first().is_some_and(|first: &Payment| *first != p) {
                    errors += 1;
                }
            }
            Seen::Failed(why) => {
                eprintln!("   a client failed: {why}");
                errors += 1;
            }
        }
    }
    println!(
        "   the handler ran {} time(s); {replayed} clients got its response replayed; 409 was answered {conflicts} times \
         to clients that came while it ran",
        shop.runs()
    );

    println!("2. the same key with another amount:");
    let other = PaymentRequest { amount_cents: 9_900, ..Default::default() };
    let mismatch = send(&client, &base, &key, &other).await?;
    let mismatches = usize::from(mismatch.status() == StatusCode::UNPROCESSABLE_ENTITY);
    println!("   {} {}", mismatch.status(), mismatch.text().await.unwrap_or_default());
    errors += 1 - mismatches;

    if executed.len() != 1 || shop.runs() != 1 {
        errors += 1;
    }
    println!(
        "requests={} executed={} replayed={replayed} conflicts={conflicts} mismatches_422={mismatches} errors={errors}",
        args.requests + 1,
        shop.runs()
    );
    if errors > 0 {
        std::process::exit(1);
    }
    Ok(())
}
