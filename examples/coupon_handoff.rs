//! The coupon incident, end to end, across two databases.
//!
//! The payment service keeps orders (and idem's records) in its database;
//! the coupon service keeps coupons in another. "Mark the order paid, then
//! tell the coupon service" failed both ways in the incident: a crash
//! after the order's commit and before the publish left a paid order with
//! no coupon, and an operator's replay by hand granted coupons twice.
//!
//! Here the payment callback is a guarded `dedup` call that marks the
//! order paid and publishes a "grant coupon" message through its outbox
//! handle: the message commits with the order, or not at all, and its id
//! is the call's. A relay hands it to the broker after the commit. The
//! coupon service's consumer writes its own dedup record, keyed by that
//! id, in the same transaction as the coupon. Then everything that went
//! wrong in the incident goes wrong again:
//!
//! 1. the gateway sends the callback 6 times: one order paid, one message;
//! 2. 1,000 concurrent copies follow: all replayed, no message more;
//! 3. the relay is killed after the broker took the message and before it
//!    marked it sent; the coupon consumer is stopped after granting the
//!    coupon and before acking it, so the broker delivers it again;
//! 4. the broker's connection is cut while a restarted relay publishes
//!    the message again (it cannot know whether the broker had it);
//! 5. an operator re-sends every message, to be sure.
//!
//! The coupon service sees the message three times from the relay, once
//! more from its own redelivery, and grants one coupon. The last line:
//!
//! ```text
//! callbacks=1006 published=3 delivered=4 coupons_granted=1 lost=0 duplicate_effects=0 resent=1
//! ```
//!
//! ```text
//! cargo run --example coupon_handoff --features outbox       # two SQLite files, the in-process broker
//! cargo run --example coupon_handoff --features rabbitmq -- \
//!     --database-url postgres://postgres@127.0.0.1/test --coupon-database-url mysql://root@127.0.0.1/test \
//!     --amqp-url amqp://guest:guest@127.0.0.1:5672/%2f
//! cargo run --example coupon_handoff --features nats -- \
//!     --database-url mysql://root@127.0.0.1/test --coupon-database-url postgres://postgres@127.0.0.1/test \
//!     --nats-url nats://127.0.0.1:4222
//! ```
//!
//! With RabbitMQ (a queue and an exchange of the run's own) the consumer
//! gets every copy and deduplicates by id, as above. With JetStream (a
//! stream of the run's own, a 2-minute duplicate window) the stream drops
//! the copies published again, since their id is the same: `published=3
//! delivered=2` (the one copy, and its redelivery after the consumer's
//! stop before its ack). The relay reaches a real broker through a proxy
//! of the demo's, which it cuts in step 4.
//!
//! On PostgreSQL and MySQL/MariaDB each run works in a schema (database)
//! of its own, dropped at the end, so runs against a shared server never
//! meet.

mod common;

use std::collections::VecDeque;
use std::future::Future;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use common::{AppError, BoxError, sql};
#[cfg(feature = "nats")]
use idem::outbox::JetStream;
#[cfg(feature = "rabbitmq")]
use idem::outbox::RabbitMq;
use idem::outbox::{InProcess, Message, MessageQuery, MessageState, PublishError, Publisher, Relay};
use idem::sql::SqlBackend;
use idem::store::BoxFuture;
use idem::{Claim, Guard, Outcome, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::Transaction;
use tokio::sync::mpsc::UnboundedReceiver;

// ---------------------------------------------------------------------
// The payment service: orders, idem's records and the outbox, one database.
// ---------------------------------------------------------------------

/// What the gateway posts when a payment succeeds.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct PayCallback {
    trade_no: String,
    user_id: i64,
    amount_cents: i64,
}

/// The message for the coupon service.
#[derive(Serialize, Deserialize)]
struct GrantCoupon {
    trade_no: String,
    user_id: i64,
}

const PAYMENTS: &str = "payments.on_pay";
/// Where the coupon service's messages go.
const TOPIC: &str = "coupons.grant";

