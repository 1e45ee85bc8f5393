//! The outbox's relay, measured (`--scenario relay`, `--scenario outbox-latency`).
//!
//! `relay`: the outbox holds `--messages` messages of `--keys` keys,
//! published by guarded calls (not timed); then, in turns, a relay
//! ([`Relay::drain`], its defaults: batches of 100, 32 in flight) hands
//! them to a publisher, and the same publisher is given the same number of
//! messages directly, 32 in flight, with no database (`raw`): what the
//! broker's confirmed publishing allows. `ratio` is the relay's rate over
//! the raw rate, the median of the rounds'. The publishers: the in-process
//! broker always (no I/O: the relay's own cost), and RabbitMQ
//! (`--amqp-url`: the durable queue `loadgen.relay`, persistent messages,
//! publisher confirms) and NATS JetStream (`--nats-url`: the stream
//! `LOADGEN_RELAY`, a 2-minute duplicate window) where given, emptied
//! before each turn and removed at the end.
//!
//! `outbox-latency`: `--clients` tasks run guarded calls that publish one
//! message each, about 50 a second each, while a started relay
//! ([`Relay::start`]) hands them to the in-process broker; the time from a
//! call's commit returning to the broker's subscriber receiving its
//! message, p50 and p99, with the relay woken on commit (`listen`:
//! PostgreSQL's `LISTEN`; the other databases poll anyway) and polling
//! (`poll`, every `poll_interval`, 1 s by default and 100 ms).
//!
//! ```text
//! cargo run --release -p idem-bench -- --scenario relay --database-url postgres://postgres@127.0.0.1/test \
//!     --amqp-url amqp://guest:guest@127.0.0.1:5672/%2f --nats-url nats://127.0.0.1:4222
//! cargo run --release -p idem-bench -- --scenario outbox-latency --database-url postgres://postgres@127.0.0.1/test --clients 4 --seconds 30
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use idem::idempotent;
use idem::outbox::{InProcess, JetStream, Message, MessageId, Publisher, RabbitMq, Relay};
use sqlx::Transaction;

use crate::common::{AppError, BoxError, Shop};
use crate::{median_of_ratios, percentile};

/// What the two scenarios are given.
pub(crate) struct Options {
    pub(crate) clients: usize,
    pub(crate) seconds: u64,
    pub(crate) messages: usize,
    pub(crate) keys: usize,
    pub(crate) amqp_url: Option<String>,
    pub(crate) nats_url: Option<String>,
}

const SCOPE: &str = "loadgen.relay";
const TOPIC: &str = "loadgen.relay";
/// Messages in flight: the relay's default `max_in_flight`, and the raw side's.
const IN_FLIGHT: usize = 32;

/// One call publishing `count` messages for its key.
#[idempotent(key = "key", scope = "loadgen.relay", retention = "1h", outbox = "outbox")]
async fn fill<DB: Shop>(tx: &mut Transaction<'_, DB>, key: &str, count: usize) -> Result<(), AppError>
where
    DB::Connection: Send,
{
    for n in 0..count {
        outbox.publish(tx, TOPIC, payload(key, n)).await?;
    }
    Ok(())
}

/// A message's payload: about what a business event weighs.
fn payload(key: &str, n: usize) -> Vec<u8> {
    format!(r#"{{"trade_no":"{key}","n":{n},"coupon":"WELCOME-10","amount_cents":12900}}"#).into_bytes()
}

/// One call publishing one message, for the latency scenario.
#[idempotent(key = "key", scope = "loadgen.relay", retention = "1h", outbox = "outbox")]
async fn one<DB: Shop>(tx: &mut Transaction<'_, DB>, key: &str) -> Result<(), AppError>
where
    DB::Connection: Send,
{
    outbox.publish(tx, TOPIC, payload(key, 0)).await?;
    Ok(())
}

async fn reset<DB: Shop>(pool: &sqlx::Pool<DB>) -> Result<(), BoxError>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    idem::migrate(pool).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DELETE FROM idem_outbox WHERE scope = '{SCOPE}'; DELETE FROM idem_records WHERE scope = '{SCOPE}'"
    )))
    .execute(pool)
    .await?;
    Ok(())
}

/// A publisher to measure, and what it needs around it.
struct Side {
    broker: &'static str,
    publisher: Arc<dyn Publisher>,
    /// The queue or stream the messages go to, emptied between rounds.
    place: Place,
}

enum Place {
    None,
    /// A durable queue named as the topic (the default exchange routes there).
    Queue(lapin::Channel),
    Stream(Arc<JetStream>),
}

/// The stream of `--nats-url`, capturing the topic.
const STREAM: &str = "LOADGEN_RELAY";

impl Place {
    /// Empty it between rounds (the broker's memory and disk stay level).
    async fn empty(&self) -> Result<(), BoxError> {
        match self {
            Place::None => {}
            Place::Queue(channel) => {
                channel.queue_purge(TOPIC.into(), lapin::options::QueuePurgeOptions::default()).await?;
            }
            Place::Stream(js) => {
                js.context().get_stream(STREAM).await?.purge().await?;
            }
        }
        Ok(())
    }

