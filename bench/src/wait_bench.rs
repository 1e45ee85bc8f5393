//! `loadgen --scenario wait`: what a waiting duplicate adds after the call
//! it waits for completes ([`idem::Guard::lease_or_wait`], the HTTP
//! layer's `wait`), on each store given, beside the control: a plain
//! replay sent the moment the first call completed (the floor: one claim
//! that finds the record done).
//!
//! Each round: a first call holds a fresh key for 100 ms; `--clients`
//! duplicates start 10 ms in and wait; the moment the first call's ticket
//! returns, a control replay is sent. A waiter's added latency is from
//! that moment to its own answer. Rounds of the stores take turns.
//!
//! ```text
//! cargo run --release -p idem-bench -- --scenario wait --database-url postgres://postgres@127.0.0.1/test \
//!     --redis-url redis://127.0.0.1:6379 --clients 16 --rounds 40
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::lease::LeaseStore;

use crate::BoxError;
use crate::lease_bench::median;

type Store = Arc<dyn LeaseStore>;

const HOLD: Duration = Duration::from_millis(100);
const WAIT: Duration = Duration::from_secs(5);

async fn call(store: &dyn LeaseStore, key: &str, wait: Duration) -> Result<u64, idem::Error> {
    match idem::Guard::new("loadgen.wait").key(key).lease_or_wait::<u64>(store, Duration::from_secs(10), wait).await? {
        idem::Claim::Replay(answer) => Ok(answer),
        idem::Claim::Run(ticket) => {
            ticket
                .run(async {
                    tokio::time::sleep(HOLD).await;
                    Ok::<u64, idem::Error>(7)
                })
                .await
        }
    }
}

/// One round on `store`: the waiters' added latencies and the control's,
/// in milliseconds.
async fn round(store: &Store, clients: usize, key: &str) -> Result<(Vec<f64>, f64), BoxError> {
    let first = {
        let (store, key) = (store.clone(), key.to_owned());
        tokio::spawn(async move {
            let answer = call(&*store, &key, Duration::ZERO).await;
            (answer, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    let waiters: Vec<_> = (0..clients)
        .map(|_| {
            let (store, key) = (store.clone(), key.to_owned());
            tokio::spawn(async move {
                let answer = call(&*store, &key, WAIT).await;
                (answer, Instant::now())
            })
        })
        .collect();
    let (answer, done) = first.await?;
    answer?;
    let control = call(&**store, key, Duration::ZERO).await;
    let control_ms = done.elapsed().as_secs_f64() * 1e3;
    control?;
    let mut added = Vec::with_capacity(clients);
    for waiter in waiters {
        let (answer, at) = waiter.await?;
        answer?;
        added.push(at.saturating_duration_since(done).as_secs_f64() * 1e3);
    }
    Ok((added, control_ms))
}

async fn stores(database_url: Option<&str>, redis_url: Option<&str>) -> Result<Vec<(String, Store)>, BoxError> {
    let mut stores: Vec<(String, Store)> = vec![("memory".into(), Arc::new(idem::store::MemoryStore::new()))];
    if let Some(url) = database_url {
        let store: Store = if url.starts_with("postgres") {
            let pool = sqlx::PgPool::connect(url).await?;
            idem::migrate(&pool).await?;
            Arc::new(idem::store::SqlStore::new(pool))
        } else if url.starts_with("mysql") {
            let pool = sqlx::MySqlPool::connect(url).await?;
            idem::migrate(&pool).await?;
            Arc::new(idem::store::SqlStore::new(pool))
        } else {
            let pool = sqlx::SqlitePool::connect(url).await?;
            idem::migrate(&pool).await?;
            Arc::new(idem::store::SqlStore::new(pool))
        };
        stores.push((store.kind().into(), store));
    }
    if let Some(url) = redis_url {
        let client = redis::Client::open(url)?;
        let conn = redis::aio::ConnectionManager::new(client.clone()).await?;
        let prefix = format!("loadgen-wait-{}:", std::process::id());
        let plain = idem::store::RedisStore::new(conn.clone(), format!("{prefix}plain:"));
        let noticed = idem::store::RedisStore::new(conn, format!("{prefix}noticed:")).notifications(&client).await?;
        stores.push(("redis_backing_off".into(), Arc::new(plain)));
        stores.push(("redis_with_notices".into(), Arc::new(noticed)));
    }
    Ok(stores)
}

pub async fn run(
    database_url: Option<&str>,
    redis_url: Option<&str>,
    clients: usize,
    rounds: u32,
) -> Result<(), BoxError> {
    let stores = stores(database_url, redis_url).await?;
    let mut added: Vec<Vec<f64>> = vec![Vec::new(); stores.len()];
    let mut control: Vec<Vec<f64>> = vec![Vec::new(); stores.len()];
    let run = std::process::id();
    for r in 0..rounds {
        // The stores take turns, round by round.
        for (i, (_, store)) in stores.iter().enumerate() {
            let (waits, floor) = round(store, clients, &format!("w{run}-{r}-{i}")).await?;
            added[i].extend(waits);
            control[i].push(floor);
        }
    }
    for (i, (name, _)) in stores.iter().enumerate() {
        let mut waits = added[i].clone();
        waits.sort_by(f64::total_cmp);
        let p99 = waits[(waits.len() * 99 / 100).min(waits.len() - 1)];
        let max = waits.last().copied().unwrap_or(0.0);
        println!(
            "scenario=wait store={name} clients={clients} rounds={rounds} added_ms_median={:.2} added_ms_p99={p99:.2} \
             added_ms_max={max:.2} control_replay_ms_median={:.2}",
            median(added[i].clone()),
            median(control[i].clone())
        );
    }
    Ok(())
}
