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
use crate::errors::Errors;

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Ack {
    pub(crate) id: u64,
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
pub(crate) async fn guarded(store: &dyn LeaseStore, key: &str, id: u64) -> Result<Ack, AppError> {
    Ok(Ack { id })
}

/// Calls per second of `call(n)` from `clients` tasks for `length`; an
/// error if any call failed (`mode`: what the calls measure).
async fn measure<F, Fut>(mode: &str, clients: usize, length: Duration, call: F) -> Result<f64, BoxError>
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), BoxError>> + Send,
{
    let m = measure_calls(clients, length, false, call).await;
    m.errors.check("lease", mode)?;
    Ok(m.tps)
}

/// What [`measure_calls`] saw.
#[derive(Default)]
pub(crate) struct Measured {
    /// Calls that succeeded, per second.
    pub tps: f64,
    /// Calls made, failed ones too (each ran to its end: a slice stops
    /// starting calls, it does not cut one short).
    pub calls: u64,
    pub errors: Errors,
    /// Each successful call's time, in µs, when asked for.
    pub latencies_us: Vec<u32>,
}

/// `call(n)` from `clients` tasks for `length`; `timed`: also each call's
/// latency (a clock read per call, left out where only throughput counts).
pub(crate) async fn measure_calls<F, Fut>(clients: usize, length: Duration, timed: bool, call: F) -> Measured
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
            let (mut ok, mut errors, mut latencies) = (0u64, Errors::default(), Vec::new());
            while !stop.load(Ordering::Relaxed) {
                // The memory store's futures are ready at once: without a
                // yield now and then, busy clients would starve the timer.
                if ok % 32 == 31 {
                    tokio::task::yield_now().await;
                }
                let t = timed.then(Instant::now);
                match call(SEQ.fetch_add(1, Ordering::Relaxed)).await {
                    Ok(()) => {
                        ok += 1;
                        if let Some(t) = t {
                            latencies.push(t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                        }
                    }
                    Err(e) => errors.add(e),
                }
            }
            (ok, errors, latencies)
        }));
    }
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    let mut m = Measured::default();
    let mut ok = 0;
    for t in tasks {
        let (calls, errors, latencies) = t.await.expect("bench task");
        ok += calls;
        m.calls += errors.count();
        m.errors.absorb(errors);
        m.latencies_us.extend(latencies);
    }
    m.calls += ok;
    m.tps = ok as f64 / started.elapsed().as_secs_f64();
    m
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
pub(crate) async fn idem_pair(
    store: &Arc<dyn LeaseStore>,
    clients: usize,
    length: Duration,
    run: &str,
) -> Result<(f64, f64), BoxError> {
    let first = idem_first(store, clients, length, run).await?;
    let keys = completed_keys(store, &format!("R{run}-{clients}-"), 1000).await?;
    Ok((first, idem_replay(store, clients, length, keys).await?))
}

/// First runs per second: every call a fresh key.
async fn idem_first(store: &Arc<dyn LeaseStore>, clients: usize, length: Duration, run: &str) -> Result<f64, BoxError> {
    let (store, run) = (store.clone(), run.to_owned());
    measure("idem first run", clients, length, move |n| {
        let (store, key) = (store.clone(), format!("F{run}-{n}"));
        async move {
            guarded(&*store, &key, n).await?;
            Ok(())
        }
    })
    .await
}

/// Replays per second over `keys`, all completed.
async fn idem_replay(
    store: &Arc<dyn LeaseStore>,
    clients: usize,
    length: Duration,
    keys: Arc<Vec<String>>,
) -> Result<f64, BoxError> {
    let store = store.clone();
    measure("idem replay", clients, length, move |n| {
        let (store, keys) = (store.clone(), keys.clone());
        async move {
            guarded(&*store, &keys[n as usize % keys.len()], n).await?;
            Ok(())
        }
    })
    .await
}

/// The Redis server's CPU time (user + system, seconds) so far, from `INFO cpu`.
async fn server_cpu(conn: &mut redis::aio::MultiplexedConnection) -> Result<f64, BoxError> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    Ok(info
        .lines()
        .filter_map(|l| l.strip_prefix("used_cpu_user:").or_else(|| l.strip_prefix("used_cpu_sys:")))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum())
}