    /// Remove it.
    async fn remove(&self) {
        match self {
            Place::None => {}
            Place::Queue(channel) => {
                let _ = channel.queue_delete(TOPIC.into(), lapin::options::QueueDeleteOptions::default()).await;
            }
            Place::Stream(js) => {
                let _ = js.context().delete_stream(STREAM).await;
            }
        }
    }
}

/// The publishers to measure: in-process, and the brokers named.
async fn sides(options: &Options) -> Result<Vec<Side>, BoxError> {
    let mut sides = vec![Side { broker: "in-process", publisher: Arc::new(InProcess::new()), place: Place::None }];
    if let Some(url) = &options.amqp_url {
        let conn = lapin::Connection::connect(url, lapin::ConnectionProperties::default()).await?;
        let channel = conn.create_channel().await?;
        let durable = lapin::options::QueueDeclareOptions { durable: true, ..Default::default() };
        channel.queue_declare(TOPIC.into(), durable, Default::default()).await?;
        // The connection lives as long as its channel is used.
        std::mem::forget(conn);
        let publisher = Arc::new(RabbitMq::connect(url).await?);
        sides.push(Side { broker: "rabbitmq", publisher, place: Place::Queue(channel) });
    }
    if let Some(url) = &options.nats_url {
        let js = Arc::new(JetStream::connect(url).await?);
        js.ensure_stream(STREAM, &[TOPIC], Duration::from_secs(120)).await?;
        sides.push(Side { broker: "nats", publisher: js.clone(), place: Place::Stream(js) });
    }
    Ok(sides)
}

pub(crate) async fn run<DB: Shop>(
    store: &str,
    pool: &sqlx::Pool<DB>,
    options: &Options,
    latency: bool,
) -> Result<(), BoxError>
where
    DB::Connection: Send,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    reset(pool).await?;
    let done = if latency { latencies(store, pool, options).await } else { throughput(store, pool, options).await };
    // Leave the shared outbox as it was.
    reset(pool).await?;
    done
}

/// `--scenario relay`.
async fn throughput<DB: Shop>(store: &str, pool: &sqlx::Pool<DB>, options: &Options) -> Result<(), BoxError>
where
    DB::Connection: Send,
{
    let rounds = 3;
    let (messages, keys) = (options.messages.max(1), options.keys.clamp(1, options.messages.max(1)));
    for Side { broker, publisher, place } in sides(options).await? {
        let (mut relay_tps, mut raw_tps) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            // The raw side first in odd rounds: neither always runs on a
            // warmer broker.
            for side in if round % 2 == 0 { ["relay", "raw"] } else { ["raw", "relay"] } {
                place.empty().await?;
                // Keys of this broker's round alone: a key once published
                // replays (its call is recorded) and publishes nothing.
                let tag = format!("{broker}-{round}");
                let tps = if side == "relay" {
                    relay_round(pool, publisher.clone(), &tag, messages, keys, options.clients).await?
                } else {
                    raw_round(&*publisher, &tag, messages, keys).await?
                };
                eprintln!("{broker} round {round}: {side} {tps:.0} msg/s");
                if side == "relay" { relay_tps.push(tps) } else { raw_tps.push(tps) }
            }
        }
        place.remove().await;
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let ratio = median_of_ratios(&relay_tps, &raw_tps);
        println!(
            "scenario=relay store={store} broker={broker} messages={messages} keys={keys} relay_msg_s={:.0} \
             raw_msg_s={:.0} ratio={ratio:.3} rounds={rounds}",
            mean(&relay_tps),
            mean(&raw_tps),
        );
    }
    Ok(())
}

/// Fill the outbox (not timed), then time one relay draining it.
async fn relay_round<DB: Shop>(
    pool: &sqlx::Pool<DB>,
    publisher: Arc<dyn Publisher>,
    tag: &str,
    messages: usize,
    keys: usize,
    clients: usize,
) -> Result<f64, BoxError>
where
    DB::Connection: Send,
{
    let per_key = messages.div_ceil(keys);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tag = tag.to_owned();
    let mut fillers = Vec::new();
    for _ in 0..clients.max(1) {
        let (pool, next, tag) = (pool.clone(), next.clone(), tag.clone());
        fillers.push(tokio::spawn(async move {
            loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if k >= keys {
                    return Ok::<_, AppError>(());
                }
                let count = per_key.min(messages.saturating_sub(k * per_key));
                let mut tx = pool.begin().await?;
                fill::<DB>(&mut tx, &format!("R{tag}-{k}"), count).await?;
                tx.commit().await?;
            }
        }));
    }
    for filler in fillers {
        filler.await??;
    }
    let relay = Relay::new(pool.clone(), publisher).scope(SCOPE).max_in_flight(IN_FLIGHT);
    let started = Instant::now();
    let report = relay.drain().await?;
    let took = started.elapsed();
    if report.sent != messages || report.retried + report.dead + report.released > 0 {
        return Err(format!("the relay sent {} of {messages} messages: {report:?}", report.sent).into());
    }
    Ok(report.sent as f64 / took.as_secs_f64())
}

