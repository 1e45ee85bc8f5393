//! `loadgen --scenario lease`: what a lease guard costs per call, on the
//! memory store, Redis or a SQL database, for first runs (claim + complete)
//! and replays (one claim that finds the stored answer), serially and with N
//! clients. On Redis it also measures the round-trip floor (raw EVALSHA of a
//! one-line script) and, side by side on the same server, the `idempotent`
//! crate 0.3 with its Valkey/Redis store doing the same two operations.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem::idempotent;
use idem::lease::LeaseStore;

use crate::common::{AppError, BoxError, Store};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Ack {
    id: u64,
}

/// The guarded call: no work in the body, so the figure is the guard's.
#[idempotent(
    key = "key",
    strategy = "lease",
    lease = "30s",
    retention = "1h",
    scope = "loadgen.lease",
    store = "store"
)]
async fn guarded(store: &dyn LeaseStore, key: &str, id: u64) -> Result<Ack, AppError> {
    Ok(Ack { id })
}

/// Calls per second of `call(n)` from `clients` tasks for `length`.
async fn measure<F, Fut>(clients: usize, length: Duration, call: F) -> f64
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), BoxError>> + Send,
{
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let call = Arc::new(call);
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients.max(1) {
        let (call, stop) = (call.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut errors) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                // The memory store's futures are ready at once: without a
                // yield now and then, busy clients would starve the timer.
                if ok % 32 == 31 {
                    tokio::task::yield_now().await;
                }
                match call(SEQ.fetch_add(1, Ordering::Relaxed)).await {
                    Ok(()) => ok += 1,
                    Err(e) => {
                        errors += 1;
                        if errors < 3 {
                            eprintln!("lease bench: {e}");
                        }
                    }
                }
            }
            ok
        }));
    }
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    let mut calls = 0;
    for t in tasks {
        calls += t.await.expect("bench task");
    }
    calls as f64 / started.elapsed().as_secs_f64()
}

/// The median of `v` (NaN when empty); the other bench modules use it too.
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let mid = v.len() / 2;
    if v.len() % 2 == 1 { v[mid] } else { (v[mid - 1] + v[mid]) / 2.0 }
}

/// Keys `{prefix}{i}` for i in 0..n, completed once so that calls replay.
async fn completed_keys(store: &Arc<dyn LeaseStore>, prefix: &str, n: u64) -> Result<Arc<Vec<String>>, BoxError> {
    let keys: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        guarded(&**store, k, i as u64).await?;
    }
    Ok(Arc::new(keys))
}

/// One measurement of idem's first runs and replays.
async fn idem_pair(
    store: &Arc<dyn LeaseStore>,
    clients: usize,
    length: Duration,
    run: &str,
) -> Result<(f64, f64), BoxError> {
    let first = {
        let (store, run) = (store.clone(), run.to_owned());
        measure(clients, length, move |n| {
            let (store, key) = (store.clone(), format!("F{run}-{n}"));
            async move {
                guarded(&*store, &key, n).await?;
                Ok(())
            }
        })
        .await
    };
    let keys = completed_keys(store, &format!("R{run}-{clients}-"), 1000).await?;
    let replay = {
        let store = store.clone();
        measure(clients, length, move |n| {
            let (store, keys) = (store.clone(), keys.clone());
            async move {
                guarded(&*store, &keys[(n % 1000) as usize], n).await?;
                Ok(())
            }
        })
        .await
    };
    Ok((first, replay))
}

/// The store under test, and what a run reports about it.
struct Under {
    name: &'static str,
    store: Arc<dyn LeaseStore>,
    sql: Option<Store>,
    /// The Redis store's own count of script calls and the operations they
    /// carried (a batch is one call).
    redis_stats: Option<Box<dyn Fn() -> idem::lease::RedisStats>>,
}

fn redis_store<C>(conn: C) -> Under
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let store = idem::lease::RedisStore::new(conn, "idem-bench:");
    let handle = store.clone();
    Under { name: "redis", store: Arc::new(store), sql: None, redis_stats: Some(Box::new(move || handle.stats())) }
}

async fn open(database_url: Option<&str>, redis_url: Option<&str>, clients: usize) -> Result<Under, BoxError> {
    if let Some(url) = redis_url {
        let client = redis::Client::open(url)?;
        return Ok(if std::env::var("LEASE_BENCH_MANAGER").is_ok() {
            redis_store(redis::aio::ConnectionManager::new(client).await?)
        } else {
            redis_store(client.get_multiplexed_async_connection().await?)
        });
    }
    let Some(url) = database_url else {
        return Ok(Under {
            name: "memory",
            store: Arc::new(idem::lease::MemoryStore::new()),
            sql: None,
            redis_stats: None,
        });
    };
    let s = Store::connect(Some(url), clients as u32 + 2).await?;
    let store: Arc<dyn LeaseStore> = match &s {
        Store::Sqlite(pool, _) => {
            idem::migrate(pool).await?;
            Arc::new(idem::lease::SqlStore::new(pool.clone()))
        }
        Store::Postgres(pool) => {
            idem::migrate(pool).await?;
            Arc::new(idem::lease::SqlStore::new(pool.clone()))
        }
        Store::MySql(pool) => {
            idem::migrate(pool).await?;
            Arc::new(idem::lease::SqlStore::new(pool.clone()))
        }
    };
    Ok(Under { name: s.name(), store, sql: Some(s), redis_stats: None })
}