/// The store under test, and what a run reports about it.
pub(crate) struct Under {
    pub name: &'static str,
    pub store: Arc<dyn LeaseStore>,
    pub sql: Option<Store>,
    /// The Redis store's own count of script calls and the operations they
    /// carried (a batch is one call).
    pub redis_stats: Option<Box<dyn Fn() -> idem::store::RedisStats>>,
}

fn redis_store<C>(conn: C) -> Under
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let store = idem::store::RedisStore::new(conn, "idem-bench:");
    let handle = store.clone();
    Under { name: "redis", store: Arc::new(store), sql: None, redis_stats: Some(Box::new(move || handle.stats())) }
}

/// The store `--redis-url` or `--database-url` names (its record table
/// migrated), or the memory store.
pub(crate) async fn open(
    database_url: Option<&str>,
    redis_url: Option<&str>,
    clients: usize,
) -> Result<Under, BoxError> {
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
            store: Arc::new(idem::store::MemoryStore::new()),
            sql: None,
            redis_stats: None,
        });
    };
    let s = Store::connect(Some(url), clients as u32 + 2).await?;
    let store = s.lease_store().await?;
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
    // On Redis, the server's CPU time per call too: while the server is the
    // limit, it is what throughput follows, and it varies far less from run
    // to run on a shared machine than calls per second do.
    let mut probe = match redis_url {
        Some(url) => Some(redis::Client::open(url)?.get_multiplexed_async_connection().await?),
        None => None,
    };
    let mut cpu = async || -> Result<f64, BoxError> {
        match probe.as_mut() {
            Some(conn) => server_cpu(conn).await,
            None => Ok(f64::NAN),
        }
    };
    let mut t = [0.0; 3];
    // idem on Redis: operations per script call, first runs and replays.
    let mut batches = None;
    let (name, first, replay) = match only {
        Only::Idem => {
            let under = open(database_url, redis_url, clients).await?;
            let stats = || under.redis_stats.as_ref().map(|s| s());
            t[0] = cpu().await?;
            let s0 = stats();
            let first = idem_first(&under.store, clients, length, &run).await?;
            let s1 = stats();
            t[1] = cpu().await?;
            let keys = completed_keys(&under.store, &format!("R{run}-{clients}-"), 1000).await?;
            t[2] = cpu().await?;
            let s2 = stats();
            let replay = idem_replay(&under.store, clients, length, keys).await?;
            if let (Some(s0), Some(s1), Some(s2), Some(s3)) = (s0, s1, s2, stats()) {
                let mean = |a: idem::store::RedisStats, b: idem::store::RedisStats| {
                    (b.operations - a.operations) as f64 / (b.script_calls - a.script_calls).max(1) as f64
                };
                batches = Some((mean(s0, s1), mean(s2, s3)));
            }
            if let Some(s) = under.sql {
                s.close().await;
            }
            (under.name, first, replay)
        }
        Only::Peer => {
            let url = redis_url.ok_or("--only peer needs --redis-url")?;
            let peer = peer::Peer::connect(url).await?;
            t[0] = cpu().await?;
            let first = peer.first_tps(clients, length, &run).await?;
            t[1] = cpu().await?;
            let keys = peer.completed_keys(&format!("R{run}-{clients}-")).await?;
            t[2] = cpu().await?;
            ("redis (idempotent 0.3)", first, peer.replay_tps(clients, length, keys).await?)
        }
    };
    let t3 = cpu().await?;
    let secs = length.as_secs_f64();
    let us = |cpu: f64, tps: f64| cpu / (tps * secs) * 1e6;
    let mut line = format!(
        "scenario=lease only={} store={name} clients={clients} first_tps={first:.0} replay_tps={replay:.0}",
        format!("{only:?}").to_lowercase()
    );
    if redis_url.is_some() {
        line.push_str(&format!(
            " server_us_first={:.1} server_us_replay={:.1}",
            us(t[1] - t[0], first),
            us(t3 - t[2], replay)
        ));
    }
    if let Some((first, replay)) = batches {
        line.push_str(&format!(" mean_batch_first={first:.1} mean_batch_replay={replay:.1}"));
    }
    println!("{line}");
    Ok(())
}