/// The same number of messages, handed to the publisher directly.
async fn raw_round(publisher: &dyn Publisher, tag: &str, messages: usize, keys: usize) -> Result<f64, BoxError> {
    let per_key = messages.div_ceil(keys);
    let all: Vec<Message> = (0..messages)
        .map(|i| {
            let (k, n) = (i % keys, i / keys);
            let key = format!("W{tag}-{k}");
            let mut m = Message::new(MessageId::for_call(SCOPE, &key, n as u32), TOPIC, payload(&key, n));
            (m.scope, m.key) = (SCOPE.to_owned(), key);
            debug_assert!(n < per_key);
            m
        })
        .collect();
    let started = Instant::now();
    let failed = futures_util::stream::iter(&all)
        .map(|m| publisher.publish(m))
        .buffer_unordered(IN_FLIGHT)
        .filter(|r| std::future::ready(r.is_err()))
        .count()
        .await;
    let took = started.elapsed();
    if failed > 0 {
        return Err(format!("{failed} of {messages} raw publishes failed").into());
    }
    Ok(messages as f64 / took.as_secs_f64())
}

/// `--scenario outbox-latency`.
async fn latencies<DB: Shop>(store: &str, pool: &sqlx::Pool<DB>, options: &Options) -> Result<(), BoxError>
where
    DB::Connection: Send,
{
    let each = Duration::from_secs_f64((options.seconds as f64 / 3.0).max(2.0));
    let sides = [
        ("listen", true, Duration::from_secs(1)),
        ("poll_1s", false, Duration::from_secs(1)),
        ("poll_100ms", false, Duration::from_millis(100)),
    ];
    let mut line = format!("scenario=outbox-latency store={store} clients={}", options.clients);
    for (round, (side, listen, poll)) in sides.into_iter().enumerate() {
        let (mut lat, sent) = latency_round(pool, options.clients, each, (round, listen, poll)).await?;
        lat.sort_unstable();
        let (p50, p99) = (percentile(&lat, 0.50), percentile(&lat, 0.99));
        println!("{side}: {sent} messages, commit to publish p50 {p50} us, p99 {p99} us");
        line.push_str(&format!(" {side}_p50_us={p50} {side}_p99_us={p99} {side}_messages={sent}"));
    }
    println!("{line}");
    Ok(())
}

/// One side: callers publishing for `length`, a relay handing over; each
/// message's time from its commit to its delivery, in µs.
async fn latency_round<DB: Shop>(
    pool: &sqlx::Pool<DB>,
    clients: usize,
    length: Duration,
    (round, listen, poll): (usize, bool, Duration),
) -> Result<(Vec<u32>, usize), BoxError>
where
    DB::Connection: Send,
{
    let broker = InProcess::new();
    let mut deliveries = broker.subscribe();
    let relay = Relay::new(pool.clone(), broker.clone()).scope(SCOPE).listen(listen).poll_interval(poll).start();
    let committed: Arc<Mutex<HashMap<MessageId, Instant>>> = Arc::default();
    let received: Arc<Mutex<HashMap<MessageId, Instant>>> = Arc::default();
    let receiver = {
        let received = received.clone();
        tokio::spawn(async move {
            while let Some(m) = deliveries.recv().await {
                received.lock().unwrap().entry(m.id).or_insert_with(Instant::now);
            }
        })
    };
    let stop = Instant::now() + length;
    let mut callers = Vec::new();
    for client in 0..clients.max(1) {
        let (pool, committed) = (pool.clone(), committed.clone());
        callers.push(tokio::spawn(async move {
            let mut n = 0;
            while Instant::now() < stop {
                let key = format!("L{round}-{client}-{n}");
                let mut tx = pool.begin().await?;
                one::<DB>(&mut tx, &key).await?;
                tx.commit().await?;
                committed.lock().unwrap().insert(MessageId::for_call(SCOPE, &key, 0), Instant::now());
                n += 1;
                // About 50 calls a second each, spread out.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok::<_, AppError>(())
        }));
    }
    for caller in callers {
        caller.await??;
    }
    // Every message delivered (or give up after the poll interval and more).
    let sent = committed.lock().unwrap().len();
    let deadline = Instant::now() + poll * 3 + Duration::from_secs(5);
    while received.lock().unwrap().len() < sent && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    relay.stop().await;
    receiver.abort();
    let (committed, received) = (committed.lock().unwrap(), received.lock().unwrap());
    if received.len() < sent {
        return Err(format!("{} of {sent} messages were delivered", received.len()).into());
    }
    let lat = committed
        .iter()
        .map(|(id, at)| received[id].saturating_duration_since(*at).as_micros().min(u128::from(u32::MAX)) as u32)
        .collect();
    Ok((lat, sent))
}