/// `--only`: which side `run_only` measures.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Only {
    /// idem's guard on the chosen store.
    Idem,
    /// The `idempotent` crate 0.3 (needs `--redis-url`).
    Peer,
}

/// One side alone: first runs for `seconds`, then replays for `seconds`.
pub async fn run_only(
    only: Only,
    database_url: Option<&str>,
    redis_url: Option<&str>,
    clients: usize,
    seconds: u64,
) -> Result<(), BoxError> {
    let (run, length) = (crate::common::run_id(), Duration::from_secs(seconds));
    let (name, (first, replay)) = match only {
        Only::Idem => {
            let under = open(database_url, redis_url, clients).await?;
            let pair = idem_pair(&under.store, clients, length, &run).await?;
            if let Some(s) = under.sql {
                s.close().await;
            }
            (under.name, pair)
        }
        Only::Peer => {
            let url = redis_url.ok_or("--only peer needs --redis-url")?;
            ("redis (idempotent 0.3)", peer::Peer::connect(url).await?.pair(clients, length, &run).await?)
        }
    };
    println!(
        "scenario=lease only={} store={name} clients={clients} first_tps={first:.0} replay_tps={replay:.0}",
        format!("{only:?}").to_lowercase()
    );
    Ok(())
}

pub async fn run(
    database_url: Option<&str>,
    redis_url: Option<&str>,
    clients: usize,
    seconds: u64,
    rounds: u32,
) -> Result<(), BoxError> {
    let run = crate::common::run_id();
    let Under { name, store, sql, redis_stats } = open(database_url, redis_url, clients).await?;
    let rounds = rounds.max(1);
    // Each round: idem (first, replay) and, on Redis, the peer and the raw
    // script, at `clients` and serially. Slices alternate so all see the
    // same server.
    let per_slice = crate::common::slice_length(seconds, rounds, 8.0, 0.5);
    let peer = match redis_url {
        Some(url) => Some(peer::Peer::connect(url).await?),
        None => None,
    };
    // Warm-up: scripts loaded, connections open.
    idem_pair(&store, clients, Duration::from_millis(300), &format!("{run}w")).await?;
    if let Some(peer) = &peer {
        peer.pair(clients, Duration::from_millis(300), &format!("{run}w")).await?;
    }
    let mut t: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    for round in 0..rounds {
        let tag = format!("{run}r{round}");
        for (label, n) in [("", clients), ("serial_", 1)] {
            let (first, replay) = idem_pair(&store, n, per_slice, &format!("{tag}{label}")).await?;
            t.entry(if n == 1 { "serial_first" } else { "first" }).or_default().push(first);
            t.entry(if n == 1 { "serial_replay" } else { "replay" }).or_default().push(replay);
            if let (Some(peer), Some(url)) = (&peer, redis_url) {
                let (pf, pr) = peer.pair(n, per_slice, &format!("{tag}{label}")).await?;
                let raw = raw_evalsha(url, n, per_slice).await?;
                t.entry(if n == 1 { "serial_peer_first" } else { "peer_first" }).or_default().push(pf);
                t.entry(if n == 1 { "serial_peer_replay" } else { "peer_replay" }).or_default().push(pr);
                t.entry(if n == 1 { "serial_raw" } else { "raw" }).or_default().push(raw);
                t.entry(if n == 1 { "serial_vs_peer_first" } else { "vs_peer_first" }).or_default().push(first / pf);
                t.entry(if n == 1 { "serial_vs_peer_replay" } else { "vs_peer_replay" }).or_default().push(replay / pr);
            }
        }
    }
    let m = |k: &str| t.get(k).cloned().map(median).unwrap_or(f64::NAN);
    println!(
        "lease on {name}: {clients} clients: first runs {:.0}/s, replays {:.0}/s; serial: first runs {:.0}/s, replays {:.0}/s",
        m("first"),
        m("replay"),
        m("serial_first"),
        m("serial_replay")
    );
    let mut line = format!(
        "scenario=lease store={name} clients={clients} first_tps={:.0} replay_tps={:.0} serial_first_tps={:.0} \
         serial_replay_tps={:.0} round_trips_first=2 round_trips_replay=1",
        m("first"),
        m("replay"),
        m("serial_first"),
        m("serial_replay")
    );
    if let Some(stats) = &redis_stats {
        let s = stats();
        line.push_str(&format!(" mean_batch={:.1}", s.operations as f64 / s.script_calls.max(1) as f64));
    }
    if peer.is_some() {
        // The floor: raw EVALSHA calls per second divided by round trips per call.
        let (raw, serial_raw) = (m("raw"), m("serial_raw"));
        println!(
            "raw EVALSHA: {raw:.0}/s at {clients} clients, {serial_raw:.0}/s serially; idempotent 0.3: first runs {:.0}/s, \
             replays {:.0}/s",
            m("peer_first"),
            m("peer_replay")
        );
        line.push_str(&format!(
            " raw_evalsha_tps={raw:.0} serial_raw_evalsha_tps={serial_raw:.0} serial_first_vs_floor={:.3} \
             serial_replay_vs_floor={:.3} peer_first_tps={:.0} peer_replay_tps={:.0} serial_peer_first_tps={:.0} \
             serial_peer_replay_tps={:.0} vs_peer_first={:.2} vs_peer_replay={:.2} serial_vs_peer_first={:.2} \
             serial_vs_peer_replay={:.2}",
            m("serial_first") / (serial_raw / 2.0),
            m("serial_replay") / serial_raw,
            m("peer_first"),
            m("peer_replay"),
            m("serial_peer_first"),
            m("serial_peer_replay"),
            m("vs_peer_first"),
            m("vs_peer_replay"),
            m("serial_vs_peer_first"),
            m("serial_vs_peer_replay"),
        ));
    }
    println!("{line}");
    if let Some(s) = sql {
        s.close().await;
    }
    Ok(())
}

