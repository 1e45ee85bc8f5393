//! The outbox's real publishers, `RabbitMq` and `JetStream`, on SQLite,
//! PostgreSQL and MariaDB, against the real brokers (`IDEM_AMQP_URL`,
//! `IDEM_NATS_URL`): a message written in a guarded transaction goes out
//! once per commit, whatever stops on the way (the relay before or after
//! publishing, the broker's connection for 10 s), and a consumer that
//! keys its own dedup record on the delivery's id
//! (`idem::outbox::consumer::message_id`) takes it once; a message the
//! broker refuses is dead-lettered with its words while the rest go on.
//!
//! Each test has a queue (RabbitMQ) or a stream (JetStream) of its own,
//! deleted at its end (a queue left by a failed test expires; a stream
//! does not: `nats stream rm` the `idemtest-*` ones), and a scope of its
//! own, which its relays relay alone: the outbox table of PostgreSQL and
//! MariaDB is shared.

use idem_test_support as common;

#[macro_use]
mod outbox_calls;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::proxy::Proxy;
use common::{AppError, unique};
use futures_util::StreamExt as _;
use idem::outbox::{
    JetStream, KEY_HEADER, Message, MessageId, MessageQuery, MessageState, PublishError, Publisher, RabbitMq, Relay,
    consumer,
};
use idem::store::BoxFuture;
use idem::{Claim, Guard};
use outbox_calls::{End, everything};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Broker {
    Rabbit,
    Nats,
}

/// A delivery as the consumer read it (and acknowledged it).
#[derive(Clone, Debug)]
struct Got {
    id: MessageId,
    key: String,
    payload: Vec<u8>,
}

/// A test's place on a broker: a queue on the default exchange (RabbitMQ)
/// or a stream capturing `<name>.>` (JetStream), a consumer on it, and a
/// topic no queue or stream takes.
struct Bus {
    broker: Broker,
    url: String,
    /// Where the test's messages go (the queue's name, a subject of the stream).
    topic: String,
    /// Where nothing takes them: the broker refuses.
    nowhere: String,
    rx: UnboundedReceiver<Got>,
    consumer: tokio::task::JoinHandle<()>,
    place: Place,
}

enum Place {
    Queue(lapin::Connection, lapin::Channel),
    Stream(async_nats::jetstream::Context),
}

/// The text of a header of an AMQP delivery.
fn amqp_header(d: &lapin::message::Delivery, name: &str) -> Option<String> {
    match d.properties.headers().as_ref()?.inner().get(name)? {
        lapin::types::AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        _ => None,
    }
}

