//! Batches on a real RabbitMQ broker, PostgreSQL and Redis: a poison
//! message in the middle of a batch, a whole batch redelivered, and the
//! consumer (the `mq_consumer` program, `--queue`) killed mid-batch and
//! restarted. Every message takes effect once, none is lost. Queues, keys,
//! runs and markers are each test's own.

// The workspace's test set-up (databases, Redis, skipping).
use idem_test_support as common;

mod bus;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use bus::{Bus, KEY_HEADER};
use common::{AppError, unique};
use idem::Guard;
use idem::batch::Handled;
use lapin::options::*;
use lapin::types::AMQPValue;
use sqlx::PgPool;

/// The program under test, on the test's services and queue, one consumer.
fn consumer(bus: &Bus, run: &str, batch: usize) -> Command {
    let env = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mq_consumer"));
    cmd.args(["--amqp-url", &env("IDEM_AMQP_URL", bus::DEFAULT_AMQP_URL)])
        .args(["--redis-url", &env("IDEM_REDIS_URL", common::DEFAULT_REDIS_URL)])
        .args(["--database-url", &env("IDEM_PG_URL", common::DEFAULT_PG_URL)])
        .args(["--queue", &bus.queue, "--run", run, "--batch", &batch.to_string()])
        .args(["--consumers", "1", "--max-attempts", "3", "--nack-every", "1000000000"]);
    cmd
}

/// The `key=value` pairs of the program's last line.
fn line(stdout: &str) -> BTreeMap<String, i64> {
    let last = stdout.lines().rev().find(|l| l.contains("dead_lettered=")).unwrap_or_else(|| panic!("{stdout}"));
    let pair = |kv: &str| kv.split_once('=').map(|(k, v)| (k.to_owned(), v.parse().unwrap()));
    last.split_whitespace().filter_map(pair).collect()
}

/// Run the program to its end (it stops once the queue is idle).
async fn drain(mut cmd: Command) -> (BTreeMap<String, i64>, String) {
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap()).await.unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    (line(&stdout), stdout)
}

