//! Message consumers on a real RabbitMQ broker: the key is the business key
//! the producer put in a header, a Redis marker (`precheck = "redis"`) is a
//! hint, the PostgreSQL dedup record decides. Each test declares queues of
//! its own (expiring a minute after their last use, should it fail) and
//! uses keys of its own; the effects table has no unique index, so a
//! duplicate effect would be counted.

// The workspace's test set-up (databases, Redis, skipping).
use idem_test_support as common;

mod bus;

use std::io::Write;
use std::sync::{Arc, Mutex};

use bus::{Bus, KEY_HEADER};
use common::{AppError, unique};
use idem::precheck::{Counters, PrecheckStore, counters};
use idem::{Error, Outcome, idempotent};
use lapin::message::Delivery;
use lapin::options::*;
use lapin::types::AMQPValue;
use sqlx::{PgPool, Postgres, Transaction};

/// The tests compare the process-wide precheck counters: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A message as the handler takes it: the producer's key, if it set one.
struct Message {
    key: Option<String>,
}

impl Message {
    fn of(delivery: &Delivery) -> Message {
        let key = delivery.properties.headers().as_ref().and_then(|h| match h.inner().get(KEY_HEADER) {
            Some(AMQPValue::LongString(key)) => Some(key.to_string()),
            _ => None,
        });
        Message { key }
    }
}

#[idempotent(key = "msg.key", scope = "tests.mq.book", precheck = "redis", ttl = "1h", store = "marks")]
async fn book(tx: &mut Transaction<'_, Postgres>, marks: &dyn PrecheckStore, msg: &Message) -> Result<i64, AppError> {
    let id = sqlx::query_scalar("INSERT INTO idem_test_coupons (trade_no) VALUES ($1) RETURNING id")
        .bind(msg.key.as_deref())
        .fetch_one(&mut **tx)
        .await?;
    Ok(id)
}

/// One delivery: begin, book, commit (if it succeeded).
async fn handle(
    pool: &PgPool,
    marks: &dyn PrecheckStore,
    delivery: &Delivery,
) -> (Result<i64, AppError>, Option<Outcome>) {
    let mut tx = pool.begin().await.unwrap();
    let out = idem::observe(book(&mut tx, marks, &Message::of(delivery))).await;
    if out.0.is_ok() {
        tx.commit().await.unwrap();
    }
    out
}

