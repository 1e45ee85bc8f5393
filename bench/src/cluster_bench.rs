//! `loadgen --scenario lease --redis-cluster-urls ...`: the lease guard on
//! one Redis node against a Redis Cluster, side by side; and with
//! `--failover`, how long a master's slots go unserved when it dies.
//!
//! Throughput: each round measures, in alternating slices, idem's first
//! runs and replays at `--clients` and serially on the standalone server
//! (`--redis-url`; batching on, as by default, and off) and on the cluster
//! (a `ClusterConnection`, batching off there). Figures are medians over
//! rounds.
//!
//! Failover (`--failover`, the local cluster of `.ci/redis-cluster` only):
//! `--clients` tasks call the guard on keys of one master's slots; the
//! master is killed (SIGKILL); the window is the time from the kill to the
//! first call made after it that succeeds. Then `.ci/redis-cluster` starts
//! the node again (it rejoins as a replica) and waits until the cluster is
//! whole before the next round.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem::lease::LeaseStore;
use idem::store::RecordKind;

use crate::common::BoxError;
use crate::lease_bench::{guarded, idem_pair, median};

async fn cluster_conn(urls: &[String]) -> Result<redis::cluster_async::ClusterConnection, BoxError> {
    let client = redis::cluster::ClusterClient::builder(urls.iter().map(String::as_str))
        .connection_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_secs(1))
        .build()?;
    Ok(client.get_async_connection().await?)
}

pub async fn run(
    redis_url: &str,
    cluster_urls: &[String],
    clients: usize,
    seconds: u64,
    rounds: u32,
) -> Result<(), BoxError> {
    let run = crate::common::run_id();
    let single = redis::Client::open(redis_url)?.get_multiplexed_async_connection().await?;
    let stores: Vec<(&str, Arc<dyn LeaseStore>)> = vec![
        ("single", Arc::new(idem::store::RedisStore::new(single.clone(), "idem-bench:"))),
        ("single_unbatched", Arc::new(idem::store::RedisStore::new(single, "idem-bench:").batching(false))),
        ("cluster", Arc::new(idem::store::RedisStore::new(cluster_conn(cluster_urls).await?, "idem-bench:"))),
    ];
    let rounds = rounds.max(1);
    let per_slice = crate::slice_length(seconds, rounds, 2.0 * 2.0 * stores.len() as f64, 0.5);
    for (name, store) in &stores {
        idem_pair(store, clients, Duration::from_millis(300), &format!("{run}w{name}")).await?;
    }
    let mut t: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    for round in 0..rounds {
        for (label, n) in [("", clients), ("serial_", 1)] {
            for (name, store) in &stores {
                let (first, replay) = idem_pair(store, n, per_slice, &format!("{run}r{round}{label}{name}")).await?;
                t.entry(format!("{name}_{label}first")).or_default().push(first);
                t.entry(format!("{name}_{label}replay")).or_default().push(replay);
            }
        }
    }
    let m = |k: &str| t.get(k).cloned().map(median).unwrap_or(f64::NAN);
    let mut line = format!("scenario=lease_cluster clients={clients} rounds={rounds}");
    for (name, _) in &stores {
        println!(
            "lease on {name}: {clients} clients: first runs {:.0}/s, replays {:.0}/s; serial: first runs {:.0}/s, \
             replays {:.0}/s",
            m(&format!("{name}_first")),
            m(&format!("{name}_replay")),
            m(&format!("{name}_serial_first")),
            m(&format!("{name}_serial_replay")),
        );
        for k in ["first", "replay", "serial_first", "serial_replay"] {
            line.push_str(&format!(" {name}_{k}_tps={:.0}", m(&format!("{name}_{k}"))));
        }
    }
    println!("{line}");
    Ok(())
}

/// One line of `CLUSTER NODES`: id, port, flags, slot ranges.
type NodeLine = (String, u16, String, Vec<(u16, u16)>);

fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let port = f.get(1)?.split('@').next()?.rsplit(':').next()?.parse().ok()?;
            let slots = f
                .iter()
                .skip(8)
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect();
            Some((f[0].to_owned(), port, f[2].to_owned(), slots))
        })
        .collect()
}