async fn publish_posting(bus: &Bus, key: &str, account: i64) {
    bus.publish_body(Some(key), format!(r#"{{"account":{account},"amount_cents":100}}"#).as_bytes()).await;
}

/// How often the program booked each key of `run`.
async fn applied(pool: &PgPool, run: &str) -> BTreeMap<String, i64> {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT business_key, COUNT(*) FROM mq_applied WHERE run = $1 GROUP BY business_key")
            .bind(run)
            .fetch_all(pool)
            .await
            .unwrap();
    rows.into_iter().collect()
}

fn once(keys: &[String]) -> BTreeMap<String, i64> {
    keys.iter().map(|k| (k.clone(), 1)).collect()
}

/// The dead-lettered copy of a message, as the dead-letter queue holds it.
struct DeadLetter {
    attempts: i64,
    error: String,
    message_id: Option<String>,
}

impl DeadLetter {
    /// Take (and acknowledge) the next dead letter, which must be `key`'s.
    async fn take(bus: &Bus, key: &str) -> DeadLetter {
        let dead = bus.dead_letter().await.unwrap_or_else(|| panic!("{key} is not in the dead-letter queue"));
        let headers = dead.properties.headers().clone().unwrap();
        let header = |name: &str| headers.inner().get(name).cloned();
        assert_eq!(header(KEY_HEADER), Some(AMQPValue::LongString(key.into())));
        let Some(AMQPValue::LongLongInt(attempts)) = header("x-idem-attempts") else { panic!("{headers:?}") };
        let Some(AMQPValue::LongString(error)) = header("x-idem-error") else { panic!("{headers:?}") };
        let message_id = dead.properties.message_id().as_ref().map(|id| id.to_string());
        dead.ack(BasicAckOptions::default()).await.unwrap();
        DeadLetter { attempts, error: error.to_string(), message_id }
    }
}

#[tokio::test]
async fn a_poison_message_in_the_middle_of_a_batch_is_retried_then_dead_lettered_with_its_error() {
    let Some(pool) = common::postgres().await else { return };
    let Some(_) = common::redis().await else { return };
    let Some(bus) = Bus::new().await else { return };
    let (run, poison) = (unique("run"), unique("mq-poison"));
    let good: Vec<String> = (0..4).map(|_| unique("mq-good")).collect();
    for (i, key) in good.iter().enumerate() {
        if i == 2 {
            publish_posting(&bus, &poison, -1).await; // the ledger has no account -1
        }
        publish_posting(&bus, key, 1).await;
    }
    let mut cmd = consumer(&bus, &run, 5);
    cmd.arg("--trace");
    let started = std::time::Instant::now();
    let (counts, stdout) = drain(cmd).await;
    // Each retry waited out its backoff in `{queue}.retry` (200 ms, 400 ms).
    assert!(started.elapsed() >= std::time::Duration::from_millis(600), "{:?}", started.elapsed());
    assert!(stdout.contains(&format!("batch 1, message 3: applying {poison}")), "{stdout}");
    assert!(stdout.contains(&format!("batch 1, message 5: applying {}", good[3])), "the batch went on: {stdout}");
    // One batch of five, then the poison's two retries, each a batch of its own.
    let expected =
        [("delivered", 7), ("batches", 3), ("executed", 4), ("retried", 2), ("poison", 1), ("dead_lettered", 1)];
    for (field, n) in expected {
        assert_eq!(counts[field], n, "{field}: {stdout}");
    }
    assert_eq!(applied(&pool, &run).await, once(&good), "the others once, the poison never");

    let dead = DeadLetter::take(&bus, &poison).await;
    assert_eq!((dead.attempts, dead.error.as_str()), (3, "the ledger has no account -1"));
    bus.close().await;
}

#[tokio::test]
async fn a_body_that_does_not_decode_is_dead_lettered_at_its_first_attempt() {
    let Some(pool) = common::postgres().await else { return };
    let Some(_) = common::redis().await else { return };
    let Some(bus) = Bus::new().await else { return };
    let (run, broken) = (unique("run"), unique("mq-broken"));
    let good: Vec<String> = (0..2).map(|_| unique("mq-good")).collect();
    publish_posting(&bus, &good[0], 1).await;
    bus.publish_body(Some(&broken), b"{\"account\": 1, \"amount_cents\": ").await;
    publish_posting(&bus, &good[1], 1).await;
    let (counts, stdout) = drain(consumer(&bus, &run, 5)).await;
    let expected = [("delivered", 3), ("executed", 2), ("retried", 0), ("malformed", 1), ("dead_lettered", 1)];
    for (field, n) in expected {
        assert_eq!(counts[field], n, "{field}: {stdout}");
    }
    assert_eq!(applied(&pool, &run).await, once(&good));
    let dead = DeadLetter::take(&bus, &broken).await;
    assert_eq!(dead.attempts, 1);
    assert!(dead.error.starts_with("the body is not a posting: "), "{}", dead.error);
    assert!(dead.message_id.is_some_and(|id| id.starts_with("m-")), "the copy keeps the producer's message id");
    bus.close().await;
}

#[tokio::test]
async fn a_whole_batch_redelivered_after_its_work_replays_every_message() {
    let Some(pool) = common::postgres().await else { return };
    let Some(conn) = common::redis().await else { return };
    let Some(bus) = Bus::new().await else { return };
    let prefix = format!("{}:", unique("idem-test-batch"));
    let marks = idem::store::RedisStore::new(conn.clone(), prefix.clone());
    let keys: Vec<String> = (0..5).map(|_| unique("mq-batch")).collect();
    for key in &keys {
        bus.publish(Some(key)).await;
    }
    let mut consumer = bus.consumer(5).await;
    let mut answers = Vec::new();
    for round in ["delivered", "redelivered"] {
        let mut batch = Vec::new();
        for _ in &keys {
            batch.push(consumer.next().await);
        }
        assert!(batch.iter().all(|d| d.redelivered == (round == "redelivered")), "{round}");
        let guarded = batch.iter().map(|d| {
            let key = d.properties.headers().as_ref().and_then(|h| match h.inner().get(KEY_HEADER) {
                Some(AMQPValue::LongString(key)) => Some(key.to_string()),
                _ => None,
            });
            (Guard::new("tests.mq.batch").key(&key).precheck(&marks, Duration::from_secs(3600)), key)
        });
        let handled = idem::batch::dedup(&pool, guarded, |tx, key| {
            Box::pin(async move {
                let id: i64 = sqlx::query_scalar("INSERT INTO idem_test_coupons (trade_no) VALUES ($1) RETURNING id")
                    .bind(key.as_deref())
                    .fetch_one(&mut **tx)
                    .await?;
                Ok::<_, AppError>(id)
            })
        })
        .await;
        let got: Vec<(bool, i64)> = handled
            .into_iter()
            .map(|h| match h {
                Handled::Succeeded(id) => (true, id),
                Handled::Repeat(Some(id)) => (false, id),
                Handled::Repeat(None) | Handled::Failed(_) => panic!("{round}: {h:?}"),
            })
            .collect();
        assert!(got.iter().all(|(ran, _)| *ran == (round == "delivered")), "{round}: {got:?}");
        answers.push(got.into_iter().map(|(_, id)| id).collect::<Vec<_>>());
        let last = batch.last().unwrap();
        if round == "delivered" {
            // The work committed, then the consumer lost its channel before its acks.
            last.nack(BasicNackOptions { multiple: true, requeue: true }).await.unwrap();
        } else {
            last.ack(BasicAckOptions { multiple: true }).await.unwrap();
        }
    }
    assert_eq!(answers[0], answers[1], "every first answer replayed");
    for key in &keys {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_test_coupons WHERE trade_no = $1")
            .bind(key)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(n, 1, "{key}");
    }
    assert!(consumer.idle(200).await, "all acked");
    let mut conn = conn;
    assert_eq!(common::scan_unlink(&mut conn, &format!("{prefix}*")).await, keys.len());
    bus.close().await;
}

#[tokio::test]
async fn a_consumer_killed_mid_batch_and_restarted_books_every_message_once() {
    let Some(pool) = common::postgres().await else { return };
    let Some(_) = common::redis().await else { return };
    let Some(bus) = Bus::new().await else { return };
    let run = unique("run");
    let keys: Vec<String> = (0..30).map(|_| unique("mq-kill")).collect();
    for key in &keys {
        publish_posting(&bus, key, 1).await;
    }
    // Slow work, so that the kill lands inside the second batch of ten.
    let mut cmd = consumer(&bus, &run, 10);
    // Its stderr to a file: what it said if it stopped before the kill.
    let errors = std::env::temp_dir().join(format!("{run}.stderr"));
    let stderr = std::fs::File::create(&errors).unwrap();
    cmd.args(["--trace", "--work-ms", "100"]).stdout(Stdio::piped()).stderr(stderr);
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let started = tokio::task::spawn_blocking(move || {
        let mut applying = 0;
        for line in BufReader::new(stdout).lines().map(Result::unwrap) {
            applying += usize::from(line.contains(": applying "));
            if line.contains("batch 2, message 4: applying") {
                break;
            }
        }
        applying
    });
    let applying = tokio::time::timeout(Duration::from_secs(30), started).await.expect("batch 2 began").unwrap();
    child.kill().unwrap(); // SIGKILL: no ack, no rollback sent, no cleanup
    child.wait().unwrap();
    let said = std::fs::read_to_string(&errors).unwrap_or_default();
    let _ = std::fs::remove_file(&errors);
    assert!(applying > 0, "the consumer stopped before its first message: {said}");
    // Batch 1 was acked; of batch 2, messages 1 to 3 committed, 4 was in its transaction.
    let committed = applying - 1;
    assert_eq!(committed, 13, "10 of batch 1 and 3 of batch 2");

    let (counts, stdout) = drain(consumer(&bus, &run, 10)).await;
    assert_eq!(counts["replayed"], 3, "batch 2's committed messages, redelivered: {stdout}");
    assert_eq!(counts["executed"], 30 - 13, "{stdout}");
    assert_eq!((counts["dead_lettered"], counts["errors"]), (0, 0), "{stdout}");
    assert_eq!(applied(&pool, &run).await, once(&keys), "every message once, none lost");
    bus.close().await;
}