/// The round-trip floor: EVALSHA of a script that only reads its key.
async fn raw_evalsha(url: &str, clients: usize, length: Duration) -> Result<f64, BoxError> {
    static SCRIPT: std::sync::LazyLock<redis::Script> =
        std::sync::LazyLock::new(|| redis::Script::new("return redis.call('EXISTS', KEYS[1])"));
    let conn = redis::aio::ConnectionManager::new(redis::Client::open(url)?).await?;
    Ok(measure(clients, length, move |n| {
        let mut conn = conn.clone();
        async move {
            let _: i64 = SCRIPT.key(format!("idem-bench-raw:{}", n % 1000)).invoke_async(&mut conn).await?;
            Ok(())
        }
    })
    .await)
}

/// The `idempotent` crate 0.3 (its Valkey/Redis store), doing what the
/// guard does: claim then complete for a first run, one claim that finds
/// the completed entry for a replay.
mod peer {
    use std::sync::Arc;
    use std::time::Duration;

    use idempotent::entry::ExistingEntry;
    use idempotent::fingerprint::{DefaultFingerprintStrategy, FingerprintStrategy};
    use idempotent::store::valkey::ValkeyStore;
    use idempotent::store::{IdempotencyStore, InsertResult};
    use idempotent::{CachedResponse, IdempotencyEntry, IdempotencyKey, Metadata};

    use super::{BoxError, measure};

    pub struct Peer {
        store: Arc<ValkeyStore>,
    }

    const TTL: Duration = Duration::from_secs(3600);

    fn fingerprint() -> idempotent::Fingerprint {
        DefaultFingerprintStrategy.compute("POST /transfer", b"{}")
    }

    async fn first(store: &ValkeyStore, key: String) -> Result<(), BoxError> {
        let key = IdempotencyKey::new(key)?;
        let entry = IdempotencyEntry::new(fingerprint(), TTL);
        match store.try_insert(&key, entry.clone()).await? {
            InsertResult::Claimed { fencing_token } => {
                let response = CachedResponse {
                    status_code: 200,
                    metadata: Metadata::default(),
                    body: b"{\"id\":1}".to_vec().into(),
                };
                store.complete(&key, entry.complete(response), fencing_token).await?;
                Ok(())
            }
            _ => Err("peer: a fresh key was not claimed".into()),
        }
    }

    async fn replay(store: &ValkeyStore, key: String) -> Result<(), BoxError> {
        let key = IdempotencyKey::new(key)?;
        match store.try_insert(&key, IdempotencyEntry::new(fingerprint(), TTL)).await? {
            InsertResult::Exists(ExistingEntry::Completed(done)) if done.fingerprint_matches(fingerprint()) => Ok(()),
            _ => Err("peer: a completed key did not replay".into()),
        }
    }

    impl Peer {
        pub async fn connect(url: &str) -> Result<Peer, BoxError> {
            let store = ValkeyStore::with_prefix(redis::Client::open(url)?, Some("idem-bench-peer")).await?;
            Ok(Peer { store: Arc::new(store) })
        }

        pub async fn pair(&self, clients: usize, length: Duration, run: &str) -> Result<(f64, f64), BoxError> {
            let (store, tag) = (self.store.clone(), run.to_owned());
            let first_tps = measure(clients, length, move |n| {
                let (store, key) = (store.clone(), format!("F{tag}-{n}"));
                async move { first(&store, key).await }
            })
            .await;
            let prefix = format!("R{run}-{clients}-");
            for i in 0..1000 {
                first(&self.store, format!("{prefix}{i}")).await?;
            }
            let store = self.store.clone();
            let replay_tps = measure(clients, length, move |n| {
                let (store, key) = (store.clone(), format!("{prefix}{}", n % 1000));
                async move { replay(&store, key).await }
            })
            .await;
            Ok((first_tps, replay_tps))
        }
    }
}