/// The callback: the order WAIT_PAY -> PAID and the message, in `tx`,
/// with the dedup record. Every repeat replays, and publishes nothing.
#[idempotent(key = "event.trade_no", fingerprint = "event", scope = "payments.on_pay", outbox = "outbox")]
async fn on_pay<DB: Db>(tx: &mut Transaction<'_, DB>, event: &PayCallback) -> Result<bool, AppError>
where
    DB::Connection: Send,
{
    let paid = DB::mark_paid(tx, &event.trade_no).await?;
    let grant = GrantCoupon { trade_no: event.trade_no.clone(), user_id: event.user_id };
    outbox.publish_json(&mut *tx, TOPIC, &grant).await?;
    Ok(paid)
}

/// One callback: begin, handle, commit.
async fn callback<DB: Db>(pool: &sqlx::Pool<DB>, event: &PayCallback) -> Result<Outcome, AppError>
where
    DB::Connection: Send,
{
    let mut tx = pool.begin().await?;
    let (paid, outcome) = idem::observe(on_pay(&mut tx, event)).await;
    paid?;
    tx.commit().await?;
    Ok(outcome.expect("a guard ran"))
}

// ---------------------------------------------------------------------
// The coupon service: coupons and its own dedup records, another database.
// ---------------------------------------------------------------------

/// The coupon service's consumer, on its database.
struct CouponService<C: Db> {
    pool: sqlx::Pool<C>,
}

impl<C: Db> CouponService<C>
where
    C::Connection: Send,
{
    /// One delivery, in one transaction of the coupon database: the dedup
    /// record keyed by the message id, and the coupon, or neither. Whether
    /// it granted the coupon (`false`: a repeat of a message taken before).
    async fn take(&self, message: &Message) -> Result<bool, AppError> {
        let grant: GrantCoupon = serde_json::from_slice(&message.payload)
            .map_err(|e| AppError::Malformed(format!("message {}: {e}", message.id)))?;
        let mut tx = self.pool.begin().await?;
        let granted = match Guard::new("coupons.on_grant").key(message.id.as_str()).dedup::<(), _>(&mut tx).await? {
            Claim::Replay(()) => false,
            Claim::Run(ticket) => {
                let coupon = C::insert_coupon(&mut tx, message.id.as_str(), &grant.trade_no, grant.user_id).await;
                ticket.finish(&mut tx, coupon.map_err(AppError::from)).await?;
                true
            }
        };
        tx.commit().await?;
        Ok(granted)
    }
}

/// The coupon service as the demo drives it, whichever its database.
trait Coupons: Send + Sync {
    fn take<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<bool, AppError>>;
    /// A count over the coupon table (`?`: `arg`).
    fn count<'a>(&'a self, query: &'static str, arg: Option<&'a str>) -> BoxFuture<'a, Result<i64, AppError>>;
}

impl<C: Db> Coupons for CouponService<C>
where
    C::Connection: Send,
{
    fn take<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<bool, AppError>> {
        Box::pin(CouponService::take(self, message))
    }

    fn count<'a>(&'a self, query: &'static str, arg: Option<&'a str>) -> BoxFuture<'a, Result<i64, AppError>> {
        Box::pin(async move { Ok(C::count(&self.pool, query, arg).await?) })
    }
}

/// What the consumer saw.
#[derive(Default)]
struct Seen {
    /// Copies the broker handed over (each publish once, since the consumer
    /// subscribed).
    from_broker: AtomicU64,
    /// Deliveries taken, redeliveries included.
    delivered: AtomicU64,
    acked: AtomicU64,
    granted: AtomicU64,
    repeats: AtomicU64,
    errors: AtomicU64,
}