async fn effects(pool: &PgPool, key: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM idem_test_coupons WHERE trade_no = $1")
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn ack(delivery: &Delivery) {
    delivery.ack(BasicAckOptions::default()).await.unwrap();
}

fn delta(before: Counters) -> Counters {
    let after = counters();
    Counters {
        marked: after.marked - before.marked,
        seen: after.seen - before.seen,
        confirmed: after.confirmed - before.confirmed,
        missing: after.missing - before.missing,
        unavailable: after.unavailable - before.unavailable,
    }
}

/// PostgreSQL, the broker and Redis markers under a prefix of this test's.
async fn services() -> Option<(PgPool, Bus, idem::store::RedisStore, redis::aio::ConnectionManager, String)> {
    let pool = common::postgres().await?;
    let conn = common::redis().await?;
    let bus = Bus::new().await?;
    let prefix = format!("{}:", unique("idem-test-mq"));
    Some((pool, bus, idem::store::RedisStore::new(conn.clone(), prefix.clone()), conn, prefix))
}

/// Every marker of this test gone, as a FLUSHALL would leave them (without
/// flushing a Redis other tests share).
async fn flush(conn: &redis::aio::ConnectionManager, prefix: &str) {
    let mut conn = conn.clone();
    assert!(common::scan_unlink(&mut conn, &format!("{prefix}*")).await > 0, "the markers were in Redis");
}

#[tokio::test]
async fn a_redelivery_after_a_nack_replays_the_first_answer() {
    let _serial = SERIAL.lock().await;
    let Some((pool, bus, marks, _, _)) = services().await else { return };
    let key = unique("mq-nack");
    bus.publish(Some(&key)).await;
    let mut consumer = bus.consumer(10).await;

    let first = consumer.next().await;
    assert!(!first.redelivered);
    let (entry, outcome) = handle(&pool, &marks, &first).await;
    assert_eq!(outcome, Some(Outcome::Executed));
    // The work committed, then the consumer "crashed" before its ack.
    first.nack(BasicNackOptions { requeue: true, multiple: false }).await.unwrap();

    let again = consumer.next().await;
    assert!(again.redelivered, "the broker redelivers the nacked message");
    let before = counters();
    let (replayed, outcome) = handle(&pool, &marks, &again).await;
    assert_eq!(outcome, Some(Outcome::Replayed));
    assert_eq!(replayed.unwrap(), entry.unwrap(), "the first answer");
    let d = delta(before);
    assert_eq!((d.seen, d.confirmed, d.missing), (1, 1, 0), "confirmed by the record, no claim: {d:?}");
    ack(&again).await;

    assert_eq!(effects(&pool, &key).await, 1);
    assert!(consumer.idle(200).await, "acked: nothing more to deliver");
    bus.close().await;
}

#[tokio::test]
async fn two_consumers_racing_on_republished_copies_book_once() {
    let _serial = SERIAL.lock().await;
    let Some((pool, bus, marks, _, _)) = services().await else { return };
    let key = unique("mq-race");
    // One unacked delivery each: the broker hands one copy to each consumer.
    let (mut a, mut b) = (bus.consumer(1).await, bus.consumer(1).await);
    bus.publish(Some(&key)).await;
    bus.publish(Some(&key)).await; // re-published: a new message, the same key
    let (da, db) = tokio::join!(a.next(), b.next());
    let ((ra, oa), (rb, ob)) = tokio::join!(handle(&pool, &marks, &da), handle(&pool, &marks, &db));
    let mut outcomes = [oa.unwrap(), ob.unwrap()];
    outcomes.sort_by_key(|o| o.as_str());
    assert_eq!(outcomes, [Outcome::Executed, Outcome::Replayed]);
    assert_eq!(ra.unwrap(), rb.unwrap(), "both answer with the one entry");
    tokio::join!(ack(&da), ack(&db));
    assert_eq!(effects(&pool, &key).await, 1);
    bus.close().await;
}

#[tokio::test]
async fn redis_flushed_mid_stream_still_books_each_message_once() {
    let _serial = SERIAL.lock().await;
    let Some((pool, bus, marks, conn, prefix)) = services().await else { return };
    let keys: Vec<String> = (0..10).map(|_| unique("mq-flush")).collect();
    // Each key three times: the message, then two re-published copies.
    for key in keys.iter().chain(&keys).chain(&keys) {
        bus.publish(Some(key)).await;
    }
    let mut consumer = bus.consumer(10).await;
    let before = counters();
    let mut outcomes = Vec::new();
    for n in 0..30 {
        if n == 15 {
            flush(&conn, &prefix).await;
        }
        let delivery = consumer.next().await;
        let (entry, outcome) = handle(&pool, &marks, &delivery).await;
        entry.unwrap();
        outcomes.push(outcome.unwrap());
        ack(&delivery).await;
    }
    assert!(outcomes[..10].iter().all(|o| *o == Outcome::Executed), "{outcomes:?}");
    assert!(outcomes[10..].iter().all(|o| *o == Outcome::Replayed), "{outcomes:?}");
    // Before the flush: 10 first sights, 5 hits. After it: keys 5..9 (second
    // copies) and 0..4 (third copies) are first sights again, replayed by the
    // claim; keys 5..9 (third copies) hit the markers written after the flush.
    let d = delta(before);
    assert_eq!((d.marked, d.seen, d.confirmed, d.missing), (20, 10, 10, 0), "{d:?}");
    for key in &keys {
        assert_eq!(effects(&pool, key).await, 1, "{key}");
    }
    bus.close().await;
}

/// A log writer the test reads back.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn with_redis_down_the_database_alone_dedups_and_warns() {
    let _serial = SERIAL.lock().await;
    let Some((pool, bus, _, _, _)) = services().await else { return };
    let Some(down) = common::unreachable_redis().await else { return };
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
    let _logging = tracing_subscriber::util::SubscriberInitExt::set_default(subscriber);

    let key = unique("mq-down");
    bus.publish(Some(&key)).await;
    bus.publish(Some(&key)).await;
    let mut consumer = bus.consumer(10).await;
    let before = counters();
    let (first, second) = (consumer.next().await, consumer.next().await);
    let (entry, outcome) = handle(&pool, &down, &first).await;
    assert_eq!(outcome, Some(Outcome::Executed));
    ack(&first).await;
    let (replayed, outcome) = handle(&pool, &down, &second).await;
    assert_eq!(outcome, Some(Outcome::Replayed), "{replayed:?}");
    assert_eq!(replayed.unwrap(), entry.unwrap());
    ack(&second).await;

    let d = delta(before);
    assert_eq!((d.unavailable, d.marked, d.seen), (2, 0, 0), "{d:?}");
    assert_eq!(effects(&pool, &key).await, 1);
    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("WARN") && logs.contains("precheck store unreachable"), "{logs}");
    bus.close().await;
}

#[tokio::test]
async fn a_message_without_a_key_is_refused_and_dead_lettered_not_acked() {
    let _serial = SERIAL.lock().await;
    let Some((pool, bus, marks, _, _)) = services().await else { return };
    bus.publish(None).await;
    let mut consumer = bus.consumer(10).await;
    let delivery = consumer.next().await;
    let before = counters();
    let (refused, _) = handle(&pool, &marks, &delivery).await;
    match &refused {
        Err(AppError::Idem(e @ Error::InvalidKey { reason, .. })) => {
            assert!(reason.contains("msg.key") && reason.contains("None"), "{e}");
            assert!(!e.is_retryable(), "requeueing it would loop forever");
        }
        other => panic!("expected InvalidKey, got {other:?}"),
    }
    assert_eq!(delta(before), Counters::default(), "no marker for a message without a key");
    // Not done: rejected without requeue, so the broker dead-letters it.
    delivery.reject(BasicRejectOptions { requeue: false }).await.unwrap();
    let dead = bus.dead_letter().await.expect("the message is in the dead-letter queue");
    assert!(Message::of(&dead).key.is_none());
    assert!(dead.properties.headers().as_ref().is_some_and(|h| h.contains_key("x-death")));
    dead.ack(BasicAckOptions::default()).await.unwrap();
    assert!(consumer.idle(200).await, "not redelivered");
    bus.close().await;
}