impl Bus {
    async fn new(broker: Broker) -> Option<Bus> {
        use lapin::options::*;
        use lapin::types::{AMQPValue, FieldTable};
        let (tx, rx) = unbounded_channel();
        match broker {
            Broker::Rabbit => {
                let url = common::amqp().await?;
                let conn = lapin::Connection::connect(&url, lapin::ConnectionProperties::default()).await.unwrap();
                let channel = conn.create_channel().await.unwrap();
                let queue = unique("idem-test-outbox");
                let mut args = FieldTable::default();
                // Gone a minute after its last use, should the test fail.
                args.insert("x-expires".into(), AMQPValue::LongInt(60_000));
                channel.queue_declare(queue.as_str().into(), QueueDeclareOptions::default(), args).await.unwrap();
                let reader = conn.create_channel().await.unwrap();
                reader.basic_qos(1000, BasicQosOptions::default()).await.unwrap();
                let tag = unique("consumer");
                let mut deliveries = reader
                    .basic_consume(queue.as_str().into(), tag.into(), Default::default(), FieldTable::default())
                    .await
                    .unwrap();
                let consumer = tokio::spawn(async move {
                    let _reader = reader;
                    while let Some(Ok(d)) = deliveries.next().await {
                        let got = Got {
                            id: consumer::message_id(&d).unwrap(),
                            key: amqp_header(&d, KEY_HEADER).unwrap(),
                            payload: d.data.clone(),
                        };
                        assert_eq!(d.properties.delivery_mode(), &Some(2), "persistent");
                        d.acker.ack(BasicAckOptions::default()).await.unwrap();
                        if tx.send(got).is_err() {
                            break;
                        }
                    }
                });
                let nowhere = format!("{queue}.nowhere");
                Some(Bus { broker, url, topic: queue, nowhere, rx, consumer, place: Place::Queue(conn, channel) })
            }
            Broker::Nats => {
                use async_nats::jetstream::consumer::{AckPolicy, pull};
                let url = common::nats().await?;
                let js = async_nats::jetstream::new(async_nats::connect(&url).await.unwrap());
                let name = unique("idemtest");
                let stream = js
                    .get_or_create_stream(async_nats::jetstream::stream::Config {
                        name: name.clone(),
                        subjects: vec![format!("{name}.>")],
                        duplicate_window: Duration::from_secs(120),
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                let config = pull::Config { ack_policy: AckPolicy::Explicit, ..Default::default() };
                let reader = stream.create_consumer(config).await.unwrap();
                let mut messages = reader.messages().await.unwrap();
                let consumer = tokio::spawn(async move {
                    while let Some(Ok(m)) = messages.next().await {
                        let key = m.headers.as_ref().and_then(|h| h.get(KEY_HEADER)).unwrap().to_string();
                        let got = Got { id: consumer::message_id(&m).unwrap(), key, payload: m.payload.to_vec() };
                        m.ack().await.unwrap();
                        if tx.send(got).is_err() {
                            break;
                        }
                    }
                });
                let (topic, nowhere) = (format!("{name}.coupons"), format!("{name}-nowhere.coupons"));
                Some(Bus { broker, url, topic, nowhere, rx, consumer, place: Place::Stream(js) })
            }
        }
    }

    /// A publisher to this broker, through `proxy` if given.
    async fn publisher(&self, proxy: Option<&Proxy>) -> Arc<dyn Publisher> {
        let url = proxy.map_or_else(|| self.url.clone(), |p| p.url(&self.url));
        match self.broker {
            Broker::Rabbit => Arc::new(RabbitMq::connect(&url).await.unwrap().confirm_timeout(Duration::from_secs(2))),
            Broker::Nats => Arc::new(JetStream::connect(&url).await.unwrap().ack_timeout(Duration::from_secs(1))),
        }
    }

    /// A proxy to this broker.
    async fn proxy(&self) -> Proxy {
        Proxy::start(&common::proxy::host_port(&self.url)).await
    }

    /// Receive until `n` distinct ids came (or `within` passed): every
    /// delivery, in order.
    async fn receive(&mut self, n: usize, within: Duration) -> Vec<Got> {
        let deadline = Instant::now() + within;
        let (mut got, mut ids) = (Vec::new(), HashSet::new());
        while ids.len() < n {
            match tokio::time::timeout_at(deadline.into(), self.rx.recv()).await {
                Ok(Some(m)) => {
                    ids.insert(m.id.clone());
                    got.push(m);
                }
                _ => break,
            }
        }
        got
    }

    /// Nothing more arrives within `quiet`.
    async fn nothing_more(&mut self, quiet: Duration) {
        if let Ok(Some(m)) = tokio::time::timeout(quiet, self.rx.recv()).await {
            panic!("unexpected delivery of {} (key {})", m.id, m.key);
        }
    }

    /// How many messages the stream holds (JetStream only).
    async fn stored(&self) -> Option<u64> {
        match &self.place {
            Place::Queue(..) => None,
            Place::Stream(js) => {
                let name = self.topic.split('.').next().unwrap();
                Some(js.get_stream(name).await.unwrap().get_info().await.unwrap().state.messages)
            }
        }
    }

    async fn close(self) {
        self.consumer.abort();
        match self.place {
            Place::Queue(conn, channel) => {
                use lapin::options::QueueDeleteOptions;
                let _ = channel.queue_delete(self.topic.as_str().into(), QueueDeleteOptions::default()).await;
                let _ = conn.close(200, "done".into()).await;
            }
            Place::Stream(js) => {
                let _ = js.delete_stream(self.topic.split('.').next().unwrap()).await;
            }
        }
    }
}

/// A publisher that hands each message to the broker and then, while
/// `stalled`, never returns: the relay stopped between the broker's
/// confirmation and marking the message sent.
struct StallAfterPublish {
    inner: Arc<dyn Publisher>,
    stalled: AtomicBool,
}

impl Publisher for StallAfterPublish {
    fn kind(&self) -> &'static str {
        "stall-after-publish"
    }

    fn publish<'a>(&'a self, m: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(async move {
            self.inner.publish(m).await?;
            if self.stalled.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            Ok(())
        })
    }
}

