//! What the `Idempotency-Key` layer costs a request, measured side by side
//! in one run, in slices that take turns (order rotated each round) so that
//! every side sees the same machine:
//!
//! - `plain`: the handler with no layer (the floor);
//! - `idem_memory`: idem's layer, records in memory;
//! - `idem_redis`: idem's layer, records in Redis;
//! - `peer_redis`: the `idempotent` crate's (2.0) tower layer, records in
//!   the same Redis (its `ValkeyStore`).
//!
//! Two ways in:
//! - `--transport inproc`: the tower service called directly
//!   (`ServiceExt::oneshot` on the router), no network: the layer's own
//!   cost per request, in microseconds, without the HTTP stack's noise;
//! - `--transport http`: a real server on loopback and `--clients`
//!   concurrent reqwest clients with keep-alive: requests per second.
//!
//! Each request is a first call (a fresh key) or, with `--replays`, a
//! repeat of a completed one. Ends with one line of `key=value` pairs.
//!
//! ```text
//! cargo run --release --ignore-rust-version --manifest-path bench/http/Cargo.toml -- \
//!     --transport inproc --clients 1 --seconds 2 --rounds 5
//! cargo run --release --ignore-rust-version --manifest-path bench/http/Cargo.toml -- \
//!     --transport http --clients 16 --seconds 3 --rounds 5
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use clap::{Parser, ValueEnum};
use tower::ServiceExt as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Transport {
    Inproc,
    Http,
}

