//! Redis restarted between a lease claim and its completion.
//!
//! A test binary of its own: cargo runs test binaries one after another, so
//! restarting the server here cuts no other test's connection. Only a
//! server on this machine can be restarted; elsewhere the test says it
//! skipped (or fails, with `IDEM_REQUIRE_SERVICES=1`).

mod common;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::{AppError, unique};
use idem::RedisStore;
use idem::lease::LeaseStore;
use idem::{Error, idempotent};

#[idempotent(key = "id", strategy = "lease", lease = "10s", scope = "tests.redis_restart", store = "store")]
async fn transfer(
    store: &dyn LeaseStore,
    id: &str,
    runs: &AtomicUsize,
    go: tokio::sync::oneshot::Receiver<()>,
) -> Result<u64, AppError> {
    runs.fetch_add(1, SeqCst);
    let _ = go.await; // "calling the bank" until the test says go
    Ok(1)
}

fn config(conn_url: &str, name: &str) -> Option<String> {
    let out = Command::new("redis-cli").args(["-u", conn_url, "CONFIG", "GET", name]).output().ok()?;
    String::from_utf8(out.stdout).ok()?.lines().nth(1).map(str::to_owned)
}

/// Shut the server down without saving and start it again with the same
/// port and directory. `None` when it cannot be restarted from here.
async fn restart(url: &str) -> Option<()> {
    let port = config(url, "port")?;
    let dir = config(url, "dir")?;
    let save = config(url, "save").unwrap_or_default();
    let appendonly = config(url, "appendonly").unwrap_or_else(|| "no".into());
    let logfile = config(url, "logfile").unwrap_or_default();
    let _ = Command::new("redis-cli").args(["-u", url, "SHUTDOWN", "NOSAVE"]).output();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Command::new("redis-server")
        .args(["--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", &port, "--dir", &dir])
        .args(["--save", &save, "--appendonly", &appendonly, "--logfile", &logfile])
        .status()
        .ok()?;
    if !started.success() {
        return None;
    }
    for _ in 0..50 {
        let pong = Command::new("redis-cli").args(["-u", url, "PING"]).output().ok()?;
        if String::from_utf8_lossy(&pong.stdout).trim() == "PONG" {
            return Some(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

#[tokio::test]
async fn a_restart_between_claim_and_completion_is_a_clear_error_not_a_second_run() {
    let url = std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| common::DEFAULT_REDIS_URL.to_owned());
    let local = url.contains("127.0.0.1") || url.contains("localhost");
    let Some(conn) = common::redis().await else { return };
    if !local || Command::new("redis-server").arg("--version").output().is_err() {
        common::cannot_run(format!("Redis at {url} is not a server this test can restart"));
        return;
    }
    let store = Arc::new(RedisStore::new(conn, format!("{}:", unique("restart"))));
    let id = unique("t");
    let runs = Arc::new(AtomicUsize::new(0));
    let (go, wait) = tokio::sync::oneshot::channel();
    let first = {
        let (store, id, runs) = (store.clone(), id.clone(), runs.clone());
        tokio::spawn(async move { transfer(&*store, &id, &runs, wait).await })
    };
    while runs.load(SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The server goes away with the record (it keeps nothing on disk here),
    // and comes back empty while the body is still running.
    restart(&url).await.expect("restart the local Redis");
    go.send(()).unwrap();
    let result = first.await.unwrap();
    match result {
        Err(AppError::Idem(Error::LeaseLost { scope, .. })) => assert_eq!(scope, "tests.redis_restart"),
        // A store that kept the record (persistence on) completes normally.
        Ok(1) => {}
        other => panic!("expected LeaseLost (the record is gone) or Ok, got {other:?}"),
    }
    assert_eq!(runs.load(SeqCst), 1, "idem never runs the body a second time by itself");
}