macro_rules! broker_suite {
    (mod $m:ident; db = $db:ty; placeholder = $ph:literal; pool = $pool:expr; broker = $broker:expr;
     fleet = ($keys:expr, $per_key:expr); down = $down:expr;) => {
        mod $m {
            use super::*;

            outbox_calls!($db, $ph);

            /// The pool and the test's place on the broker, or the test skips.
            macro_rules! setup {
                () => {{
                    let Some(pool) = $pool.await else { return };
                    let Some(bus) = Bus::new($broker).await else { return };
                    (pool, bus)
                }};
            }

            /// The consumer's work for a delivery: its effect (a coupon
            /// row) under a dedup record keyed on the delivery's id, in
            /// one transaction. Whether it took effect.
            async fn take(pool: &Pool, scope: &str, got: &Got) -> bool {
                let mut tx = pool.begin().await.unwrap();
                let guard = Guard::new(scope.to_owned()).key(&got.id);
                let applied = match guard.dedup::<(), _>(&mut tx).await.unwrap() {
                    Claim::Replay(()) => false,
                    Claim::Run(ticket) => {
                        sqlx::query(concat!("INSERT INTO idem_test_coupons (trade_no) VALUES (", $ph, ")"))
                            .bind(got.id.as_str())
                            .execute(&mut *tx)
                            .await
                            .unwrap();
                        ticket.complete(&mut tx, Ok::<(), AppError>(())).await.unwrap().unwrap();
                        true
                    }
                };
                tx.commit().await.unwrap();
                applied
            }

            /// The coupons granted for `id`.
            async fn effects(pool: &Pool, id: &MessageId) -> i64 {
                sqlx::query_scalar(concat!("SELECT COUNT(*) FROM idem_test_coupons WHERE trade_no = ", $ph))
                    .bind(id.as_str())
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            fn relay(pool: &Pool, publisher: &Arc<dyn Publisher>, scope: &str) -> Relay<Db> {
                Relay::new(pool.clone(), publisher.clone())
                    .scope(scope)
                    .poll_interval(Duration::from_millis(50))
                    .backoff(Duration::from_millis(50), Duration::from_millis(500))
            }

            #[tokio::test]
            async fn a_rolled_back_body_publishes_nothing() {
                let (pool, mut bus) = setup!();
                let scope = unique("brokers.rollback");
                let publisher = bus.publisher(None).await;
                let topic = bus.topic.clone();
                call(&pool, &scope, "T-1", &[(&topic, b"a")], End::Rollback).await.unwrap();
                call(&pool, &scope, "T-2", &[(&topic, b"b")], End::FailCommit).await.unwrap();
                assert_eq!(relay(&pool, &publisher, &scope).drain().await.unwrap().claimed, 0);
                // The same calls committed: out, with their ids.
                let ids = call(&pool, &scope, "T-1", &[(&topic, b"a")], End::Commit).await.unwrap();
                assert_eq!(relay(&pool, &publisher, &scope).drain().await.unwrap().sent, 1);
                let got = bus.receive(1, Duration::from_secs(10)).await;
                assert_eq!(
                    got.iter().map(|g| (&g.id, g.key.as_str(), &g.payload[..])).collect::<Vec<_>>(),
                    [(&ids[0], "T-1", &b"a"[..])]
                );
                bus.nothing_more(Duration::from_millis(300)).await;
                forget(&pool, &scope).await;
                bus.close().await;
            }

            #[tokio::test]
            async fn committed_before_a_crash_it_goes_out_later_and_takes_effect_once() {
                let (pool, mut bus) = setup!();
                let scope = unique("brokers.late");
                let binary: &[u8] = &[0xff, 0x00, b'\'', 0x80];
                let topic = bus.topic.clone();
                let ids = call(&pool, &scope, "T-1", &[(&topic, binary)], End::Commit).await.unwrap();
                // The service stopped here: committed, never published. It
                // starts again, with its relay.
                let publisher = bus.publisher(None).await;
                let relay = relay(&pool, &publisher, &scope).start();
                let got = bus.receive(1, Duration::from_secs(10)).await;
                relay.stop().await;
                assert_eq!(got.len(), 1);
                assert_eq!((&got[0].id, &got[0].payload[..]), (&ids[0], binary));
                assert!(take(&pool, &format!("{scope}.consumer"), &got[0]).await);
                bus.nothing_more(Duration::from_millis(300)).await;
                assert_eq!(effects(&pool, &ids[0]).await, 1);
                let rows = idem::outbox::list_messages(&pool, &everything(&scope)).await.unwrap();
                assert_eq!(rows[0].state, MessageState::Sent);
                forget(&pool, &scope).await;
                bus.close().await;
            }

            #[tokio::test]
            async fn published_before_a_crash_it_goes_out_again_and_takes_effect_once() {
                let (pool, mut bus) = setup!();
                let scope = unique("brokers.killed");
                let topic = bus.topic.clone();
                let ids = call(&pool, &scope, "T-1", &[(&topic, b"grant")], End::Commit).await.unwrap();
                let real = bus.publisher(None).await;
                let stalling: Arc<dyn Publisher> =
                    Arc::new(StallAfterPublish { inner: real.clone(), stalled: AtomicBool::new(true) });
                let lease = Duration::from_secs(1);
                let doomed = relay(&pool, &stalling, &scope).claim_lease(lease).start();
                let first = bus.receive(1, Duration::from_secs(10)).await;
                drop(doomed); // confirmed by the broker, never marked sent
                assert_eq!(first.len(), 1);
                let next = relay(&pool, &real, &scope).claim_lease(lease);
                let deadline = Instant::now() + Duration::from_secs(10);
                while idem::outbox::oldest_pending(&pool, Some(&scope)).await.unwrap().is_some() {
                    assert!(Instant::now() < deadline, "sent again once the claim ran out");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    next.drain().await.unwrap();
                }
                let again = bus.receive(2, Duration::from_secs(2)).await;
                let deliveries: Vec<&Got> = first.iter().chain(&again).collect();
                assert!(deliveries.iter().all(|g| g.id == ids[0]), "one id");
                match $broker {
                    // Delivered again, to be deduplicated by the consumer.
                    Broker::Rabbit => assert_eq!(deliveries.len(), 2),
                    // Dropped by the stream's duplicate window.
                    Broker::Nats => {
                        assert_eq!(deliveries.len(), 1);
                        assert_eq!(bus.stored().await, Some(1));
                    }
                }
                let consumer = format!("{scope}.consumer");
                let mut applied = 0;
                for got in deliveries {
                    applied += usize::from(take(&pool, &consumer, got).await);
                }
                assert_eq!(applied, 1);
                assert_eq!(effects(&pool, &ids[0]).await, 1, "one effect");
                forget(&pool, &scope).await;
                bus.close().await;
            }

            #[tokio::test]
            async fn four_relays_hand_over_every_message_once_in_key_order() {
                let (pool, mut bus) = setup!();
                let scope = unique("brokers.fleet");
                let (keys, per_key): (usize, u32) = ($keys, $per_key);
                let started = Instant::now();
                let mut writers = tokio::task::JoinSet::new();
                for w in 0..4 {
                    let (pool, scope, topic) = (pool.clone(), scope.clone(), bus.topic.clone());
                    writers.spawn(async move {
                        let payloads: Vec<[u8; 4]> = (0..per_key).map(u32::to_be_bytes).collect();
                        let messages: Vec<(&str, &[u8])> = payloads.iter().map(|p| (topic.as_str(), &p[..])).collect();
                        for k in (w..keys).step_by(4) {
                            call(&pool, &scope, &format!("K-{k}"), &messages, End::Commit).await.unwrap();
                        }
                    });
                }
                let publisher = bus.publisher(None).await;
                let relays: Vec<_> = (0..4).map(|_| relay(&pool, &publisher, &scope).batch_size(250).start()).collect();
                writers.join_all().await;
                let written = started.elapsed();
                let total = keys * per_key as usize;
                let got = bus.receive(total, Duration::from_secs(60)).await;
                for relay in relays {
                    relay.stop().await;
                }
                let mut effects: HashMap<&MessageId, usize> = HashMap::new();
                let mut order: HashMap<&str, Vec<u32>> = HashMap::new();
                for g in &got {
                    if !effects.contains_key(&g.id) {
                        order.entry(&g.key).or_default().push(u32::from_be_bytes(g.payload[..4].try_into().unwrap()));
                    }
                    *effects.entry(&g.id).or_default() += 1;
                }
                assert_eq!(effects.len(), total, "none lost");
                assert_eq!(order.len(), keys);
                assert!(order.values().all(|seen| *seen == (0..per_key).collect::<Vec<_>>()), "per-key order");
                let copies = got.len() - total;
                eprintln!(
                    "{total} messages over {:?}: written in {written:?}, all consumed after {:?} ({copies} copies)",
                    $broker,
                    started.elapsed()
                );
                let rows = idem::outbox::list_messages(&pool, &everything(&scope)).await.unwrap();
                assert!(rows.iter().all(|e| e.state == MessageState::Sent), "all marked sent");
                forget(&pool, &scope).await;
                bus.close().await;
            }

            #[tokio::test]
            async fn a_broker_out_of_reach_loses_nothing() {
                let (pool, mut bus) = setup!();
                let scope = unique("brokers.down");
                let proxy = bus.proxy().await;
                let publisher = bus.publisher(Some(&proxy)).await;
                let relay = relay(&pool, &publisher, &scope).max_attempts(1000).start();
                let topic = bus.topic.clone();
                let before = call(&pool, &scope, "K-0", &[(&topic, b"before")], End::Commit).await.unwrap();
                assert_eq!(bus.receive(1, Duration::from_secs(10)).await.len(), 1, "the path works");
                // Its confirmation back too (delivered is not yet confirmed:
                // cut before the relay had it, it would fail as well).
                let deadline = Instant::now() + Duration::from_secs(10);
                while idem::outbox::list_messages(&pool, &everything(&scope))
                    .await
                    .unwrap()
                    .iter()
                    .any(|e| e.state != MessageState::Sent)
                {
                    assert!(Instant::now() < deadline, "the first message was not marked sent");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                proxy.cut();
                let down = Instant::now();
                let mut ids: HashSet<MessageId> = HashSet::new();
                for k in 1..=5 {
                    ids.extend(call(&pool, &scope, &format!("K-{k}"), &[(&topic, b"x")], End::Commit).await.unwrap());
                }
                tokio::time::sleep($down).await;
                let rows = idem::outbox::list_messages(&pool, &everything(&scope)).await.unwrap();
                let failing: Vec<_> = rows.iter().filter(|e| e.state == MessageState::Failing).collect();
                assert_eq!(failing.len(), 5, "tried and failed while it was out of reach: {rows:?}");
                assert!(
                    failing.iter().all(|e| e.last_error.as_deref().is_some_and(|e| e.contains("broker unavailable"))),
                    "{failing:?}"
                );
                bus.nothing_more(Duration::ZERO).await;
                proxy.restore();
                let got = bus.receive(5, Duration::from_secs(30)).await;
                let back = down.elapsed();
                // A copy the client buffered while cut may reach the
                // consumer before the relay's next try is confirmed.
                let deadline = Instant::now() + Duration::from_secs(10);
                while idem::outbox::oldest_pending(&pool, Some(&scope)).await.unwrap().is_some() {
                    assert!(Instant::now() < deadline, "marked sent once the broker confirmed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                relay.stop().await;
                assert_eq!(got.iter().map(|g| g.id.clone()).collect::<HashSet<_>>(), ids, "none lost");
                assert!(!ids.contains(&before[0]));
                let rows = idem::outbox::list_messages(&pool, &everything(&scope)).await.unwrap();
                assert!(rows.iter().all(|e| e.state == MessageState::Sent), "{rows:?}");
                eprintln!("{:?} out of reach for {:?}: all delivered {back:?} after the cut", $broker, $down);
                forget(&pool, &scope).await;
                bus.close().await;
            }

            #[tokio::test]
            async fn a_refused_message_goes_dead_with_the_brokers_words_and_the_rest_go_on() {
                let (pool, mut bus) = setup!();
                let scope = unique("brokers.refused");
                let (topic, nowhere) = (bus.topic.clone(), bus.nowhere.clone());
                // The refused one first, and after it a message of its own key.
                let poison =
                    call(&pool, &scope, "T-1", &[(&nowhere, b"p"), (&topic, b"after")], End::Commit).await.unwrap();
                let other = call(&pool, &scope, "T-2", &[(&topic, b"other")], End::Commit).await.unwrap();
                let publisher = bus.publisher(None).await;
                let report = relay(&pool, &publisher, &scope).drain().await.unwrap();
                assert_eq!((report.dead, report.sent), (1, 2), "{report:?}");
                let got = bus.receive(2, Duration::from_secs(10)).await;
                assert_eq!(
                    got.iter().map(|g| g.id.clone()).collect::<HashSet<_>>(),
                    HashSet::from([poison[1].clone(), other[0].clone()])
                );
                let query = MessageQuery { scope: Some(scope.clone()), ..MessageQuery::default() };
                let listed = idem::outbox::list_messages(&pool, &query).await.unwrap();
                assert_eq!(listed.len(), 1, "{listed:?}");
                assert_eq!((&listed[0].id, listed[0].state), (&poison[0], MessageState::Dead));
                let error = listed[0].last_error.as_deref().unwrap();
                let words = match $broker {
                    Broker::Rabbit => "NO_ROUTE",
                    Broker::Nats => "no stream captures the subject",
                };
                assert!(error.starts_with("refused by the broker") && error.contains(words), "{error}");
                forget(&pool, &scope).await;
                bus.close().await;
            }
        }
    };
}

broker_suite! {
    mod sqlite_rabbitmq;
    db = sqlx::Sqlite; placeholder = "?"; pool = common::sqlite(); broker = Broker::Rabbit;
    fleet = (500, 20); down = Duration::from_secs(10);
}

broker_suite! {
    mod sqlite_nats;
    db = sqlx::Sqlite; placeholder = "?"; pool = common::sqlite(); broker = Broker::Nats;
    fleet = (500, 20); down = Duration::from_secs(10);
}

broker_suite! {
    mod postgres_rabbitmq;
    db = sqlx::Postgres; placeholder = "$1"; pool = common::postgres(); broker = Broker::Rabbit;
    fleet = (500, 20); down = Duration::from_secs(10);
}

broker_suite! {
    mod postgres_nats;
    db = sqlx::Postgres; placeholder = "$1"; pool = common::postgres(); broker = Broker::Nats;
    fleet = (500, 20); down = Duration::from_secs(10);
}

broker_suite! {
    mod mysql_rabbitmq;
    db = sqlx::MySql; placeholder = "?"; pool = common::mysql(); broker = Broker::Rabbit;
    fleet = (500, 20); down = Duration::from_secs(10);
}

broker_suite! {
    mod mysql_nats;
    db = sqlx::MySql; placeholder = "?"; pool = common::mysql(); broker = Broker::Nats;
    fleet = (500, 20); down = Duration::from_secs(10);
}

/// A delivery whose producer set no id cannot be deduplicated by id: the
/// helper says which delivery, and where it looked.
#[tokio::test]
async fn a_delivery_without_an_id_is_named_in_the_error() {
    use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
    let Some(url) = common::amqp().await else { return };
    let conn = lapin::Connection::connect(&url, lapin::ConnectionProperties::default()).await.unwrap();
    let channel = conn.create_channel().await.unwrap();
    let queue = unique("idem-test-no-id");
    channel.queue_declare(queue.as_str().into(), QueueDeclareOptions::default(), Default::default()).await.unwrap();
    let props = lapin::BasicProperties::default();
    channel.basic_publish("".into(), queue.as_str().into(), Default::default(), b"x", props).await.unwrap();
    let mut got = None;
    for _ in 0..100 {
        got = channel.basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true }).await.unwrap();
        if got.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let e = consumer::message_id(&got.expect("the message")).unwrap_err();
    assert!(matches!(e, idem::Error::NoMessageId { .. }), "{e}");
    let text = e.to_string();
    assert!(text.contains("AMQP delivery") && text.contains(&format!("routing key `{queue}`")), "{text}");
    assert!(text.contains("no `message_id` property"), "{text}");
    channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
    conn.close(200, "done".into()).await.unwrap();

    let Some(url) = common::nats().await else { return };
    let client = async_nats::connect(&url).await.unwrap();
    let subject = unique("idemtest-no-id");
    let mut sub = client.subscribe(subject.clone()).await.unwrap();
    client.publish(subject.clone(), "x".into()).await.unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(async_nats::header::NATS_MESSAGE_ID, "idem-msg-1");
    client.publish_with_headers(subject.clone(), headers, "y".into()).await.unwrap();
    let bare = tokio::time::timeout(Duration::from_secs(5), sub.next()).await.unwrap().unwrap();
    let e = consumer::message_id(&bare).unwrap_err();
    assert!(e.to_string().contains(&format!("NATS message on subject `{subject}` has no `Nats-Msg-Id` header")), "{e}");
    let with_id = tokio::time::timeout(Duration::from_secs(5), sub.next()).await.unwrap().unwrap();
    assert_eq!(consumer::message_id(&with_id).unwrap().as_str(), "idem-msg-1");
}

/// A channel of the caller's publishes with confirms; once it is closed,
/// a publish is unavailable (tried again later), saying it cannot reopen it.
#[tokio::test]
async fn a_channel_given_to_rabbitmq_publishes_until_it_is_closed() {
    use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
    let Some(url) = common::amqp().await else { return };
    let conn = lapin::Connection::connect(&url, lapin::ConnectionProperties::default()).await.unwrap();
    let admin = conn.create_channel().await.unwrap();
    let queue = unique("idem-test-channel");
    admin.queue_declare(queue.as_str().into(), QueueDeclareOptions::default(), Default::default()).await.unwrap();
    let rabbit = RabbitMq::from_channel(conn.create_channel().await.unwrap()).await.unwrap();
    let id = MessageId::for_call("tests.channel", "T-1", 0);
    rabbit.publish(&Message::new(id.clone(), queue.as_str(), b"x".to_vec())).await.unwrap();
    let got = admin.basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true }).await.unwrap();
    assert_eq!(consumer::message_id(&got.expect("confirmed, so queued")).unwrap(), id);
    // A publish to an exchange that does not exist: the broker closes the
    // channel, refusing it; the channel is gone after that.
    let missing = RabbitMq::from_channel(conn.create_channel().await.unwrap()).await.unwrap().exchange(unique("nope"));
    let e = missing.publish(&Message::new(id.clone(), queue.as_str(), b"y".to_vec())).await.unwrap_err();
    assert!(e.is_refused() && e.message().contains("NOT_FOUND"), "{e}");
    let e = missing.publish(&Message::new(id, queue.as_str(), b"z".to_vec())).await.unwrap_err();
    assert!(!e.is_refused() && e.message().contains("cannot be reopened"), "{e}");
    admin.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await.unwrap();
    conn.close(200, "done".into()).await.unwrap();
}
