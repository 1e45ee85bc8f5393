//! `examples/coupon_handoff` run as a user runs it: embedded (two SQLite
//! files, the in-process broker), then with the orders on PostgreSQL and
//! the coupons on MariaDB, and the reverse, with the in-process broker,
//! RabbitMQ (PostgreSQL orders) and NATS JetStream (MariaDB orders). Each run ends with one line,
//! `callbacks=... published=... delivered=... coupons_granted=1 lost=0
//! duplicate_effects=0 resent=...`, and exits 0 only if it says so; each
//! works in a schema (database) of its own, so runs in parallel never meet.
//!
//! The example is a target of the root package: `cargo test --workspace`
//! builds it (with the outbox and both brokers, which this package's tests
//! turn on) before any test runs. Run alone, this test needs it built
//! first: `cargo build --example coupon_handoff --features rabbitmq,nats`.

use idem_test_support as common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

/// The example's binary, beside this test's (`target/<profile>/deps/..`),
/// no older than its source.
fn example() -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let binary =
        deps.parent().unwrap().join("examples").join(format!("coupon_handoff{}", std::env::consts::EXE_SUFFIX));
    let build = "build it: cargo build --example coupon_handoff --features rabbitmq,nats (cargo test --workspace does)";
    let built = std::fs::metadata(&binary).and_then(|m| m.modified());
    let built = built.unwrap_or_else(|e| panic!("{} is missing ({e}): {build}", binary.display()));
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/coupon_handoff.rs");
    let written = std::fs::metadata(source).and_then(|m| m.modified()).unwrap();
    assert!(built >= written, "{} is older than its source: {build}", binary.display());
    binary
}

/// Run the example with `args`: its last line's `key=value` pairs, once it
/// exited 0.
fn run(args: &[&str]) -> BTreeMap<String, u64> {
    let out = Command::new(example()).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?} exited with {}:\n{stdout}\n{stderr}", out.status);
    let last = stdout.lines().last().unwrap_or_default();
    let pair = |kv: &str| kv.split_once('=').map(|(k, v)| (k.to_owned(), v.parse().unwrap()));
    let line: BTreeMap<String, u64> = last.split_whitespace().filter_map(pair).collect();
    let keys = ["callbacks", "published", "delivered", "coupons_granted", "lost", "duplicate_effects", "resent"];
    assert!(keys.iter().all(|k| line.contains_key(*k)), "{last}");
    line
}

/// What every run must end with, whatever its databases, with the
/// in-process broker or RabbitMQ.
fn check(line: &BTreeMap<String, u64>) {
    check_effects(line);
    // Relay #1 before its kill, relay #2 after the outage, the re-send
    // (one more if a stalled machine let relay #1 give its publish up and
    // try again before the kill); and the consumer's own redelivery.
    assert!(line["published"] >= 3, "{line:?}");
    assert_eq!(line["delivered"], line["published"] + 1, "{line:?}");
}

/// One coupon, none lost, none twice, the re-send done.
fn check_effects(line: &BTreeMap<String, u64>) {
    assert_eq!(line["callbacks"], 1006, "{line:?}");
    assert_eq!(line["coupons_granted"], 1, "{line:?}");
    assert_eq!(line["lost"], 0, "{line:?}");
    assert_eq!(line["duplicate_effects"], 0, "{line:?}");
    assert_eq!(line["resent"], 1, "{line:?}");
}

fn url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

#[test]
fn embedded() {
    check(&run(&[]));
}

/// Both servers reachable (or the test skips, or fails when they are
/// required): their URLs.
async fn servers() -> Option<(String, String)> {
    common::postgres().await?;
    common::mysql().await?;
    Some((url("IDEM_PG_URL", common::DEFAULT_PG_URL), url("IDEM_MYSQL_URL", common::DEFAULT_MYSQL_URL)))
}

#[tokio::test]
async fn orders_on_postgres_coupons_on_mariadb() {
    let Some((pg, mysql)) = servers().await else { return };
    let line = tokio::task::spawn_blocking(move || run(&["--database-url", &pg, "--coupon-database-url", &mysql]));
    check(&line.await.unwrap());
}

#[tokio::test]
async fn orders_on_mariadb_coupons_on_postgres() {
    let Some((pg, mysql)) = servers().await else { return };
    let line = tokio::task::spawn_blocking(move || run(&["--database-url", &mysql, "--coupon-database-url", &pg]));
    check(&line.await.unwrap());
}

#[tokio::test]
async fn orders_on_postgres_coupons_on_mariadb_over_rabbitmq() {
    let Some((pg, mysql)) = servers().await else { return };
    let Some(amqp) = common::amqp().await else { return };
    let args = ["--database-url", &pg, "--coupon-database-url", &mysql, "--amqp-url", &amqp].map(str::to_owned);
    let line = tokio::task::spawn_blocking(move || run(&args.each_ref().map(String::as_str)));
    check(&line.await.unwrap());
}

/// JetStream drops the copies published again (their id is the same):
/// the consumer gets one, and its redelivery after the stop before its ack.
#[tokio::test]
async fn orders_on_mariadb_coupons_on_postgres_over_nats() {
    let Some((pg, mysql)) = servers().await else { return };
    let Some(nats) = common::nats().await else { return };
    let args = ["--database-url", &mysql, "--coupon-database-url", &pg, "--nats-url", &nats].map(str::to_owned);
    let line = tokio::task::spawn_blocking(move || run(&args.each_ref().map(String::as_str)));
    let line = line.await.unwrap();
    check_effects(&line);
    assert!(line["published"] >= 3, "{line:?}");
    assert_eq!(line["delivered"], 2, "{line:?}");
}