pub async fn failover(cluster_urls: &[String], clients: usize, rounds: u32) -> Result<(), BoxError> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../.ci/redis-cluster");
    let heal = || -> Result<(), BoxError> {
        let status = std::process::Command::new("bash").arg(script).stdout(std::process::Stdio::null()).status()?;
        if !status.success() {
            return Err(format!("{script} failed").into());
        }
        Ok(())
    };
    heal()?;
    let mut windows = Vec::new();
    for round in 0..rounds.max(1) {
        let mut conn = cluster_conn(cluster_urls).await?;
        let store =
            Arc::new(idem::store::RedisStore::new(conn.clone(), format!("idem-bench-fo:{}:", crate::common::run_id())));
        let nodes: String = redis::cmd("CLUSTER").arg("NODES").query_async(&mut conn).await?;
        let nodes = parse_nodes(&nodes);
        // Keys of the slots of the master that serves the first one.
        let (mut keys, mut victim) = (Vec::new(), None);
        for i in 0..20_000u32 {
            let key = format!("k{i}");
            let name = store.key(RecordKind::Lease, "loadgen.lease", &key);
            let slot: u16 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(&name).query_async(&mut conn).await?;
            let owner = nodes
                .iter()
                .find(|(_, _, flags, slots)| {
                    flags.contains("master") && slots.iter().any(|&(a, b)| a <= slot && slot <= b)
                })
                .ok_or("a slot without a master: is the cluster whole?")?;
            if *victim.get_or_insert(owner.1) == owner.1 {
                keys.push(key);
            }
            if keys.len() == 5000 {
                break;
            }
        }
        let port = victim.ok_or("no key")?;
        let mut node =
            redis::Client::open(format!("redis://127.0.0.1:{port}/"))?.get_multiplexed_async_connection().await?;
        let info: String = redis::cmd("INFO").arg("server").query_async(&mut node).await?;
        let pid = info.lines().find_map(|l| l.strip_prefix("process_id:")).ok_or("no process_id")?.trim().to_owned();

        // Callers streaming first runs on those keys, each call noting its
        // start; the first success of a call started after the kill ends
        // the window.
        let (stop, next) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let (killed, first_ok) =
            (Arc::new(std::sync::Mutex::new(None::<Instant>)), Arc::new(std::sync::Mutex::new(None)));
        let keys = Arc::new(keys);
        let tasks: Vec<_> = (0..clients.max(1))
            .map(|_| {
                let (store, stop, next, killed, first_ok, keys) =
                    (store.clone(), stop.clone(), next.clone(), killed.clone(), first_ok.clone(), keys.clone());
                tokio::spawn(async move {
                    let mut errors = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        let key = &keys[n as usize % keys.len()];
                        let started = Instant::now();
                        let ok = guarded(&*store, key, n).await.is_ok();
                        let after_kill = killed.lock().unwrap().is_some_and(|k| started > k);
                        if ok && after_kill {
                            first_ok.lock().unwrap().get_or_insert(Instant::now());
                        }
                        if !ok {
                            errors += 1;
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                    errors
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let status = std::process::Command::new("kill").args(["-9", &pid]).status()?;
        let at = Instant::now();
        *killed.lock().unwrap() = Some(at);
        if !status.success() {
            return Err(format!("kill -9 {pid} failed").into());
        }
        while first_ok.lock().unwrap().is_none() && at.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.store(true, Ordering::Relaxed);
        let mut errors = 0;
        for t in tasks {
            errors += t.await?;
        }
        let window = first_ok.lock().unwrap().ok_or("no call succeeded within 60 s of the kill")? - at;
        println!(
            "failover round {round}: master :{port} killed, window {:.2} s, {errors} failed calls",
            window.as_secs_f64()
        );
        windows.push(window.as_secs_f64());
        heal()?;
    }
    let (min, max) = windows.iter().fold((f64::MAX, 0.0f64), |(a, b), &w| (a.min(w), b.max(w)));
    println!(
        "scenario=lease_failover rounds={} clients={clients} window_median_s={:.2} window_min_s={min:.2} window_max_s={max:.2}",
        windows.len(),
        median(windows.clone())
    );
    Ok(())
}