#[derive(Parser)]
struct Args {
    #[arg(long, value_enum, default_value = "inproc")]
    transport: Transport,
    #[arg(long, default_value = "redis://127.0.0.1:6379/")]
    redis_url: String,
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Seconds per slice.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Repeats of completed requests instead of first calls.
    #[arg(long)]
    replays: bool,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Sends one request with the given key to one side.
type Sender = Arc<dyn Fn(String) -> std::pin::Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>> + Send + Sync>;

const SIDES: [&str; 4] = ["plain", "idem_memory", "idem_redis", "peer_redis"];

/// The handler every side serves: it reads the request's body (as a real
/// handler of a POST does: without it the plain side would skip reading
/// the request, which the layers must do) and answers a small JSON.
async fn pay(body: axum::body::Bytes) -> (StatusCode, [(&'static str, &'static str); 1], &'static str) {
    std::hint::black_box(body);
    (StatusCode::CREATED, [("content-type", "application/json")], r#"{"payment_id":1,"amount_cents":500}"#)
}

fn router() -> Router {
    Router::new().route("/payments", post(pay))
}

async fn sides(redis_url: &str, run: &str) -> Result<Vec<(&'static str, Router)>, BoxError> {
    let conn = redis::aio::ConnectionManager::new(redis::Client::open(redis_url)?).await?;
    let idem_memory =
        idem::http::IdempotencyLayer::new(idem::store::MemoryStore::new()).scope(format!("bench.http.{run}"));
    let idem_redis =
        idem::http::IdempotencyLayer::new(idem::store::RedisStore::new(conn, format!("idem-bench-http-{run}:")))
            .scope(format!("bench.http.{run}"))
            // Ten minutes is plenty for a run; the keys are deleted at its end too.
            .retention(Duration::from_secs(600));
    let peer_store = idempotent::store::valkey::ValkeyStore::with_url(redis_url)
        .prefix(format!("peer-bench-http-{run}"))
        .try_build()
        .await?;
    let peer = idempotent::middleware::IdempotencyLayer::new(peer_store);
    Ok(vec![
        ("plain", router()),
        ("idem_memory", router().layer(idem_memory)),
        ("idem_redis", router().layer(idem_redis)),
        ("peer_redis", router().layer(peer)),
    ])
}

/// One slice: `clients` tasks send requests for `length`; the latencies
/// (ns) of the requests done. An error naming `side` if any request failed:
/// a rate measured beside failed requests compares different work, so it
/// is no figure to print.
async fn slice(
    side: &str,
    send: Sender,
    keys: Arc<dyn Fn(u64) -> String + Send + Sync>,
    clients: usize,
    length: Duration,
) -> Result<Vec<u64>, String> {
    let next = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + length;
    let mut tasks = Vec::new();
    for _ in 0..clients.max(1) {
        let (send, keys, next) = (send.clone(), keys.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let (mut latencies, mut failed, mut first) = (Vec::new(), 0u64, None);
            while Instant::now() < deadline {
                let key = keys(next.fetch_add(1, Ordering::Relaxed));
                let start = Instant::now();
                match send(key).await {
                    Ok(()) => latencies.push(start.elapsed().as_nanos() as u64),
                    Err(e) => {
                        failed += 1;
                        first.get_or_insert_with(|| e.to_string());
                    }
                }
            }
            (latencies, failed, first)
        }));
    }
    let (mut all, mut failed, mut first) = (Vec::new(), 0, None);
    for t in tasks {
        let (latencies, f, e) = t.await.expect("a client task");
        all.extend(latencies);
        failed += f;
        first = first.or(e);
    }
    match first {
        None => Ok(all),
        Some(e) => Err(format!("scenario http, side {side}: {failed} failed requests, the first: {e}")),
    }
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let run = format!("{}-{}", std::process::id(), Instant::now().elapsed().as_nanos());
    let run = format!("{run}-{}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_micros());
    let sides = sides(&args.redis_url, &run).await?;
    let length = Duration::from_secs_f64(args.seconds);
    let client = reqwest::Client::new();
    let mut bases = BTreeMap::new();
    let mut routers = BTreeMap::new();
    for (name, router) in &sides {
        if args.transport == Transport::Http {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            bases.insert(*name, format!("http://{}/payments", listener.local_addr()?));
            let app = router.clone();
            tokio::spawn(async move { axum::serve(listener, app).await });
        }
        routers.insert(*name, router.clone());
    }
    let sender = |name: &'static str| -> Sender {
        match args.transport {
            Transport::Inproc => {
                let router = routers[name].clone();
                Arc::new(move |key: String| {
                    let router = router.clone();
                    Box::pin(async move {
                        let request = Request::post("/payments")
                            .header("idempotency-key", format!("\"{key}\""))
                            .header("content-type", "application/json")
                            .body(Body::from(r#"{"amount_cents":500}"#))?;
                        let response = router.oneshot(request).await?;
                        let status = response.status();
                        // Read the body, as a server would send it.
                        let _ = http_body_util::BodyExt::collect(response.into_body()).await?;
                        if status == StatusCode::CREATED { Ok(()) } else { Err(format!("status {status}").into()) }
                    })
                })
            }
            Transport::Http => {
                let (client, base) = (client.clone(), bases[name].clone());
                Arc::new(move |key: String| {
                    let (client, base) = (client.clone(), base.clone());
                    Box::pin(async move {
                        let response = client
                            .post(base)
                            .header("idempotency-key", format!("\"{key}\""))
                            .header("content-type", "application/json")
                            .body(r#"{"amount_cents":500}"#)
                            .send()
                            .await?;
                        let status = response.status();
                        let _ = response.bytes().await?;
                        if status.as_u16() == 201 { Ok(()) } else { Err(format!("status {status}").into()) }
                    })
                })
            }
        }
    };
    // Replays: a fixed set of keys, each completed once before the timing.
    let replay_keys = 2_000u64;
    if args.replays {
        for name in SIDES {
            let send = sender(name);
            for i in 0..replay_keys {
                send(format!("r-{run}-{i}")).await?;
            }
        }
    }
    let keys = |tag: String| -> Arc<dyn Fn(u64) -> String + Send + Sync> {
        if args.replays {
            let run = run.clone();
            Arc::new(move |i| format!("r-{run}-{}", i % replay_keys))
        } else {
            Arc::new(move |i| format!("f-{tag}-{i}"))
        }
    };
    // Warm up every side once (connections, scripts loaded).
    for name in SIDES {
        let warm = slice(name, sender(name), keys(format!("{run}-w-{name}")), args.clients, Duration::from_millis(200));
        if let Err(e) = warm.await {
            forget(&args.redis_url, &run).await?;
            return Err(e.into());
        }
    }
    let mut rates: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut latencies: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for round in 0..args.rounds {
        let mut order = SIDES.to_vec();
        order.rotate_left(round % SIDES.len());
        for name in order {
            let lat = match slice(name, sender(name), keys(format!("{run}-{round}-{name}")), args.clients, length).await
            {
                Ok(lat) => lat,
                Err(e) => {
                    forget(&args.redis_url, &run).await?;
                    return Err(e.into());
                }
            };
            rates.entry(name).or_default().push(lat.len() as f64 / length.as_secs_f64());
            latencies.entry(name).or_default().extend(lat);
        }
        eprintln!(
            "round {round}: {:?}",
            SIDES.iter().map(|s| (*s, rates[s].last().map(|r| r.round()))).collect::<Vec<_>>()
        );
    }
    let kind = if args.replays { "replays" } else { "first calls" };
    println!("{kind}, {:?}, {} clients, {} rounds of {:?}:", args.transport, args.clients, args.rounds, length);
    let mut line = format!(
        "scenario=http transport={:?} mode={} clients={}",
        args.transport,
        if args.replays { "replay" } else { "first" },
        args.clients
    )
    .to_lowercase();
    let mut p50s = BTreeMap::new();
    for name in SIDES {
        let mut lat = latencies.remove(name).unwrap_or_default();
        lat.sort_unstable();
        let (p50, p99) = (percentile(&lat, 0.5), percentile(&lat, 0.99));
        let rate = median(rates[name].clone());
        println!("  {name:12} {rate:9.0} req/s  p50 {p50:8.1} us  p99 {p99:8.1} us");
        line.push_str(&format!(" {name}_per_s={rate:.0} {name}_p50_us={p50:.1}"));
        p50s.insert(name, (p50, rate));
    }
    let added = |name| p50s[name].0 - p50s["plain"].0;
    let per_round = |a: &str, b: &str| median(rates[a].iter().zip(&rates[b]).map(|(x, y)| x / y).collect());
    println!(
        "  added p50 latency: idem on memory {:.1} us, idem on Redis {:.1} us, the peer on Redis {:.1} us",
        added("idem_memory"),
        added("idem_redis"),
        added("peer_redis")
    );
    println!(
        "  throughput vs plain: idem memory {:.3}, idem Redis {:.3}, peer Redis {:.3}; idem Redis / peer Redis {:.3}",
        per_round("idem_memory", "plain"),
        per_round("idem_redis", "plain"),
        per_round("peer_redis", "plain"),
        per_round("idem_redis", "peer_redis")
    );
    line.push_str(&format!(
        " added_us_memory={:.1} added_us_redis={:.1} added_us_peer={:.1} vs_peer={:.3}",
        added("idem_memory"),
        added("idem_redis"),
        added("peer_redis"),
        per_round("idem_redis", "peer_redis")
    ));
    println!("{line}");
    forget(&args.redis_url, &run).await
}

/// Leave the shared Redis as it was: this run's keys, found with SCAN
/// (never KEYS, which blocks the server on a big keyspace), unlinked.
async fn forget(redis_url: &str, run: &str) -> Result<(), BoxError> {
    let mut conn = redis::aio::ConnectionManager::new(redis::Client::open(redis_url)?).await?;
    for pattern in [format!("idem-bench-http-{run}:*"), format!("peer-bench-http-{run}*")] {
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await?;
            if !keys.is_empty() {
                let _: i64 = redis::cmd("UNLINK").arg(&keys).query_async(&mut conn).await?;
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    Ok(())
}