/// The consumer's loop: take each delivery, then ack it. The first time
/// it grants a coupon it stops before its ack (as a deploy or a crash
/// would), and the broker delivers that message again.
async fn consume(
    coupons: Arc<dyn Coupons>,
    mut queue: Queue,
    seen: Arc<Seen>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut stop_before_ack = true;
    loop {
        let delivery = tokio::select! {
            delivery = queue.next() => delivery,
            _ = stop.changed() => None,
        };
        let Some(delivery) = delivery else { return };
        seen.delivered.fetch_add(1, Ordering::SeqCst);
        match coupons.take(&delivery.message).await {
            Ok(true) if stop_before_ack => {
                stop_before_ack = false;
                seen.granted.fetch_add(1, Ordering::SeqCst);
                queue.abandon(delivery).await;
                continue;
            }
            Ok(true) => seen.granted.fetch_add(1, Ordering::SeqCst),
            Ok(false) => seen.repeats.fetch_add(1, Ordering::SeqCst),
            Err(e) => {
                eprintln!("   !! the coupon service failed a delivery: {e}");
                seen.errors.fetch_add(1, Ordering::SeqCst);
                queue.abandon(delivery).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        queue.ack(delivery).await;
        seen.acked.fetch_add(1, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------
// The broker between the services: in-process by default, RabbitMQ
// (`--amqp-url`) or NATS JetStream (`--nats-url`). The relay reaches a
// real one through a proxy the demo can cut; the run's queue or stream is
// its own, removed at the end.
// ---------------------------------------------------------------------

struct Broker {
    kind: Kind,
    /// What the relay hands messages to: the broker's publisher, counted
    /// and held back as the demo needs.
    publisher: Arc<Held>,
    /// Between the relay and a real broker.
    #[cfg(any(feature = "rabbitmq", feature = "nats"))]
    proxy: Option<Proxy>,
}

// One of each for the run: their sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Kind {
    InProcess(InProcess),
    /// The run's exchange routes the topic to the run's queue.
    #[cfg(feature = "rabbitmq")]
    Rabbit {
        conn: lapin::Connection,
        channel: lapin::Channel,
        name: String,
    },
    /// The run's stream captures its subjects (`<prefix>coupons.grant`).
    #[cfg(feature = "nats")]
    Nats {
        context: async_nats::jetstream::Context,
        name: String,
    },
}

/// The broker's publisher, counting the copies it took and holding each
/// confirmation back for `delay` (relay #1 is killed while it waits).
struct Held {
    inner: Arc<dyn Publisher>,
    took: AtomicU64,
    delay: std::sync::Mutex<Duration>,
}

impl Publisher for Held {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn publish<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(async move {
            self.inner.publish(message).await?;
            self.took.fetch_add(1, Ordering::SeqCst);
            let delay = *self.delay.lock().unwrap();
            tokio::time::sleep(delay).await;
            Ok(())
        })
    }
}

impl Broker {
    async fn connect(args: &Args, run: &str) -> Result<Broker, BoxError> {
        let held = |inner: Arc<dyn Publisher>| {
            Arc::new(Held { inner, took: AtomicU64::new(0), delay: std::sync::Mutex::new(Duration::ZERO) })
        };
        #[cfg(feature = "rabbitmq")]
        if let Some(url) = &args.amqp_url {
            use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
            let name = format!("idem-handoff-{run}");
            let conn = lapin::Connection::connect(url, lapin::ConnectionProperties::default()).await?;
            let channel = conn.create_channel().await?;
            let (exchange, declare) = (ExchangeDeclareOptions::default(), QueueDeclareOptions::default());
            let kind = lapin::ExchangeKind::Direct;
            channel.exchange_declare(name.as_str().into(), kind, exchange, Default::default()).await?;
            channel.queue_declare(name.as_str().into(), declare, Default::default()).await?;
            let bind = QueueBindOptions::default();
            channel
                .queue_bind(name.as_str().into(), name.as_str().into(), TOPIC.into(), bind, Default::default())
                .await?;
            let proxy = Proxy::start(url).await?;
            let publisher = RabbitMq::connect(&proxy.url(url)).await?.exchange(name.as_str());
            let publisher = publisher.confirm_timeout(Duration::from_secs(2));
            let kind = Kind::Rabbit { conn, channel, name };
            return Ok(Broker { kind, publisher: held(Arc::new(publisher)), proxy: Some(proxy) });
        }
        #[cfg(feature = "nats")]
        if let Some(url) = &args.nats_url {
            let name = format!("HANDOFF_{run}");
            let context = async_nats::jetstream::new(async_nats::connect(url).await?);
            context
                .get_or_create_stream(async_nats::jetstream::stream::Config {
                    name: name.clone(),
                    subjects: vec![format!("{name}.>")],
                    duplicate_window: Duration::from_secs(120),
                    ..Default::default()
                })
                .await?;
            let proxy = Proxy::start(url).await?;
            let publisher = JetStream::connect(&proxy.url(url)).await?.subject_prefix(format!("{name}."));
            let publisher = publisher.ack_timeout(Duration::from_secs(1));
            let kind = Kind::Nats { context, name };
            return Ok(Broker { kind, publisher: held(Arc::new(publisher)), proxy: Some(proxy) });
        }
        let _ = (args, run);
        let broker = InProcess::new();
        Ok(Broker {
            publisher: held(Arc::new(broker.clone())),
            kind: Kind::InProcess(broker),
            #[cfg(any(feature = "rabbitmq", feature = "nats"))]
            proxy: None,
        })
    }

    fn name(&self) -> &'static str {
        match &self.kind {
            Kind::InProcess(_) => "in-process",
            #[cfg(feature = "rabbitmq")]
            Kind::Rabbit { .. } => "rabbitmq",
            #[cfg(feature = "nats")]
            Kind::Nats { .. } => "nats",
        }
    }

    /// The coupon service's queue, which gets every message from now on.
    async fn queue(&self, seen: Arc<Seen>) -> Result<Queue, BoxError> {
        Ok(match &self.kind {
            Kind::InProcess(b) => Queue::InProcess { rx: b.subscribe(), unacked: VecDeque::new(), seen },
            #[cfg(feature = "rabbitmq")]
            Kind::Rabbit { conn, name, .. } => {
                let reader = conn.create_channel().await?;
                let options = lapin::options::BasicConsumeOptions::default();
                let tag = format!("{name}-coupons");
                let deliveries = reader
                    .basic_consume(name.as_str().into(), tag.as_str().into(), options, Default::default())
                    .await?;
                Queue::Rabbit { _reader: reader, deliveries, seen }
            }
            #[cfg(feature = "nats")]
            Kind::Nats { context, name } => {
                use async_nats::jetstream::consumer::{AckPolicy, pull};
                let stream = context.get_stream(name).await?;
                let config = pull::Config { ack_policy: AckPolicy::Explicit, ..Default::default() };
                let messages = stream.create_consumer(config).await?.messages().await?;
                Queue::Nats { messages, seen }
            }
        })
    }

    /// What the relay hands messages to.
    fn publisher(&self) -> Arc<dyn Publisher> {
        self.publisher.clone()
    }

    /// Copies of the message the broker took from relays.
    fn published(&self) -> u64 {
        self.publisher.took.load(Ordering::SeqCst)
    }

    /// Copies the broker keeps for the consumer: each one it took, but on
    /// JetStream, whose duplicate window drops a re-send of an id, one a
    /// message.
    async fn kept(&self) -> Result<u64, BoxError> {
        match &self.kind {
            #[cfg(feature = "nats")]
            Kind::Nats { context, name } => Ok(context.get_stream(name).await?.get_info().await?.state.messages),
            _ => Ok(self.published()),
        }
    }

    /// Confirm each message this long after the broker took it.
    fn confirm_after(&self, delay: Duration) {
        *self.publisher.delay.lock().unwrap() = delay;
    }

    /// Cut the publishers' connection for `duration`.
    fn cut_for(&self, duration: Duration) {
        match &self.kind {
            Kind::InProcess(b) => b.down_for(duration),
            #[cfg(any(feature = "rabbitmq", feature = "nats"))]
            _ => {
                if let Some(proxy) = &self.proxy {
                    proxy.cut_for(duration);
                }
            }
        }
    }

    /// What became of a copy published again: the consumer took it as a
    /// repeat, or (JetStream) the stream's duplicate window dropped it.
    fn again(&self) -> &'static str {
        match &self.kind {
            #[cfg(feature = "nats")]
            Kind::Nats { .. } => "JetStream dropped the copy (its duplicate window knows the id)",
            _ => "the coupon service took it as a repeat",
        }
    }

    /// Remove the run's queue or stream.
    async fn close(self) {
        match self.kind {
            Kind::InProcess(_) => {}
            #[cfg(feature = "rabbitmq")]
            Kind::Rabbit { conn, channel, name } => {
                use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
                let _ = channel.queue_delete(name.as_str().into(), QueueDeleteOptions::default()).await;
                let _ = channel.exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default()).await;
                let _ = conn.close(200, "done".into()).await;
            }
            #[cfg(feature = "nats")]
            Kind::Nats { context, name } => {
                let _ = context.delete_stream(&name).await;
            }
        }
    }
}