/// `op(i, key)` over `keys` from `tasks` tasks, each taking a contiguous
/// share in order (`i` counts within the share, the same on every pass).
fn in_tasks<F, Fut>(keys: &[String], tasks: usize, op: F) -> impl Future<Output = Result<(), BoxError>> + use<F, Fut>
where
    F: Fn(usize, String) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
{
    let chunks: Vec<Vec<String>> = keys.chunks(keys.len().div_ceil(tasks.max(1))).map(<[String]>::to_vec).collect();
    async move {
        let mut handles = Vec::new();
        for chunk in chunks {
            let op = op.clone();
            handles.push(tokio::spawn(async move {
                for (i, key) in chunk.into_iter().enumerate() {
                    op(i, key).await?;
                }
                Ok::<(), BoxError>(())
            }));
        }
        for h in handles {
            h.await.expect("task")?;
        }
        Ok(())
    }
}

/// `--callgrind-out FILE`: Redis runs under `valgrind --tool=callgrind
/// --callgrind-out-file=FILE`; count the instructions the server spends per
/// call, idem's and the peer's. Unlike calls per second on a shared machine,
/// the count repeats within about 1% from run to run (start each run from an
/// empty database), and while Redis is the limit (first runs and replays at
/// 64 clients) throughput follows it.
pub async fn run_instructions(redis_url: &str, out: &str, calls: u64, clients: usize) -> Result<(), BoxError> {
    let client = redis::Client::open(redis_url)?;
    let mut probe = client.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO").arg("server").query_async(&mut probe).await?;
    let pid = info
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .map(|p| p.trim().to_owned())
        .ok_or("INFO server has no process_id")?;
    let control = |flag: &str| -> Result<(), BoxError> {
        let status = std::process::Command::new("callgrind_control").args([flag, pid.as_str()]).output()?;
        if !status.status.success() {
            return Err(format!("callgrind_control {flag} {pid}: is Redis running under callgrind?").into());
        }
        Ok(())
    };
    // The instructions since the last zeroing, from the dump it writes.
    let counted = || -> Result<u64, BoxError> {
        control("-d")?;
        let dir = std::path::Path::new(out).parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(".".as_ref());
        let name = std::path::Path::new(out).file_name().and_then(|n| n.to_str()).ok_or("--callgrind-out: a file")?;
        let newest = std::fs::read_dir(dir)?
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_str().is_some_and(|f| f.starts_with(name)))
            .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
            .ok_or("no callgrind dump found")?;
        let text = std::fs::read_to_string(newest.path())?;
        let total = text
            .lines()
            .find_map(|l| l.strip_prefix("totals:").or_else(|| l.strip_prefix("summary:")))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .ok_or("no totals in the callgrind dump")?;
        Ok(total)
    };
    let (run, calls) = (crate::common::run_id(), calls.max(20));
    let per_call = |total: u64, n: u64| total as f64 / n as f64;
    let mut line = format!("scenario=lease_instructions calls={calls}");
    // idem: serially (each operation a script call of its own), then from
    // `clients` tasks, batching as they queue.
    for tasks in [1, clients.max(2) as u64] {
        let redis = idem::store::RedisStore::new(client.get_multiplexed_async_connection().await?, "idem-bench:");
        let store: Arc<dyn LeaseStore> = Arc::new(redis.clone());
        let keys: Vec<String> = (0..calls).map(|i| format!("I{run}-{tasks}-{i}")).collect();
        let each = |keys: &[String]| {
            let store = store.clone();
            in_tasks(keys, tasks as usize, move |i, key| {
                let store = store.clone();
                async move { guarded(&*store, &key, i as u64).await.map(drop).map_err(BoxError::from) }
            })
        };
        each(&keys[..10]).await?; // scripts loaded, connection warm
        let before = redis.stats();
        control("-z")?;
        each(&keys[10..]).await?;
        let first = counted()?;
        control("-z")?;
        each(&keys[10..]).await?;
        let replay = counted()?;
        let after = redis.stats();
        let n = calls - 10;
        let batch = (after.operations - before.operations) as f64 / (after.script_calls - before.script_calls) as f64;
        let label = if tasks == 1 { "serial".to_owned() } else { format!("clients{tasks}") };
        line.push_str(&format!(
            " {label}_first={:.0} {label}_replay={:.0} {label}_mean_batch={batch:.1}",
            per_call(first, n),
            per_call(replay, n)
        ));
    }
    // The peer: one script call per operation, serially, then from
    // `clients` tasks (pipelined on its connection as they queue).
    let peer = Arc::new(peer::Peer::connect(redis_url).await?);
    for tasks in [1, clients.max(2)] {
        let keys: Vec<String> = (0..calls).map(|i| format!("I{run}-p{tasks}-{i}")).collect();
        let each = |keys: &[String], replay: bool| {
            let peer = peer.clone();
            in_tasks(keys, tasks, move |_, key| {
                let peer = peer.clone();
                async move {
                    if replay { peer::replay(&peer.store, key).await } else { peer::first(&peer.store, key).await }
                }
            })
        };
        each(&keys[..10], false).await?;
        each(&keys[..10], true).await?;
        control("-z")?;
        each(&keys[10..], false).await?;
        let first = counted()?;
        control("-z")?;
        each(&keys[10..], true).await?;
        let replay = counted()?;
        let n = calls - 10;
        let label = if tasks == 1 { "peer".to_owned() } else { format!("peer_clients{tasks}") };
        line.push_str(&format!(" {label}_first={:.0} {label}_replay={:.0}", per_call(first, n), per_call(replay, n)));
    }
    println!("{line}");
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
    let per_slice = crate::slice_length(seconds, rounds, 8.0, 0.5);
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
    measure("raw EVALSHA", clients, length, move |n| {
        let mut conn = conn.clone();
        async move {
            let _: i64 = SCRIPT.key(format!("idem-bench-raw:{}", n % 1000)).invoke_async(&mut conn).await?;
            Ok(())
        }
    })
    .await
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
        pub store: Arc<ValkeyStore>,
    }

    const TTL: Duration = Duration::from_secs(3600);

    fn fingerprint() -> idempotent::Fingerprint {
        DefaultFingerprintStrategy.compute("POST /transfer", b"{}")
    }

    pub async fn first(store: &ValkeyStore, key: String) -> Result<(), BoxError> {
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

    pub async fn replay(store: &ValkeyStore, key: String) -> Result<(), BoxError> {
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
            let first_tps = self.first_tps(clients, length, run).await?;
            let keys = self.completed_keys(&format!("R{run}-{clients}-")).await?;
            Ok((first_tps, self.replay_tps(clients, length, keys).await?))
        }

        pub async fn first_tps(&self, clients: usize, length: Duration, run: &str) -> Result<f64, BoxError> {
            let (store, tag) = (self.store.clone(), run.to_owned());
            measure("peer first run", clients, length, move |n| {
                let (store, key) = (store.clone(), format!("F{tag}-{n}"));
                async move { first(&store, key).await }
            })
            .await
        }

        /// 1,000 completed keys starting with `prefix`.
        pub async fn completed_keys(&self, prefix: &str) -> Result<Arc<Vec<String>>, BoxError> {
            let keys: Vec<String> = (0..1000).map(|i| format!("{prefix}{i}")).collect();
            for key in &keys {
                first(&self.store, key.clone()).await?;
            }
            Ok(Arc::new(keys))
        }

        pub async fn replay_tps(
            &self,
            clients: usize,
            length: Duration,
            keys: Arc<Vec<String>>,
        ) -> Result<f64, BoxError> {
            let store = self.store.clone();
            measure("peer replay", clients, length, move |n| {
                let (store, keys) = (store.clone(), keys.clone());
                async move { replay(&store, keys[n as usize % keys.len()].clone()).await }
            })
            .await
        }
    }
}