/// A TCP proxy between the relay and a real broker, which the demo cuts:
/// the connections it carries close, and new ones are refused, until the
/// cut is over.
#[cfg(any(feature = "rabbitmq", feature = "nats"))]
struct Proxy {
    addr: std::net::SocketAddr,
    cut_until: Arc<std::sync::Mutex<Instant>>,
    generation: tokio::sync::watch::Sender<u64>,
}

#[cfg(any(feature = "rabbitmq", feature = "nats"))]
impl Proxy {
    /// A proxy on a free local port to the host and port of `url`.
    async fn start(url: &str) -> Result<Proxy, BoxError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let (addr, server) = (listener.local_addr()?, host_port(url).to_owned());
        let cut_until = Arc::new(std::sync::Mutex::new(Instant::now()));
        let (generation, _) = tokio::sync::watch::channel(0u64);
        let (cut, gen_) = (cut_until.clone(), generation.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if Instant::now() < *cut.lock().unwrap() {
                    continue; // refused: dropped at once
                }
                let (mut closed, server) = (gen_.subscribe(), server.clone());
                tokio::spawn(async move {
                    let Ok(mut upstream) = tokio::net::TcpStream::connect(&server).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                        _ = closed.changed() => {}
                    }
                });
            }
        });
        Ok(Proxy { addr, cut_until, generation })
    }

    /// `url` with the proxy in place of its host and port.
    fn url(&self, url: &str) -> String {
        url.replacen(host_port(url), &self.addr.to_string(), 1)
    }

    fn cut_for(&self, duration: Duration) {
        *self.cut_until.lock().unwrap() = Instant::now() + duration;
        self.generation.send_modify(|g| *g += 1);
    }
}

/// The `host:port` of `scheme://[user[:password]@]host:port[/...]`.
#[cfg(any(feature = "rabbitmq", feature = "nats"))]
fn host_port(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or(rest);
    authority.rsplit_once('@').map_or(authority, |(_, host)| host)
}

/// A delivery: acked, or abandoned (the consumer stopped before its ack).
struct Delivery {
    message: Message,
    ack: Ack,
}

enum Ack {
    InProcess,
    #[cfg(feature = "rabbitmq")]
    Rabbit(Box<lapin::Acker>),
    #[cfg(feature = "nats")]
    Nats(Box<async_nats::jetstream::Message>),
}

#[allow(clippy::large_enum_variant)]
enum Queue {
    /// The in-process broker forgets a message once delivered; this queue
    /// keeps what a consumer abandoned and delivers it again first, as a
    /// broker requeues an unacked message.
    InProcess { rx: UnboundedReceiver<Message>, unacked: VecDeque<Message>, seen: Arc<Seen> },
    #[cfg(feature = "rabbitmq")]
    Rabbit { _reader: lapin::Channel, deliveries: lapin::Consumer, seen: Arc<Seen> },
    #[cfg(feature = "nats")]
    Nats { messages: async_nats::jetstream::consumer::pull::Stream, seen: Arc<Seen> },
}

impl Queue {
    async fn next(&mut self) -> Option<Delivery> {
        match self {
            Queue::InProcess { rx, unacked, seen } => {
                if let Some(message) = unacked.pop_front() {
                    return Some(Delivery { message, ack: Ack::InProcess });
                }
                let message = rx.recv().await?;
                seen.from_broker.fetch_add(1, Ordering::SeqCst);
                Some(Delivery { message, ack: Ack::InProcess })
            }
            #[cfg(feature = "rabbitmq")]
            Queue::Rabbit { deliveries, seen, .. } => {
                use futures_util::StreamExt as _;
                let d = deliveries.next().await?.ok()?;
                if !d.redelivered {
                    seen.from_broker.fetch_add(1, Ordering::SeqCst);
                }
                let id = idem::outbox::consumer::message_id(&d).ok()?;
                let message = Message::new(id, TOPIC, d.data.clone());
                Some(Delivery { message, ack: Ack::Rabbit(Box::new(d.acker)) })
            }
            #[cfg(feature = "nats")]
            Queue::Nats { messages, seen } => {
                use futures_util::StreamExt as _;
                let m = messages.next().await?.ok()?;
                if m.info().is_ok_and(|info| info.delivered == 1) {
                    seen.from_broker.fetch_add(1, Ordering::SeqCst);
                }
                let id = idem::outbox::consumer::message_id(&m).ok()?;
                let message = Message::new(id, TOPIC, m.payload.to_vec());
                Some(Delivery { message, ack: Ack::Nats(Box::new(m)) })
            }
        }
    }

    async fn ack(&mut self, delivery: Delivery) {
        match delivery.ack {
            Ack::InProcess => {}
            #[cfg(feature = "rabbitmq")]
            Ack::Rabbit(acker) => {
                let _ = acker.ack(lapin::options::BasicAckOptions::default()).await;
            }
            #[cfg(feature = "nats")]
            Ack::Nats(m) => {
                let _ = m.double_ack().await;
            }
        }
    }

    /// Stopped before the ack: the broker delivers it again.
    async fn abandon(&mut self, delivery: Delivery) {
        match (self, delivery.ack) {
            (Queue::InProcess { unacked, .. }, _) => unacked.push_back(delivery.message),
            #[cfg(feature = "rabbitmq")]
            (_, Ack::Rabbit(acker)) => {
                let requeue = lapin::options::BasicNackOptions { requeue: true, ..Default::default() };
                let _ = acker.nack(requeue).await;
            }
            #[cfg(feature = "nats")]
            (_, Ack::Nats(m)) => {
                let _ = m.ack_with(async_nats::jetstream::AckKind::Nak(None)).await;
            }
            #[allow(unreachable_patterns)]
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------
// The run.
// ---------------------------------------------------------------------

#[derive(Parser)]
#[command(about = "The coupon incident across two databases: one coupon, none lost, none twice")]
struct Args {
    /// The payment service's database (orders, records, outbox):
    /// postgres://..., mysql://... or sqlite:PATH; default: a SQLite file in a temporary directory.
    #[arg(long)]
    database_url: Option<String>,
    /// The coupon service's database, the same kinds; default: another SQLite file.
    #[arg(long)]
    coupon_database_url: Option<String>,
    /// RabbitMQ between the services, e.g. amqp://guest:guest@127.0.0.1:5672/%2f
    /// (feature `rabbitmq`); default: a broker in the process.
    #[cfg(feature = "rabbitmq")]
    #[arg(long, conflicts_with = "nats_url")]
    amqp_url: Option<String>,
    /// NATS JetStream between the services, e.g. nats://127.0.0.1:4222 (feature `nats`).
    #[cfg(feature = "nats")]
    #[arg(long)]
    nats_url: Option<String>,
    /// Concurrent clients sending the copies.
    #[arg(long, default_value_t = 100)]
    clients: usize,
    /// Concurrent copies of the callback.
    #[arg(long, default_value_t = 1000)]
    duplicates: usize,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let run = common::run_id();
    let dir = std::env::temp_dir().join(format!("idem-coupon-handoff-{run}"));
    let orders = Database::open(args.database_url.as_deref(), &dir, "orders", &run).await?;
    let coupons = Database::open(args.coupon_database_url.as_deref(), &dir, "coupons", &run).await?;
    let broker = Broker::connect(&args, &run).await?;
    let ok = match &orders {
        Database::Sqlite(pool) => start(pool, &orders, &coupons, &broker, &args, &run).await,
        Database::Postgres(pool, _) => start(pool, &orders, &coupons, &broker, &args, &run).await,
        Database::MySql(pool, _) => start(pool, &orders, &coupons, &broker, &args, &run).await,
    };
    orders.drop_run().await;
    coupons.drop_run().await;
    broker.close().await;
    let _ = std::fs::remove_dir_all(&dir);
    if !ok? {
        std::process::exit(1);
    }
    Ok(())
}

async fn start<O: Db>(
    pool: &sqlx::Pool<O>,
    orders: &Database,
    coupons: &Database,
    broker: &Broker,
    args: &Args,
    run: &str,
) -> Result<bool, BoxError>
where
    O::Connection: Send,
{
    let service: Arc<dyn Coupons> = match coupons {
        Database::Sqlite(pool) => CouponService::open(pool).await?,
        Database::Postgres(pool, _) => CouponService::open(pool).await?,
        Database::MySql(pool, _) => CouponService::open(pool).await?,
    };
    idem::migrate(pool).await?; // the record table and the outbox
    O::create_table(pool, ORDERS).await?;
    println!("orders={} coupons={} broker={}", orders.name(), coupons.name(), broker.name());
    handoff(pool, service, broker, args, run).await
}

impl<C: Db> CouponService<C>
where
    C::Connection: Send,
{
    async fn open(pool: &sqlx::Pool<C>) -> Result<Arc<dyn Coupons>, BoxError> {
        idem::migrate(pool).await?; // the consumer's dedup records
        C::create_table(pool, COUPONS).await?;
        Ok(Arc::new(CouponService { pool: pool.clone() }))
    }
}

async fn handoff<O: Db>(
    pool: &sqlx::Pool<O>,
    coupons: Arc<dyn Coupons>,
    broker: &Broker,
    args: &Args,
    run: &str,
) -> Result<bool, BoxError>
where
    O::Connection: Send,
{
    let event = PayCallback { trade_no: format!("T{run}"), user_id: 42, amount_cents: 1999 };
    O::new_order(pool, &event.trade_no).await?;
    let seen = Arc::new(Seen::default());
    let (stop_consumer, stop) = tokio::sync::watch::channel(false);
    let consumer = tokio::spawn(consume(coupons.clone(), broker.queue(seen.clone()).await?, seen.clone(), stop));
    let mut errors = 0u64;

    println!("1. the gateway reports trade {} as paid, 6 times in a row:", event.trade_no);
    for attempt in 1..=6 {
        match callback(pool, &event).await {
            Ok(outcome) => println!("   callback #{attempt}: {}", outcome.as_str()),
            Err(e) => {
                println!("   callback #{attempt}: error {e}");
                errors += 1;
            }
        }
    }
    let message = only_message(pool).await?;
    println!("   the order is PAID; one message in the outbox, committed with it: {}", message.id);

    println!("2. {} concurrent clients send {} more copies:", args.clients, args.duplicates);
    let (replayed, failed) = burst(pool, &event, args.clients.max(1), args.duplicates).await;
    errors += failed;
    println!("   {replayed} replayed, {failed} failed; still one message: {}", only_message(pool).await?.id);

    println!("3. relay #1 publishes it and is killed before it marks it sent:");
    // The confirmation would come long after the kill (the relay gives a
    // publish up at 0.9 of its 1 s claim anyway).
    broker.confirm_after(Duration::from_secs(10));
    let relay_1 = relay(pool, broker).start();
    wait("the broker to take the message", || async { Ok(broker.published() >= 1) }).await?;
    drop(relay_1); // killed: mid-round, the broker's confirmation not yet in
    broker.confirm_after(Duration::ZERO);
    let entry = only_message(pool).await?;
    println!(
        "   the broker has it, the outbox still says {} (claimed by the dead relay: {})",
        format!("{:?}", entry.state).to_lowercase(),
        entry.claimed
    );
    wait("the coupon service to ack its delivery", || async { Ok(seen.acked.load(Ordering::SeqCst) >= 1) }).await?;
    println!(
        "   the coupon service granted the coupon and stopped before its ack; delivered again, it took it as a \
         repeat ({} deliveries, {} coupon)",
        seen.delivered.load(Ordering::SeqCst),
        seen.granted.load(Ordering::SeqCst)
    );

    println!("4. relay #2 starts while the broker's connection is cut:");
    broker.cut_for(Duration::from_millis(1500));
    let relay_2 = relay(pool, broker).start();
    settled(pool, broker, &seen).await?;
    let entry = only_message(pool).await?;
    println!(
        "   once #1's claim ran out, #2 retried while the broker was down and published it again when it came \
         back (the message's try #{}); {}",
        entry.attempts,
        broker.again()
    );

    println!("5. an operator re-sends every message, to be sure:");
    let everything = MessageQuery {
        states: vec![MessageState::Pending, MessageState::Failing, MessageState::Sent, MessageState::Dead],
        scope: Some(PAYMENTS.to_owned()),
        ..MessageQuery::default()
    };
    let resent = idem::outbox::resend_all(pool, &everything).await?;
    wait("the relay to take the re-sent message", || async { Ok(broker.published() >= 3) }).await?;
    settled(pool, broker, &seen).await?;
    println!("   {resent} re-sent, published once more; {}", broker.again());
    relay_2.stop().await;
    let _ = stop_consumer.send(true);
    consumer.await?;

    let granted = coupons.count("SELECT COUNT(*) FROM coupons WHERE trade_no = ?", Some(&event.trade_no)).await?;
    let duplicate_effects = coupons.count("SELECT COUNT(*) - COUNT(DISTINCT message_id) FROM coupons", None).await?;
    let mut lost = 0;
    for message in idem::outbox::list_messages(pool, &everything).await? {
        let coupons =
            coupons.count("SELECT COUNT(*) FROM coupons WHERE message_id = ?", Some(message.id.as_str())).await?;
        lost += u64::from(coupons == 0);
    }
    if !O::is_paid(pool, &event.trade_no).await? {
        println!("   !! the order is not PAID");
        errors += 1;
    }
    errors += seen.errors.load(Ordering::SeqCst);
    println!(
        "callbacks={} published={} delivered={} coupons_granted={granted} lost={lost} \
         duplicate_effects={duplicate_effects} resent={resent}",
        6 + args.duplicates,
        broker.published(),
        seen.delivered.load(Ordering::SeqCst),
    );
    Ok(granted == 1 && lost == 0 && duplicate_effects == 0 && errors == 0)
}

/// A relay of the payment service's messages, quick for the demo: short
/// polls and claims, retries 100 ms to 400 ms apart.
fn relay<O: Db>(pool: &sqlx::Pool<O>, broker: &Broker) -> Relay<O> {
    Relay::new(pool.clone(), broker.publisher())
        .scope(PAYMENTS)
        .poll_interval(Duration::from_millis(50))
        .claim_lease(Duration::from_secs(1))
        .backoff(Duration::from_millis(100), Duration::from_millis(400))
}

/// `copies` callbacks from `clients` concurrent clients: how many
/// replayed, how many failed.
async fn burst<O: Db>(pool: &sqlx::Pool<O>, event: &PayCallback, clients: usize, copies: usize) -> (u64, u64)
where
    O::Connection: Send,
{
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let share = copies / clients + usize::from(client < copies % clients);
            let (pool, event) = (pool.clone(), event.clone());
            tokio::spawn(async move {
                let (mut replayed, mut failed) = (0, 0);
                for _ in 0..share {
                    match callback(&pool, &event).await {
                        Ok(Outcome::Replayed) => replayed += 1,
                        Ok(outcome) => {
                            eprintln!("   !! a copy ran: {outcome:?}");
                            failed += 1;
                        }
                        Err(e) => {
                            eprintln!("   !! a copy failed: {e}");
                            failed += 1;
                        }
                    }
                }
                (replayed, failed)
            })
        })
        .collect();
    let (mut replayed, mut failed) = (0, 0);
    for task in tasks {
        let (r, f) = task.await.unwrap_or((0, 1));
        replayed += r;
        failed += f;
    }
    (replayed, failed)
}

/// The one message of the payment scope.
async fn only_message<O: Db>(pool: &sqlx::Pool<O>) -> Result<idem::outbox::Entry, BoxError> {
    let query = MessageQuery {
        states: vec![MessageState::Pending, MessageState::Failing, MessageState::Sent, MessageState::Dead],
        scope: Some(PAYMENTS.to_owned()),
        ..MessageQuery::default()
    };
    let mut messages = idem::outbox::list_messages(pool, &query).await?;
    match messages.len() {
        1 => Ok(messages.remove(0)),
        n => Err(format!("{n} messages in the outbox, one expected").into()),
    }
}

/// Wait until the outbox has nothing left to hand over and the coupon
/// service has taken and acked every copy the broker had.
async fn settled<O: Db>(pool: &sqlx::Pool<O>, broker: &Broker, seen: &Seen) -> Result<(), BoxError> {
    wait("the outbox to be sent and the coupon service to ack every copy", || async {
        let sent = only_message(pool).await?.state == MessageState::Sent;
        // Each copy the broker had, acked once (after any redelivery).
        let copies = seen.from_broker.load(Ordering::SeqCst);
        Ok(sent && copies == broker.kept().await? && seen.acked.load(Ordering::SeqCst) == copies)
    })
    .await
}

/// Poll `done` until it holds, for at most 20 s.
async fn wait<F, Fut>(what: &str, mut done: F) -> Result<(), BoxError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, BoxError>>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done().await? {
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

// ---------------------------------------------------------------------
// The databases: each service's statements, and a place of the run's own.
// ---------------------------------------------------------------------

const ORDERS: &str =
    "CREATE TABLE IF NOT EXISTS orders (trade_no VARCHAR(64) PRIMARY KEY, status VARCHAR(16) NOT NULL)";
/// No unique key: a coupon granted twice would show as a second row.
const COUPONS: &str = "CREATE TABLE IF NOT EXISTS coupons \
                       (message_id VARCHAR(100) NOT NULL, trade_no VARCHAR(64) NOT NULL, user_id BIGINT NOT NULL)";

/// Both services' statements, the same on each database but for the
/// placeholders (`common::sql` numbers them for PostgreSQL).
trait Db: SqlBackend {
    fn create_table(pool: &sqlx::Pool<Self>, ddl: &'static str)
    -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    fn new_order(pool: &sqlx::Pool<Self>, trade_no: &str) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// WAIT_PAY -> PAID; whether it moved.
    fn mark_paid(conn: &mut Self::Connection, trade_no: &str)
    -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
    fn is_paid(pool: &sqlx::Pool<Self>, trade_no: &str) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
    fn insert_coupon(
        conn: &mut Self::Connection,
        message_id: &str,
        trade_no: &str,
        user_id: i64,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// A count (`?`: `arg`).
    fn count(
        pool: &sqlx::Pool<Self>,
        query: &'static str,
        arg: Option<&str>,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;
}

macro_rules! db {
    ($($db:ty),*) => {$(
        impl Db for $db {
            async fn create_table(pool: &sqlx::Pool<$db>, ddl: &'static str) -> Result<(), sqlx::Error> {
                sqlx::query(ddl).execute(pool).await.map(drop)
            }
            async fn new_order(pool: &sqlx::Pool<$db>, trade_no: &str) -> Result<(), sqlx::Error> {
                let insert = sql(Self::BACKEND, "INSERT INTO orders (trade_no, status) VALUES (?, 'WAIT_PAY')");
                sqlx::query(insert).bind(trade_no).execute(pool).await.map(drop)
            }
            async fn mark_paid(conn: &mut <$db as sqlx::Database>::Connection, trade_no: &str) -> Result<bool, sqlx::Error> {
                let update = "UPDATE orders SET status = 'PAID' WHERE trade_no = ? AND status = 'WAIT_PAY'";
                let done = sqlx::query(sql(Self::BACKEND, update)).bind(trade_no).execute(conn).await?;
                Ok(done.rows_affected() == 1)
            }
            async fn is_paid(pool: &sqlx::Pool<$db>, trade_no: &str) -> Result<bool, sqlx::Error> {
                let select = sql(Self::BACKEND, "SELECT COUNT(*) FROM orders WHERE trade_no = ? AND status = 'PAID'");
                Ok(sqlx::query_scalar::<_, i64>(select).bind(trade_no).fetch_one(pool).await? == 1)
            }
            async fn insert_coupon(
                conn: &mut <$db as sqlx::Database>::Connection,
                message_id: &str,
                trade_no: &str,
                user_id: i64,
            ) -> Result<(), sqlx::Error> {
                let insert = "INSERT INTO coupons (message_id, trade_no, user_id) VALUES (?, ?, ?)";
                let query = sqlx::query(sql(Self::BACKEND, insert)).bind(message_id).bind(trade_no).bind(user_id);
                query.execute(conn).await.map(drop)
            }
            async fn count(pool: &sqlx::Pool<$db>, query: &'static str, arg: Option<&str>) -> Result<i64, sqlx::Error> {
                let query = sqlx::query_scalar::<_, i64>(sql(Self::BACKEND, query));
                match arg {
                    Some(arg) => query.bind(arg).fetch_one(pool).await,
                    None => query.fetch_one(pool).await,
                }
            }
        }
    )*};
}
db!(sqlx::Sqlite, sqlx::Postgres, sqlx::MySql);

/// A database of the run: a SQLite file, or on a server a schema
/// (PostgreSQL) or database (MySQL) created for the run, with the name to
/// drop.
enum Database {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool, Option<(String, String)>),
    MySql(sqlx::MySqlPool, Option<(String, String)>),
}

impl Database {
    /// `url`'s database (`None`: `dir/<name>.db`), in a place named for
    /// `name` and the run on a server.
    async fn open(url: Option<&str>, dir: &std::path::Path, name: &str, run: &str) -> Result<Database, BoxError> {
        let url = url.unwrap_or("");
        let own = format!("handoff_{name}_{run}");
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let admin = sqlx::PgPool::connect(url).await?;
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {own}"))).execute(&admin).await?;
            admin.close().await;
            let options = sqlx::postgres::PgConnectOptions::from_str(url)?.options([("search_path", own.as_str())]);
            let pool = sqlx::postgres::PgPoolOptions::new().max_connections(20).connect_with(options).await?;
            Ok(Database::Postgres(pool, Some((url.to_owned(), own))))
        } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
            let url = url.replacen("mariadb://", "mysql://", 1);
            let admin = sqlx::MySqlPool::connect(&url).await?;
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {own}"))).execute(&admin).await?;
            admin.close().await;
            let options = sqlx::mysql::MySqlConnectOptions::from_str(&url)?.database(&own);
            let pool = sqlx::mysql::MySqlPoolOptions::new().max_connections(20).connect_with(options).await?;
            Ok(Database::MySql(pool, Some((url, own))))
        } else if url.is_empty() || url.starts_with("sqlite:") {
            let path = match url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:")) {
                Some(p) if !p.is_empty() => PathBuf::from(p),
                _ => {
                    std::fs::create_dir_all(dir)?;
                    dir.join(format!("{name}.db"))
                }
            };
            let options = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true)
                .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(30));
            let pool = sqlx::sqlite::SqlitePoolOptions::new().max_connections(8).connect_with(options).await?;
            Ok(Database::Sqlite(pool))
        } else {
            Err(format!("unsupported database URL {url:?}: use postgres://, mysql:// or sqlite:").into())
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Database::Sqlite(_) => "sqlite",
            Database::Postgres(..) => "postgres",
            Database::MySql(..) => "mysql",
        }
    }

    /// Close, and drop the run's schema (database) on a server.
    async fn drop_run(&self) {
        use sqlx::Connection as _;
        let dropped: Result<(), sqlx::Error> = async {
            match self {
                Database::Sqlite(pool) => {
                    pool.close().await;
                    Ok(())
                }
                Database::Postgres(pool, own) => {
                    pool.close().await;
                    match own {
                        Some((url, own)) => {
                            let drop = format!("DROP SCHEMA {own} CASCADE");
                            let mut conn = sqlx::PgConnection::connect(url).await?;
                            sqlx::query(sqlx::AssertSqlSafe(drop)).execute(&mut conn).await.map(|_| ())
                        }
                        None => Ok(()),
                    }
                }
                Database::MySql(pool, own) => {
                    pool.close().await;
                    match own {
                        Some((url, own)) => {
                            let drop = format!("DROP DATABASE {own}");
                            let mut conn = sqlx::MySqlConnection::connect(url).await?;
                            sqlx::query(sqlx::AssertSqlSafe(drop)).execute(&mut conn).await.map(|_| ())
                        }
                        None => Ok(()),
                    }
                }
            }
        }
        .await;
        if let Err(e) = dropped {
            eprintln!("could not drop the run's schema: {e}");
        }
    }
}
